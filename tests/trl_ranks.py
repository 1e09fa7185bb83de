"""One process of a two-process TRL GRPOTrainer job (launched by torchrun; accelerate joins the
gloo group). Each process writes to its own snapshot folder, as on two nodes; the red card's
record lands in the folder of process 1 only, while it generates step 3.

    torchrun --nproc_per_node 2 tests/trl_ranks.py WORKDIR
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from grpo_monitor.contract.control import ControlRecord, now_rfc3339, write_control
from grpo_monitor.integrations.trl import GRPOMonitorCallback

RUN = "trl-ranks"


# Well under the test's 300 s: a rank that hangs (a collective its peer never joins) prints where
# every thread of it waits and exits, and the test shows that instead of a bare timeout.
HANG_DUMP_S = 240


def main() -> None:
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)
    work = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    snapshot_dir = work / f"node-{rank}"
    calls = {"n": 0}

    def reward(completions: list[str], **_: Any) -> list[float]:
        calls["n"] += 1
        if rank == 1 and calls["n"] == 3:
            write_control(snapshot_dir, RUN, ControlRecord(
                state="paused", alertname="GRPONonFiniteValues", run=RUN, onset=now_rfc3339(),
                paused_at=now_rfc3339(), fingerprint="f"))
        return [0.5 + 0.1 * (i % 2) for i in range(len(completions))]

    model_path = str(work / "tiny-llama")
    if not (work / "tiny-llama").exists():
        raise SystemExit("the test builds the model first")
    from transformers import AutoTokenizer

    args = GRPOConfig(
        output_dir=str(work / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=6, logging_steps=1, report_to=[], use_cpu=True,
        beta=0.0, save_strategy="steps", save_steps=1, seed=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["1+1=?", "ab?"] * 8}),
                          processing_class=AutoTokenizer.from_pretrained(model_path),
                          callbacks=[GRPOMonitorCallback(snapshot_dir, run=RUN, per_rank_perf=True)])
    trainer.train()
    (work / f"result-{rank}.json").write_text(json.dumps({"global_step": trainer.state.global_step}))
    # Leave together, as a launcher script should: a process that exits while its peer still
    # holds gloo connections to it can abort that peer at exit.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from plain_pytorch import leave

    leave(True)  # without finalizing: Gloo's workers may still hold tensors (plain_pytorch.leave)
