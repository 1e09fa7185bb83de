"""Generated documentation must match the code that generates it."""

from __future__ import annotations

from pathlib import Path

from grpo_monitor import metrics_doc
from grpo_monitor.exposition import RANK_FAMILIES, RUN_FAMILIES
from grpo_monitor.keys import SIGNALS

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_md_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == metrics_doc.render(), "docs/metrics.md is stale: run `make docs`"


def test_metrics_md_names_every_family_and_design_core_name() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for fam in (*RANK_FAMILIES, *RUN_FAMILIES):
        assert f"`{fam.name}`" in text
    # The core names DESIGN.md promises to dashboards, rules and users.
    core = ["grpo_step", "grpo_last_snapshot_timestamp_seconds", "grpo_reward_mean", "grpo_reward_std",
            "grpo_reward_min", "grpo_reward_max", "grpo_reward_quantile", "grpo_kl_mean",
            "grpo_kl_quantile", "grpo_kl_max", "grpo_entropy_mean", "grpo_response_length_mean_tokens",
            "grpo_response_truncated_ratio", "grpo_group_reward_gap", "grpo_group_zero_std_ratio",
            "grpo_advantage_abs_mean", "grpo_loss", "grpo_grad_norm", "grpo_learning_rate",
            "grpo_step_duration_seconds", "grpo_throughput_samples_per_second",
            "grpo_nonfinite_values_total", "grpo_snapshots_ingested_total", "grpo_snapshot_errors_total"]
    for name in core:
        assert f"`{name}`" in text, name
    # Signal names are public: new keys extend the set, none of the published ones goes away.
    published = set(core) - {"grpo_step", "grpo_last_snapshot_timestamp_seconds",
                             "grpo_nonfinite_values_total", "grpo_snapshots_ingested_total",
                             "grpo_snapshot_errors_total"} | {
        "grpo_group_reward_std", "grpo_response_length_max_tokens", "grpo_policy_clip_ratio",
        "grpo_sample_accuracy_ratio", "grpo_throughput_tokens_per_second",
        "grpo_communication_duration_seconds", "grpo_memory_allocated_bytes"}
    assert published <= {s.metric for s in SIGNALS}
