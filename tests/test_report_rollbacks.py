"""grpo-monitor report on a run that rolls back at every step: the undone steps are really undone
(the report equals that of the run without them), and the work and the output stay bounded by
the records, whatever the number of rollbacks: no rewind scans the history, curves.png draws a
bounded number of lines and bands a panel, and the text says ten spans and how many more.
Nothing here is timed: bench/bench_report_rollbacks.py measures the seconds and the MiB."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.report import build_report, load, render
from grpo_monitor.tools.simulate import generate

SIZES = (200, 2000)  # rollbacks: one every second step, on every rank
# The report's presentation caps (render.py): the spans its text says one by one, and the
# fraction of the x range below which the steps gone back to are one band.
SAID = 10
RESOLUTION = 200


def write(root: Path, steps: int, rollbacks: bool) -> Path:
    """A healthy run of two ranks that logs its even steps 2, 4, .., 2 * ``steps``. With
    ``rollbacks``, each is preceded by a sick odd step (NaN loss, collapsed reward, exploded KL,
    a 20x step time and a key of its own on every rank), which the even step's rollback mark
    undoes: no step logged again hides a rewind that failed."""
    writers = [SnapshotWriter(root, "run", rank=r, world_size=2, warn_unknown_keys=False)
               for r in range(2)]
    for st in generate("healthy", steps=steps, ranks=2, step_seconds=1.0):
        step = 2 * st.step
        for rec in st.records:
            w = writers[rec.rank]
            marks = []
            if rollbacks:
                sick = {**rec.metrics, "perf/step_time_s": 20 * rec.metrics["perf/step_time_s"],
                        "perf/tokens_per_s": 1.0}
                if rec.rank == 0:
                    sick.update({"loss": math.nan, "reward/mean": 0.0, "kl/mean": 50.0})
                w.log(sick, step - 1, by_type=rec.by_type, timestamp=rec.timestamp - 0.5)
                marks = [{"type": "rollback", "from_step": step - 1, "to_step": step - 2}]
            events = [dict(e, step=step) for e in rec.events or []] + marks
            w.log(rec.metrics, step, by_type=rec.by_type, events=events or None,
                  timestamp=rec.timestamp)
    for w in writers:
        w.close()
    return root / "run"


class _CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts the keys its iterations go over: the steps a load scans."""

    def __init__(self) -> None:
        super().__init__()
        self.scanned = 0

    def __iter__(self) -> Iterator[Any]:
        for key in super().__iter__():
            self.scanned += 1
            yield key


