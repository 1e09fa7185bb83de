"""What a run looks like on disk: ``<snapshot_dir>/<run>/``, its names, its files, their order.

One place for the facts that the trainer side (the SDK, the TRL callback) and the exporter side
(ingest, report, replay, rebaseline, the red-card pause) must agree on:

* which text may name a run (``check_run_name``), and how to make one from any text
  (``run_name_from``);
* the snapshot files of a rank (``rank_file``, ``segment_file``, ``rotation_of``) and every
  snapshot file of a run in the order it was written (``run_files``);
* the control files next to them (``PAUSE_RECORD``, ``REBASELINE_REQUEST``, ``ROLLBACK_TARGET``)
  and how they are written (``write_control_file``).

Standard library only: the SDK imports it inside the training loop's process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from grpo_monitor.contract.safe_io import replace_file, walk

__all__ = [
    "DEFAULT_RUN", "DERIVED_RUN_NAME_CHARS", "MAX_CONTROL_BYTES", "MAX_RUN_NAME_BYTES", "NOT_SNAPSHOTS",
    "PER_SAMPLE_FILE",
    "PAUSE_RECORD", "REBASELINE_REQUEST", "REPORT_FOLDER", "ROLLBACK_TARGET", "SNAPSHOT_SUFFIXES",
    "check_run_name", "folder_name", "is_appended", "is_run_label", "run_label", "is_hidden", "is_not_snapshot", "is_run_name", "is_snapshot_path", "rank_file",
    "rotation_of", "run_files", "run_name_from", "run_name_problem", "runs_in", "segment_file",
    "write_control_file",
]

# -- run names --------------------------------------------------------------------------------

# Files directly in the snapshot folder, in no run folder, belong to this run.
DEFAULT_RUN = "default"
# A run name is one folder name, and a file system holds at most 255 bytes in one (NAME_MAX).
MAX_RUN_NAME_BYTES = 255
# A name made from other text (run_name_from) is cut at this many characters first: what the TRL
# callback has always done, so a relaunch of an existing run finds its folder again.
DERIVED_RUN_NAME_CHARS = 128
# "/" separates folders on every system, "\" on Windows (and in a path a shared snapshot volume
# shows there); no file name can hold NUL.
_FORBIDDEN = ("/", "\\", "\0")
_SEPARATORS = re.compile(r"[/\\\0]+")


def run_name_problem(run: object) -> str | None:
    """Why ``run`` cannot name a run, or None when it can.

    A run name becomes a folder of the snapshot folder and the ``run`` label of every series.
    Prometheus takes any UTF-8 text as a label value, so the folder decides:

    * not empty, and not starting with "." -- which also rules out "." and "..": the ingest
      skips dot folders (a writer's scratch space), so a run in one would never be monitored,
      and the red-card pause ignores them for the same reason;
    * no "/", "\\" or NUL: the name must be one folder, the same on every system that reads
      the folder, never a path that leads elsewhere;
    * UTF-8 text (no lone surrogate, the mark of bytes that are not UTF-8): the label a
      Prometheus series carries must be the name the trainer chose, so that
      ``grpo-monitor resume <run>`` finds its folder;
    * at most ``MAX_RUN_NAME_BYTES`` bytes in UTF-8: longer cannot be a folder.

    Everything else is allowed, spaces and non-ASCII letters included.
    """
    if not isinstance(run, str):
        return "not text"
    if not run:
        return "empty"
    if run.startswith("."):
        return "starts with '.': the exporter skips dot folders"
    if any(c in run for c in _FORBIDDEN):
        return "holds '/', '\\' or NUL"
    try:
        size = len(run.encode("utf-8"))
    except UnicodeEncodeError:
        return "not UTF-8 text"
    if size > MAX_RUN_NAME_BYTES:
        return f"over {MAX_RUN_NAME_BYTES} bytes"
    return None


def is_run_name(run: object) -> bool:
    """Whether ``run`` may name a run (see ``run_name_problem``)."""
    return run_name_problem(run) is None


# The escapes of a run label (run_label): a doubled backslash, and a backslash, "udc" and the hex
# of a byte that is not UTF-8 (Python reads such a byte as a lone surrogate, U+DC80..U+DCFF).
_LABEL_ESCAPE = re.compile(r"\\(\\|udc[89a-f][0-9a-f])")


def run_label(name: str) -> str:
    r"""The ``run`` label of the run folder ``name`` (as ``os.listdir`` gives it): the name itself
    when it is UTF-8 text without a backslash, as every run name is; otherwise its backslashes
    doubled and each byte that is not UTF-8 written ``\udcXX``. Two folders never share a label,
    and ``folder_name`` leads back from the label to the folder."""
    if "\\" not in name:
        try:
            name.encode("utf-8")
            return name
        except UnicodeEncodeError:
            pass
    return name.replace("\\", "\\\\").encode("utf-8", "backslashreplace").decode("utf-8")


def folder_name(label: object) -> str:
    """The run folder's name of a run label (``run_label``'s inverse): the label itself for a
    run name; for a folder whose name is not UTF-8 or holds a backslash, its name unescaped, so
    that such a run too can be paused, resumed, re-baselined and replayed. ValueError, saying
    why, for a label that names no run folder."""
    problem = run_name_problem(label)
    if problem is None:
        return label  # type: ignore[return-value]  # run_name_problem checked it is a str
    if isinstance(label, str) and "\\" in label:
        name = _LABEL_ESCAPE.sub(
            lambda m: "\\" if m.group(1) == "\\" else chr(0xDC00 + int(m.group(1)[3:], 16)), label)
        if (run_label(name) == label and name and not name.startswith(".")
                and "/" not in name and "\0" not in name
                and len(os.fsencode(name)) <= MAX_RUN_NAME_BYTES):
            return name
    raise ValueError(f"run must be a plain folder name ({problem}), got {label!r}")


def is_run_label(label: object) -> bool:
    """Whether ``label`` names a run folder (``folder_name``)."""
    try:
        folder_name(label)
    except ValueError:
        return False
    return True


def check_run_name(run: object) -> str:
    """``run`` itself when it may name a run; ValueError saying why not otherwise."""
    # Every record names its run again: a name's verdict is kept (a name that is no str may not
    # be hashable, and is rare).
    problem = _name_problem(run) if isinstance(run, str) else run_name_problem(run)
    if problem is not None:
        raise ValueError(f"run must be a plain folder name ({problem}), got {run!r}")
    return run  # type: ignore[return-value]  # run_name_problem checked it is a str


_name_problem = lru_cache(maxsize=1024)(run_name_problem)


def run_name_from(text: str) -> str:
    """A run name made from any text (a trainer's run_name, an output folder's name): separators
    become "-", surrounding spaces and leading dots go, text that is not UTF-8 becomes "?", and
    the name is cut to ``DERIVED_RUN_NAME_CHARS`` characters and ``MAX_RUN_NAME_BYTES`` bytes.
    ``DEFAULT_RUN`` when nothing is left."""
    name = str(text).encode("utf-8", "replace").decode("utf-8")
    name = _SEPARATORS.sub("-", name).strip().lstrip(".")[:DERIVED_RUN_NAME_CHARS]
    # A cut inside a character drops that character.
    name = name.encode("utf-8")[:MAX_RUN_NAME_BYTES].decode("utf-8", "ignore")
    return name if is_run_name(name) else DEFAULT_RUN


# -- snapshot files ---------------------------------------------------------------------------

SNAPSHOT_SUFFIXES = (".jsonl", ".json")


def is_appended(path: str | os.PathLike[str]) -> bool:
    """A ``*.jsonl`` file: records appended one a line, read from where the reader left off. The
    other snapshot file, ``*.json``, holds one record and is read whole."""
    return os.fspath(path).endswith(SNAPSHOT_SUFFIXES[0])

# A rotated segment: <base>.<seq>.jsonl, the sequence growing (rank-0.jsonl -> rank-0.000001.jsonl).
_SEGMENT = re.compile(r"(?P<base>.+)\.(?P<seq>[0-9]+)\.jsonl")
# The SDK's segments carry at least this many digits, so that they also sort by name.
_SEGMENT_DIGITS = 6


def rank_file(rank: int) -> str:
    """The file a rank appends its records to: ``rank-<N>.jsonl``."""
    return f"rank-{int(rank)}.jsonl"


def segment_file(rank: int, seq: int) -> str:
    """The name ``rank_file(rank)`` takes when it is rotated away as segment ``seq`` (1, 2, ...):
    it keeps the ``rank-<N>`` prefix and ``.jsonl`` suffix, so it is still read as history."""
    return f"rank-{int(rank)}.{int(seq):0{_SEGMENT_DIGITS}d}.jsonl"


def rotation_of(name: str) -> tuple[str, int | None]:
    """A ``*.jsonl`` name's place in its rotation: (base, None) for the file being written,
    ``<base>.jsonl``, and (base, seq) for its segment ``<base>.<seq>.jsonl``. Any file of that
    shape counts, not only the SDK's: other writers rotate the same way."""
    m = _SEGMENT.fullmatch(name)
    if m:
        return m["base"], int(m["seq"])
    return name.removesuffix(".jsonl"), None


