"""Fuzzing `grpo-monitor report` with generated run folders.

Folders of one to three ranks whose signals follow generated patterns (constants at float's
edges, NaN everywhere, any floats, ramps), logged every step or far apart, with garbage lines,
empty files and whole-file records among them. Property: the report writes its outputs (strict
JSON: no NaN token), or, from the command line, exits 2 with one line on stderr; never a
traceback. Then the findings, one plain test each.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fuzz_strategies import fuzz, lines
from hypothesis import given
from hypothesis import strategies as st

from grpo_monitor import cli
from grpo_monitor.tools import report

# The report's core signals (its CSV columns) and keys that only its verdicts read.
KEYS = (*(key for _, key in report.CSV_COLUMNS), "kl/max", "reward/p95", "group/reward_gap",
        "mismatch/kl", "mismatch/is_weight_mean", "staleness/mean", "group/all_wrong_frac",
        "entropy/logp_adv_cov", "response/len_correct_mean", "response/len_incorrect_mean")
PERF_KEYS = ("perf/step_time_s", "perf/samples_per_s")
EDGES = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, 1.0, -1.0)

Pattern = Callable[[int], float]


def _cycle(values: list[float]) -> Pattern:
    return lambda i: values[i % len(values)]


def _ramp(a: float, b: float) -> Pattern:
    return lambda i: a + (b - a) * min(i, 300) / 300


patterns = st.one_of(
    st.sampled_from(EDGES).map(lambda v: (lambda i: v)),
    st.lists(st.floats(), min_size=1, max_size=5).map(_cycle),
    st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)).map(lambda ab: _ramp(*ab)),
)


@st.composite
def run_folders(draw: st.DrawFn) -> dict[str, bytes]:
    """File name -> content of one run folder."""
    steps = draw(st.integers(0, 320))
    first = draw(st.sampled_from((0, 1, 10**12)))
    stride = draw(st.sampled_from((1, 3, 10**9)))
    signals = draw(st.dictionaries(st.sampled_from(KEYS), patterns, max_size=8))
    perf = draw(st.dictionaries(st.sampled_from(PERF_KEYS), patterns, max_size=2))
    ranks = draw(st.integers(1, 3))
    typed = draw(st.dictionaries(st.sampled_from(("easy", "hard", "other")), patterns, max_size=3))
    saves = draw(st.sets(st.integers(0, 320), max_size=5))
    files: dict[str, list[bytes]] = {}
    for rank in range(ranks):
        out = files.setdefault(f"rank-{rank}.jsonl", [])
        for i in range(steps):
            metrics = {k: p(i) for k, p in perf.items()}
            rec: dict[str, Any] = {"step": first + i * stride, "metrics": metrics}
            if rank == 0:
                metrics.update({k: p(i) for k, p in signals.items()})
                if typed:
                    rec["by_type"] = {t: {"reward/mean": p(i)} for t, p in typed.items()}
                if i in saves:
                    rec["events"] = [{"type": "checkpoint_save", "duration_s": 30}]
            out.append(json.dumps(rec).encode())  # NaN, Infinity: Python's own tokens
    # Garbage where it may land: amid the records, in a rotated segment, a *.json, empty files.
    for name in draw(st.lists(st.sampled_from(("rank-0.jsonl", "rank-0.000001.jsonl",
                                               "rank-1.jsonl", "metrics.json", "empty.jsonl",
                                               "sub/rank-2.jsonl")), max_size=4)):
        out = files.setdefault(name, [])
        out.insert(draw(st.integers(0, len(out))), draw(lines))
    if draw(st.booleans()):
        files["empty.jsonl"] = []
    return {name: b"\n".join(ls) + (b"\n" if ls else b"") for name, ls in files.items()}


_serial = itertools.count()


def write_folder(root: Path, files: dict[str, bytes]) -> Path:
    run_dir = root / f"run-{next(_serial)}"
    run_dir.mkdir()
    for name, data in files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    return run_dir


def strict_json(path: str) -> Any:
    """The file's JSON; NaN or Infinity in it fail (other JSON readers refuse them)."""
    def refuse(token: str) -> None:
        raise AssertionError(f"{path}: {token} is not JSON")
    return json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=refuse)


@fuzz(250)
@given(files=run_folders())
def test_the_report_of_any_run_folder_writes_its_outputs(tmp_path: Path,
                                                           files: dict[str, bytes]) -> None:
    run_dir = write_folder(tmp_path, files)
    res = report.build_report(run_dir, run_dir / ".report", plots=False)
    verdicts = strict_json(res["outputs"]["verdicts"])
    summary = strict_json(res["outputs"]["summary"])
    assert verdicts == res["verdicts"] and summary["records"] == res["data"].records
    assert all(v["severity"] in report.SEVERITY_ORDER for v in verdicts)
    assert (verdicts == []) == (not res["data"].train)  # healthy, or what is wrong
    assert Path(res["outputs"]["csv"]).read_text(encoding="utf-8").startswith("step,")
    assert Path(res["outputs"]["text"]).read_text(encoding="utf-8").startswith(f"run {run_dir.name}")


