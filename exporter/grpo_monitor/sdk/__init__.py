"""The trainer side: what a training job imports to write its snapshots and obey a red card."""