def is_hidden(name: str) -> bool:
    """Dotfiles and dot folders are a writer's scratch space (control files, temporary files,
    a report's output), never snapshots."""
    return name.startswith(".")


# JSON files a trainer's output folder holds beside its logs, which are no records: a model's and
# tokenizer's configuration in every checkpoint, W&B's run metadata. Pointed at that folder
# (docs/loggers.md), the exporter leaves them alone rather than count each as a bad record.
NOT_SNAPSHOTS = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "adapter_config.json",
    "preprocessor_config.json", "processor_config.json", "chat_template.json",
    "model.safetensors.index.json", "pytorch_model.bin.index.json", "training_args.json",
    "wandb-summary.json", "wandb-metadata.json", "rng_state.json", "scheduler.json",
    "latest_checkpointed_iteration.json",
})
# NeMo-RL's per-sample logs, a file a step (train_data_step12.jsonl, val_data_step12.jsonl): no
# records of ours. Its training samples are read by the loggers' reader (logger_layout.py).
PER_SAMPLE_FILE = re.compile(r"(?P<split>train|val)_data_step(?P<step>\d{1,15})\.jsonl")


def is_not_snapshot(name: str) -> bool:
    """A ``*.json`` or ``*.jsonl`` name that is no snapshot file (NOT_SNAPSHOTS, PER_SAMPLE_FILE)."""
    return name in NOT_SNAPSHOTS or PER_SAMPLE_FILE.fullmatch(name) is not None


