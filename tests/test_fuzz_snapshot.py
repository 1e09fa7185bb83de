"""Fuzzing the snapshot input: any bytes as a *.jsonl line or a *.json file.

Properties: the parse gives a record or a rejection with one of the counted reasons, never an
exception; through the exporter's own ingest every line written is accounted for (ingested, or
rejected with its reason in grpo_snapshot_errors_total), and /metrics still renders and parses.
Then the findings, one plain test each.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Running, Samples, scrape, value
from fuzz_strategies import fuzz, json_text, lines
from hypothesis import given
from hypothesis import strategies as st
from polling import wait_for

from grpo_monitor.contract.snapshot import (
    MAX_INT,
    RecordError,
    decode_exactly,
    decode_record,
    is_text,
    parse_record,
)
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.runtime.health import ERROR_REASONS, SHAPES
from grpo_monitor.runtime.ingest import JSON_WHITESPACE
from grpo_monitor.runtime.signals import NONFINITE_WINDOW

# The reasons that cost a whole record; the others cost a part of one (a value, a key, the
# samples) and come beside an ingested record.
REJECTS = ("invalid_json", "incomplete", "invalid_record", "oversized")
# Run folders with names that are hard to export: quotes, a backslash, a newline, bytes that
# are not UTF-8 (os.fsdecode makes them lone surrogates).
FOLDERS = (b"run", b"with space", b'quo"te', b"back\\slash", b"new\nline", b"\xff\xfe", b"caf\xc3\xa9")


def accounted(samples: Samples) -> tuple[float, float]:
    """(records ingested, records rejected) as the exporter counts them."""
    ingested = sum(value(samples, "grpo_snapshots_ingested_total", shape=s) or 0.0 for s in SHAPES)
    rejected = sum(value(samples, "grpo_snapshot_errors_total", reason=r) or 0.0 for r in REJECTS)
    return ingested, rejected


def records_in(data: bytes) -> int:
    """Complete lines that are not blank: each is a record or a rejection."""
    return sum(1 for line in data.split(b"\n")[:-1] if line.strip(JSON_WHITESPACE))


def check_snapshot(raw: bytes) -> None:
    """The parse's contract: a record whose labels and numbers Prometheus can take, or a
    RecordError with a counted reason."""
    try:
        snap = parse_record(decode_record(raw), run="r", rank=0, mtime=1.0)
    except RecordError as exc:
        assert exc.reason in ERROR_REASONS
        return
    assert {reason for reason, _ in snap.problems} <= ERROR_REASONS.keys()
    assert 0 <= snap.step <= MAX_INT and 0 <= snap.rank <= MAX_INT
    assert snap.world_size is None or 1 <= snap.world_size <= MAX_INT
    assert math.isfinite(snap.time)
    names = [snap.run, *snap.metrics, *snap.unknown, *snap.by_type, *(e.type for e in snap.events),
             *(k for typed in snap.by_type_unknown.values() for k in typed), *(snap.placement or ())]
    assert all(is_text(n) for n in names), names


@fuzz(1000)
@given(raw=lines)
def test_a_line_parses_to_a_record_or_a_counted_reason(raw: bytes) -> None:
    check_snapshot(raw)


@fuzz(1000)
@given(raw=st.one_of(lines, json_text.map(lambda text: text.encode("utf-8", "surrogatepass"))))
def test_a_line_decodes_alike_whichever_json_decoder_reads_it(raw: bytes) -> None:
    """decode_record tries orjson first, and Python's json for what orjson refuses or may read
    otherwise: the same values of the same types, or a rejection either way."""
    try:
        expected = repr(decode_exactly(raw))
    except RecordError:
        with pytest.raises(RecordError):
            decode_record(raw)
        return
    assert repr(decode_record(raw)) == expected


@pytest.mark.parametrize("raw", [
    b'{"step": 123456789012345678901234567890}', b'[-9223372036854775809, 18446744073709551616]',
    b'{"v": NaN, "w": -Infinity}', b'{"v": 1e400}', b'{"k\\ud800": 1}', b'\xef\xbb\xbf{"v": 1}',
    '{"v": 1}'.encode("utf-16"), b'{"to_step": 123456789012345678901234567890}',
])
def test_what_orjson_reads_otherwise_is_read_as_the_standard_library_reads_it(raw: bytes) -> None:
    assert repr(decode_record(raw)) == repr(decode_exactly(raw)) == repr(json.loads(raw))


# -- through the exporter's ingest ---------------------------------------------------------------


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    """The exporter as app.py assembles it, serving /metrics, its ingest driven by the test
    (the watcher is not started: no second thread reads the files)."""
    config = ExporterConfig(snapshot_dir=tmp_path_factory.mktemp("snapshots"),
                            listen_address="127.0.0.1:0", gpu_collector=False,
                            max_line_bytes=4096, max_file_bytes=4096)
    exporter = Exporter(config)
    exporter.server.start()
    yield exporter
    exporter.server.stop()


_serial = itertools.count()


def new_file(root: Path, folder: bytes, name: str) -> Path:
    """A fresh file in a fresh run folder (its name made unique), as the file system spells it."""
    run_dir = Path(os.fsdecode(os.fsencode(root) + b"/" + folder + b"-%d" % next(_serial)))
    run_dir.mkdir()
    return run_dir / name


def ingest(exporter: Exporter, path: Path, data: bytes) -> Samples:
    """Write ``data`` to ``path``, let the exporter's ingest read it, scrape /metrics; then
    delete the file's run folder, which the exporter forgets (as its watcher would on the
    deletion): the counters stay, and a scrape does not grow with every example run so far."""
    path.write_bytes(data)
    exporter.ingestor.process(path)
    exporter.store.flush()
    samples = scrape(exporter.url)  # parsed by prometheus_client's exposition parser
    shutil.rmtree(path.parent)
    exporter.ingestor.run_folder_gone(path.parent)
    exporter.store.flush()
    return samples


@fuzz(200)
@given(data=st.lists(lines | st.integers(4097, 9000).map(lambda n: b'{"a":"' + b"x" * n + b'"}'),
                     min_size=1, max_size=6).map(lambda ls: b"\n".join(ls) + b"\n"),
       folder=st.sampled_from(FOLDERS))
def test_every_jsonl_line_is_ingested_or_rejected_and_metrics_still_parse(
        offline: Exporter, data: bytes, folder: bytes) -> None:
    before = accounted(scrape(offline.url))
    after = accounted(ingest(offline, new_file(offline.config.snapshot_dir, folder, "rank-0.jsonl"),
                             data))
    assert (after[0] - before[0]) + (after[1] - before[1]) == records_in(data)


@fuzz(60)
@given(data=lines, folder=st.sampled_from(FOLDERS))
def test_a_json_file_is_ingested_or_rejected_and_metrics_still_parse(
        offline: Exporter, data: bytes, folder: bytes) -> None:
    before = accounted(scrape(offline.url))
    after = accounted(ingest(offline, new_file(offline.config.snapshot_dir, folder, "latest.json"),
                             data))
    assert (after[0] - before[0]) + (after[1] - before[1]) == 1


@fuzz(25)
@given(data=st.lists(lines, min_size=1, max_size=4).map(lambda ls: b"\n".join(ls) + b"\n"))
def test_a_running_exporter_accounts_for_every_line(
        exporter: Running, snapshot_dir: Path, data: bytes) -> None:
    # One exporter for all the examples (a function-scoped fixture is set up once per test):
    # each example counts its own lines, read through inotify and scraped over HTTP.
    before = accounted(exporter.scrape())
    path = new_file(snapshot_dir, b"live", "rank-0.jsonl")
    path.write_bytes(data)
    wanted = records_in(data)

    def counted() -> float:
        after = accounted(exporter.scrape())
        return (after[0] - before[0]) + (after[1] - before[1])

    wait_for(lambda: counted() >= wanted)
    assert counted() == wanted


# -- findings, one example each ---------------------------------------------------------------


DEEP = 100_000


@pytest.mark.parametrize("raw", [
    b"[" * DEEP + b"]" * DEEP,
    b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    b'{"step": 1, "metrics": {"loss": ' + b"[" * DEEP + b"]" * DEEP + b"}}",
], ids=["arrays", "objects", "inside-a-record"])
def test_nesting_beyond_the_recursion_limit_is_invalid_json(raw: bytes) -> None:
    with pytest.raises(RecordError) as exc:
        decode_record(raw)
    assert exc.value.reason == "invalid_json"


def test_a_running_exporter_counts_deep_lines_and_reads_on(exporter: Running,
                                                           snapshot_dir: Path) -> None:
    # The ingest caught neither RecursionError nor OverflowError: the rest of the read was
    # lost (its offset already past it), counted only as an internal error.
    path = new_file(snapshot_dir, b"deep", "rank-0.jsonl")
    path.write_bytes(b"[" * DEEP + b"]" * DEEP + b"\n" + b'{"a":' * DEEP + b"1" + b"}" * DEEP
                     + b'\n{"step": 1, "metrics": {"loss": ' + str(10**400).encode() + b"}}\n"
                     + b'{"step": 2, "metrics": {"loss": 0.5}}\n')
    exporter.wait_value("grpo_loss", 0.5, run=path.parent.name, rank="0")
    s = exporter.scrape()
    assert value(s, "grpo_snapshot_errors_total", reason="invalid_json") == 2
    assert value(s, "grpo_snapshot_errors_total", reason="invalid_value") == 1
    assert value(s, "grpo_exporter_internal_errors_total") == 0


@pytest.mark.parametrize(("spelling", "expected"), [
    ("NaN", math.nan), ("Infinity", math.inf), ("-Infinity", -math.inf), ("1e999", math.inf),
    ("-1e999", -math.inf), ('"NaN"', math.nan), ('"nan"', math.nan), ('"-inf"', -math.inf),
    ('"Infinity"', math.inf), ('" -Infinity "', -math.inf),
    ("-NaN", "invalid_json"), ("nan", "invalid_json"), ("inf", "invalid_json"),
    ("-inf", "invalid_json"), ("+1", "invalid_json"),
    (str(10**400), "invalid_value"),  # was an OverflowError out of the parser
    ("1" + "0" * 5000, "invalid_json"),  # beyond Python's int-to-str limit
])
def test_every_spelling_of_a_non_finite_value(spelling: str, expected: float | str) -> None:
    raw = b'{"step": 1, "metrics": {"loss": ' + spelling.encode() + b', "kl/mean": 0.5}}'
    try:
        snap = parse_record(decode_record(raw), run="r", rank=0, mtime=1.0)
    except RecordError as exc:
        assert exc.reason == expected
        return
    if expected == "invalid_value":
        assert snap.problems == [("invalid_value", "loss")] and snap.metrics == {"kl/mean": 0.5}
        return
    assert isinstance(expected, float)
    loss = snap.metrics["loss"]
    assert (math.isnan(loss) and math.isnan(expected)) or loss == expected


@pytest.mark.parametrize("step", [MAX_INT + 1, 2**63, 10**400])
def test_a_step_beyond_what_a_sample_holds_is_an_invalid_record(step: int) -> None:
    # 10**400 was accepted and exported as 400 digits, which Prometheus refuses (the whole scrape).
    for rec in ({"step": step, "metrics": {}}, {"step": step, "data": {}}, {"_step": step, "x": 1},
                {"step": 1, "world_size": step, "metrics": {}}):
        with pytest.raises(RecordError) as exc:
            parse_record(decode_record(json.dumps(rec)), run="r", rank=0, mtime=1.0)
        assert exc.value.reason == "invalid_record"
    assert parse_record({"step": MAX_INT, "metrics": {}}, run="r", rank=0, mtime=1.0).step == MAX_INT


def test_lone_surrogates_cost_their_key_and_metrics_still_render(offline: Exporter) -> None:
    # A native metric key "\ud800" reached the exposition, whose UTF-8 encoding then failed on
    # every scrape; a flat key "\ud800" beside a bad events list made the parser raise.
    data = (b'{"step": 1, "metrics": {"\\ud800": 1, "a\\udcff": 2, "loss": 0.5}}\n'
            b'{"step": 2, "\\ud800": 1, "events": 5, "kl": 0.25}\n'
            b'{"step": 3, "run": "\\udcff", "metrics": {"loss": 1}}\n'
            b'{"step": 4, "metrics": {"loss": 1}, "events": [{"type": "\\ud800"}]}\n')
    before = scrape(offline.url)
    path = new_file(offline.config.snapshot_dir, b"surrogates", "rank-0.jsonl")
    after = ingest(offline, path, data)

    def delta(reason: str) -> float:
        return ((value(after, "grpo_snapshot_errors_total", reason=reason) or 0.0)
                - (value(before, "grpo_snapshot_errors_total", reason=reason) or 0.0))

    assert (delta("invalid_key"), delta("invalid_events"), delta("invalid_record")) == (3, 2, 1)
    run = path.parent.name
    assert value(after, "grpo_kl_mean", run=run, rank="0") == 0.25
    assert value(after, "grpo_step", run=run, rank="0") == 4


def test_a_run_folder_whose_name_is_not_utf8_is_exported_escaped(offline: Exporter) -> None:
    # The run's name comes from the folder: os.fsdecode made b"\xff" a lone surrogate, and the
    # whole /metrics failed to encode.
    path = new_file(offline.config.snapshot_dir, b"\xff", "rank-0.jsonl")
    after = ingest(offline, path, b'{"step": 7, "metrics": {"loss": 0.5}}\n')
    run = path.parent.name.encode("utf-8", "backslashreplace").decode()
    assert run.startswith("\\udcff-")
    assert value(after, "grpo_step", run=run, rank="0") == 7


def test_values_at_floats_edge_keep_metrics_rendering(offline: Exporter) -> None:
    # A baseline of 1e308 and -1e308 overflowed its running variance to -inf, and sqrt() raised
    # on every render of the rank.
    recs = [{"step": 0, "metrics": {"loss": 1e308}}, {"step": 1, "metrics": {"loss": -1e308}},
            {"step": 300, "metrics": {"kl/mean": 1.0}}]
    path = new_file(offline.config.snapshot_dir, b"edge", "rank-0.jsonl")
    after = ingest(offline, path, "".join(json.dumps(r) + "\n" for r in recs).encode())
    run = path.parent.name
    assert value(after, "grpo_step", run=run, rank="0") == 300
    assert value(after, "grpo_baseline_stddev", run=run, rank="0", key="loss") == math.inf


def test_a_line_of_form_feeds_is_counted_not_skipped(offline: Exporter) -> None:
    # bytes.strip() took "\x0c" and "\x0b" for blank; JSON does not, and the line vanished
    # without a count.
    before = accounted(scrape(offline.url))
    path = new_file(offline.config.snapshot_dir, b"ff", "rank-0.jsonl")
    after = accounted(ingest(offline, path, b"\x0c\n\x0b\n \t\r\n"))
    assert (after[0] - before[0], after[1] - before[1]) == (0, 2)


def test_a_nan_under_a_key_that_needs_escaping(offline: Exporter) -> None:
    # The NaN window of an unknown key wrote the key into its label unescaped: a quote or a
    # backslash in it broke the whole exposition, for every scrape after.
    key = 'odd"key\\with\nall'
    path = new_file(offline.config.snapshot_dir, b"nan-key", "rank-0.jsonl")
    after = ingest(offline, path, json.dumps({"step": 3, "metrics": {key: math.nan}}).encode() + b"\n")
    run = path.parent.name
    assert value(after, "grpo_window_nonfinite", run=run, rank="0", key=key,
                 window_steps=str(NONFINITE_WINDOW)) == 1
    assert value(after, "grpo_nonfinite_values_total", run=run, rank="0", key=key) == 1
