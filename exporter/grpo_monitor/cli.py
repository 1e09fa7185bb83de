"""``grpo-monitor``: the exporter (serve), the snapshot schema, and the demo.

Flags follow Prometheus' style (``--snapshot.dir``, ``--web.listen-address``); every serve flag
can also be set in the environment as ``GRPO_MONITOR_`` + the flag in upper case with dots and
dashes as underscores (``GRPO_MONITOR_SNAPSHOT_DIR``). A flag on the command line wins.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor import __version__

ENV_PREFIX = "GRPO_MONITOR_"


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").upper().replace(".", "_").replace("-", "_")


def _add(parser: argparse.ArgumentParser, flag: str, help: str, *, default: Any = None,  # noqa: A002
         type: Callable[[str], Any] = str, action: Any = None, **kw: Any) -> None:  # noqa: A002
    env = env_name(flag)
    raw = os.environ.get(env)
    if raw is not None:
        default = (raw.lower() in ("1", "true", "yes", "on")) if action else type(raw)
    shown = "" if default is None else f" (default: {default})"
    help = f"{help}{shown} [env {env}]"
    if action:
        parser.add_argument(flag, action=action, default=default, help=help, **kw)
    else:
        parser.add_argument(flag, type=type, default=default, help=help, **kw)


def _add_serve_flags(p: argparse.ArgumentParser, *, dir_required: bool) -> None:
    from grpo_monitor.config import parse_bytes, parse_duration

    _add(p, "--snapshot.dir", "Folder the trainers write snapshots to; read recursively.",
         type=Path, required=dir_required and env_name("--snapshot.dir") not in os.environ)
    _add(p, "--web.listen-address", "Address to serve /metrics on, HOST:PORT or :PORT.",
         default=":9400")
    _add(p, "--snapshot.poll", "Poll the folder instead of inotify; for NFS and other network "
         "filesystems where inotify sees no remote writes.", default=False,
         action=argparse.BooleanOptionalAction)
    _add(p, "--snapshot.poll-interval", "How often to poll with --snapshot.poll.",
         default=1.0, type=parse_duration)
    _add(p, "--snapshot.rescan-interval", "Full rescan of the folder, a safety net for missed "
         "file events.", default=30.0, type=parse_duration)
    _add(p, "--snapshot.run-timeout", "A run with no new snapshot for this long leaves /metrics "
         "(its files stay on disk).", default=3600.0, type=parse_duration)
    _add(p, "--snapshot.max-file-bytes", "Largest *.json snapshot read; larger ones are counted "
         "as oversized.", default=16 * 2**20, type=parse_bytes)
    _add(p, "--snapshot.max-line-bytes", "Longest *.jsonl line read.", default=2**20, type=parse_bytes)
    _add(p, "--metrics.max-unknown-keys", "Per run: distinct non-canonical keys exported as "
         "grpo_metric_value before the cap drops the rest.", default=256, type=int)
    _add(p, "--metrics.max-prompt-types", "Per run: distinct by_type prompt types exported.",
         default=32, type=int)
    _add(p, "--metrics.max-event-types", "Per run: distinct event types counted.", default=32, type=int)
    _add(p, "--log.level", "Log level: debug, info, warn, error.", default="info")


def _config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from grpo_monitor.config import ExporterConfig
    from grpo_monitor.store import Limits

    v = vars(args)
    return ExporterConfig(
        snapshot_dir=v["snapshot.dir"], listen_address=v["web.listen_address"],
        poll=v["snapshot.poll"], poll_interval=v["snapshot.poll_interval"],
        rescan_interval=v["snapshot.rescan_interval"], run_timeout=v["snapshot.run_timeout"],
        max_file_bytes=v["snapshot.max_file_bytes"], max_line_bytes=v["snapshot.max_line_bytes"],
        limits=Limits(max_unknown_keys=v["metrics.max_unknown_keys"],
                      max_prompt_types=v["metrics.max_prompt_types"],
                      max_event_types=v["metrics.max_event_types"]))


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level={"warn": "WARNING"}.get(level.lower(), level.upper()),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)r",
        stream=sys.stderr)


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def cmd_serve(args: argparse.Namespace) -> int:
    from grpo_monitor.app import Exporter

    _setup_logging(args.__dict__["log.level"])
    config = _config(args)
    exporter = Exporter(config).start()
    logging.getLogger("grpo_monitor").info(
        "serving %s/metrics for snapshots under %s", exporter.url, config.snapshot_dir)
    _wait_for_signal()
    exporter.stop()
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from grpo_monitor.snapshot import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The exporter on a folder, fed a healthy synthetic run in real time."""
    from grpo_monitor.app import Exporter
    from grpo_monitor.simulate import write_run

    _setup_logging(args.__dict__["log.level"])
    if args.__dict__["snapshot.dir"] is None:
        args.__dict__["snapshot.dir"] = Path(tempfile.mkdtemp(prefix="grpo-demo-"))
    config = _config(args)
    exporter = Exporter(config).start()
    print(f"grpo-monitor demo: snapshots in {config.snapshot_dir}\n"
          f"  scrape {exporter.url}/metrics   (Ctrl-C stops)", flush=True)
    feeder = threading.Thread(
        target=write_run, args=(config.snapshot_dir, args.run, args.steps),
        kwargs={"step_seconds": args.step_seconds, "ranks": args.ranks, "realtime": True},
        daemon=True)
    feeder.start()
    if args.exit_after_run:
        feeder.join()
    else:
        _wait_for_signal()
    exporter.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-monitor", description="Signal-health monitoring for GRPO / PPO-style RL post-training.")
    parser.add_argument("--version", action="version", version=f"grpo-monitor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="Run the exporter: watch the snapshot folder, serve /metrics.",
                           description=cmd_serve.__doc__ or "Run the exporter.")
    _add_serve_flags(serve, dir_required=True)
    serve.set_defaults(func=cmd_serve)

    schema = sub.add_parser("schema", help="Print the JSON Schema of a snapshot record (contract v1).")
    schema.set_defaults(func=cmd_schema)

    demo = sub.add_parser("demo", help="Start the exporter on a temporary folder and feed it a "
                          "built-in synthetic run.", description=cmd_demo.__doc__)
    _add_serve_flags(demo, dir_required=False)
    demo.add_argument("--run", default="demo", help="Run name (default: demo).")
    demo.add_argument("--steps", type=int, default=2000, help="Steps to simulate (default: 2000).")
    demo.add_argument("--step-seconds", type=float, default=1.0, help="Seconds per step (default: 1).")
    demo.add_argument("--ranks", type=int, default=4, help="Ranks to simulate (default: 4).")
    demo.add_argument("--exit-after-run", action="store_true", help="Stop when the run is written.")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
