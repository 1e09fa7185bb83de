"""Save and restore a plain PyTorch trainer's whole state, for a rollback in place.

A rollback that restores the weights alone is no rollback: the optimizer's moments, the
scheduler's position, the random streams (which prompts and samples come next) and the step
counter all moved on with the sick weights. ``save_training_state`` writes them all into one
file; ``load_training_state`` puts them back and returns the step to go on from. Pair them with
``PauseGate`` (pause.py): log each save as a ``checkpoint_save`` event with its ``path``, and
after a resume load ``decision.rollback_path``. This module is the ``torch`` extra.

Frameworks with their own checkpoints (transformers' ``Trainer``, verl, DeepSpeed) restore them
with their own loaders; see docs/pause.md.
"""

from __future__ import annotations

import os
import random
from typing import Any

from grpo_monitor.extras import import_extra

# One line naming the torch extra, not a bare ModuleNotFoundError, when torch is missing.
import_extra("torch", "torch", "grpo_monitor.sdk.checkpoint")
import torch  # noqa: E402

__all__ = ["load_training_state", "rng_state_path", "save_rng_state", "save_training_state"]


def _state_dict(obj: Any) -> Any:
    return obj.state_dict() if obj is not None else None


def rng_state_path(path: str | os.PathLike[str], rank: int) -> str:
    """Where rank ``rank`` keeps its own random streams beside the checkpoint ``path``: with
    DDP one rank saves the weights, but every rank draws its own samples."""
    return f"{os.fspath(path)}.rng-rank{int(rank)}"


def _rng_state() -> dict[str, Any]:
    rng: dict[str, Any] = {
        "python": random.getstate(), "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    try:
        import numpy

        rng["numpy"] = numpy.random.get_state()
    except ImportError:  # numpy is torch's companion, not its requirement
        pass
    return rng


def _set_rng_state(rng: dict[str, Any]) -> None:
    if "python" in rng:
        random.setstate(rng["python"])
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        import numpy

        numpy.random.set_state(rng["numpy"])


def _save_atomically(state: dict[str, Any], path: str) -> None:
    # A half-written checkpoint must never be the one a rollback finds.
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def save_rng_state(path: str | os.PathLike[str], rank: int) -> str:
    """Save this rank's random streams beside the checkpoint ``path`` (every rank but the one
    that calls ``save_training_state``)."""
    target = rng_state_path(path, rank)
    _save_atomically({"rng": _rng_state()}, target)
    return target


def save_training_state(path: str | os.PathLike[str], *, step: int, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                        extra: dict[str, Any] | None = None) -> str:
    """Write model, optimizer, scheduler, this process's RNG streams and the step to ``path``,
    atomically. Returns the path."""
    path = os.fspath(path)
    _save_atomically({"step": int(step), "model": model.state_dict(),
                      "optimizer": _state_dict(optimizer), "scheduler": _state_dict(scheduler),
                      "rng": _rng_state(), "extra": extra or {}}, path)
    return path


def load_training_state(path: str | os.PathLike[str], *, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                        rank: int | None = None, map_location: Any = "cpu") -> tuple[int, dict[str, Any]]:
    """Restore what ``save_training_state`` wrote; returns (step, extra). The step is the one the
    checkpoint was saved after: go on with step + 1. With ``rank``, that rank's own random
    streams (``save_rng_state``) replace the saver's when they were saved."""
    # weights_only=False: the RNG states are Python and numpy objects, written by this trainer.
    state = torch.load(os.fspath(path), map_location=map_location, weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    rng = state.get("rng") or {}
    own = rng_state_path(path, rank) if rank is not None else None
    if own is not None and os.path.exists(own):
        rng = torch.load(own, weights_only=False)["rng"]
    _set_rng_state(rng)
    return int(state["step"]), dict(state.get("extra") or {})