def curves(monkeypatch: pytest.MonkeyPatch, res: dict[str, Any]) -> Any:
    """curves.png's figure, left open."""
    figures: list[Any] = []
    monkeypatch.setattr(render, "_png", lambda fig, path: figures.append(fig) or b"")
    render.plot_curves(res["data"], res["verdicts"])
    (fig,) = figures
    return fig


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"{n}-rollbacks")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report of the rolled-back run and of the same run without its undone records."""
    steps = request.param
    root = tmp_path_factory.mktemp(f"rollbacks-{steps}")
    return {"steps": steps,
            "rolled": build_report(write(root / "rolled", steps, True), root / "out-rolled", plots=False),
            "clean": build_report(write(root / "clean", steps, False), root / "out-clean", plots=False)}


def test_the_undone_steps_are_undone(runs: dict[str, Any]) -> None:
    """Every sick step is undone, on both ranks: the verdicts, the summary, the CSV and the
    text past its header are those of the run that never logged them."""
    rolled, clean, steps = runs["rolled"], runs["clean"], runs["steps"]
    assert rolled["summary"]["undone"] == [{"steps": [s, s], "back_to": s - 1}
                                           for s in range(1, 2 * steps, 2)]
    assert rolled["summary"]["records"] == 2 * clean["summary"]["records"] - 2  # run_end once
    assert rolled["verdicts"] == clean["verdicts"]
    assert [v["id"] for v in clean["verdicts"]] == ["healthy"]
    drop = ("records", "undone")
    assert ({k: v for k, v in rolled["summary"].items() if k not in drop}
            == {k: v for k, v in clean["summary"].items() if k not in drop})
    assert render.csv_text(rolled["data"]) == render.csv_text(clean["data"])
    assert rolled["text"].split("\nverdicts:\n")[1] == clean["text"].split("\nverdicts:\n")[1]
    assert rolled["data"].perf[1] == clean["data"].perf[1]


def test_the_text_says_ten_spans_and_how_many_more(runs: dict[str, Any]) -> None:
    """report.txt and report.html say the first UNDONE_SAID spans, then how many more;
    summary.json keeps every one (above)."""
    rolled, steps = runs["rolled"], runs["steps"]
    said = [line for line in rolled["text"].splitlines() if "were undone (the run went back" in line]
    assert said == [f"steps {s}-{s} were undone (the run went back to step {s - 1}): their first "
                    "records are left out, the steps logged again judged"
                    for s in range(1, 2 * SAID, 2)]
    more = (f"and {steps - SAID:,} more spans were undone (summary.json lists "
            "every one)")
    assert more in rolled["text"].splitlines()
    page = render.html_report(rolled["summary"], rolled["verdicts"], b"")
    assert page.count("were undone (the run went back") == SAID
    assert f"<p>{more}</p>" in page


def test_the_rollbacks_are_one_band_a_panel(runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each panel of the rolled-back run holds the clean run's lines and collections and one
    more, whatever the number of rollbacks: the band over the steps the run went back to (0, 2,
    ..: closer than the plot can draw apart), one polygon from the first to the last."""
    rolled_fig = curves(monkeypatch, runs["rolled"])
    clean_fig = curves(monkeypatch, runs["clean"])
    assert len(rolled_fig.axes) == len(clean_fig.axes) >= 4
    for ax, clean_ax in zip(rolled_fig.axes, clean_fig.axes):
        assert len(ax.lines) + len(ax.collections) == len(clean_ax.lines) + len(clean_ax.collections) + 1
        (band,) = [c for c in ax.collections if c.get_label().startswith("_")]  # p25-p75 is named
        (polygon,) = band.get_paths()
        assert (polygon.vertices[:, 0].min(), polygon.vertices[:, 0].max()) == (0, 2 * runs["steps"] - 2)
    note = [t.get_text() for t in rolled_fig.axes[0].texts]
    assert note == [f"went back to 0, undoing 1-1; went back to 2, undoing 3-3; and "
                    f"{runs['steps'] - 2:,} more undone spans"]


def test_the_steps_gone_back_to_are_lines_and_bands_of_bounded_number() -> None:
    """A lone step is a dashed line, steps closer than 1/200 of the x range a band from the
    first to the last; 90,100 steps in 150 clusters and 100 strays are at most 201 lines and
    bands, each step on a line or in a band, and no band reaching past them."""
    lines, bands = render._went_back(np.array([3.0, 0.0, 1.0, 2.0, 50.0, 97.0, 98.0, 99.0, 99.0]),
                                     np.array([1.0, 200.0]))
    assert lines.tolist() == [50.0] and bands.tolist() == [[0.0, 3.0], [97.0, 99.0]]
    lines, bands = render._went_back(np.array([20.0]), np.array([1.0, 300.0]))
    assert lines.tolist() == [20.0] and bands.size == 0
    rng = np.random.default_rng(0)
    clusters = rng.integers(0, 10**6, 150)[:, None] + rng.integers(-100, 100, (150, 600))
    backs = np.concatenate([clusters.ravel(), rng.integers(0, 10**6, 100)]).astype(float)
    lines, bands = render._went_back(backs, np.array([1.0, 10.0**6]))
    assert len(lines) + len(bands) <= RESOLUTION + 1 < len(np.unique(backs))
    assert len(lines) > 0 and len(bands) > 10
    inside = np.isin(backs, lines)
    for lo, hi in bands:
        assert lo in backs and hi in backs
        inside |= (backs >= lo) & (backs <= hi)
    assert inside.all()


def test_no_rewind_scans_the_history(runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rewind cuts the end of the history: the load goes over no step of rank 0's history
    to find what a rollback undoes (before, each rewind went over all of it: steps^2 / 2)."""
    made: list[_CountingDict] = []
    run_data = load.RunData

    def counting(**kwargs: Any) -> load.RunData:
        made.append(_CountingDict())
        return run_data(**kwargs, train=made[-1])

    monkeypatch.setattr(load, "RunData", counting)
    data = load.load_run(runs["rolled"]["data"].path)
    assert len(data.undone) == runs["steps"] and len(data.train) == runs["steps"]
    scanned = made[0].scanned
    assert scanned <= data.records
