"""The documented torchrun command, run again and again on a loaded machine: does every rank exit 0?

Usage: python bench/bench_exits.py [--runs 100] [--load 2] [--steps 3] [--out PATH]

Method. --load busy processes (one spinning loop each) keep every core of the machine occupied,
as a CI runner shared with other jobs is. Meanwhile the command examples/README.md documents,
``torchrun --nproc_per_node 2 examples/plain_pytorch.py --snapshot-dir DIR --steps N``, runs
--runs times in a row, each in a fresh folder and on a fresh port; a run passes when torchrun
exits 0 and both ranks' files end with their run_end mark. Failures are listed with the last
lines of their output ("terminate called without an active exception": a rank aborted at exit).
This is a stress script, not a timed test: it says how often, not how fast.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import machine, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plain_pytorch.py"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "exits.json"


def spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(steps: int) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="grpo-exits-") as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(EXAMPLE),
               "--snapshot-dir", tmp, "--steps", str(steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        ended = []
        for rank in (0, 1):
            path = Path(tmp) / "plain-pytorch" / f"rank-{rank}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            last = json.loads(lines[-1]) if lines else {}
            ended.append([e.get("type") for e in last.get("events") or []] == ["run_end"])
        ok = proc.returncode == 0 and all(ended)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-6:])
        return ok, f"exit {proc.returncode}, ends {ended}: {tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--load", type=int, default=2, help="busy processes beside the runs")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    stop_at = time.monotonic() + 24 * 3600
    load = [multiprocessing.Process(target=spin, args=(stop_at,), daemon=True)
            for _ in range(args.load)]
    for p in load:
        p.start()
    failures: list[str] = []
    t0 = time.monotonic()
    try:
        for i in range(1, args.runs + 1):
            ok, what = one_run(args.steps)
            if not ok:
                failures.append(f"run {i}: {what}")
                print(f"run {i} failed: {what}", flush=True)
    finally:
        for p in load:
            p.terminate()
    wall = time.monotonic() - t0
    print(f"{args.runs - len(failures)} of {args.runs} runs exited cleanly with {args.load} busy "
          f"processes beside them ({wall:.0f} s)")
    write_result(args.out, {"source": "bench/bench_exits.py", "runs": args.runs, "load": args.load,
                            "steps": args.steps, "failed": len(failures), "failures": failures,
                            "wall_s": round(wall), "machine": machine()})
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
