"""Snapshot contract v1: the record models and their normalisation into one ``Snapshot``.

A record is one of three shapes, detected from its keys: native (``metrics``), verl's file
logger (``step`` + ``data``) and flat wandb-style dicts. Validation is split on purpose: the
pydantic models check the envelope (step, time, run, rank, samples, events), while metric
values are converted one by one, so one bad value costs that value and not the record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePath
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)

from grpo_monitor.contract.key_map import KeyMap
from grpo_monitor.contract.keys import KeyMatch, match_key
from grpo_monitor.contract.logger_layout import APPENDED_FORMATS, logger_format, logger_run
from grpo_monitor.contract.run_layout import (
    DEFAULT_RUN,
    MAX_RUN_NAME_BYTES,
    check_run_name,
    run_label,
)

Shape = Literal["native", "verl", "flat"]

CONTRACT_VERSION = 1
MAX_KEY_LENGTH = 200
# Nested metric dicts are flattened with "/" (reward_quantiles: {"25": ..} -> reward_quantiles/25);
# a bound keeps a hostile record from recursing without end.
MAX_NESTING = 4
# The largest step, rank or size a record may carry: a Prometheus sample is a float64, which
# holds every integer up to 2**53 exactly (and a number of 400 digits not at all: Prometheus
# would refuse the whole scrape).
MAX_INT = 2**53
Count = Annotated[int, Field(ge=0, le=MAX_INT)]

_METRIC_VALUE_SCHEMA = {
    "anyOf": [
        {"type": "number"},
        {"type": "string", "description": "'nan', 'inf', '-inf' (any case) or a numeric string"},
        {"type": "boolean"},
        {"type": "null", "description": "not measured at this step; ignored"},
        {"type": "object", "description": "nested metrics, flattened with '/'"},
    ]
}
MetricsMap = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "additionalProperties": _METRIC_VALUE_SCHEMA}),
]
NameStr = Annotated[str, Field(min_length=1, max_length=128)]
# A record's run is held to the rule the SDK and the run folders follow (run_layout), so that a
# name the writer accepts is one the exporter accepts.
RunName = Annotated[str, AfterValidator(check_run_name), WithJsonSchema({
    "type": "string", "minLength": 1,
    "description": f"a plain folder name: not starting with '.', no '/', '\\' or NUL, at most "
                   f"{MAX_RUN_NAME_BYTES} bytes of UTF-8"})]


class SampleResponse(BaseModel):
    """One of the G responses to a replayed prompt."""

    model_config = ConfigDict(extra="allow")
    text: str
    reward: float | None = None
    length: Count | None = None


class Sample(BaseModel):
    """A prompt with its group of responses, logged for replay (background.md#reading-samples)."""

    model_config = ConfigDict(extra="allow")
    prompt: str
    prompt_type: str | None = None
    responses: list[SampleResponse] = Field(default_factory=list)


class Event(BaseModel):
    """Something that happened in the trainer, e.g. ``{"type": "checkpoint_save", "duration_s": 41}``."""

    model_config = ConfigDict(extra="allow")
    type: Annotated[str, Field(min_length=1, max_length=64)]
    step: Count | None = None
    time: float | None = None
    duration_s: float | None = None


class _Envelope(BaseModel):
    # Unknown top-level fields are tolerated so that newer writers stay readable (contract v1
    # only grows).
    model_config = ConfigDict(extra="allow")
    run: RunName | None = None
    rank: Count | None = None
    world_size: Annotated[int, Field(ge=1, le=MAX_INT)] | None = None
    step: Count
    time: Annotated[float, Field(allow_inf_nan=False)] | None = None


class NativeRecord(_Envelope):
    """Shape 1, what ``SnapshotWriter`` writes."""

    host: Annotated[str, Field(max_length=253)] | None = None
    local_rank: Count | None = None
    gpu: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="physical GPU index as NVML numbers it")
    gpu_uuid: Annotated[str, Field(max_length=96)] | None = None
    framework: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="the trainer that wrote the record (trl, verl, ...), which the "
        "coverage card names when it knows why a framework's run lacks a curve")
    metrics: MetricsMap
    by_type: dict[NameStr, MetricsMap] = Field(default_factory=dict)
    samples: list[Sample] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)