def is_snapshot_path(path: Path, root: Path) -> bool:
    """Whether ``path`` under ``root`` names a snapshot file: a ``*.jsonl`` or ``*.json`` file
    not hidden, in no hidden folder below ``root``, and no other program's (is_not_snapshot)."""
    if path.suffix not in SNAPSHOT_SUFFIXES or is_not_snapshot(path.name):
        return False
    # String work, not pathlib's relative_to: the ingest asks for every file event.
    full, top = str(path), str(root)
    prefix = top if top.endswith(os.sep) else top + os.sep
    if not full.startswith(prefix) or len(full) == len(prefix):
        return False
    return not any(is_hidden(part) for part in full[len(prefix):].split(os.sep))


def _written_order(path: Path, root: Path) -> tuple[tuple[str, ...], str, int, int, str]:
    # Per folder, per rotation: the segments by sequence, then the file still written to (a
    # *.json file, rewritten whole, is a rotation of its own with no segments).
    name = path.name
    if name.endswith(".jsonl"):
        base, seq = rotation_of(name)
    else:
        base, seq = name.removesuffix(".json"), None
    return (path.parent.relative_to(root).parts, base, 0 if seq is not None else 1, seq or 0, name)


def run_files(run_dir: str | os.PathLike[str], *, nested: bool = True,
              root: str | os.PathLike[str] | None = None) -> list[Path]:
    """The snapshot files of the run folder ``run_dir``, in the order they were written.

    Every ``*.jsonl`` and ``*.json`` name that is no folder, in ``run_dir`` and, with ``nested``,
    in its folders, skipping dotfiles and dot folders. Links are not followed (safe_io.walk): a
    linked folder is not entered, and a link, FIFO or socket under a snapshot name is listed for
    the reader to refuse (safe_io.open_regular) and say so. ``root``: the snapshot folder that
    ``run_dir`` lies in, when it does; a ``run_dir`` that is a link there raises
    safe_io.Refused. Ordered folder by folder and, within one, rotation by rotation (by base
    name): a rotation's segments by sequence number, then the file still being written, so that
    a later record of a step replaces an earlier one when read in this order. The order comes
    from the names alone, never from modification times, which a copy or a coarse clock
    reorders. ``nested=False`` lists the loose files of a snapshot folder, which are run
    ``DEFAULT_RUN``. An unreadable or missing folder lists nothing.
    """
    top = Path(run_dir)
    found: list[Path] = []
    for folder, entries in walk(root if root is not None else top, top,
                                descend=lambda name: nested and not is_hidden(name)):
        for entry in entries:
            if (entry.name.endswith(SNAPSHOT_SUFFIXES) and not is_hidden(entry.name)
                    and not is_not_snapshot(entry.name)
                    and not entry.is_dir(follow_symlinks=False)):
                found.append(folder / entry.name)
    found.sort(key=lambda p: _written_order(p, top))
    return found


