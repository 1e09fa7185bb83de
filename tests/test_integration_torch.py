"""examples/plain_pytorch.py under torch.distributed (gloo), read by a real exporter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Running, value
from gloo_job import EXAMPLE, ROOT, clean_env, records, wait_all

from grpo_monitor.tools.stack import free_port

STEPS = 10

# One rank: join the group with an explicit rank (no RANK / WORLD_SIZE in the environment), then
# run the example's main(), so the writer can only have its rank from torch.distributed.
_RANK_SCRIPT = """
import sys
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import plain_pytorch
dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=int(sys.argv[3]))
plain_pytorch.main(sys.argv[4:])
dist.barrier()  # leave together (examples/plain_pytorch.py says why)
dist.destroy_process_group()
plain_pytorch.leave(True)  # without finalizing: Gloo's workers may still hold tensors
"""


def test_two_gloo_ranks_feed_the_exporter(exporter: Running, snapshot_dir: Path) -> None:
    run = "torch-gloo"
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    args = ["--snapshot-dir", str(snapshot_dir), "--run", run, "--steps", str(STEPS)]
    procs = [subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(EXAMPLE.parent), str(rank),
                               "2", *args], env=env, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in (0, 1)]
    wait_all(procs)

    # Each rank's last record marks the clean end of the run (no hung-run card).
    *rank0, end0 = records(snapshot_dir / run / "rank-0.jsonl")
    *rank1, end1 = records(snapshot_dir / run / "rank-1.jsonl")
    for end in (end0, end1):
        assert (end["step"], end["metrics"]) == (STEPS, {})
        assert [e["type"] for e in end["events"]] == ["run_end"]  # type: ignore[union-attr]
    assert [r["step"] for r in rank0] == [r["step"] for r in rank1] == list(range(1, STEPS + 1))
    assert {(r["rank"], r["world_size"], r["run"]) for r in rank0} == {(0, 2, run)}
    assert {(r["rank"], r["world_size"], r["run"]) for r in rank1} == {(1, 2, run)}
    training = {"reward/mean", "reward/std", "reward/min", "reward/max", "group/zero_std_frac",
                "adv/mean_abs", "kl/mean", "kl/p95", "kl/max", "entropy/mean",
                "response/len_mean", "response/clip_ratio", "loss", "grad/norm", "train/lr"}
    perf = {"perf/step_time_s", "perf/samples_per_s", "perf/comm_time_s"}
    for rec in rank0:
        assert training | perf <= rec["metrics"].keys()  # type: ignore[union-attr]
    for rec in rank1:
        assert rec["metrics"].keys() == perf  # type: ignore[union-attr]
    last = rank0[-1]["metrics"]
    assert isinstance(last, dict)
    # Whole-batch extremes: the MAX all-reduce combined both shards.
    assert 0.0 <= last["reward/min"] <= last["reward/mean"] <= last["reward/max"] <= 1.0
    assert last["kl/max"] >= last["kl/p95"] > 0 and last["entropy/mean"] > 0

    exporter.wait_value("grpo_step", STEPS, run=run, rank="1")
    exporter.wait_value("grpo_step", STEPS, run=run, rank="0")
    s = exporter.scrape()
    assert value(s, "grpo_world_size", run=run, rank="0") == 2
    assert value(s, "grpo_world_size", run=run, rank="1") == 2
    assert value(s, "grpo_reward_mean", run=run, rank="0") == last["reward/mean"]
    assert value(s, "grpo_kl_mean", run=run, rank="0") == last["kl/mean"]
    assert value(s, "grpo_grad_norm", run=run, rank="0") == last["grad/norm"]
    assert value(s, "grpo_reward_mean", run=run, rank="1") is None
    for rank, recs in (("0", rank0), ("1", rank1)):
        m = recs[-1]["metrics"]
        assert isinstance(m, dict)
        assert value(s, "grpo_step_duration_seconds", run=run, rank=rank) == m["perf/step_time_s"]
        assert value(s, "grpo_throughput_samples_per_second", run=run, rank=rank) == \
            m["perf/samples_per_s"]
        assert value(s, "grpo_communication_duration_seconds", run=run, rank=rank) == \
            m["perf/comm_time_s"]
    assert (value(s, "grpo_snapshot_errors_total", reason="invalid_record") or 0) == 0
    assert value(s, "grpo_run_ended", run=run) == 1


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_documented_command_lines(tmp_path: Path, launcher: str) -> None:
    # The two ways examples/README.md runs the example; torchrun sets RANK / WORLD_SIZE.
    cmd = [sys.executable, str(EXAMPLE)]
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(EXAMPLE)]
    proc = subprocess.run([*cmd, "--snapshot-dir", str(tmp_path), "--steps", "3"], cwd=ROOT,
                          env=clean_env(), text=True, capture_output=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    world = 2 if launcher == "torchrun" else 1
    files = sorted(p.name for p in (tmp_path / "plain-pytorch").iterdir())
    assert files == [f"rank-{r}.jsonl" for r in range(world)]
    for r in range(world):
        *recs, end = records(tmp_path / "plain-pytorch" / f"rank-{r}.jsonl")
        assert [(x["step"], x["rank"], x["world_size"]) for x in recs] == \
            [(step, r, world) for step in (1, 2, 3)]
        assert end["step"] == 3 and [e["type"] for e in end["events"]] == ["run_end"]
