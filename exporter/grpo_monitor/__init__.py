"""grpo-monitor: signal-health monitoring for GRPO / PPO-style RL post-training.

The trainer side needs only ``SnapshotWriter`` (and, with torch, ``grpo_monitor.sdk.torch``);
importing this package never imports torch, transformers or the exporter's dependencies.
"""

from grpo_monitor.sdk.writer import SnapshotWriter

__version__ = "0.1.0"
__all__ = ["SnapshotWriter", "__version__"]