class VerlRecord(BaseModel):
    """Shape 2, a line of verl's file logger (``trainer.logger=['file']``)."""

    model_config = ConfigDict(extra="allow")
    step: Count
    data: MetricsMap


class FlatRecord(_Envelope):
    """Shape 3, the dict people pass to ``wandb.log``: every other key is a metric."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": _METRIC_VALUE_SCHEMA})
    step: Count = Field(validation_alias=AliasChoices("step", "_step", "global_step", "trainer/global_step"))
    time: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        default=None, validation_alias=AliasChoices("time", "_timestamp", "timestamp"))
    # Not a metric: the same trainer events as a native record's, so that a flat-dict or verl
    # run can mark its end with one appended line ({"step": N, "events": [{"type": "run_end"}]}).
    events: list[Event] = Field(default_factory=list)


_FLAT_RESERVED = frozenset(
    {"run", "rank", "world_size", "step", "_step", "global_step", "trainer/global_step", "time",
     "_timestamp", "timestamp", "_runtime", "events"})
# Fields whose validation errors cost only themselves: the record's metrics survive. A bad time
# (NaN, infinite, a word) loses the time, under any of its names: the record is timed by its file.
_TIME_NAMES = ("time", "_timestamp", "timestamp")
_DROPPABLE = ("samples", "events", "by_type", "framework", *_TIME_NAMES)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of one snapshot record (any of the three shapes)."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(NativeRecord | VerlRecord | FlatRecord).json_schema()
    schema["title"] = f"grpo-monitor snapshot record, contract v{CONTRACT_VERSION}"
    schema["description"] = (
        "One record: a line of a *.jsonl file or a whole *.json file. The shape is detected: "
        "'metrics' present -> native; 'step' and 'data' -> verl file logger; else flat.")
    return schema


@dataclass
class Snapshot:
    """One record, validated and mapped onto canonical keys."""

    run: str
    rank: int
    step: int
    time: float
    shape: Shape
    world_size: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # canonical key -> value
    names: dict[str, str] = field(default_factory=dict)  # canonical key -> the name it was logged as
    unknown: dict[str, float] = field(default_factory=dict)  # other numeric keys -> value
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)  # prompt type -> canonical
    by_type_unknown: dict[str, dict[str, float]] = field(default_factory=dict)  # same keys as by_type
    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # Where the rank runs: (host, local_rank, gpu, gpu_uuid), each "" when unknown.
    placement: tuple[str, str, str, str] | None = None
    # Problems that cost part of the record, as (reason, detail) for the error counter.
    problems: list[tuple[str, str]] = field(default_factory=list)
    framework: str | None = None  # a native record's own word on who wrote it
    # What it was read from: "snapshots", or the format of a logger's file (logger_layout.py).
    source: str = "snapshots"


class RecordError(ValueError):
    """The record cannot be used at all; ``reason`` is the error counter's label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)", re.IGNORECASE)


def is_text(s: str) -> bool:
    """Whether ``s`` can be written as UTF-8. A lone surrogate cannot: JSON's ``"\\ud800"``
    escape decodes to one, and so does a file name that is not UTF-8 (os.fsdecode). The
    exposition, and every file the exporter writes, is UTF-8."""
    if s.isascii():  # nearly every key: no encoding needed to know
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_text(s: str) -> str:
    """``s`` with what UTF-8 cannot hold written as a backslash escape (``\\udcff``): two names
    that differ stay apart."""
    return s if is_text(s) else s.encode("utf-8", "backslashreplace").decode("utf-8")


@lru_cache(maxsize=65536)  # per record, for a few files: the ingest's hottest path
def identity_from_path(path: PurePath, snapshot_dir: PurePath) -> tuple[str, int]:
    """Run and rank implied by where a file lies: ``<dir>/<run>/.../rank-<N>.jsonl``; a
    logger's file (a framework's ``metrics.jsonl``, ``trainer_state.json``) is in the run of
    the folder it lies in, however deep (contract/logger_layout.py)."""
    fmt = logger_format(path.name)
    if fmt in APPENDED_FORMATS:
        return logger_run(path, snapshot_dir, fmt), 0
    try:
        parts = path.relative_to(snapshot_dir).parts
    except ValueError:
        parts = (path.name,)
    run = run_label(parts[0]) if len(parts) > 1 else DEFAULT_RUN  # folder_name leads back
    m = _RANK_IN_NAME.search(path.name)
    return run, int(m.group(1)) if m else 0


