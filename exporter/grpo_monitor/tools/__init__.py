"""The tools around a run: ``grpo-monitor`` subcommands, and the generators ``make docs`` runs.

Subcommands: ``report`` (the offline post-mortem), ``simulate`` (synthetic runs through the real
SDK), ``train_demo`` (a tiny real GRPO trainer), ``stack`` (the native stack as child processes)
and ``compose_init`` (the compose stack's one-shot set-up). Generators: ``metrics_doc``
(docs/metrics.md from the code's catalogs) and ``module_map`` (docs/modules.md from the
docstrings).
"""
