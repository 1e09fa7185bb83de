"""Trainer-framework integrations that feed the snapshot folder.

Each submodule imports its framework itself (``grpo_monitor.integrations.trl`` imports
transformers); importing ``grpo_monitor`` or this package imports none of them.
"""
