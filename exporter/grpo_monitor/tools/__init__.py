"""The tools around a run, each a ``grpo-monitor`` subcommand.

``report`` (the offline
post-mortem), ``simulate`` (synthetic runs through the real SDK), ``train_demo`` (a tiny real
GRPO trainer), ``stack`` (the native stack as child processes), ``compose_init`` (the compose
stack's one-shot set-up) and ``metrics_doc`` (docs/metrics.md from the code's catalogs).
"""
