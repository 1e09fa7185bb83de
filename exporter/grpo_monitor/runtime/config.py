"""Exporter settings and the Prometheus-style value syntaxes of their flags.

The defaults of ``grpo-monitor serve``'s flags are this model's (and its Limits'): the CLI reads
them from here. A default that another module enforces is that module's constant, read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.runtime import runbook
from grpo_monitor.runtime.http import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT
from grpo_monitor.runtime.ingest import (
    DEFAULT_BACKFILL_ABOVE_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_LINE_BYTES,
)
from grpo_monitor.runtime.store import Limits

# The exporter's port when none is given, for serve's --web.listen-address and the native
# stack's exporter alike. The docs, the committed Prometheus config and the Dockerfile spell
# it out as 9400: change them together.
DEFAULT_PORT = 9400
# Where the cards' runbook_url points when Prometheus has no grpo_runbook_url external label:
# the runbook this exporter serves on its default port (runbook.py).
DEFAULT_RUNBOOK_URL = f"http://localhost:{DEFAULT_PORT}{runbook.PATH}"

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_BYTES = re.compile(r"(\d+)\s*([KMGT]i?B|B)?", re.IGNORECASE)
_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``90s``, ``1h30m`` or ``500ms``."""
    text = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h30m)")
    return total


def parse_bytes(text: str) -> int:
    """Bytes in ``16MiB``, ``512KB`` or a plain integer."""
    m = _BYTES.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 16MiB, 512KB)")
    return int(m.group(1)) * _BYTE_UNITS[(m.group(2) or "b").lower()]


def format_duration(seconds: float) -> str:
    """The Prometheus duration that parse_duration reads back as ``seconds`` (to the
    millisecond): ``3600.0`` -> ``1h``, ``9000.0`` -> ``2h30m``, ``0.5`` -> ``500ms``."""
    left = round(seconds * 1000)
    parts = []
    for unit in ("y", "w", "d", "h", "m", "s", "ms"):
        size = round(_DURATION_UNITS[unit] * 1000)
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def format_bytes(n: int) -> str:
    """The largest binary unit that holds ``n`` whole, as parse_bytes reads it: ``16MiB``."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _BYTE_UNITS[unit.lower()]
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


@dataclass
class ExporterConfig:
    snapshot_dir: Path
    listen_address: str = f":{DEFAULT_PORT}"
    poll: bool = False
    poll_interval: float = 1.0
    rescan_interval: float = 30.0
    # A folder of the exporter's own for its saved state (saved_state.py): a restart then reads
    # only what was written since. None: none saved, a start-up reads every snapshot file.
    storage_path: Path | None = None
    storage_save_interval: float = 60.0
    # An hour: ten 6-minute steps of a large run, far beyond the stall alerts' windows, so a
    # stalled run is alerted on long before it leaves /metrics.
    run_timeout: float = 3600.0
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    # A first start with more than this to read reads each long file at its head and tail, and
    # the middles after /-/ready (backfill.py); 0: every file whole before ready.
    backfill_above_bytes: int = DEFAULT_BACKFILL_ABOVE_BYTES
    # The user's names for the canonical keys, for every run (contract/key_map.py); None: none.
    key_map_file: Path | None = None
    limits: Limits = field(default_factory=Limits)
    # NVML GPU health (collectors/gpu.py): off the scrape path, every gpu_interval seconds.
    gpu_collector: bool = True
    gpu_interval: float = 5.0
    # A pynvml-shaped module for the GPU collector (tests inject a fake); None imports pynvml.
    gpu_nvml: Any = field(default=None, repr=False, compare=False)
    # Bearer token for POST /-/alertmanager/webhook (red card -> pause); None: no webhook (404).
    webhook_token_file: Path | None = None
    # Relay every webhook notification to a person: space-separated slack+https://, ntfy+https://,
    # smtp:// or smtps:// URLs (notify.py); None or "": no relay.
    notify_url: str | None = None
    # Ask this Alertmanager for red cards (alertmanager_poll.py): a fleet's exporters then pause
    # the runs of their own node, whichever exporter the webhook reaches. None: do not ask.
    alertmanager_url: str | None = None
    alertmanager_poll_interval: float = 5.0
    # exporter-toolkit web configuration (web_config.py): TLS, basic auth, response headers.
    # None: plain HTTP, no authentication.
    web_config_file: Path | None = None
    # /replay serves the prompts and responses trainers logged, which can be proprietary
    # training data: off unless asked for.
    enable_replay: bool = False
    # A whole request (TLS handshake and keep-alive wait included) must arrive within this; and
    # at most this many connections are open (http.py).
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