def decode_record(raw: bytes | str, *, whole_file: bool = False) -> Any:
    """One record's JSON text, decoded; RecordError when it is none.

    ``invalid_json``: not JSON, not UTF-8, nested deeper than Python's recursion limit, or an
    integer of more than 4300 digits (Python's limit on converting one). ``incomplete``: a
    ``whole_file`` that stops mid-document, most likely still being written (a line of a
    ``*.jsonl`` file is complete once its newline is there, so a line never is).

    orjson decodes first: a few times faster, and a first start parses hundreds of thousands of
    lines. What it refuses (NaN and Infinity, which Python's json writes; a lone surrogate; a
    BOM; bytes that are not UTF-8) goes to Python's json, whose errors are the ones counted; so
    does a line with a run of 19 digits, since orjson reads an integer beyond 64 bits as a
    float. Whichever reads a line, it decodes alike (tests/test_fuzz_snapshot.py).
    """
    if isinstance(raw, bytes) and _NINETEEN_DIGITS not in raw.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return decode_exactly(raw, whole_file=whole_file)


# A line's digits as b"0", everything else as b" ": where an integer may need more than 64 bits
# (2**63 has 19 digits), found by one translate() and one search, both in C.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_NINETEEN_DIGITS = b"0" * 19


def decode_exactly(raw: bytes | str, *, whole_file: bool = False) -> Any:
    """decode_record with Python's json alone."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        at_end = whole_file and exc.pos >= len(exc.doc.rstrip())
        raise RecordError("incomplete" if at_end else "invalid_json",
                          f"{exc.msg} at byte {exc.pos}") from None
    except RecursionError:
        raise RecordError("invalid_json", "nested deeper than the parser's limit") from None
    except ValueError as exc:  # not UTF-8; an integer over the digit limit
        raise RecordError("invalid_json", str(exc)[:80]) from None


def parse_number(raw: Any) -> float | None:
    """A metric value as float; None for null; raises ValueError for anything not a number."""
    if raw is None:
        return None
    if isinstance(raw, (int, float)):  # bool is an int: True -> 1.0
        try:
            return float(raw)
        except OverflowError:  # an integer beyond float's range (JSON allows any number of digits)
            raise ValueError("an integer too large for a float") from None
    if isinstance(raw, str):
        # float() already accepts 'nan', 'inf', '-Infinity', '1e-3' in any case.
        return float(raw.strip())
    raise ValueError(f"not a number: {type(raw).__name__}")


def _flatten(raw: dict[str, Any], prefix: str, depth: int, out: dict[str, Any]) -> None:
    for k, v in raw.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and depth < MAX_NESTING:
            _flatten(v, name + "/", depth + 1, out)
        else:
            out[name] = v


def normalize_metrics(
    raw: dict[str, Any], problems: list[tuple[str, str]], names: dict[str, str] | None = None,
    key_map: KeyMap | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Split raw metrics into (canonical, unknown) float maps; ``names``, when given, receives
    the name each canonical key was read from (``completions/mean_length`` for
    ``response/len_mean``).

    A canonical key wins over its aliases when a record carries both, so that a trainer that
    logs ``reward/mean`` next to TRL's ``reward`` is read as it meant. Between two aliases of
    one key, the one ranked first in keys.py wins (not the one written first): which KL verl's
    ``actor/kl_loss`` and ``actor/reward_kl_penalty`` stand for is decided there, once. An alias
    logged in another unit is converted. A name of the user's ``key_map`` wins over all of them,
    or, mapped to no signal, stays unknown.
    """
    flat: dict[str, Any] = {}
    _flatten(raw, "", 0, flat)
    best: dict[str, tuple[int, float, str]] = {}  # canonical key -> (rank of the name used, value, name)
    unknown: dict[str, float] = {}
    for name, value in flat.items():
        if not name or len(name) > MAX_KEY_LENGTH or not is_text(name):
            problems.append(("invalid_key", as_text(name[:40])))
            continue
        try:
            number = parse_number(value)
        except (ValueError, TypeError):
            problems.append(("invalid_value", name))
            continue
        if number is None:
            continue
        hit = _mapped(name, key_map) if key_map else match_key(name)
        if hit is None:
            unknown[name] = number
            continue
        if hit.scale != 1.0:
            number *= hit.scale
        held = best.get(hit.key)
        if held is None or hit.rank < held[0]:
            best[hit.key] = (hit.rank, number, name)
    if names is not None:
        names.update({key: name for key, (_, _, name) in best.items()})
    return {key: number for key, (_, number, _) in best.items()}, unknown


