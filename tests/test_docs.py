"""The documentation: generated pages match the code that generates them, and every link
between the docs reaches a file and a section that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import DOCS

from grpo_monitor.contract.keys import SIGNALS
from grpo_monitor.runtime.exposition import RANK_FAMILIES, RUN_FAMILIES
from grpo_monitor.runtime.runbook import anchors
from grpo_monitor.tools import frameworks_doc, metrics_doc

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_md_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == metrics_doc.render(), "docs/metrics.md is stale: run `make docs`"


def test_frameworks_md_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "frameworks.md").read_text()
    assert committed == frameworks_doc.render(), "docs/frameworks.md is stale: run `make docs`"


def test_metrics_md_names_every_family_and_design_core_name() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for fam in (*RANK_FAMILIES, *RUN_FAMILIES):
        assert f"`{fam.name}`" in text
    # The core names that dashboards, rules and users' own queries depend on.
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


def local_links(path: Path) -> list[tuple[str, Path, str]]:
    """(link as written, file it reaches, section) of every Markdown link outside code."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, section = target.partition("#")
        out.append((target, (path.parent / file) if file else path, section))
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_reach_a_file_and_a_section(path: Path) -> None:
    """Sections by GitHub's anchors (the exporter's runbook page uses the same)."""
    broken = []
    for target, file, section in local_links(path):
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif section and file.suffix == ".md" and section not in anchors(file.read_text()):
            broken.append(f"{target}: no such section in {file.name}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_docs_link_each_other() -> None:
    links = [link for path in DOCS for link in local_links(path)]
    assert len(links) > 100
    assert any(section for _, file, section in links if file.name == "background.md")



def test_every_cited_background_section_exists() -> None:
    """Code, rules, dashboards and docs cite the domain rules as background.md#<section>."""
    sections = set(anchors((ROOT / "docs" / "background.md").read_text()))
    cited: dict[str, set[str]] = {}
    for folder in ("docs", "exporter", "tests", "prometheus", "grafana", "bench", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".md", ".py", ".yml", ".json") and "__pycache__" not in path.parts:
                for section in re.findall(r"background\.md#([a-z0-9_-]+)", path.read_text()):
                    cited.setdefault(section, set()).add(str(path.relative_to(ROOT)))
    assert len(cited) > 20
    missing = {s: sorted(where) for s, where in cited.items() if s not in sections}
    assert not missing, f"background.md has no such section: {missing}"
