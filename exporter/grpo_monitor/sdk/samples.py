"""Build the snapshot contract's ``samples`` list from a step's rollouts (background.md#reading-samples).

Every few hundred steps a trainer logs a handful of prompts with their G responses and
rewards; replaying them (``grpo-monitor replay``, ``/replay``) is the most direct way to see
reward hacking. This module only shapes plain Python data: it never imports torch. Tensors and
numpy arrays are accepted through their ``.tolist()``.

    from grpo_monitor.sdk.samples import replay_samples, should_log_samples

    samples = None
    if should_log_samples(step, every=500):
        samples = replay_samples(prompts, responses, rewards, lengths, prompt_types=types)
    writer.log(metrics, step, samples=samples)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from grpo_monitor.contract.samples import reward_sort_key

__all__ = ["TRUNCATION_MARKER", "replay_samples", "reward_sort_key", "should_log_samples", "truncate_text"]

# Appended to a cut text, with the number of characters left out.
TRUNCATION_MARKER = "… [truncated {n} chars]"


def should_log_samples(step: int, every: int = 500) -> bool:
    """Whether ``step`` is a sample-logging step: every ``every`` steps, step 0 included."""
    try:
        step, every = int(step), int(every)
    except (TypeError, ValueError):
        return False
    return every > 0 and step >= 0 and step % every == 0


def truncate_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters plus a marker naming how many were left out."""
    if max_chars < 0 or len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


def _as_list(value: Any) -> list[Any]:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    item = getattr(value, "item", None)
    if callable(item):
        value = item()
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _length(value: Any) -> int | None:
    number = _number(value)
    if number is None or not math.isfinite(number) or number < 0:
        return None
    return int(number)


def _grouped(values: Any, n_prompts: int, what: str) -> list[list[Any]]:
    """Per-prompt groups from nested ``[[..G..] * N]`` or flat ``[N*G]`` input."""
    items = _as_list(values)
    if items and all(not isinstance(v, (str, bytes)) and (isinstance(v, Sequence) or hasattr(v, "tolist"))
                     for v in items):
        groups = [_as_list(v) for v in items]
        if len(groups) != n_prompts:
            raise ValueError(f"{what}: {len(groups)} groups for {n_prompts} prompts")
        return groups
    if n_prompts == 0:
        return []
    if len(items) % n_prompts:
        raise ValueError(f"{what}: {len(items)} values do not split into {n_prompts} equal groups")
    g = len(items) // n_prompts
    return [items[i * g:(i + 1) * g] for i in range(n_prompts)]


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices out of ``range(n)``, evenly spread, first and last included."""
    if k <= 0:
        return []
    if n <= k:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def replay_samples(
    prompts: Sequence[str] | Any,
    responses: Sequence[Sequence[str]] | Sequence[str] | Any,
    rewards: Sequence[Sequence[float]] | Sequence[float] | Any,
    lengths: Sequence[Sequence[int]] | Sequence[int] | Any | None = None,
    *,
    prompt_types: Sequence[str | None] | str | None = None,
    max_prompts: int = 8,
    max_responses: int = 8,
    max_chars: int = 2000,
) -> list[dict[str, Any]]:
    """The contract's ``samples`` list for one step's rollouts, size-capped.

    ``responses``, ``rewards`` and ``lengths`` (token counts) are either nested, one group of G
    per prompt, or flat with the G responses of a prompt next to each other (N*G, as GRPO
    trainers lay out a batch). ``prompt_types`` is one type per prompt, or one for all.

    Caps: at most ``max_prompts`` prompts, evenly spread over the batch; at most
    ``max_responses`` responses per prompt, evenly spread over the group sorted by reward so
    the best and the worst response always stay; prompt and response texts longer than
    ``max_chars`` are cut and end in ``TRUNCATION_MARKER``. Raises ValueError on mismatched
    shapes (call it outside the hot path, only when ``should_log_samples``).
    """
    prompt_list = [_text(p) for p in _as_list(prompts)]
    n = len(prompt_list)
    response_groups = _grouped(responses, n, "responses")
    reward_groups = _grouped(rewards, n, "rewards")
    length_groups = _grouped(lengths, n, "lengths") if lengths is not None else [[] for _ in range(n)]
    if prompt_types is None or isinstance(prompt_types, str):
        types: list[str | None] = [prompt_types] * n
    else:
        types = [None if t is None else _text(t) for t in _as_list(prompt_types)]
        if len(types) != n:
            raise ValueError(f"prompt_types: {len(types)} values for {n} prompts")

    samples: list[dict[str, Any]] = []
    for i in _spread(n, max_prompts):
        texts, rews, lens = response_groups[i], reward_groups[i], length_groups[i]
        if len(rews) != len(texts) or (lengths is not None and len(lens) != len(texts)):
            raise ValueError(f"prompt {i}: {len(texts)} responses, {len(rews)} rewards"
                             + (f", {len(lens)} lengths" if lengths is not None else ""))
        group = []
        for j, text in enumerate(texts):
            resp: dict[str, Any] = {"text": truncate_text(_text(text), max_chars),
                                    "reward": _number(rews[j])}
            length = _length(lens[j]) if lengths is not None else None
            if length is not None:
                resp["length"] = length
            group.append(resp)
        # Best first; a missing or NaN reward sorts last.
        group.sort(key=lambda r: reward_sort_key(r["reward"]))
        group = [group[j] for j in _spread(len(group), max_responses)]
        sample: dict[str, Any] = {"prompt": truncate_text(prompt_list[i], max_chars)}
        if types[i] is not None:
            sample["prompt_type"] = types[i]
        sample["responses"] = group
        samples.append(sample)
    return samples