def _mapped(name: str, key_map: KeyMap) -> KeyMatch | None:
    target = key_map.get(name)
    if target is None:
        return match_key(name)
    if target.key is None:
        return None
    return KeyMatch(target.key, -1, target.scale, "key_map")


def _ascii_names(obj: dict[Any, Any]) -> bool:
    """Whether every name of ``obj`` is ASCII text: one check in C for a record's dozen names."""
    try:
        return "".join(obj).isascii()
    except TypeError:  # a name that is no text (a dict built by hand, not decoded JSON)
        return False


def detect_shape(obj: Any) -> Shape:
    if not isinstance(obj, dict):
        raise RecordError("invalid_record", f"a record must be a JSON object, not {type(obj).__name__}")
    if isinstance(obj.get("metrics"), dict):
        return "native"
    if isinstance(obj.get("data"), dict) and "step" in obj:
        return "verl"
    return "flat"


def _validate(model: type[BaseModel], obj: dict[str, Any], problems: list[tuple[str, str]]) -> BaseModel:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors()
    # An error of the record as a whole has no location: nothing to drop, the record goes.
    locs = {e["loc"][0] if e["loc"] else None for e in errors}
    droppable = {str(loc) for loc in locs if loc in _DROPPABLE}
    if droppable and not locs - droppable:
        try:
            rec = model.model_validate({k: v for k, v in obj.items() if k not in droppable})
        except ValidationError as exc:
            errors = exc.errors()
        else:
            for name in sorted(droppable):
                problems.append(("invalid_time" if name in _TIME_NAMES else f"invalid_{name}", name))
            return rec
    first = errors[0]
    where = as_text(".".join(str(p) for p in first["loc"])) or "record"
    raise RecordError("invalid_record", f"{where}: {first['msg']}")


