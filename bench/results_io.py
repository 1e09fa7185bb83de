"""What every benchmark records about the machine, and how it writes its result file."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "machine": f"{platform.machine()} {os.cpu_count()} cpus"}


def write_result(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
