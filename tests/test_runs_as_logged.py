"""Runs as their authors log them: names read by their words or a user's key map, the held-out
score judged on its own points, and sickness caught in a run's first records.

The synthetic runs here are shaped like the misses of runs nobody here made (a 14-step entropy
cliff with every answer at the length cap, a run without a KL penalty whose KL climbs from its
first steps, reward-model over-optimisation against a sparse held-out score, a 16-step run whose
last records are truncated and at its lowest reward, a reward pinned at its maximum): written as
files, read by the exporter's ingest and store, judged by the committed rules in the real promtool.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpo_monitor.contract import vocabulary
from grpo_monitor.contract.key_map import KEY_MAP_FILE, KeyMap, KeyMapError
from grpo_monitor.contract.keys import SIGNALS, is_known_unmapped, match_key, proposals
from grpo_monitor.contract.snapshot import parse_record
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.sdk.writer import SnapshotWriter, UnknownKeyWarning
from grpo_monitor.tools.check import check
from conftest import Running, value
from promtool_harness import Played, Recorder, fired


def play_records(records: list[dict[str, Any]], tmp: Path, run: str = "r",
                 key_map: str | None = None) -> Played:
    """Each record appended to ``run/metrics.jsonl`` as a trainer would, one scrape after each."""
    root = tmp / "snap"
    folder = root / run
    folder.mkdir(parents=True)
    if key_map is not None:
        (folder / KEY_MAP_FILE).write_text(key_map)
    path = folder / "metrics.jsonl"
    recorder = Recorder(root)
    for rec in records:
        with open(path, "a") as fh:
            fh.write(json.dumps({**rec, "time": 1_700_000_000 + 30 * rec["step"]}) + "\n")
        recorder.scrape(rec["step"], [path])
    return recorder.played()


def first_step(spans: dict[str, list[tuple[int, int]]], card: str) -> int | None:
    return spans[card][0][0] if card in spans else None


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "key"), [
    ("train/mean_completion_len", "response/len_mean"), ("train_reward", "reward/mean"),
    ("policy_entropy", "entropy/mean"), ("truncated_fraction", "response/clip_ratio"),
    ("frac_zero_adv", "group/zero_std_frac"), ("train/truncation_rate", "response/clip_ratio"),
    ("mean_response_length", "response/len_mean"), ("entropy_avg", "entropy/mean"),
    ("actor/main_chain/entropy", "entropy/mean"), ("val-core/openai/gsm8k/acc/mean@1",
                                                   "eval/heldout_score"),
    ("val/test_score/openai/gsm8k", "eval/heldout_score"), ("eval_reward", "eval/heldout_score"),
    ("eval/accuracy", "eval/heldout_score")])
def test_names_as_authors_spell_them_map_to_their_signal(name: str, key: str) -> None:
    hit = match_key(name)
    assert hit is not None and hit.key == key
    assert hit.rank > 1000  # after every listed name: a record's listed name wins


@pytest.mark.parametrize("name", [
    # other statistics, other signals, framework counters: never matched automatically
    "reward/std/mean", "completions/min_length", "eval_loss", "val-core/x/reward/std@4",
    "actor/ppo_kl", "critic/rewards/mean", "clip_ratio/high_max", "num_tokens", "my_thing",
    "zero_std_frac_of_tokens", "reward"])
def test_the_matcher_applies_only_what_it_can_prove(name: str) -> None:
    hit = match_key(name)
    assert hit is None or hit.how == "listed"


def test_the_matcher_is_unambiguous_over_every_known_name() -> None:
    # The rule: a form maps only where every name of that form belongs to one key. No listed
    # name's form may point at another key than its own.
    forms = vocabulary.index({s.key: (s.key, *s.aliases) for s in SIGNALS})
    for sig in SIGNALS:
        for name in (sig.key, *sig.aliases):
            auto = vocabulary.auto_match(name, forms)
            assert auto in (None, sig.key), (name, auto)


def test_proposals_name_candidates_without_applying_them() -> None:
    assert match_key("kl_div_ref") is None
    assert proposals("kl_div_ref")[0] == "kl/mean"
    assert proposals("mean_gen_chars") == ["response/len_mean"]
    assert proposals("num_tokens") == [] and is_known_unmapped("num_tokens")


def test_a_key_map_maps_scales_and_silences(tmp_path: Path) -> None:
    km = KeyMap.parse('"gen_chars" = { key = "response/len_mean", scale = 0.25 }\n'
                      '"reward" = "eval/heldout_score"\n"debug/x" = false\n')
    snap = parse_record({"step": 1, "gen_chars": 400, "reward": 0.5, "debug/x": 3,
                         "reward/mean": 0.1}, run="r", rank=0, mtime=0, key_map=km)
    assert snap.metrics == {"response/len_mean": 100.0, "eval/heldout_score": 0.5, "reward/mean": 0.1}
    assert snap.unknown == {"debug/x": 3.0}
    for bad in ('"a" = "reward/meen"', '"a" = { key = "loss", scale = 0 }', '"a" = { kee = "loss" }',
                "not toml ="):
        with pytest.raises(KeyMapError):
            KeyMap.parse(bad)
    with pytest.raises(KeyMapError, match="did you mean 'reward/mean'"):
        KeyMap.parse('"a" = "reward/meen"')


def test_check_prints_the_lines_to_paste_and_the_exporter_reads_them(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    rows = [{"step": s, "kl_div_ref": 0.01, "score_train": 0.5, "num_tokens": 10} for s in (1, 2, 3)]
    (run / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    check(run, out)
    assert '"kl_div_ref" = "kl/mean"' in out.getvalue()
    out = out.getvalue()
    assert "num_tokens" not in out.split("minimum curves")[0].split("map to no signal")[-1]
    line = next(ln.strip() for ln in out.splitlines() if ln.strip().startswith('"kl_div_ref"'))
    (run / KEY_MAP_FILE).write_text(line.split("   #")[0] + "\n")
    again = io.StringIO()
    check(run, again)
    assert "kl_div_ref -> kl/mean" in again.getvalue()


def test_a_bad_key_map_is_counted_and_the_run_still_read(tmp_path: Path) -> None:
    played = play_records([{"step": s, "reward": 0.5} for s in (1, 2, 3)], tmp_path,
                          key_map='"reward" = "nope"')
    assert any(k.startswith("grpo_window_") and 'key="reward/mean"' in k for k in played.series)


def test_the_writer_maps_names_and_stays_quiet_about_a_frameworks_own(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = SnapshotWriter(tmp_path, "r", rank=0, world_size=1,
                           key_map={"gen_chars": {"key": "response/len_mean", "scale": 0.5}})
        w.log({"gen_chars": 10, "completions/min_length": 3, "num_tokens": 9, "epoch": 0.1,
               "rewards/f/mean": 1, "my_odd_metric": 2}, step=1)
        w.close()
    unknown = [str(c.message) for c in caught if issubclass(c.category, UnknownKeyWarning)]
    assert len(unknown) == 1 and "my_odd_metric" in unknown[0]
    rec = json.loads((tmp_path / "r" / "rank-0.jsonl").read_text().splitlines()[0])
    assert rec["metrics"]["response/len_mean"] == 5.0 and "gen_chars" not in rec["metrics"]


# -- the held-out score ------------------------------------------------------------------------


def over_optimised(steps: int = 200) -> list[dict[str, Any]]:
    """The proxy reward climbs steadily; the gold accuracy, every 10 steps, peaks at step 100 and
    falls by about a fifth."""
    out = []
    for s in range(1, steps + 1):
        rec: dict[str, Any] = {"step": s, "reward": 0.2 + 0.6 * s / steps + 0.02 * math.sin(s)}
        if s % 10 == 0:
            peak = 0.6 - 0.0004 * (s - 100) ** 2 / 10 if s <= 100 else 0.6 - 0.0012 * (s - 100)
            rec["eval/accuracy"] = round(peak + 0.005 * math.cos(s), 4)
        out.append(rec)
    return out


def test_over_optimisation_is_caught_on_the_sparse_held_out_points(tmp_path: Path) -> None:
    spans = fired(play_records(over_optimised(), tmp_path), tmp_path)
    first = first_step(spans, "GRPORewardOverOptimization")
    # gold 0.6 at step 100, under 0.54 (a tenth off) from step 150: caught at its 2nd such point
    assert first is not None and 150 <= first <= 170, spans
    assert not {a for a in spans if a in {"GRPOHeldOutCollapse"}}


def test_a_held_out_score_that_only_wanders_raises_nothing(tmp_path: Path) -> None:
    recs = over_optimised()
    for r in recs:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = round(0.6 + 0.02 * math.sin(r["step"]), 4)
    spans = fired(play_records(recs, tmp_path), tmp_path)
    assert "GRPORewardOverOptimization" not in spans and "GRPOHeldOutCollapse" not in spans


def test_a_held_out_collapse_is_red_and_stays_red(tmp_path: Path) -> None:
    recs = over_optimised(120)
    for r in recs:
        if "eval/accuracy" in r and r["step"] >= 80:
            r["eval/accuracy"] = 0.05
    spans = fired(play_records(recs, tmp_path), tmp_path)
    assert spans.get("GRPOHeldOutCollapse") == [(90, 120)], spans


# -- sickness in the first records -------------------------------------------------------------


def test_a_14_step_entropy_cliff_at_the_length_cap_is_caught(tmp_path: Path) -> None:
    entropy = [1.0, 0.45, 0.2, 0.09, 0.06, 0.05, 0.045, 0.04, 0.04, 0.035, 0.03, 0.03, 0.03, 0.03]
    recs = [{"step": s, "entropy": e, "reward": 0.3, "completions/mean_length": 1024,
             "completions/clipped_ratio": 0.97, "kl": 0.001 * s}
            for s, e in enumerate(entropy, 1)]
    spans = fired(play_records(recs, tmp_path), tmp_path)
    assert first_step(spans, "GRPOEntropyCollapse") is not None, spans
    assert first_step(spans, "GRPOCompletionsTruncated") == 3, spans
    assert spans["GRPOEntropyCollapse"][-1][1] == 14  # still red at the end


def test_kl_climbing_from_the_first_steps_without_a_penalty_is_red(tmp_path: Path) -> None:
    # KL exactly 0 at step 1, ~0.002 after, then multiplying from step 5: the lowest 20-step
    # mean (0.125) would hide the climb; the first records' median does not.
    recs = [{"step": s, "kl": 0.0 if s == 1 else 0.002 * (1.09 ** max(0, s - 5)),
             "reward": min(1.0, 0.3 + 0.01 * s), "reward_std": 0.2} for s in range(1, 101)]
    spans = fired(play_records(recs, tmp_path), tmp_path)
    onset = next(r["step"] for r in recs if r["kl"] > 0.5)
    first = first_step(spans, "GRPOKLExplosion")
    assert first is not None and first <= onset + 50, spans
    assert spans["GRPOKLExplosion"][-1][1] == 100


def test_a_reward_pinned_at_its_top_with_no_spread_is_a_dead_signal(tmp_path: Path) -> None:
    recs = [{"step": s, "reward": min(1.0, 0.4 + 0.03 * s),
             "reward_std": 0.3 if s < 20 else (0.0 if s % 3 else 0.05)} for s in range(1, 101)]
    spans = fired(play_records(recs, tmp_path), tmp_path)
    first = first_step(spans, "GRPOAdvantageVanishing")
    assert first is not None and first <= 45, spans


def test_a_16_step_run_truncated_at_its_lowest_reward_is_judged_before_it_ends(tmp_path: Path) -> None:
    recs = []
    for s in range(1, 17):
        sick = s >= 15
        recs.append({"step": s, "reward": 0.05 if sick else 0.5 + 0.01 * (s % 3),
                     "completions/clipped_ratio": 0.86 if sick else 0.08 + 0.01 * (s % 2),
                     "completions/mean_length": 1900 if sick else 600 + 5 * (s % 4),
                     "entropy": 0.5, "kl": 0.01})
    spans = fired(play_records(recs, tmp_path), tmp_path)
    assert first_step(spans, "GRPOTrainingBlowUp") == 16, spans


def test_a_reward_collapse_is_judged_from_min_and_max_without_a_spread(tmp_path: Path) -> None:
    recs = []
    for s in range(1, 161):
        level = 0.1 + 0.8 * min(1.0, s / 60) if s < 100 else 0.1
        recs.append({"step": s, "critic/score/mean": level, "critic/score/min": 0.0,
                     "critic/score/max": 1.0})
    spans = fired(play_records(recs, tmp_path), tmp_path)
    first = first_step(spans, "GRPORewardCollapse")
    assert first is not None and first <= 150, spans


# -- the exporter, over HTTP -----------------------------------------------------------------


def test_the_exporter_reads_the_flags_key_map_and_a_run_folders_over_it(
        start_exporter: Callable[..., Running], snapshot_dir: Path, tmp_path: Path) -> None:
    flag_map = tmp_path / "keys.toml"
    flag_map.write_text('"kl_div_ref" = "kl/mean"\n"gold" = "eval/heldout_score"\n')
    mine = snapshot_dir / "mine"
    mine.mkdir()
    # The run's own file wins over the flag's for the same name.
    (mine / KEY_MAP_FILE).write_text('"gold" = false\n')
    running = start_exporter(key_map_file=flag_map)
    for run in ("mine", "theirs"):
        (snapshot_dir / run).mkdir(exist_ok=True)
        with open(snapshot_dir / run / "m.jsonl", "a") as fh:
            fh.write(json.dumps({"step": 1, "kl_div_ref": 0.02, "gold": 0.7}) + "\n")
    running.wait_value("grpo_kl_mean", 0.02, run="theirs", rank="0")
    running.wait_value("grpo_heldout_score", 0.7, run="theirs", rank="0")
    running.wait_value("grpo_kl_mean", 0.02, run="mine", rank="0")
    samples = running.scrape()
    assert value(samples, "grpo_heldout_score", run="mine", rank="0") is None
    assert value(samples, "grpo_metric_value", run="mine", rank="0", key="gold") == 0.7


def test_a_key_map_flag_that_is_no_key_map_is_one_line(tmp_path: Path, snapshot_dir: Path) -> None:
    bad = tmp_path / "keys.toml"
    bad.write_text('"x" = "reward/meen"\n')
    with pytest.raises(ValueError, match=r"--snapshot.key-map: .*did you mean 'reward/mean'"):
        Exporter(ExporterConfig(snapshot_dir=snapshot_dir, listen_address="127.0.0.1:0",
                                key_map_file=bad))


def test_a_key_map_nested_thousands_deep_is_one_bad_key_map(tmp_path: Path, snapshot_dir: Path) -> None:
    """A few KB of inline tables nested 3,000 deep: counted once as a bad key map in a run
    folder (the run still read, with the flag's names), one line for the flag, for check."""
    deep = ('"reward" = ' + "{ x = " * 3000 + "1" + " }" * 3000 + "\n").encode()
    with pytest.raises(KeyMapError, match="nested deeper"):
        KeyMap.parse(deep, "deep.toml")
    played = play_records([{"step": s, "reward": 0.5} for s in (1, 2, 3)], tmp_path,
                          key_map=deep.decode())
    assert any(k.startswith("grpo_window_") and 'key="reward/mean"' in k for k in played.series)
    flag = tmp_path / "deep.toml"
    flag.write_bytes(deep)
    with pytest.raises(ValueError, match=r"--snapshot.key-map: .*nested deeper"):
        Exporter(ExporterConfig(snapshot_dir=snapshot_dir, listen_address="127.0.0.1:0",
                                key_map_file=flag))
