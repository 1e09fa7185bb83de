"""The ingest thread at rest: a tick with no file event handles nothing again. (It once kept
re-handling its last batch every tick: a full rescan of the folder twice a second after
start-up, and the last files read again until the next event.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polling import wait_for
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.runtime.watch import SnapshotWatcher
from grpo_monitor.sdk.writer import SnapshotWriter


class CountingIngestor(Ingestor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rescans = 0
        self.reads: list[Path] = []

    def rescan(self) -> None:
        self.rescans += 1
        super().rescan()

    def process(self, path: Path, *args: Any, **kwargs: Any) -> None:
        self.reads.append(Path(path))
        super().process(path, *args, **kwargs)


class TickCounter(SnapshotWatcher):
    ticks = 0

    def _maintain(self) -> None:
        self.ticks += 1
        super()._maintain()


def test_idle_ticks_handle_nothing_again(snapshot_dir: Path) -> None:
    ingestor = CountingIngestor(snapshot_dir, RunStore(), ExporterHealth())
    watcher = TickCounter(ingestor, tick=0.05, rescan_interval=3600)
    watcher.start()
    try:
        wait_for(watcher.ready.is_set)
        with SnapshotWriter(snapshot_dir, "idle", rank=0, world_size=1) as w:
            w.log({"loss": 1.0}, 1)
        wait_for(lambda: ingestor.store.max_step("idle") == 1)
        # Every event of the write handled: the file events arrive in order, so once a file
        # renamed in after the write (one event, nothing after it) is read, the write's own
        # late events (its close) have been handled too. An empty queue alone does not say so:
        # the observer thread may not have queued them yet on a busy machine.
        marker = snapshot_dir / "idle" / "rank-1.jsonl"
        staged = snapshot_dir.parent / "rank-1.jsonl"
        staged.write_text('{"step": 1, "metrics": {"loss": 1.0}}\n')
        staged.rename(marker)
        wait_for(lambda: marker in ingestor.reads and watcher._q.empty())
        assert ingestor.health.internal_errors._value.get() == 0
        rescans, reads = ingestor.rescans, len(ingestor.reads)
        start = watcher.ticks
        wait_for(lambda: watcher.ticks >= start + 10)  # ten idle ticks
        assert (ingestor.rescans, len(ingestor.reads)) == (rescans, reads)
    finally:
        watcher.stop()
