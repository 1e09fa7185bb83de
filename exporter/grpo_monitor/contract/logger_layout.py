"""Where the loggers trainers already use keep their runs, and which run a file of theirs is.

A trainer that never writes our snapshots still leaves its metrics on disk through its logger
(docs/loggers.md): W&B's run file, TensorBoard's event files, MLflow's and Trackio's databases,
a framework's own JSONL file, a Hugging Face checkpoint's ``trainer_state.json``. The exporter,
``check``, ``report`` and ``replay`` find them below the folder they are pointed at, beside our
own snapshot runs, by these names alone:

* ``logger_format``: which logger wrote a file, from its name;
* ``logger_run``: the run a file belongs to, from where it lies (a logger's own metadata, read by
  the runtime, may name it better: a W&B or MLflow run name);
* ``is_logger_link``: the links loggers make on purpose (W&B's ``latest-run``), which are
  neither followed nor counted as errors.

Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path, PurePath

from grpo_monitor.contract.run_layout import (
    DEFAULT_RUN, PER_SAMPLE_FILE, is_hidden, run_label, runs_in,
)
from grpo_monitor.contract.safe_io import walk

__all__ = [
    "APPENDED_FORMATS", "READER_FORMATS", "FRAMEWORK_JSONL", "LOGGER_FORMATS", "SOURCE_PRECEDENCE",
    "TRAINER_STATE", "holds_logger_files", "is_logger_link", "run_folders", "logger_format", "logger_run",
    "sample_file_step", "wandb_run_id",
]

# A framework's own JSONL file, one row a logged step, by its file name; the frameworks that
# write it by default (docs/loggers.md cites the code).
FRAMEWORK_JSONL: dict[str, str] = {
    "metrics.jsonl": "prime-rl, Tinker cookbook",
    "logging.jsonl": "ms-swift",
    "trainer_log.jsonl": "LLaMA-Factory",
    "history.jsonl": "ART",
    "experiment_log.jsonl": "EasyR1",
}
# What a Hugging Face Trainer (TRL, Unsloth) saves with each checkpoint: its whole log so far.
TRAINER_STATE = "trainer_state.json"

# The formats, as check names them.
LOGGER_FORMATS = ("wandb", "tensorboard", "mlflow", "trackio", "jsonl", "trainer_state", "csv",
                  "samples")
# Read by the ingest's JSONL and JSON machinery (offsets, rotation, truncation).
APPENDED_FORMATS = frozenset({"jsonl", "trainer_state"})
# Read by a reader of their own (runtime/loggers).
READER_FORMATS = frozenset({"wandb", "tensorboard", "mlflow", "trackio", "csv", "samples"})

# One run, one source: a trainer that logs to two loggers at once (ms-swift's logging.jsonl and its
# TensorBoard files; a Trainer's event files and its checkpoints' trainer_state.json; verl's W&B
# run and its TensorBoard folder, both named after the experiment) would feed the run every step
# twice, its steps going back at each. The run is read from the first of these it has files of,
# the others' rows left out (check names them): our snapshots (every rank, the pause's gate), a
# framework's JSONL (a line a step, written at once), TensorBoard (flushed by Trainers at each
# log), W&B (32 KiB blocks), the databases, a checkpoint's whole log (every save_steps), tables,
# and last NeMo-RL's per-sample files (the statistics of a few signals, where no logger is on).
SOURCE_PRECEDENCE: tuple[str, ...] = (
    "snapshots", "jsonl", "tensorboard", "wandb", "mlflow", "trackio", "trainer_state", "csv",
    "samples")

_TFEVENTS = "events.out.tfevents."
# W&B's run file: run-<id>.wandb in run-<YYYYMMDD_HHMMSS>-<id>/ (offline-run-... offline).
_WANDB_FILE = re.compile(r"run-(?P<id>[A-Za-z0-9_-]+)\.wandb")
# MLflow's default store since 3.7 is ./mlflow.db; verl points it at /tmp/mlruns.db.
_MLFLOW_DB = frozenset({"mlflow.db", "mlruns.db"})
# A Trackio project's database: <TRACKIO_DIR>/<project>.db (any other *.db is looked at once:
# the tables say whether it is Trackio's or MLflow's).
_DB_SUFFIX = ".db"
# Folders whose name says nothing of the run: the run is named by the folder above.
_GENERIC_FOLDERS = frozenset({"runs", "tensorboard", "tensorboard_log", "tensorboard_logs",
                              "tb", "tb_logs", "logs", "log", "events", "files", "wandb"})
# The log folder SummaryWriter makes when given none (torch, tensorboardX, Hugging Face's
# Trainer): runs/<Mon><DD>_<HH-MM-SS>_<host>[<comment>].
_DEFAULT_LOGDIR = re.compile(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+")
# W&B's links to the newest run and to its debug logs.
_WANDB_LINKS = frozenset({"latest-run", "debug.log", "debug-internal.log", "debug-core.log"})


@lru_cache(maxsize=4096)
def logger_format(name: str) -> str | None:
    """The logger that writes files called ``name``: one of LOGGER_FORMATS, or None. Cached:
    asked for every record, of a few file names (``rank-0.jsonl``)."""
    if name in FRAMEWORK_JSONL:
        return "jsonl"
    if name == TRAINER_STATE:
        return "trainer_state"
    if name.startswith(_TFEVENTS):
        return "tensorboard"
    if sample_file_step(name) is not None:
        return "samples"
    if _WANDB_FILE.fullmatch(name):
        return "wandb"
    if name in _MLFLOW_DB:
        return "mlflow"
    if name.endswith(_DB_SUFFIX) and len(name) > len(_DB_SUFFIX):
        return "trackio"  # confirmed by its tables when opened (runtime/loggers/databases.py)
    if name.endswith(".csv") and len(name) > 4:
        # A table of metrics by step (a W&B export, a loop's own log), confirmed by its header
        # (contract/logger_rows.py): any other CSV is left alone.
        return "csv"
    return None


def is_logger_link(folder: PurePath, name: str) -> bool:
    """A link a logger makes on purpose: never followed, and no error of the folder."""
    return name in _WANDB_LINKS and folder.name in ("wandb", "logs")


def sample_file_step(name: str) -> int | None:
    """The step of a NeMo-RL training step's per-sample file (``train_data_step12.jsonl``: 12);
    None for any other name (its validation samples, ``val_data_step*``, are not read)."""
    m = PER_SAMPLE_FILE.fullmatch(name)
    return int(m.group("step")) if m and m.group("split") == "train" else None


def holds_logger_files(folder: PurePath) -> bool:
    """Whether a logger's file lies anywhere below ``folder`` (no link followed, no dot folder
    entered)."""
    for _, entries in walk(folder, descend=lambda name: not is_hidden(name)):
        if any(logger_format(e.name) and not e.is_dir(follow_symlinks=False) for e in entries):
            return True
    return False


def run_folders(folder: PurePath) -> list[Path]:
    """The run folders of a snapshot folder or a trainer's output folder: those that hold
    snapshot files or a logger's files (run_layout.runs_in)."""
    return runs_in(folder, also=holds_logger_files)