def runs_in(folder: str | os.PathLike[str], *,
            also: Callable[[Path], bool] | None = None) -> list[Path]:
    """The run folders of ``folder`` when it is a snapshot folder (no snapshot files of its
    own, sub-folders that hold some, or of which ``also`` says so), else []: a run folder is
    one run, read as one. ``check`` counts a logger's files too (logger_layout.run_folders)."""
    root = Path(folder)
    if run_files(root, nested=False):
        return []
    try:
        subs = sorted(p for p in root.iterdir() if not is_hidden(p.name) and p.is_dir()
                      and not p.is_symlink())
    except OSError:
        return []
    return [p for p in subs if run_files(p) or (also is not None and also(p))]


# -- control files ----------------------------------------------------------------------------
# Dotfiles in the run folder: the ingest never reads them as snapshots.

# The red-card pause: written by the exporter when a red card fires (state "paused") and by
# `grpo-monitor resume` (state "running"); read by the trainer (SnapshotWriter, PauseGate).
PAUSE_RECORD = ".grpo-control.json"
# `grpo-monitor rebaseline`'s request: {"at_step": S, "steps": N}; read by the ingest.
REBASELINE_REQUEST = ".grpo-baseline.json"
# Where a run stopped by a red card goes on from (the TRL callback): the last healthy checkpoint.
ROLLBACK_TARGET = ".grpo-rollback.json"
# `grpo-monitor report RUN_DIR` writes here unless told otherwise.
REPORT_FOLDER = ".report"
# A control file is a few hundred bytes; a bigger one is no control file, and is not read whole.
MAX_CONTROL_BYTES = 1 << 16


def write_control_file(path: str | os.PathLike[str], data: bytes, *,
                       root: str | os.PathLike[str] | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (safe_io.replace_file): a reader sees the old
    content or the new, never half of one, and a link or FIFO in its place is replaced, never
    written through. ``root``: the snapshot folder ``path`` lies in, whose folders on the way
    must be no links (default: ``path``'s own folder, followed as given). The result is readable
    by all: the trainer and the exporter may run as different users."""
    folder = root if root is not None else os.path.dirname(os.path.abspath(path))
    replace_file(folder, path, data, 0o644)
