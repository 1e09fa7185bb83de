"""What every benchmark records about the machine, how it times calls, and how it writes its
result file."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "machine": f"{platform.machine()} {os.cpu_count()} cpus"}


def write_result(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def time_calls(fn: Callable[[int], object], n: int, warmup: int) -> list[int]:
    """Nanoseconds of each of ``n`` calls ``fn(i)``, timed one by one after ``warmup`` calls."""
    for i in range(warmup):
        fn(i)
    out = [0] * n
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn(warmup + i)
        out[i] = clock() - t0
    return out


def summary_us(ns: list[int]) -> dict[str, float]:
    s = sorted(ns)

    def pick(q: float) -> float:
        return s[min(int(q * len(s)), len(s) - 1)] / 1000

    return {"median_us": statistics.median(s) / 1000, "p90_us": pick(0.90),
            "p99_us": pick(0.99), "mean_us": statistics.fmean(s) / 1000}
