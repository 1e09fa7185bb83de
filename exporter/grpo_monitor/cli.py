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
from grpo_monitor.extras import MissingExtra, require
from grpo_monitor.signals import INITIAL_STEPS

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


def _add_snapshot_dir(p: argparse.ArgumentParser, help: str, *, required: bool) -> None:  # noqa: A002
    """``--snapshot.dir``; when required, GRPO_MONITOR_SNAPSHOT_DIR can stand in for it."""
    _add(p, "--snapshot.dir", help, type=Path,
         required=required and env_name("--snapshot.dir") not in os.environ)


def _add_serve_flags(p: argparse.ArgumentParser, *, dir_required: bool) -> None:
    from grpo_monitor.config import parse_bytes, parse_duration
    from grpo_monitor.http import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT

    _add_snapshot_dir(p, "Folder the trainers write snapshots to; read recursively.",
                      required=dir_required)
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
    _add(p, "--signals.baseline-steps", "Steps of each rank's baseline period (seed 000 §3.3); "
         "cards that compare to a baseline wait for it.", default=200, type=int)
    _add(p, "--signals.initial-steps", "Steps at the start of each signal whose mean is its initial "
         "value, the reference of the cards that work before the baseline is ready (entropy below "
         "0.1x its initial value, say).", default=INITIAL_STEPS, type=int)
    _add(p, "--collector.gpu", "GPU health from NVML (pynvml); without NVML or a GPU it exports "
         "grpo_gpu_collector_up 0 and nothing else.", default=True, action=argparse.BooleanOptionalAction)
    _add(p, "--collector.gpu.interval", "How often the GPU collector reads NVML (never on a scrape).",
         default=5.0, type=parse_duration)
    _add(p, "--web.webhook-token-file", "File holding the bearer token Alertmanager sends to "
         "POST /-/alertmanager/webhook (a red card pauses its run); without it the webhook is off.",
         type=Path)
    _add(p, "--web.config.file", "Web configuration in the Prometheus exporter-toolkit format: TLS "
         "(tls_server_config), basic auth (basic_auth_users, bcrypt) on every path but the "
         "webhook's, response headers (docs/security.md). Without it: plain HTTP, no auth.",
         type=Path)
    _add(p, "--web.enable-replay", "Serve /replay: the prompts and responses trainers logged, "
         "which can be proprietary training data (behind basic auth when configured).",
         default=False, action=argparse.BooleanOptionalAction)
    _add(p, "--web.read-timeout", "A whole request (TLS handshake and keep-alive wait included) "
         "must arrive within this, or the connection is dropped: slow clients cannot hold "
         "the exporter.", default=DEFAULT_READ_TIMEOUT, type=parse_duration)
    _add(p, "--web.max-connections", "Open connections at most; a new one that finds them all "
         "taken drops the one that has waited longest for its request.",
         default=DEFAULT_MAX_CONNECTIONS, type=int)
    _add(p, "--notify.url", "Relay every card Alertmanager sends to the webhook to a person: "
         "space-separated slack+https://..., ntfy+https://..., smtp://HOST?to=ADDR URLs "
         "(docs/pause.md); needs --web.webhook-token-file.")
    _add(p, "--alertmanager.url", "Ask this Alertmanager (http://HOST:9093) for red cards and "
         "pause the runs that have a folder here: one exporter per node, whichever node the "
         "webhook reaches (docs/pause.md).")
    _add(p, "--alertmanager.poll-interval", "How often to ask --alertmanager.url.", default=5.0,
         type=parse_duration)
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
                      max_event_types=v["metrics.max_event_types"],
                      baseline_steps=v["signals.baseline_steps"],
                      initial_steps=v["signals.initial_steps"]),
        gpu_collector=v["collector.gpu"], gpu_interval=v["collector.gpu.interval"],
        webhook_token_file=v.get("web.webhook_token_file"), notify_url=v.get("notify.url") or None,
        alertmanager_url=v.get("alertmanager.url") or None,
        alertmanager_poll_interval=v["alertmanager.poll_interval"],
        web_config_file=v.get("web.config.file"), enable_replay=v["web.enable_replay"],
        read_timeout=v["web.read_timeout"], max_connections=v["web.max_connections"])


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
    try:
        exporter = Exporter(config).start()
    except ValueError as exc:
        print(f"grpo-monitor serve: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("grpo_monitor").info(
        "serving %s/metrics for snapshots under %s", exporter.url, config.snapshot_dir)
    _wait_for_signal()
    exporter.stop()
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from grpo_monitor.snapshot import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _stack(args: argparse.Namespace, snapshot_dir: Path, interval: str | None):  # type: ignore[no-untyped-def]
    from grpo_monitor.stack import NativeStack, StackConfig, project_config_dir

    config_dir = args.__dict__["config.dir"] or project_config_dir()
    if config_dir is None:
        raise SystemExit("grpo-monitor: no prometheus/ configuration found; pass --config.dir")
    state_dir = args.__dict__["stack.dir"] or Path(tempfile.mkdtemp(prefix="grpo-stack-"))
    return NativeStack(StackConfig(
        snapshot_dir=snapshot_dir, state_dir=state_dir, config_dir=config_dir,
        exporter_port=args.__dict__["exporter.port"], prometheus_port=args.__dict__["prometheus.port"],
        alertmanager_port=args.__dict__["alertmanager.port"], grafana_port=args.__dict__["grafana.port"],
        interval=interval))


