"""``python -m grpo_monitor.tools.report RUN_DIR [...]``: ``grpo-monitor report RUN_DIR [...]``."""

import sys

from grpo_monitor.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["report", *sys.argv[1:]]))
