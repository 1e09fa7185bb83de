"""Hypothesis settings and strategies shared by the fuzz tests (tests/test_fuzz_*.py).

JSON is generated as text, not dumped from Python objects, so that every spelling a writer may
produce can stand where a value goes: the tokens Python's json writes (``NaN``, ``Infinity``),
those it refuses (``nan``, ``-NaN``, ``inf``), numbers beyond float's range (``1e999``),
integers beyond Python's int-to-str limit (5000 digits), lone surrogate escapes
(``"\\ud800"``), and, once encoded, raw bytes that are not UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from grpo_monitor.contract.snapshot import MAX_INT

F = TypeVar("F", bound=Callable[..., Any])


def fuzz(max_examples: int) -> Callable[[F], F]:
    """The fuzz tests' settings: reproducible (derandomize: the same examples on every run, no
    example database), no wall-clock deadline. A function-scoped fixture (a running exporter)
    is shared by a test's examples on purpose: each example counts its own effect on it."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# -- text --------------------------------------------------------------------------------------

# Names that mean something to the parser (canonical keys, aliases, envelope fields) and names
# that are hard to export (empty, over-long, control characters, quotes, lone surrogates).
NAMES = (
    "reward/mean", "reward/std", "kl/mean", "kl/p95", "loss", "entropy/mean", "response/len_mean",
    "perf/step_time_s", "group/zero_std_frac", "reward", "kl", "actor/kl_loss", "actor/lr(1e-4)",
    "timing_s/save_checkpoint", "train/reward", "rewards / check_answer", "reward_quantiles",
    "step", "_step", "global_step", "time", "_timestamp", "run", "rank", "world_size", "events",
    "metrics", "data", "samples", "by_type", "host", "gpu",
    "", "x" * 201, "\ud800", "a\udcff", "\x00", "new\nline", 'quo"te', "back\\slash", "é", "😀",
    "\u2028", " / ", "{", "#",
)
surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                     max_size=2)
names = st.one_of(st.sampled_from(NAMES), st.text(max_size=12), surrogates)


def string_literal(s: str) -> str:
    """``s`` as a JSON string; a lone surrogate as its ``\\udXXX`` escape."""
    return json.dumps(s)


def json_object(pairs: list[tuple[str, str]] | dict[str, str]) -> str:
    """A JSON object from (name, value text) pairs; a name may repeat (JSON allows it)."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return "{" + ",".join(f"{string_literal(k)}:{v}" for k, v in items) + "}"


def json_array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


# -- numbers -----------------------------------------------------------------------------------

NUMBER_SPELLINGS = (
    "NaN", "-NaN", "nan", "Infinity", "-Infinity", "inf", "-inf", "1e999", "-1e999", "1e-999",
    "-0", "-0.0", "0e0", "1E+2", "01", "1.", ".5", "+1", "0x10", "1_000", "5e-324",
    "1.7976931348623157e308", str(MAX_INT), str(MAX_INT + 1), str(2**63), str(10**400),
    "1" + "0" * 5000,
)
NUMBER_STRINGS = ('"NaN"', '"nan"', '"-inf"', '"Infinity"', '" 1.5 "', '"1_000"', '"١٢"', '""',
                  '"lots"', '"1e999"')
numbers = st.one_of(
    st.sampled_from(NUMBER_SPELLINGS),
    st.sampled_from(NUMBER_STRINGS),
    st.integers().map(str),
    st.floats().map(json.dumps),  # NaN, Infinity, -Infinity as Python writes them
    st.sampled_from(("true", "false", "null")),
)
scalars = st.one_of(numbers, names.map(string_literal))
json_text = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4).map(json_array),
                           st.lists(st.tuples(names, kids), max_size=4).map(json_object)),
    max_leaves=12)


def mostly(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A field's value: usually of the right type, sometimes any JSON at all (or not JSON: a
    record of a dozen fields is then seldom whole)."""
    return st.one_of(valid, valid, valid, json_text)


# RFC 3339 time stamps as Alertmanager and the control record write them, and the calendar's
# ends (a time zone there takes it past year 1 or 9999), and what is no date at all.
DATES = ("2025-01-01T00:00:00.000Z", "2025-01-01T00:00:00+02:00", "0001-01-01T00:00:00Z",
         "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59-14:00",
         "2025-13-45T99:00:00Z", "not a date", "")
dates = st.sampled_from(DATES)

# -- records -----------------------------------------------------------------------------------

steps = mostly(st.one_of(st.integers(0, 10**6).map(str),
                         st.sampled_from((str(MAX_INT), str(MAX_INT + 1), "-1", "1.0", "1.5",
                                          '"12"', "true", "null", str(10**400)))))
finite = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
                   st.integers(-10**6, 10**6).map(str))
values = st.one_of(finite, finite, numbers, json_text)
metrics = st.lists(st.tuples(names, values), max_size=6).map(json_object)
labels = mostly(names.map(string_literal))
events = mostly(st.lists(st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(("run_end", "paused", "resumed", "checkpoint_save", "x" * 65,
                                     "")).map(string_literal) | labels)},
    optional={"step": steps, "time": values, "duration_s": values, "path": labels},
).map(json_object), max_size=3).map(json_array))
samples = mostly(st.lists(st.fixed_dictionaries(
    {"prompt": labels},
    optional={"prompt_type": labels, "responses": mostly(st.lists(st.fixed_dictionaries(
        {"text": labels}, optional={"reward": values, "length": steps}).map(json_object),
        max_size=3).map(json_array))},
).map(json_object), max_size=2).map(json_array))
by_type = mostly(st.lists(st.tuples(names, metrics), max_size=3).map(json_object))
ENVELOPE = {"run": labels, "rank": steps, "world_size": steps, "time": values, "events": events}
native = st.fixed_dictionaries(
    {"step": steps, "metrics": metrics},
    optional={**ENVELOPE, "host": labels, "local_rank": steps, "gpu": labels, "gpu_uuid": labels,
              "by_type": by_type, "samples": samples, "newer_field": json_text},
).map(json_object)
verl = st.fixed_dictionaries({"step": steps, "data": metrics}).map(json_object)
flat = st.builds(
    lambda step_name, step, envelope, pairs: json_object([(step_name, step), *envelope.items(),
                                                          *pairs]),
    st.sampled_from(("step", "_step", "global_step", "trainer/global_step")), steps,
    st.fixed_dictionaries({}, optional=ENVELOPE), st.lists(st.tuples(names, values), max_size=6))
records = st.one_of(native, verl, flat)


def _truncated(text: str, at: float) -> str:
    return text[: int(len(text) * at)]


def encode(text: str) -> bytes:
    """UTF-8, a lone surrogate kept as its three bytes (which no UTF-8 decoder takes)."""
    return text.encode("utf-8", "surrogatepass")


# One line of a *.jsonl file (or a whole *.json file): almost-valid records above all, then any
# JSON, records cut short, and bytes. A line may hold a newline (bytes): it is then two lines.
lines = st.one_of(
    records.map(encode), records.map(encode), records.map(encode),
    json_text.map(encode),
    st.builds(_truncated, records, st.floats(0, 1)).map(encode),
    # Names written as they are (ensure_ascii=False): é as two bytes, a lone surrogate as three.
    names.map(lambda n: encode(json.dumps({"step": 1, "metrics": {n: 1}}, ensure_ascii=False))),
    st.binary(max_size=64),
)
