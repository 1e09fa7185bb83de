"""Real torch.distributed jobs for the tests: a script (examples/plain_pytorch.py by default)
as one gloo process per rank, launched as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT in the environment).

A job's ranks may write to different snapshot folders ("nodes"), in blocks: rank r goes to
``snapshot_dirs[r * len(snapshot_dirs) // world_size]``, so ranks 0-1 of four land in the first
of two folders and ranks 2-3 in the second, as one exporter per node would see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polling import wait_for
from processes import log_tail

from grpo_monitor.tools.stack import Child, free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plain_pytorch.py"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "CUDA_VISIBLE_DEVICES"}}
    # Ranks share two cores: one thread each keeps them from starving each other.
    return env | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"} | extra


def records(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a snapshot file (a line being written is left out)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def wait_all(procs: Sequence[subprocess.Popen[str]], timeout: float = 60) -> list[str]:
    """Wait for every process; kill the rest on a timeout. Asserts each exited 0."""
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    return outputs


class GlooJob:
    """``world_size`` ranks of ``script``, each given ``--snapshot-dir <its folder> --run <run>
    *args`` (the interface of examples/plain_pytorch.py); logs in ``log_dir``."""

    def __init__(self, snapshot_dirs: Sequence[Path], run: str, args: Sequence[str] = (), *,
                 world_size: int = 4, script: Path = EXAMPLE, log_dir: Path,
                 cwd: Path = ROOT) -> None:
        self.snapshot_dirs = list(snapshot_dirs)
        self.run = run
        self.world_size = world_size
        self.placement = [r * len(self.snapshot_dirs) // world_size for r in range(world_size)]
        port = str(free_port())
        self.processes: list[Child] = []
        for r, folder in enumerate(self.placement):
            env = clean_env(
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                WORLD_SIZE=str(world_size), LOCAL_RANK=str(self.placement[:r].count(folder)),
                # Loopback only, whatever the host name resolves to.
                GLOO_SOCKET_IFNAME="lo",
                # No GPU even on a machine that has one: the example would take NCCL, and
                # several ranks cannot share one GPU there. These are CPU, gloo jobs.
                CUDA_VISIBLE_DEVICES="")
            argv = [sys.executable, str(script), "--snapshot-dir", str(self.snapshot_dir(r)),
                    "--run", run, *args]
            self.processes.append(Child.start(f"{run}-rank-{r}", argv,
                                              log_dir / f"{run}-rank-{r}.log", cwd, env=env))

    def snapshot_dir(self, rank: int) -> Path:
        return self.snapshot_dirs[self.placement[rank]]

    def file(self, rank: int) -> Path:
        return self.snapshot_dir(rank) / self.run / f"rank-{rank}.jsonl"

    def records(self, rank: int) -> list[dict[str, Any]]:
        return records(self.file(rank))

    def events(self, rank: int, kind: str) -> list[dict[str, Any]]:
        """The ``kind`` events rank ``rank`` logged, each with its record's step."""
        return [{**e, "record_step": rec["step"]} for rec in self.records(rank)
                for e in rec.get("events") or () if e.get("type") == kind]

    def steps(self, rank: int) -> list[int]:
        """The steps of the records that carry metrics, in file order."""
        return [rec["step"] for rec in self.records(rank) if rec.get("metrics")]

    def alive(self) -> list[int]:
        return [r for r, p in enumerate(self.processes) if p.alive()]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{log_tail(p, 20)}" for p in self.processes)

    def wait(self, timeout: float) -> None:
        """Until every rank has exited; fail unless all exited with 0."""
        wait_for(lambda: not self.alive(), timeout, interval=0.2,
                 what=f"every rank of {self.run} exited", diagnose=self.logs)
        failed = {r: p.proc.returncode for r, p in enumerate(self.processes)
                  if p.proc.returncode != 0}
        assert not failed, f"ranks of {self.run} failed {failed}:\n{self.logs()}"

    def stop(self) -> None:
        for p in self.processes:
            p.stop()
