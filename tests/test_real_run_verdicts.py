"""Every labelled run of the shared collection, judged as bench/bench_real_runs.py judges it.

Each run is played through the exporter and the committed rules in the real promtool, one scrape
per logged step, and scored against its label (bench_real_runs.LABELS: healthy, or sick from an
onset, with the cards that name its sickness): a healthy run raises no red card, and a sick one
is caught within 50 steps of its onset by a red card or a card of its sickness. The runs the
cards still miss are listed by name, with why: the test fails when one of them is caught too, so
the list never hides progress, and when any other run is missed, so it never hides a
regression. The bench prints the same verdicts, and the leave-one-repository-out ones beside
them, as the table of docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from real_runs import run_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_real_runs as bench  # noqa: E402

# Sick runs the cards do not catch within 50 steps of their onset, and why.
KNOWN_MISSES = {
    # Entropy leaves its 0.15-0.25 band at step 678 for a 0.30-0.45 plateau, 1.6-1.9x its
    # lowest 20-step mean yet still below the 0.32 it started at: no card calls a climb back
    # toward the start a sickness (healthy runs spend 30-60% of their entropy and may recover
    # some); the explosion from step 790, above the start, is red at step 810.
    "treerl-qwen25-0.5b-gsm8k-verl-entropy-explosion",
}


def test_every_run_has_a_label() -> None:
    assert set(run_names()) == set(bench.LABELS)
    assert KNOWN_MISSES <= {n for n, label in bench.LABELS.items() if label.verdict == "sick"}


@pytest.mark.parametrize("name", sorted(bench.LABELS))
def test_real_run_verdict(name: str, tmp_path: Path) -> None:
    result, _ = bench.play(name, tmp_path, leave_out=False)
    assert result.repository != "?", "its PROVENANCE.md names no repository"
    if result.label.verdict == "healthy":
        assert result.false_reds == [], f"red card(s) on a healthy run: {result.spans}"
    elif name in KNOWN_MISSES:
        assert result.catch is None, f"caught now ({result.catch}): take it off KNOWN_MISSES"
    else:
        assert result.catch is not None, f"missed: {result.spans}"
        assert result.catch.delay <= bench.CAUGHT_WITHIN