def wandb_run_id(name: str) -> str | None:
    """The run id in a W&B run file's name."""
    m = _WANDB_FILE.fullmatch(name)
    return m.group("id") if m else None


def logger_run(path: PurePath, root: PurePath, fmt: str) -> str:
    """The run a logger's file at ``path`` belongs to, by its place below ``root``.

    * a framework JSONL file: the folder it lies in (prime-rl's ``<output>/<run>/``, Tinker's
      ``<log_path>/``, EasyR1's ``<project>/<experiment>/``);
    * ``trainer_state.json``: the output folder above its ``checkpoint-N`` folder, so that every
      checkpoint of a run is the one run;
    * a TensorBoard event file: its log folder (``logdir/<run>/``), or the one above when that
      says nothing (``runs``, ``tensorboard``: ms-swift's ``<output>/vN-<date>/runs``; the
      default ``runs/<time>_<host>`` of PyTorch and a Hugging Face Trainer's output folder);
    * W&B: the run folder's id (``run-<date>-<id>``: the id), until the file names the run;
    * a database: the database file's name (its runs are named by their own rows);
    * NeMo-RL's per-sample files: their log folder (``logs/exp_001/``), as its event files';
    * a CSV: the folder it lies in (a W&B export or a long table names its runs itself).

    A file in ``root`` itself (or in a folder of no name of its own there) is in the run
    ``default``, as a snapshot file there is.
    """
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = (path.name,)
    folders = list(parts[:-1])
    if fmt == "wandb":
        return run_label(wandb_run_id(path.name) or path.name)
    if fmt in ("mlflow", "trackio"):
        return run_label(path.name.removesuffix(_DB_SUFFIX))
    # A CSV without run names of its own is the run of its folder, as a framework's JSONL file.
    if fmt == "trainer_state" and folders and folders[-1].startswith("checkpoint-"):
        folders.pop()
    if fmt == "tensorboard" and len(folders) > 1 and folders[-2] == "runs" \
            and _DEFAULT_LOGDIR.fullmatch(folders[-1]):
        folders.pop()  # PyTorch's and Hugging Face's runs/<time>_<host>: the run is above
    while fmt == "tensorboard" and folders and folders[-1].lower() in _GENERIC_FOLDERS:
        folders.pop()
    return run_label(folders[-1]) if folders else DEFAULT_RUN
