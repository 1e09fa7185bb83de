"""The pause record of a run: ``<snapshot_dir>/<run>/.grpo-control.json`` (run_layout.PAUSE_RECORD).

Written by the exporter's Alertmanager webhook when a red card fires (state ``paused``) and by
``grpo-monitor resume`` (state ``running``); read by the trainer SDK
(``SnapshotWriter.should_pause``). A dotfile, so the ingest never reads it as a snapshot.
Read and written through safe_io, within the snapshot folder: a link, FIFO or device in its
place (or a linked run folder) is refused, never followed or waited on. Always written
atomically (a temporary file in the same folder, then a rename): a reader sees the old record
or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from grpo_monitor.contract.run_layout import (
    MAX_CONTROL_BYTES,
    PAUSE_RECORD,
    folder_name,
    write_control_file,
)
from grpo_monitor.contract.safe_io import Refused, is_plain_folder, read_regular


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
    """Where the run's pause record lies; ValueError for a name that cannot name a run."""
    return Path(snapshot_dir) / folder_name(run) / PAUSE_RECORD


class RefusedControl(ValueError):
    """The control record's place holds what safe_io refuses: a link, a FIFO, a socket, a device,
    or the run folder is a link (``reason``: safe_io.SYMLINK or NOT_REGULAR)."""

    def __init__(self, path: Path, refused: Refused) -> None:
        # refused.filename: the record's path, or the run folder's when that is the link.
        super().__init__(f"{refused.filename}: {refused.what}, never read as a control record")
        self.path = Path(refused.filename)
        self.reason = refused.reason


def read_control(snapshot_dir: str | os.PathLike[str], run: str) -> ControlRecord | None:
    """The run's control record, or None when it has none (no file, no run folder). One that
    cannot be used raises ValueError, and only that: malformed (not JSON, not UTF-8, not a
    record, over MAX_CONTROL_BYTES), unreadable (a folder in its place, a permission), or
    refused without being opened (RefusedControl: a link, a FIFO, a linked run folder)."""
    path = control_path(snapshot_dir, run)
    try:
        data = read_regular(snapshot_dir, path, MAX_CONTROL_BYTES)
    except Refused as exc:
        raise RefusedControl(path, exc) from None
    except (FileNotFoundError, NotADirectoryError):  # no record, or the "run folder" is a file
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONTROL_BYTES:
        raise ValueError(f"{path}: over {MAX_CONTROL_BYTES} bytes, not a control record")
    return ControlRecord.model_validate_json(data)


def write_control(snapshot_dir: str | os.PathLike[str], run: str, record: ControlRecord) -> Path:
    """Write atomically (run_layout.write_control_file), readable by the trainer's user, in the
    run's folder (made if missing); safe_io.Refused when that folder is a link."""
    path = control_path(snapshot_dir, run)
    try:
        path.parent.mkdir(exist_ok=True)
    except FileExistsError:  # a file or a link of that name: write_control_file says which
        pass
    write_control_file(path, (json.dumps(record.model_dump(), indent=2) + "\n").encode(),
                       root=snapshot_dir)
    return path


def run_folder_here(snapshot_dir: str | os.PathLike[str], run: str) -> bool:
    """Whether the run has its folder in ``snapshot_dir``: a plain folder, not a link (a linked
    run folder is never read nor written into, safe_io), nor a file of that name."""
    try:
        return is_plain_folder(snapshot_dir, Path(snapshot_dir) / folder_name(run))
    except Refused:
        return False
