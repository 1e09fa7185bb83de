"""A saved state kept as a fixture: a small job's snapshot files and the state an exporter of the
release that wrote it saved after reading them (tests/fixtures/saved-state-schema-<N>/).

Every later release must restore it and serve what a full read of the same files gives
(tests/test_state_format.py). Written once per schema, never rewritten:

    .venv/bin/python tests/state_fixture.py    # writes the current schema's folder, if missing
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RANKS, STEPS = 2, 230  # past the 200-step baseline, so that every feature is in the state
RUN = "job"


def folder(schema: int) -> Path:
    return FIXTURES / f"saved-state-schema-{schema}"


def snapshots(where: Path, into: Path) -> Path:
    """Unpack the fixture's snapshot files into ``into``; the snapshot folder."""
    with tarfile.open(where / "snapshots.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / "snapshots"


def state(where: Path, into: Path) -> tuple[Path, Path]:
    """Unpack the fixture's state file into ``into`` (0700, the file 0600, as the exporter keeps
    them); (the state folder, the snapshot folder it was saved for)."""
    from grpo_monitor.runtime.saved_state import FILE_NAME, MAGIC

    into.mkdir(mode=0o700)
    data = gzip.decompress((where / f"{FILE_NAME}.gz").read_bytes())
    (into / FILE_NAME).write_bytes(data)
    (into / FILE_NAME).chmod(0o600)
    header = json.loads(data[len(MAGIC):].split(b"\n", 1)[0])
    return into, Path(header["root"])


def write() -> Path:
    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.saved_state import FILE_NAME, StateFile
    from grpo_monitor.runtime.state_codec import SCHEMA
    from grpo_monitor.runtime.store import RunStore
    from grpo_monitor.sdk.writer import SnapshotWriter
    from grpo_monitor.tools import simulate

    out = folder(SCHEMA)
    if out.exists():
        raise SystemExit(f"{out} exists: a fixture is written once per schema, never again")
    with tempfile.TemporaryDirectory(prefix="grpo-state-fixture-") as tmp:
        root = Path(tmp) / "snapshots"
        writers = [SnapshotWriter(root, RUN, rank=r, world_size=RANKS) for r in range(RANKS)]
        simulate.write_steps(writers, simulate.generate("healthy", steps=STEPS, ranks=RANKS))
        for w in writers:
            w.close(end=False)
        for path in root.rglob("*"):  # whole seconds: a tar keeps them exactly
            os.utime(path, (int(path.stat().st_mtime), int(path.stat().st_mtime)))
        store = RunStore()
        ingestor = Ingestor(root, store, ExporterHealth())
        ingestor.rescan()
        store.flush()
        state_file = StateFile(Path(tmp) / "state", root)
        state_file.save(store, ingestor)
        out.mkdir(parents=True)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(root, arcname="snapshots")
        (out / "snapshots.tar.gz").write_bytes(buffer.getvalue())
        (out / f"{FILE_NAME}.gz").write_bytes(gzip.compress(state_file.path.read_bytes(), mtime=0))
    return out


if __name__ == "__main__":
    sys.stdout.write(f"{write()}\n")
