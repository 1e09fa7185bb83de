"""A short soak on real processes (tests/soak.py): 16 ranks writing through SnapshotWriter at 10
records/s each for 35 s, every rank rotating about five times with old segments deleted, the
exporter a `grpo-monitor serve` subprocess, the real Prometheus scraping it every second.

The same properties as bench/bench_soak.py's ten-minute run, minus the memory slope (a short
run cannot measure one): every record each rank wrote was applied exactly once, up to its last
step, and its end marked; no snapshot error and no internal error counted; the files the
exporter follows are exactly those on disk once the writers are done, and never more than every
rank's current file and kept segments during the run (deleted segments are forgotten). No
timing is asserted: a slow machine only makes the run late, and each rank still writes its
exact step sequence.
"""

from __future__ import annotations

from pathlib import Path

from soak import SoakConfig, problems, run_soak

CONFIG = SoakConfig(ranks=16, rate_hz=10.0, duration_s=35.0, writer_processes=2,
                    sample_interval_s=2.0, rotations=5, keep_segments=2)


def test_soak_every_record_once_through_rotation_no_error_files_bounded(tmp_path: Path) -> None:
    result = run_soak(CONFIG, tmp_path)
    found = problems(result)
    assert not found, f"{len(found)} problems:\n" + "\n".join(found)
