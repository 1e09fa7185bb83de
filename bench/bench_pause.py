"""Per-step cost of PauseGate.check() on every rank of a gloo job, next to the all-reduce alone.

Usage: python bench/bench_pause.py [--out PATH] [-n N] [--world-sizes 2,4]

The gate runs once per training step on every rank: one os.stat of the run's control record and
one all-reduce of three float64 (the newest pause, the newest resume, the card's onset). A bare
all-reduce of the same three numbers is the floor it cannot beat; the rest is the stat and the
parse of a record that changed. Cases: no control record (a run no card ever touched), a
"running" record (after a resume; parsed once, then one stat per step), and ``every=10`` (the
gate decides at every tenth step only). Each world size is a job of that many local gloo
processes; rank 0 reports. A real step also all-reduces gradients, megabytes to gigabytes: the
gate is to be compared with that, not with nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import machine, summary_us, time_calls, write_result

WARMUP = 200


def worker(n: int, out: Path, run_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from grpo_monitor.contract.control import ControlRecord, now_rfc3339, write_control
    from grpo_monitor.sdk.pause import PauseGate

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    floor = torch.zeros(3, dtype=torch.float64)

    def bare(_: int) -> None:
        dist.all_reduce(floor, op=dist.ReduceOp.MAX)

    gate = PauseGate(run_dir=run_dir)
    every = PauseGate(run_dir=run_dir, every=10)
    cases = {"all_reduce_3_float64": time_calls(bare, n, WARMUP),
             "check_no_record": time_calls(gate.check, n, WARMUP),
             "check_every_10": time_calls(every.check, n, WARMUP)}
    dist.barrier()
    if rank == 0:
        snapshot_dir, run = os.path.split(run_dir)
        write_control(snapshot_dir, run, ControlRecord(state="running", run=run,
                                                       resumed_at=now_rfc3339()))
    dist.barrier()
    cases["check_running_record"] = time_calls(gate.check, n, WARMUP)
    if rank == 0:
        out.write_text(json.dumps({k: summary_us(v) for k, v in cases.items()}))
    dist.destroy_process_group()


def run_job(world: int, n: int) -> dict[str, dict[str, float]]:
    from grpo_monitor.tools.stack import free_port

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "bench")
        os.makedirs(run_dir)
        out = Path(tmp) / "result.json"
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", "-n", str(n),
                                   "--out", str(out), "--run-dir", run_dir],
                                  env={**env, "RANK": str(r)}) for r in range(world)]
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise SystemExit(f"a worker failed with {p.returncode}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "pause.json")
    parser.add_argument("-n", type=int, default=5000, help="timed steps per case")
    parser.add_argument("--world-sizes", default="1,2,4")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.n, args.out, args.run_dir)
        return 0

    result = {"case": "PauseGate.check per step, gloo on loopback", "n": args.n,
              "warmup": WARMUP, "worlds": {}, **machine(), "time": time.time()}
    for world in (int(w) for w in args.world_sizes.split(",")):
        cases = run_job(world, args.n)
        result["worlds"][str(world)] = cases
        for name, r in cases.items():
            print(f"world {world} {name:>22}: median {r['median_us']:.1f} us  "
                  f"p90 {r['p90_us']:.1f} us  p99 {r['p99_us']:.1f} us")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