def parse_record(obj: Any, *, run: str, rank: int, mtime: float,
                 key_map: KeyMap | None = None) -> Snapshot:
    """Validate one decoded JSON record and normalise it.

    ``run``/``rank`` are what the file's location implies and ``mtime`` its modification time;
    the record's own fields take precedence. ``key_map``: the user's names for the run
    (key_map.py). Raises RecordError when nothing can be used.
    """
    shape = detect_shape(obj)
    problems: list[tuple[str, str]] = []
    bad_names = [] if _ascii_names(obj) else \
        [k for k in obj if not (isinstance(k, str) and is_text(k))]
    if bad_names:
        # A top-level name that is no text (a lone surrogate) costs itself: in a flat record it
        # is a metric's key, elsewhere an unknown field.
        problems.extend(("invalid_key", as_text(str(k))[:40]) for k in bad_names)
        obj = {k: v for k, v in obj.items() if isinstance(k, str) and is_text(k)}
    if shape == "native":
        rec = _validate(NativeRecord, obj, problems)
        assert isinstance(rec, NativeRecord)
        names: dict[str, str] = {}
        metrics, unknown = normalize_metrics(rec.metrics, problems, names, key_map)
        by_type: dict[str, dict[str, float]] = {}
        by_type_unknown: dict[str, dict[str, float]] = {}
        for ptype, values in rec.by_type.items():
            by_type[ptype], by_type_unknown[ptype] = normalize_metrics(values, problems,
                                                                       key_map=key_map)
        placement = None
        if rec.host or rec.gpu or rec.gpu_uuid:
            placement = (rec.host or "", "" if rec.local_rank is None else str(rec.local_rank),
                         rec.gpu or "", rec.gpu_uuid or "")
        return Snapshot(
            run=rec.run or run, rank=rank if rec.rank is None else rec.rank, step=rec.step,
            time=mtime if rec.time is None else rec.time, shape=shape, world_size=rec.world_size,
            metrics=metrics, names=names, unknown=unknown, by_type=by_type,
            by_type_unknown=by_type_unknown, samples=rec.samples,
            events=_marks_checked(rec.events, problems),
            placement=placement, problems=problems, framework=rec.framework)
    if shape == "verl":
        verl = _validate(VerlRecord, obj, problems)
        assert isinstance(verl, VerlRecord)
        names = {}
        metrics, unknown = normalize_metrics(verl.data, problems, names, key_map)
        # verl lines carry no events; its checkpoint timing marks a save step, which the step
        # time cards must leave out (background.md#checkpoint-io).
        events = [Event(type="checkpoint_save")] if "timing_s/save_checkpoint" in verl.data else []
        return Snapshot(run=run, rank=rank, step=verl.step, time=mtime, shape=shape,
                        metrics=metrics, names=names, unknown=unknown, events=events,
                        problems=problems, framework="verl")
    flat = _validate(FlatRecord, obj, problems)
    assert isinstance(flat, FlatRecord)
    values = {k: v for k, v in obj.items() if k not in _FLAT_RESERVED}
    names = {}
    metrics, unknown = normalize_metrics(values, problems, names, key_map)
    return Snapshot(
        run=flat.run or run, rank=rank if flat.rank is None else flat.rank, step=flat.step,
        time=mtime if flat.time is None else flat.time, shape=shape, world_size=flat.world_size,
        metrics=metrics, names=names, unknown=unknown, events=_marks_checked(flat.events, problems),
        problems=problems)



# A trainer that went back to a checkpoint says so: {"type": "rollback", "from_step": 70,
# "to_step": 20}. The steps after to_step are undone (docs/signals.md#a-runs-timeline).
ROLLBACK = "rollback"


def _step_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _marks_checked(events: list[Event], problems: list[tuple[str, str]]) -> list[Event]:
    """The events, less the rollback marks whose ``to_step`` is no step (missing, negative, not
    an integer, past 2^53) or lies after their ``from_step``: each is counted (invalid_events)
    and undoes nothing."""
    kept = []
    for event in events:
        if event.type == ROLLBACK:
            extra = event.model_extra or {}
            to, back_from = extra.get("to_step"), extra.get("from_step")
            if not _step_number(to) or (_step_number(back_from) and to > back_from):  # type: ignore[operator]
                problems.append(("invalid_events", f"a rollback mark whose to_step is no step "
                                 f"before its from_step: {as_text(repr(to))[:40]}"))
                continue
        kept.append(event)
    return kept


def rollback_to(events: list[Event]) -> int | None:
    """The step a record's rollback mark goes back to (the lowest, if several); None without."""
    steps = [to for e in events if e.type == ROLLBACK
             for to in [(e.model_extra or {}).get("to_step")]
             if isinstance(to, int) and not isinstance(to, bool) and to >= 0]
    return min(steps, default=None)


class Timeline:
    """Each rank's newest step, and what a record undoes (docs/signals.md#a-runs-timeline): a
    rollback mark the steps after its to_step, a step record older than the newest the steps
    from its own on. For the readers that follow a run's files after the fact (report, replay);
    the exporter's store keeps its own per rank."""

    def __init__(self) -> None:
        self.newest: dict[int, int] = {}

    def undone_after(self, rank: int, step: int, step_record: bool, events: list[Event]) -> int | None:
        """The step after which this record undoes the rank's steps; None when it undoes none."""
        newest = self.newest.get(rank)
        keep = rollback_to(events)
        if step_record and newest is not None and step < newest:
            keep = step - 1 if keep is None else min(keep, step - 1)
        if keep is not None and (newest is None or keep >= newest):
            keep = None
        if keep is not None:
            newest = keep
        if step_record:
            newest = step if newest is None else max(newest, step)
        if newest is not None:
            self.newest[rank] = newest
        return keep
