"""The control record of a run: ``<snapshot_dir>/<run>/.grpo-control.json``.

Written by the exporter's Alertmanager webhook when a red card fires (state ``paused``) and by
``grpo-monitor resume`` (state ``running``); read by the trainer SDK
(``SnapshotWriter.should_pause``). A dotfile, so the ingest never reads it as a snapshot.
Always written atomically (a temporary file in the same folder, then ``os.replace``): a reader
sees the old record or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

CONTROL_FILE = ".grpo-control.json"
# A record is a few hundred bytes; a bigger file is no record, and is not read whole.
MAX_CONTROL_BYTES = 1 << 16


class ControlRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: Literal[1] = 1
    state: Literal["paused", "running"]
    alertname: str | None = None
    run: str | None = None
    step: int | None = None  # the run's newest step the exporter knew when the card arrived
    onset: str | None = None  # the alert's startsAt (RFC 3339)
    # Checkpoints saved before this moment predate what the card saw (card_pause.healthy_before):
    # the rollback's "last healthy" is the newest of them.
    healthy_before: str | None = None
    fingerprint: str | None = None
    paused_at: str | None = None
    resumed_at: str | None = None
    # What a resume asks the trainer to go on from (sdk/pause.py's PauseGate): the last healthy
    # checkpoint (the newest saved before the card's onset), the step in rollback_to, or "none":
    # from where it stopped. Absent in records written before it existed: rollback_to decides.
    rollback: Literal["last_healthy", "step", "none"] | None = None
    rollback_to: int | None = None


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def control_path(snapshot_dir: str | os.PathLike[str], run: str) -> Path:
    if not run or run in (".", "..") or "/" in run or os.sep in run or "\x00" in run:
        raise ValueError(f"run must be a plain folder name, got {run!r}")
    return Path(snapshot_dir) / run / CONTROL_FILE


def read_control(snapshot_dir: str | os.PathLike[str], run: str) -> ControlRecord | None:
    """The run's control record, or None when it has none (no file, no run folder). One that
    cannot be used raises ValueError, and only that: malformed (not JSON, not UTF-8, not a
    record, over MAX_CONTROL_BYTES), or unreadable (a folder in its place, a permission)."""
    path = control_path(snapshot_dir, run)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONTROL_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):  # no record, or the "run folder" is a file
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONTROL_BYTES:
        raise ValueError(f"{path}: over {MAX_CONTROL_BYTES} bytes, not a control record")
    return ControlRecord.model_validate_json(data)


def write_control(snapshot_dir: str | os.PathLike[str], run: str, record: ControlRecord) -> Path:
    """Write atomically: tmp file in the run folder + fsync + os.replace."""
    path = control_path(snapshot_dir, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(record.model_dump(), indent=2) + "\n"
    # A dotfile ending in .tmp: the ingest ignores it on both counts.
    fd, tmp = tempfile.mkstemp(prefix=".grpo-control.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # the trainer (another uid, maybe) must be able to read it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
