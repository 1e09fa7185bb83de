"""The order of a sample's responses, shared by the SDK that logs them and the replay that
shows them.

Standard library only: the SDK imports it inside a training job.
"""

from __future__ import annotations

import math

__all__ = ["reward_sort_key"]


def reward_sort_key(reward: float | None) -> tuple[bool, float]:
    """Sort key putting the best reward first and a missing or NaN one last."""
    missing = reward is None or math.isnan(reward)
    return (missing, 0.0 if missing else -reward)  # type: ignore[operator]