def _start_stack(stack) -> int:  # type: ignore[no-untyped-def]
    try:
        stack.start()
        stack.wait_ready()
    except RuntimeError as exc:
        print(f"grpo-monitor stack: {exc}", file=sys.stderr)
        stack.stop()
        return 1
    print(f"grpo-monitor stack (state and logs in {stack.config.state_dir}):", flush=True)
    for ch in stack.children:
        print(f"  {ch.name:13} {ch.url}", flush=True)
    return 0


def cmd_stack(args: argparse.Namespace) -> int:
    """Exporter, Prometheus and Alertmanager (and Grafana, if grafana-server is installed) as
    child processes, from the project's own configuration; Ctrl-C stops them all."""
    stack = _stack(args, args.__dict__["snapshot.dir"], args.interval)
    if _start_stack(stack):
        return 1
    print("  (Ctrl-C stops all)", flush=True)
    return stack.wait()


class _CardWatcher:
    """Prints each alert the first time Alertmanager shows it."""

    def __init__(self, alertmanager_url: str) -> None:
        self.url = alertmanager_url + "/api/v2/alerts"
        self.seen: set[str] = set()
        self.names: set[str] = set()
        self._next = 0.0

    def poll(self) -> None:
        import time

        import requests

        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + 2
        try:
            alerts = requests.get(self.url, timeout=2).json()
        except (requests.RequestException, ValueError):
            return
        for alert in alerts:
            if alert["fingerprint"] in self.seen:
                continue
            self.seen.add(alert["fingerprint"])
            lbl = alert["labels"]
            self.names.add(lbl.get("alertname", ""))
            card = {"critical": "RED   ", "warning": "yellow"}.get(lbl.get("severity", ""), "other ")
            where = " ".join(f"{k}={lbl[k]}" for k in ("run", "rank", "gpu") if k in lbl)
            print(f"  [{card}] {lbl.get('alertname')} {where}: {alert['annotations'].get('summary', '')}",
                  flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole stack on a temporary folder, and a synthetic run that turns sick: watch the cards
    arrive at Alertmanager within a few minutes."""
    import time

    from grpo_monitor.simulate import write_run

    snapshot_dir = args.__dict__["snapshot.dir"] or Path(tempfile.mkdtemp(prefix="grpo-demo-"))
    stack = _stack(args, snapshot_dir, args.interval)
    if _start_stack(stack):
        return 1
    print(f"  snapshots     {snapshot_dir}\n"
          f"playing {args.scenario!r} for run {args.run!r}: {args.steps} steps of {args.step_seconds} s, "
          f"sick from step {args.onset}; cards appear below as Alertmanager receives them "
          "(Ctrl-C stops)", flush=True)
    feeder = threading.Thread(
        target=write_run, args=(snapshot_dir, args.run, args.scenario),
        kwargs={"steps": args.steps, "onset": args.onset, "step_seconds": args.step_seconds,
                "ranks": args.ranks, "realtime": True},
        daemon=True)
    feeder.start()
    cards = _CardWatcher(next(ch.url for ch in stack.children if ch.name == "alertmanager"))
    deadline = time.monotonic() + args.timeout if args.timeout else None
    result = {"status": 0}

    def tick() -> bool:
        cards.poll()
        if args.until_card and args.until_card in cards.names:
            return True
        if deadline is not None and time.monotonic() > deadline:
            print(f"grpo-monitor demo: no {args.until_card or 'end'} within {args.timeout:.0f} s",
                  file=sys.stderr)
            result["status"] = 1
            return True
        return bool(args.exit_after_run and not feeder.is_alive())

    status = stack.wait(tick)
    return status or result["status"]


def _add_stack_flags(p: argparse.ArgumentParser, interval_default: str | None) -> None:
    _add(p, "--config.dir", "Folder with prometheus.yml, rules/ and alertmanager.yml (default: the "
         "checkout's prometheus/).", type=Path)
    _add(p, "--stack.dir", "Folder for the children's generated configs, data and logs (default: "
         "a new temporary folder).", type=Path)
    for name, port in (("exporter", 9400), ("prometheus", 9090), ("alertmanager", 9093), ("grafana", 3000)):
        _add(p, f"--{name}.port", f"Loopback port of {name} (0: any free port).", default=port, type=int)
    shown = interval_default or "the configuration's own, 15s"
    p.add_argument("--interval", default=interval_default,
                   help=f"Scrape and rule-evaluation interval, e.g. 5s (default: {shown}).")


def cmd_simulate(args: argparse.Namespace) -> int:
    """Write a synthetic run: healthy, or turning sick mid-run with one of the catalog's sicknesses."""
    from grpo_monitor.simulate import SCENARIOS, write_run

    if args.list:
        for sc in SCENARIOS.values():
            cards = ", ".join(sc.alerts) or "none"
            print(f"{sc.name:26} {sc.seed_section:18} cards: {cards}\n{'':26} {sc.description}")
        return 0
    if args.scenario not in SCENARIOS:
        print(f"unknown scenario {args.scenario!r}; --list shows them", file=sys.stderr)
        return 2
    snapshot_dir = args.__dict__["snapshot.dir"]
    if snapshot_dir is None:
        print("--snapshot.dir is required", file=sys.stderr)
        return 2
    n = write_run(snapshot_dir, args.run or args.scenario, args.scenario, steps=args.steps,
                  onset=args.onset, ranks=args.ranks, step_seconds=args.step_seconds,
                  realtime=args.realtime, seed=args.seed)
    print(f"wrote {n} steps of {args.scenario!r} for {args.ranks} ranks under "
          f"{snapshot_dir / (args.run or args.scenario)}")
    return 0


def cmd_rebaseline(args: argparse.Namespace) -> int:
    """Make a run's last N steps its new baseline (seed 000 §3.3: recalibrate around step 2000)."""
    from grpo_monitor.rebaseline import request_rebaseline

    snapshot_dir = args.__dict__["snapshot.dir"]
    try:
        path, at_step = request_rebaseline(snapshot_dir, args.run, steps=args.steps, at_step=args.at_step)
    except ValueError as exc:
        print(f"grpo-monitor rebaseline: {exc}", file=sys.stderr)
        return 2
    print(f"run {args.run!r}: the {args.steps} steps up to step {at_step} become the baseline "
          f"({path}); the exporter applies it on its next read, and after a restart")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Lift a red-card pause: set the run's control record to "running". Every rank of the run
    goes on together (sdk PauseGate), by default from the last healthy checkpoint: the newest one
    saved before the card's onset. On a fleet with node-local snapshot folders, run it on any
    node that holds ranks of the run."""
    from grpo_monitor.control import ControlRecord, now_rfc3339, read_control, write_control

    snapshot_dir = args.__dict__["snapshot.dir"]
    try:
        record = read_control(snapshot_dir, args.run)
    except ValueError as exc:
        print(f"grpo-monitor resume: run {args.run!r}: bad control record: {exc}", file=sys.stderr)
        return 2
    if record is None:
        if not (Path(snapshot_dir) / args.run).is_dir():
            print(f"grpo-monitor resume: no run {args.run!r} under {snapshot_dir}", file=sys.stderr)
            return 2
        # The card's record went to another node's folder; a resume written here reaches every
        # rank of the run all the same (the newest resume wins across the process group).
        record = ControlRecord(state="running", run=args.run)
        was = "paused on another node"
    else:
        was = record.state
    if args.no_rollback:
        rollback, what = "none", "no rollback"
    elif args.rollback_to is not None:
        rollback, what = "step", f"rollback to step {args.rollback_to}"
    else:
        rollback, what = "last_healthy", "rollback to the last healthy checkpoint"
    record = record.model_copy(update={"state": "running", "resumed_at": now_rfc3339(),
                                       "rollback": rollback, "rollback_to": args.rollback_to})
    path = write_control(snapshot_dir, args.run, record)
    print(f"run {args.run!r}: {was} -> running, {what} ({path})")
    return 0


def cmd_compose_init(args: argparse.Namespace) -> int:
    """Create the stack's secrets when missing (webhook token, Grafana admin password) and let the
    exporter (uid 10001) write pause records into the snapshot folder's run folders."""
    from grpo_monitor.compose_init import run

    return run(args)


def _add_train_demo_flags(p: argparse.ArgumentParser) -> None:
    # train_demo imports torch only when training starts: the parser builds without it.
    from grpo_monitor.train_demo import add_arguments

    add_arguments(p)


def cmd_train_demo(args: argparse.Namespace) -> int:
    """A real, tiny GRPO training loop on the CPU (a ~5k-parameter GRU learning single-digit
    addition) that writes its signals to the snapshot folder; its knobs make the seeds'
    sicknesses happen for real. Needs the torch extra."""
    import time

    snapshot_dir = args.__dict__["snapshot.dir"]
    from grpo_monitor import train_demo

    require("train-demo", "torch", "torch")
    try:
        cfg = train_demo.config_from_args(args, snapshot_dir)
    except ValueError as exc:
        print(f"grpo-monitor train-demo: {exc}", file=sys.stderr)
        return 2
    every = max(cfg.steps // 10, 1)

    def progress(res) -> None:  # type: ignore[no-untyped-def]
        m = res.metrics
        if res.step % every == 0 or res.step == cfg.steps:
            print(f"step {res.step:5d}  reward {m['reward/mean']:.3f}  acc {m['eval/sample_acc']:.3f}  "
                  f"kl {m['kl/mean']:.3f}  entropy {m['entropy/mean']:.3f}  "
                  f"len {m['response/len_mean']:.2f}  zero-std {m['group/zero_std_frac']:.2f}", flush=True)

    start = time.perf_counter()
    try:
        train_demo.train(cfg, progress)
    except ValueError as exc:
        print(f"grpo-monitor train-demo: {exc}", file=sys.stderr)
        return 2
    print(f"trained {cfg.steps} steps in {time.perf_counter() - start:.1f} s; snapshots under "
          f"{Path(snapshot_dir) / cfg.run}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Offline post-mortem of one run folder (numpy and matplotlib: the report extra). Exit 0,
    or 2 when the folder has no records."""
    # report.py imports numpy at module level; check first so that a plain install gets one line.
    require("report", "report", "numpy", "matplotlib")
    from grpo_monitor.report import cmd_report as run_report

    return run_report(args)


def cmd_replay(args: argparse.Namespace) -> int:
    """Print a run's replayed samples: prompts with their G responses, rewards and lengths."""
    from grpo_monitor.replay import print_replay

    snapshot_dir = args.__dict__["snapshot.dir"]
    return print_replay(snapshot_dir, args.run, args.step)


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

    stack = sub.add_parser("stack", help="The native stack for machines without Docker.",
                           description=cmd_stack.__doc__)
    stack_sub = stack.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = stack_sub.add_parser("up", help="Start exporter, Prometheus, Alertmanager (and Grafana).",
                              description=cmd_stack.__doc__)
    _add_snapshot_dir(up, "Folder the trainers write snapshots to.", required=True)
    _add_stack_flags(up, None)
    up.set_defaults(func=cmd_stack)

    demo = sub.add_parser("demo", help="The native stack and a synthetic run that turns sick.",
                          description=cmd_demo.__doc__)
    _add(demo, "--snapshot.dir", "Folder for the run's snapshots (default: a new temporary folder).",
         type=Path)
    _add_stack_flags(demo, "5s")
    demo.add_argument("--run", default="demo", help="Run name (default: demo).")
    demo.add_argument("--scenario", default="kl_explosion", help="Scenario to play (default: "
                      "kl_explosion; `grpo-monitor simulate --list` lists them).")
    demo.add_argument("--steps", type=int, default=700, help="Steps to simulate (default: 700).")
    demo.add_argument("--onset", type=int, default=300, help="Step the sickness starts (default: 300).")
    demo.add_argument("--step-seconds", type=float, default=0.5, help="Seconds per step (default: 0.5).")
    demo.add_argument("--ranks", type=int, default=4, help="Ranks to simulate (default: 4).")
    demo.add_argument("--exit-after-run", action="store_true", help="Stop when the run is written.")
    demo.add_argument("--until-card", default=None, metavar="ALERTNAME",
                      help="Stop (status 0) once this card reaches Alertmanager.")
    demo.add_argument("--timeout", type=float, default=0.0,
                      help="With --until-card or --exit-after-run: give up after this many seconds (status 1).")
    demo.set_defaults(func=cmd_demo)

    rep = sub.add_parser("replay", help="Print a run's logged samples (seed 000 §5.2).",
                         description=cmd_replay.__doc__)
    _add_snapshot_dir(rep, "The snapshot folder.", required=True)
    rep.add_argument("run", help="Run name (its folder under the snapshot folder).")
    rep.add_argument("--step", type=int, default=None,
                     help="Step (default: the newest with samples; else the nearest earlier one).")
    rep.set_defaults(func=cmd_replay)

    report = sub.add_parser("report", help="Offline post-mortem of one run folder: summary, "
                            "verdicts, reward-vs-step.csv, curves.png, report.html (the report extra).",
                            description=cmd_report.__doc__)
    report.add_argument("run_dir", metavar="RUN_DIR", help="The run's folder (<snapshot_dir>/<run>).")
    report.add_argument("--out", default=None, metavar="DIR",
                        help="Output folder (default RUN_DIR/.report, which ingest ignores).")
    report.add_argument("--format", choices=("text", "json", "html"), default="text",
                        help="What to print: the text report, JSON, or the report.html path.")
    report.set_defaults(func=cmd_report)

    sim = sub.add_parser("simulate", help="Write a synthetic run (healthy or sick) to a snapshot folder.",
                         description=cmd_simulate.__doc__)
    _add(sim, "--snapshot.dir", "Folder to write the run under.", type=Path)
    sim.add_argument("--scenario", default="healthy", help="Scenario (default: healthy); --list shows all.")
    sim.add_argument("--list", action="store_true", help="List the scenarios and the cards each raises.")
    sim.add_argument("--run", default=None, help="Run name (default: the scenario's name).")
    sim.add_argument("--steps", type=int, default=None, help="Steps (default: the scenario's).")
    sim.add_argument("--onset", type=int, default=None, help="Step the sickness starts (default: the scenario's).")
    sim.add_argument("--ranks", type=int, default=4, help="Ranks (default: 4).")
    sim.add_argument("--step-seconds", type=float, default=5.0,
                     help="Seconds per step on the records' clock (default: 5).")
    sim.add_argument("--realtime", action="store_true",
                     help="Sleep --step-seconds per step and stamp records with the wall clock; "
                     "default: write as fast as the disk allows on a simulated clock.")
    sim.add_argument("--seed", type=int, default=0, help="Random seed (default: 0).")
    sim.set_defaults(func=cmd_simulate)

    td = sub.add_parser("train-demo", help="A real tiny GRPO training loop on the CPU (needs torch).",
                        description=cmd_train_demo.__doc__)
    _add_snapshot_dir(td, "Folder to write the run's snapshots under.", required=True)
    _add_train_demo_flags(td)
    td.set_defaults(func=cmd_train_demo)

    reb = sub.add_parser("rebaseline", help="Make a run's last N steps its new baseline.",
                         description=cmd_rebaseline.__doc__)
    _add_snapshot_dir(reb, "The exporter's snapshot folder.", required=True)
    reb.add_argument("run", help="Run name (its folder under the snapshot folder).")
    reb.add_argument("--steps", type=int, default=200, help="Baseline length in steps (default: 200).")
    reb.add_argument("--at-step", type=int, default=None,
                     help="Last step of the new baseline (default: the newest step on disk).")
    reb.set_defaults(func=cmd_rebaseline)

    init = sub.add_parser("compose-init", help="docker-compose.yml's init service: secrets and "
                          "snapshot-folder permissions before the stack starts (as root).",
                          description=cmd_compose_init.__doc__)
    from grpo_monitor.compose_init import add_arguments as add_init_arguments

    add_init_arguments(init)
    init.set_defaults(func=cmd_compose_init)

    res = sub.add_parser("resume", help="Resume a run a red card paused.", description=cmd_resume.__doc__)
    _add_snapshot_dir(res, "The exporter's snapshot folder.", required=True)
    res.add_argument("run", help="Run name (its folder under the snapshot folder).")
    choice = res.add_mutually_exclusive_group()
    choice.add_argument("--rollback-to", type=int, default=None, metavar="STEP",
                        help="Go on from this step's checkpoint instead of the last healthy one.")
    choice.add_argument("--no-rollback", action="store_true",
                        help="Go on from where the run stopped (default: from the last healthy "
                             "checkpoint, the newest saved before the card's onset).")
    res.set_defaults(func=cmd_resume)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MissingExtra as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
