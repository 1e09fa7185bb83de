"""Write a run through a logger's own library, as a trainer does: ``write_run.py FORMAT DIR
NAME RECORDS``, RECORDS a JSONL file of ``{"step": N, <name>: value, ...}``.

Run by the suite with the interpreter of ``.venv-loggers`` (tests/loggers/requirements.txt);
every value is logged at its step, in order, and the run is closed as a trainer closes it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(fmt: str, out: Path, name: str, records_file: Path) -> None:
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line]
    if fmt == "tensorboard":
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(str(out / "runs" / name))
        for rec in records:
            step = rec.pop("step")
            for key, value in rec.items():
                writer.add_scalar(key, value, step)
        writer.close()
    elif fmt == "wandb":
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(out))
        import wandb

        run = wandb.init(project="grpo", name=name, dir=str(out))
        for rec in records:
            step = rec.pop("step")
            run.log(rec, step=step)
        run.finish()
    elif fmt == "mlflow":
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
        with mlflow.start_run(run_name=name):
            for rec in records:
                step = rec.pop("step")
                mlflow.log_metrics(rec, step=step)
    elif fmt == "trackio":
        os.environ.update(TRACKIO_DIR=str(out), TRACKIO_STORAGE_MODE="sqlite", HF_HUB_OFFLINE="1")
        import trackio

        trackio.init(project="grpo", name=name)
        for rec in records:
            step = rec.pop("step")
            trackio.log(rec, step=step)
        trackio.finish()
    else:
        raise SystemExit(f"unknown format {fmt}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
