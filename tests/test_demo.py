"""The synthetic runs behind `make demo`, through the real SDK and exporter (the demo command
itself: tests/test_stack.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import Running, value
from grpo_monitor.tools.simulate import generate, write_run


def test_synthetic_run_reaches_metrics(exporter: Running, snapshot_dir: Path) -> None:
    write_run(snapshot_dir, "demo", "healthy", steps=600, ranks=2, step_seconds=2.0)
    exporter.wait_value("grpo_step", 600, run="demo", rank="1")
    exporter.wait_value("grpo_step", 600, run="demo", rank="0")
    s = exporter.scrape()
    lbl = {"run": "demo", "rank": "0"}
    assert 0.35 < value(s, "grpo_reward_mean", **lbl) < 0.6  # type: ignore[operator]
    assert value(s, "grpo_reward_mean", prompt_type="hard", **lbl) < value(s, "grpo_reward_mean", **lbl)  # type: ignore[operator]
    assert value(s, "grpo_events_total", type="checkpoint_save", **lbl) == 1
    # Other ranks report their performance only.
    assert value(s, "grpo_step_duration_seconds", run="demo", rank="1") is not None
    assert value(s, "grpo_reward_mean", run="demo", rank="1") is None
    assert value(s, "grpo_world_size", **lbl) == 2


def test_healthy_run_has_the_seed_shape() -> None:
    steps = [st.records[0] for st in generate("healthy", steps=3000, ranks=1)]
    first, last = steps[0].metrics, steps[-1].metrics
    # background.md#distribution-stability and #healthy-ranges: reward rises, KL climbs then flattens, entropy falls
    # 30-60% and settles, length within ±15%.
    assert last["reward/mean"] > first["reward/mean"] + 0.3
    kl = [s.metrics["kl/mean"] for s in steps]
    assert kl[999] - kl[899] > 3 * (kl[2999] - kl[2899])
    drop = 1 - last["entropy/mean"] / first["entropy/mean"]
    assert 0.3 <= drop <= 0.6
    lengths = [s.metrics["response/len_mean"] for s in steps]
    assert max(lengths) / min(lengths) < 1.3
