"""Collectors for sources beside the snapshot folder; each degrades to its health series alone."""

from grpo_monitor.runtime.collectors.gpu import GPUCollector

__all__ = ["GPUCollector"]