@fuzz(10)
@given(files=run_folders())
def test_the_command_writes_every_output_or_exits_2(tmp_path: Path, files: dict[str, bytes],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # In-process, plots included (curves.png, report.html): matplotlib with any values.
    run_dir = write_folder(tmp_path, files)
    code = cli.main(["report", str(run_dir), "--format", "json"])
    out, err = capsys.readouterr()
    if code == 2:
        assert err == f"grpo-monitor report: no records in {run_dir}\n"
        return
    assert code == 0, err
    outputs = json.loads(out)["outputs"]
    assert {"summary", "verdicts", "csv", "text", "png", "html"} <= outputs.keys()
    assert Path(outputs["png"]).read_bytes().startswith(b"\x89PNG")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "report", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_command_exits_2_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    garbage = write_folder(tmp_path, {"rank-0.jsonl": b"\x00\xff\nnot json\n[1, 2]\n{\"step\": -1}\n",
                                      "x.json": b"", "empty.jsonl": b""})
    blocked = write_folder(tmp_path, {"rank-0.jsonl": b'{"step": 1, "metrics": {"loss": 1}}\n'})
    (tmp_path / "a-file").write_text("")  # --out under a file: the outputs cannot be written
    for args, says in [((str(empty),), f"no records in {empty}"),
                       ((str(tmp_path / "nothing"),), "is not a folder"),
                       ((str(garbage),), f"no records in {garbage}"),
                       ((str(blocked), "--out", str(tmp_path / "a-file" / "out")), "cannot write")]:
        res = _cli(*args)
        assert res.returncode == 2, res
        assert res.stderr.count("\n") == 1 and says in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


# -- findings, one example each ---------------------------------------------------------------


def test_a_run_folder_whose_name_is_not_utf8(tmp_path: Path) -> None:
    # report.txt is UTF-8: the name's lone surrogate (os.fsdecode of b"\xff") raised there.
    import os

    run_dir = Path(os.fsdecode(os.fsencode(tmp_path) + b"/run-\xff"))
    run_dir.mkdir()
    (run_dir / "rank-0.jsonl").write_text('{"step": 1, "metrics": {"loss": 0.5}}\n')
    res = report.build_report(run_dir, tmp_path / "out", plots=False)
    assert res["summary"]["run"] == "run-\\udcff"
    assert (tmp_path / "out" / "report.txt").read_text().startswith("run run-\\udcff:")


def test_lines_nested_beyond_the_recursion_limit_are_bad_lines(tmp_path: Path) -> None:
    run_dir = write_folder(tmp_path, {"rank-0.jsonl": b"[" * 100_000 + b"]" * 100_000 + b"\n"
                                      + b'{"step": 1, "metrics": {"loss": 0.5}}\n'})
    res = report.build_report(run_dir, tmp_path / "out", plots=False)
    assert (res["summary"]["records"], res["summary"]["bad_lines"]) == (1, 1)


def test_a_run_shorter_than_one_window(tmp_path: Path) -> None:
    # Any run of fewer than 10 logged steps (min_window_steps) raised IndexError.
    run_dir = write_folder(tmp_path, {"rank-0.jsonl": b"".join(
        b'{"step": %d, "metrics": {"reward/mean": 0.%d, "kl/mean": 0.01}}\n' % (i, i)
        for i in range(1, 6))})
    res = report.build_report(run_dir, tmp_path / "out", plots=False)
    assert [v["id"] for v in res["verdicts"]] == ["healthy"]
    assert res["verdicts"][0]["steps"] == [1, 5]


def test_a_kl_whose_p95_is_zero(tmp_path: Path) -> None:
    # KL's p95 at 0 (most tokens at the reference policy) made kl/max / kl/p95 raise
    # ZeroDivisionError. As in PromQL, the tail ratio over a positive max is infinite: the card
    # still fires once p95's 50-step mean is 0 (from step 250), to the last step.
    run_dir = write_folder(tmp_path, {"rank-0.jsonl": b"".join(
        b'{"step": %d, "metrics": {"reward/mean": 0.5, "kl/p95": %s, "kl/max": %s}}\n'
        % ((i, b"0.05", b"0.1") if i < 200 else (i, b"0.0", b"0.5")) for i in range(300))})
    res = report.build_report(run_dir, tmp_path / "out", plots=False)
    tail = next(v for v in res["verdicts"] if v["id"] == "kl_tail_outliers")
    assert tail["steps"] == [204, 299]
    assert tail["evidence"]["kl/max:baseline"] / tail["evidence"]["kl/p95:baseline"] == pytest.approx(2.0)


def test_a_value_near_the_largest_float_is_left_out_of_the_plot(tmp_path: Path) -> None:
    # One step whose reward is 1e308: matplotlib's tick locator overflowed on the axis around
    # it (ValueError). The plot leaves the value out, as it does NaN; the CSV keeps it.
    run_dir = write_folder(tmp_path, {"rank-0.jsonl": b'{"step": 0, "metrics": {"reward/mean": 1e+308}}\n'})
    res = report.build_report(run_dir, tmp_path / "out")
    assert Path(res["outputs"]["png"]).read_bytes().startswith(b"\x89PNG")
    assert "1e+308" in (tmp_path / "out" / "reward-vs-step.csv").read_text()
