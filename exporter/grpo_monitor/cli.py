"""``grpo-monitor``: every subcommand and its flags, in one registry.

The exporter (serve), the snapshot schema, the native stack and the demo, and the tools around a
run (simulate, train-demo, report, replay, rebaseline, resume, compose-init).

One registry: every command is one :class:`Command` in :data:`COMMANDS` (its name, help, flags and
handler), every flag one :class:`Flag` with its ``dest``, the attribute the handler reads
(``args.snapshot_dir``). A flag's default is read from the model it fills: ExporterConfig and its
Limits for ``serve``, StackConfig for the stack, train_demo.Config, simulate.write_run.

Flags follow Prometheus' style (``--snapshot.dir``, ``--web.listen-address``); every such dotted
flag can also be set in the environment as ``GRPO_MONITOR_`` + the flag in upper case with dots and
dashes as underscores (``GRPO_MONITOR_SNAPSHOT_DIR``). A flag on the command line wins.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import inspect
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

from grpo_monitor import __version__
from grpo_monitor.contract.safe_io import printable
from grpo_monitor.extras import MissingExtra, missing_dependency, require
from grpo_monitor.runtime.signals import BASELINE_STEPS

ENV_PREFIX = "GRPO_MONITOR_"
LOG_LEVEL = "info"
_TRUE_WORDS = ("1", "true", "yes", "on")


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").upper().replace(".", "_").replace("-", "_")


# -- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One command-line argument. ``name`` is its spelling (``--snapshot.dir``; without a leading
    dash, a positional argument shown as ``name``); ``dest`` the attribute a handler reads."""

    name: str
    dest: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    # "store_true" or argparse.BooleanOptionalAction for switches; None: the flag takes a value.
    action: str | type[argparse.Action] | None = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    required: bool = False
    # How --help states the default: ``show(default)`` (str unless given), or this text instead.
    show: Callable[[Any], str] = str
    shown_default: str | None = None
    # Former spellings: still accepted, left out of --help (the help names them).
    old_names: tuple[str, ...] = ()
    # Settable as GRPO_MONITOR_<FLAG>; None: the dotted (Prometheus-style) flags are.
    env: bool | None = None
    # Flags with the same key exclude each other.
    exclusive: str | None = None

    @property
    def positional(self) -> bool:
        return not self.name.startswith("-")

    @property
    def env_var(self) -> str | None:
        settable = ("." in self.name) if self.env is None else self.env
        return env_name(self.name) if settable and not self.positional else None

    def add_to(self, parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
        if self.positional:
            parser.add_argument(self.dest, metavar=self.metavar or self.name, help=self.help)
            return
        default, required = self.default, self.required
        env = self.env_var
        raw = os.environ.get(env) if env else None
        if raw is not None:  # the environment stands in for the flag (read when the parser is built)
            default = raw.lower() in _TRUE_WORDS if self.action else (self.type or str)(raw)
            required = False
        # The value's placeholder is the flag's own name (SNAPSHOT.DIR), as argparse would show
        # it without a dest; choices show themselves.
        metavar = self.metavar or (None if self.choices else self.name.lstrip("-").upper().replace("-", "_"))
        value_kw: dict[str, Any] = (
            {"action": self.action} if self.action else
            {"type": self.type, "choices": self.choices, "metavar": metavar})
        parser.add_argument(self.name, dest=self.dest, default=default, required=required,
                            help=self._help(default, env), **value_kw)
        if self.old_names:
            # SUPPRESS as the default: the old spelling, when absent, leaves the new one's default.
            parser.add_argument(*self.old_names, dest=self.dest, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS, **value_kw)

    def _help(self, default: Any, env: str | None) -> str:
        if self.shown_default is not None:
            shown = self.shown_default
        elif default is None or self.action in ("store_true", "store_false"):
            shown = ""
        else:
            shown = self.show(default)
        text = self.help + (f" (default: {shown})" if shown else "")
        if self.old_names:
            text += f" Formerly {', '.join(self.old_names)}, which still works."
        if env:
            text += f" [env {env}]"
        return text.replace("%", "%%")  # argparse %-formats help


@dataclass(frozen=True)
class Command:
    """One subcommand. ``name`` may be two words (``stack up``): an action under a group of
    COMMAND_GROUPS. ``flags`` is called when the parser is built, so that the defaults it reads
    from the models (and the environment) are current; its imports must not need an extra."""

    name: str
    help: str
    flags: Callable[[], Sequence[Flag]]
    handler: Callable[[argparse.Namespace], int]

    @property
    def description(self) -> str:
        return inspect.getdoc(self.handler) or self.help


def register(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    """Add flags to a parser: the one way every flag gets there."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for flag in flags:
        if flag.exclusive is None:
            flag.add_to(parser)
        else:
            if flag.exclusive not in groups:
                groups[flag.exclusive] = parser.add_mutually_exclusive_group()
            flag.add_to(groups[flag.exclusive])


def _model_defaults(model: Any) -> dict[str, Any]:
    """Field defaults of a dataclass, or keyword defaults of a function."""
    if dataclasses.is_dataclass(model):
        return {f.name: f.default for f in dataclasses.fields(model)
                if f.default is not dataclasses.MISSING}
    return {name: p.default for name, p in inspect.signature(model).parameters.items()
            if p.default is not inspect.Parameter.empty}


# -- flags shared by several commands ----------------------------------------------------------


def _snapshot_dir(help: str, *, required: bool = True, env: bool | None = None,  # noqa: A002
                  default: Path | None = None) -> Flag:
    """``--snapshot.dir``; when required, GRPO_MONITOR_SNAPSHOT_DIR can stand in for it."""
    return Flag("--snapshot.dir", "snapshot_dir", help, default, type=Path, required=required, env=env)


def _run_name() -> Flag:
    return Flag("run", "run", "Run name (its folder under the snapshot folder).")


def _write_run_defaults() -> dict[str, Any]:
    from grpo_monitor.tools.simulate import write_run

    return _model_defaults(write_run)


def _scenario(help: str, default: str) -> Flag:
    from grpo_monitor.tools.simulate import SCENARIOS

    # A typo is a usage error at once, not a feeder that dies after the stack started.
    return Flag("--scenario", "scenario", help, default, choices=tuple(SCENARIOS), metavar="SCENARIO")


def _simulated_steps(default: int | None, shown: str | None = None) -> Flag:
    return Flag("--simulated-steps", "simulated_steps", "Steps of the synthetic run to write.",
                default, type=int, shown_default=shown, old_names=("--steps",))


# -- serve --------------------------------------------------------------------------------------


def _serve_flags() -> list[Flag]:
    # dest is the ExporterConfig (or Limits) field the flag sets; _config() relies on it.
    from grpo_monitor.runtime.config import (
        ExporterConfig,
        format_bytes,
        format_duration,
        parse_bytes,
        parse_duration,
    )
    from grpo_monitor.runtime.store import Limits

    d, lim = _model_defaults(ExporterConfig), _model_defaults(Limits)

    def duration(name: str, dest: str, help: str) -> Flag:  # noqa: A002
        return Flag(name, dest, help, d[dest], type=parse_duration, show=format_duration)

    def size(name: str, dest: str, help: str) -> Flag:  # noqa: A002
        return Flag(name, dest, help, d[dest], type=parse_bytes, show=format_bytes)

    def switch(name: str, dest: str, help: str) -> Flag:  # noqa: A002
        return Flag(name, dest, help, d[dest], action=argparse.BooleanOptionalAction)

    def limit(name: str, dest: str, help: str) -> Flag:  # noqa: A002
        return Flag(name, dest, help, lim[dest], type=int)

    return [
        _snapshot_dir("Folder the trainers write snapshots to; read recursively."),
        Flag("--web.listen-address", "listen_address",
             "Address to serve /metrics on, HOST:PORT or :PORT.", d["listen_address"]),
        switch("--snapshot.poll", "poll", "Poll the folder instead of inotify; for NFS and other "
               "network filesystems where inotify sees no remote writes."),
        duration("--snapshot.poll-interval", "poll_interval", "How often to poll with --snapshot.poll."),
        duration("--snapshot.rescan-interval", "rescan_interval",
                 "Full rescan of the folder, a safety net for missed file events."),
        Flag("--storage.path", "storage_path", "Folder of the exporter's own (not the snapshot "
             "folder) for its saved state: a restart reads only what was written since, ready in "
             "seconds at any run length (docs/scaling.md). Without it every start-up reads every "
             "snapshot file.", d["storage_path"], type=Path),
        duration("--storage.save-interval", "storage_save_interval",
                 "How often the state is saved to --storage.path (and once at a clean stop)."),
        duration("--snapshot.run-timeout", "run_timeout", "A run with no new snapshot for this long "
                 "leaves /metrics (its files stay on disk)."),
        size("--snapshot.max-file-bytes", "max_file_bytes",
             "Largest *.json snapshot read; larger ones are counted as oversized."),
        size("--snapshot.max-line-bytes", "max_line_bytes", "Longest *.jsonl line read."),
        size("--snapshot.backfill-above-bytes", "backfill_above_bytes", "A start-up that finds "
             "more than this to read without a saved state reads each long *.jsonl file at its "
             "head (the baseline) and tail (the windows), and is ready then; it reads the middles "
             "after, and the families that need every record are published once "
             "grpo_exporter_partial_runs is 0 (docs/scaling.md#first-start). 0: every file whole "
             "before ready."),
        Flag("--snapshot.key-map", "key_map_file", "TOML file mapping the names runs log onto "
             "the canonical keys, for every run (a run folder's own .grpo-keys.toml goes on top; "
             "grpo-monitor check prints the lines to paste; docs/snapshot-format.md).",
             d["key_map_file"], type=Path),
        limit("--metrics.max-unknown-keys", "max_unknown_keys", "Per run: distinct non-canonical "
              "keys exported as grpo_metric_value before the cap drops the rest."),
        limit("--metrics.max-prompt-types", "max_prompt_types", "Per run: distinct by_type prompt "
              "types exported."),
        limit("--metrics.max-event-types", "max_event_types", "Per run: distinct event types counted."),
        limit("--metrics.max-runs", "max_runs", "Runs exported at once; a record of another run is "
              "refused and counted (grpo_snapshot_errors_total{reason=\"run_limit\"})."),
        limit("--signals.baseline-steps", "baseline_steps", "Steps of each rank's baseline period, "
              "its first steps; cards that compare to a baseline wait for it."),
        limit("--signals.initial-steps", "initial_steps", "Steps at the start of each signal whose "
              "mean is its initial value, the reference of the cards that work before the baseline "
              "is ready (entropy below 0.1x its initial value, say)."),
        switch("--collector.gpu", "gpu_collector", "GPU health from NVML (pynvml); without NVML or "
               "a GPU it exports grpo_gpu_collector_up 0 and nothing else."),
        duration("--collector.gpu.interval", "gpu_interval",
                 "How often the GPU collector reads NVML (never on a scrape)."),
        Flag("--web.webhook-token-file", "webhook_token_file", "File holding the bearer token "
             "Alertmanager sends to POST /-/alertmanager/webhook (a red card pauses its run); "
             "without it the webhook is off.", d["webhook_token_file"], type=Path),
        Flag("--web.config.file", "web_config_file", "Web configuration in the Prometheus "
             "exporter-toolkit format: TLS (tls_server_config), basic auth (basic_auth_users, "
             "bcrypt) on every path but the webhook's, response headers (docs/security.md). "
             "Without it: plain HTTP, no auth.", d["web_config_file"], type=Path),
        switch("--web.enable-replay", "enable_replay", "Serve /replay: the prompts and responses "
               "trainers logged, which can be proprietary training data (behind basic auth when "
               "configured)."),
        duration("--web.read-timeout", "read_timeout", "A whole request (TLS handshake and "
                 "keep-alive wait included) must arrive within this, or the connection is dropped: "
                 "slow clients cannot hold the exporter."),
        Flag("--web.max-connections", "max_connections", "Open connections at most; a new one that "
             "finds them all taken drops the one that has waited longest for its request.",
             d["max_connections"], type=int),
        Flag("--notify.url", "notify_url", "Relay every card Alertmanager sends to the webhook to a "
             "person: space-separated slack+https://..., ntfy+https://..., smtp://HOST?to=ADDR URLs "
             "(docs/pause.md); needs --web.webhook-token-file.", d["notify_url"]),
        Flag("--alertmanager.url", "alertmanager_url", "Ask this Alertmanager (http://HOST:9093) for "
             "red cards and pause the runs that have a folder here: one exporter per node, "
             "whichever node the webhook reaches (docs/pause.md).", d["alertmanager_url"]),
        duration("--alertmanager.poll-interval", "alertmanager_poll_interval",
                 "How often to ask --alertmanager.url."),
        Flag("--log.level", "log_level", "Log level: debug, info, warn, error.", LOG_LEVEL),
    ]


def _config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The ExporterConfig of parsed serve flags: each flag's dest is the field it sets."""
    from grpo_monitor.runtime.config import ExporterConfig
    from grpo_monitor.runtime.store import Limits

    given = vars(args)
    limits = Limits(**{f.name: given[f.name] for f in dataclasses.fields(Limits) if f.name in given})
    settings = {f.name: given[f.name] for f in dataclasses.fields(ExporterConfig) if f.name in given}
    # An empty environment variable (compose's ${GRPO_NOTIFY_URL:-}) means "not set".
    for name in ("notify_url", "alertmanager_url"):
        settings[name] = settings.get(name) or None
    return ExporterConfig(**settings, limits=limits)


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
    """Run the exporter: watch the snapshot folder, serve /metrics. SIGINT or SIGTERM stops it."""
    from grpo_monitor.runtime.app import Exporter

    _setup_logging(args.log_level)
    config = _config(args)
    try:
        exporter = Exporter(config).start()
    except ValueError as exc:
        print(f"grpo-monitor serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the listening socket: a busy port, a privileged one, no such address
        print(f"grpo-monitor serve: cannot listen on {config.listen_address}: "
              f"{(exc.strerror or str(exc)).lower()}; pick another with --web.listen-address",
              file=sys.stderr)
        return 2
    logging.getLogger("grpo_monitor").info(
        "serving %s/metrics for snapshots under %s", exporter.url, config.snapshot_dir)
    _wait_for_signal()
    exporter.stop()
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from grpo_monitor.contract.snapshot import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


# -- the native stack and the demo ---------------------------------------------------------------


def _stack_flags(interval: str | None) -> list[Flag]:
    from grpo_monitor.tools.stack import ENGINES, StackConfig

    d = _model_defaults(StackConfig)
    return [
        Flag("--config.dir", "config_dir", "Folder with prometheus.yml, rules/ and alertmanager.yml.",
             type=Path, shown_default="the checkout's prometheus/, else the installed copy"),
        Flag("--stack.dir", "state_dir", "Folder for the children's generated configs, data and logs.",
             type=Path, shown_default="a temporary folder, removed on exit"),
        Flag("--stack.engine", "engine", "What stores the samples and evaluates the rules: "
             "prometheus, or victoriametrics (vmagent + victoria-metrics + vmalert, for jobs that "
             "outgrow one Prometheus; docs/scaling.md#victoriametrics).", d["engine"],
             choices=ENGINES),
        *(Flag(f"--{name}.port", f"{name}_port", f"Loopback port of {name} (0: any free port).",
               d[f"{name}_port"], type=int)
          for name in ("exporter", "prometheus", "alertmanager", "grafana", "victoriametrics",
                       "vmagent", "vmalert")),
        Flag("--interval", "interval", "Scrape and rule-evaluation interval, e.g. 5s.", interval,
             shown_default=None if interval else "the configuration's own, 15s"),
        Flag("--notify.url", "notify_url", "Relay every card to a person as well (the exporter's "
             "--notify.url): space-separated slack+https://..., ntfy+https://..., "
             "smtp://HOST?to=ADDR URLs (docs/pause.md).", d["notify_url"]),
    ]


@contextlib.contextmanager
def _folder(given: Path | None, prefix: str) -> Iterator[Path]:
    """``given``, or a new temporary folder that is removed on the way out, Ctrl-C included."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


def _interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C until the stack's own handler takes over: the children and
    the temporary folders go with it."""
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _run_stack(args: argparse.Namespace, command: str, snapshot_dir: Path,
               play: Callable[[Any], Callable[[], bool] | None] | None = None) -> int:
    """Start the native stack on ``snapshot_dir``, say where to look, print the cards and pause
    records as they come; ``play(stack)`` starts what feeds it and returns the demo's own
    ``tick`` (True: stop now). Exit 2 for what a person fixes (a busy port, a missing binary),
    1 when a child dies."""
    from grpo_monitor.tools.stack import (
        GRAFANA_MISSING,
        CardPrinter,
        NativeStack,
        PausePrinter,
        PortBusy,
        StackConfig,
        StackError,
        project_config_dir,
        where_to_look,
    )

    config_dir = args.config_dir or project_config_dir()
    if config_dir is None:
        print(f"grpo-monitor {command}: no prometheus/ configuration found; pass --config.dir",
              file=sys.stderr)
        return 2
    _interrupt_on_sigterm()
    with _folder(args.state_dir, "grpo-stack-") as state_dir:
        stack = NativeStack(StackConfig(
            snapshot_dir=snapshot_dir, state_dir=state_dir, config_dir=config_dir,
            exporter_port=args.exporter_port, prometheus_port=args.prometheus_port,
            alertmanager_port=args.alertmanager_port, grafana_port=args.grafana_port,
            interval=args.interval, notify_url=args.notify_url or None, engine=args.engine,
            victoriametrics_port=args.victoriametrics_port, vmagent_port=args.vmagent_port,
            vmalert_port=args.vmalert_port))
        try:
            try:
                stack.start()
                stack.wait_ready()
            except PortBusy as exc:
                print(f"grpo-monitor {command}: {exc}; move it with --{exc.name}.port N "
                      "(0: any free port)", file=sys.stderr)
                return 2
            except StackError as exc:
                print(f"grpo-monitor {command}: {exc}", file=sys.stderr)
                return 2
            except RuntimeError as exc:
                print(f"grpo-monitor {command}: {exc}", file=sys.stderr)
                return 1
            kept = "" if args.state_dir else ", removed on exit"
            print(f"grpo-monitor {command} (configs, data and logs in {state_dir}{kept}):", flush=True)
            for line in where_to_look(stack.children):
                print(f"  {line}", flush=True)
            if not any(ch.name == "grafana" for ch in stack.children):
                print(f"  {GRAFANA_MISSING}", flush=True)
            print(f"  snapshots     {snapshot_dir}", flush=True)
            alertmanager = next(ch.url for ch in stack.children if ch.name == "alertmanager")
            cards, pauses = CardPrinter(alertmanager, _say), PausePrinter(snapshot_dir, _say)
            demo_tick = play(SimpleNamespace(stack=stack, cards=cards, pauses=pauses)) if play else None
            print("cards and pause records appear below as they happen (Ctrl-C stops all)", flush=True)

            def tick() -> bool:
                cards.poll()
                pauses.poll()
                return bool(demo_tick and demo_tick())

            return stack.wait(tick)
        except KeyboardInterrupt:  # Ctrl-C before the stack's own handler was in place
            return 130
        finally:
            stack.stop()


def _say(line: str) -> None:
    print(line, flush=True)


def _stack_up_flags() -> list[Flag]:
    return [_snapshot_dir("Folder the trainers write snapshots to."), *_stack_flags(None)]


def cmd_stack(args: argparse.Namespace) -> int:
    """Exporter, Prometheus and Alertmanager (and Grafana, if grafana-server is installed) as
    child processes, from the project's own configuration. Prints the pages that answer, each
    card as Alertmanager holds it active, and each pause record the exporter writes; Ctrl-C
    stops them all."""
    return _run_stack(args, "stack", args.snapshot_dir)


def _demo_flags() -> list[Flag]:
    run = _write_run_defaults()
    return [
        _snapshot_dir("Folder for the run's snapshots.", required=False),
        *_stack_flags("5s"),
        Flag("--trainer", "trainer", "Play the tiny real trainer (train-demo; the torch extra) "
             "instead of the synthetic run: its verifier returns NaN once at step --onset, the red "
             "card pauses the training loop, and the demo resumes it --resume-after seconds later "
             "from the last healthy checkpoint.", False, action="store_true"),
        Flag("--run", "run", "Run name.", shown_default="demo; train-demo with --trainer"),
        _scenario("Scenario to play (`grpo-monitor simulate --list` lists them).", "kl_explosion"),
        _simulated_steps(700),
        Flag("--training-steps", "training_steps", "With --trainer: its training steps.", 200, type=int),
        Flag("--onset", "onset", "Step the sickness starts.", type=int,
             shown_default=f"{DEMO_ONSET}; {TRAINER_ONSET} with --trainer"),
        Flag("--step-seconds", "step_seconds", "Seconds per step.", 0.5, type=float),
        Flag("--resume-after", "resume_after", "With --trainer: resume a paused run this many "
             "seconds after its pause record appears, as `grpo-monitor resume RUN` does (0: leave "
             "it to you).", 10.0, type=float),
        Flag("--ranks", "ranks", "Ranks to simulate.", run["ranks"], type=int),
        Flag("--exit-after-run", "exit_after_run", "Stop when the run is written.", False,
             action="store_true"),
        Flag("--until-card", "until_card", "Stop (status 0) once this card reaches Alertmanager.",
             metavar="ALERTNAME"),
        Flag("--timeout", "timeout", "With --until-card or --exit-after-run: give up after this many "
             "seconds (status 1).", 0.0, type=float, shown_default="0, never"),
    ]


# The demo's sickness onsets: past the synthetic run's 200-step baseline; early for the trainer,
# whose red card (a NaN) needs no baseline.
DEMO_ONSET = 300
TRAINER_ONSET = 50


def _play_synthetic(args: argparse.Namespace, snapshot_dir: Path, run: str, onset: int) -> threading.Thread:
    from grpo_monitor.tools.simulate import write_run

    print(f"playing {args.scenario!r} for run {run!r}: {args.simulated_steps} steps of "
          f"{args.step_seconds} s, sick from step {onset}", flush=True)
    feeder = threading.Thread(
        target=write_run, args=(snapshot_dir, run, args.scenario),
        kwargs={"steps": args.simulated_steps, "onset": onset, "step_seconds": args.step_seconds,
                "ranks": args.ranks, "realtime": True},
        daemon=True)
    feeder.start()
    return feeder


class _Trainer:
    """``grpo-monitor train-demo`` as a child process, its output printed as it comes."""

    def __init__(self, argv: list[str]) -> None:
        import subprocess

        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._relay, daemon=True)
        self.reader.start()
        self.stopped = False  # by the demo, not by itself

    def _relay(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            _say(f"  trainer       {line.rstrip()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failed(self) -> bool:
        """It ended by itself with an error (its own lines said which)."""
        return not self.stopped and self.proc.poll() not in (None, 0)

    def stop(self) -> None:
        if self.alive():
            self.stopped = True
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:  # noqa: BLE001 -- it would not stop: kill it
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole stack on a temporary folder, and a run that turns sick: a synthetic one, or with
    --trainer the tiny real trainer, whose red card pauses its training loop until the demo (or
    you) resumes it from the last healthy checkpoint. Cards arrive within a few minutes."""
    import time

    if args.trainer:
        require("demo --trainer", "torch", "torch")
    run = args.run or ("train-demo" if args.trainer else "demo")
    onset = args.onset if args.onset is not None else (TRAINER_ONSET if args.trainer else DEMO_ONSET)
    with _folder(args.snapshot_dir, "grpo-demo-") as snapshot_dir:
        stopped: list[_Trainer] = []

        def play(live: Any) -> Callable[[], bool]:
            deadline = time.monotonic() + args.timeout if args.timeout else None
            if args.trainer:
                trainer = _Trainer([
                    sys.executable, "-m", "grpo_monitor.cli", "train-demo",
                    "--snapshot.dir", str(snapshot_dir), "--run", run,
                    "--training-steps", str(args.training_steps), "--nan-reward-at", str(onset),
                    "--checkpoint-every", "20", "--step-seconds", str(args.step_seconds)])
                stopped.append(trainer)
                print(f"training run {run!r} for real: {args.training_steps} steps of at least "
                      f"{args.step_seconds} s, a checkpoint every 20, the verifier's NaN at step "
                      f"{onset}", flush=True)
                running = trainer.alive
            else:
                running = _play_synthetic(args, snapshot_dir, run, onset).is_alive
                live.pauses.deaf.add(run)  # write_run reads no pause record
            paused_since: dict[str, float] = {}
            ended: list[bool] = []

            def tick() -> bool:
                if args.trainer and args.resume_after > 0:
                    _resume_when_due(live.pauses.paused, paused_since, run, snapshot_dir,
                                     args.resume_after)
                if args.until_card and args.until_card in live.cards.names:
                    return True
                if deadline is not None and time.monotonic() > deadline:
                    print(f"grpo-monitor demo: no {args.until_card or 'end'} within "
                          f"{args.timeout:.0f} s", file=sys.stderr)
                    result["status"] = 1
                    return True
                if running():
                    return False
                if not args.trainer and not ended:
                    ended.append(True)
                    _say(f"  demo          the simulated run {run!r} wrote its last step "
                         f"({args.simulated_steps}); "
                         + ("stopping" if args.exit_after_run else "the stack stays up until Ctrl-C"))
                # The trainer's end, if it failed (its own lines said why); else as asked.
                return args.exit_after_run or any(t.failed() for t in stopped)

            return tick

        result = {"status": 0}
        try:
            status = _run_stack(args, "demo", snapshot_dir, play)
        finally:
            for trainer in stopped:
                trainer.stop()
        if status == 0 and any(t.failed() for t in stopped):
            status = 1
        return status or result["status"]


def _resume_when_due(paused: dict[str, int | None], since: dict[str, float], run: str,
                     snapshot_dir: Path, after: float) -> None:
    """Resume ``run`` once its pause is ``after`` seconds old, as a person would."""
    import time

    if run not in paused:
        since.pop(run, None)
        return
    first = since.setdefault(run, time.monotonic())
    if time.monotonic() - first < after:
        return
    since[run] = math.inf  # once per pause
    _say(f"  demo          {after:.0f} s later, as a person would: grpo-monitor resume "
         f"--snapshot.dir {snapshot_dir} {run}")
    # No --wait: the demo's own [resume] line says what the trainer did when it answers.
    cmd_resume(argparse.Namespace(snapshot_dir=snapshot_dir, run=run, rollback_to=None,
                                  no_rollback=False, force=False, wait=0.0))


# -- runs: simulate, train-demo, report, replay, rebaseline, resume ------------------------------


def _simulate_flags() -> list[Flag]:
    run = _write_run_defaults()
    return [
        _snapshot_dir("Folder to write the run under.", required=False),
        _scenario("Scenario; --list shows all.", run["scenario"]),
        Flag("--list", "list", "List the scenarios and the cards each raises.", False,
             action="store_true"),
        Flag("--run", "run", "Run name.", shown_default="the scenario's name"),
        _simulated_steps(run["steps"], "the scenario's"),
        Flag("--onset", "onset", "Step the sickness starts.", run["onset"], type=int,
             shown_default="the scenario's"),
        Flag("--ranks", "ranks", "Ranks.", run["ranks"], type=int),
        Flag("--step-seconds", "step_seconds", "Seconds per step on the records' clock.",
             run["step_seconds"], type=float),
        Flag("--realtime", "realtime", "Sleep --step-seconds per step and stamp records with the "
             "wall clock; default: write as fast as the disk allows on a simulated clock.",
             run["realtime"], action="store_true"),
        Flag("--seed", "seed", "Random seed.", run["seed"], type=int),
    ]


def cmd_simulate(args: argparse.Namespace) -> int:
    """Write a synthetic run: healthy, or turning sick mid-run with one of the catalog's sicknesses."""
    from grpo_monitor.tools.simulate import SCENARIOS, write_run

    if args.list:
        for sc in SCENARIOS.values():
            cards = ", ".join(sc.alerts) or "none"
            print(f"{sc.name:26} cards: {cards}\n{'':26} {sc.description} ({sc.reference})")
        return 0
    if args.snapshot_dir is None:
        print("--snapshot.dir is required", file=sys.stderr)
        return 2
    n = write_run(args.snapshot_dir, args.run or args.scenario, args.scenario,
                  steps=args.simulated_steps, onset=args.onset, ranks=args.ranks,
                  step_seconds=args.step_seconds, realtime=args.realtime, seed=args.seed)
    print(f"wrote {n} steps of {args.scenario!r} for {args.ranks} ranks under "
          f"{args.snapshot_dir / (args.run or args.scenario)}")
    return 0


def _train_demo_flags() -> list[Flag]:
    # dest is the train_demo.Config field the flag sets (train_demo.config_from_args reads them).
    # train_demo imports torch only when training starts: its Config is there without it.
    from grpo_monitor.tools.train_demo import (
        DIFFICULTIES,
        LOSS_AGGREGATIONS,
        ROLLOUT_PRECISIONS,
        Config,
    )

    d = _model_defaults(Config)

    def knob(name: str, help: str, type: Callable[[str], Any] | None = None, **kw: Any) -> Flag:  # noqa: A002
        dest = name.lstrip("-").replace("-", "_")
        return Flag(name, dest, help, d[dest], type=type, **kw)

    return [
        _snapshot_dir("Folder to write the run's snapshots under."),
        knob("--run", "Run name."),
        Flag("--training-steps", "steps", "Training steps.", d["steps"], type=int,
             old_names=("--steps",)),
        knob("--seed", "Random seed.", int),
        knob("--prompts", "Prompts per step.", int),
        knob("--group-size", "G, sampled answers per prompt; 2 starves the advantage.", int),
        knob("--temperature", "Sampling temperature; 0.15 with --group-size 2 collapses entropy "
             "(at 0.3 it only falls to ~0.15x its initial value: no collapse).", float),
        knob("--lr", "Adam learning rate.", float),
        knob("--beta", "KL coefficient; 0 with a high --lr blows KL up.", float),
        knob("--inner-epochs", "Optimisation passes per batch.", int),
        knob("--max-new-tokens", "Generation length limit.", int),
        knob("--pretrain-steps", "Supervised warm-start steps before RL; 0 starts from a random "
             "policy.", int),
        knob("--grader", "strict: pays for the right answer; loose: also pays per generated token "
             "(reward hacking with a length surge).", choices=("strict", "loose")),
        knob("--length-penalty", "Charge X reward per answer token beyond --length-budget; 1.2 "
             "makes a right two-digit (carry) answer cost more than it earns: shortcut learning by "
             "prompt type.", float, metavar="X"),
        knob("--length-budget", "Answer tokens free of --length-penalty.", int, metavar="N"),
        knob("--difficulty", "mixed: a+b= with one-digit operands; hard: two-digit operands the "
             "policy cannot solve; easy: a+0=, which it has solved.", choices=DIFFICULTIES),
        knob("--loss-agg", "token-mean over the batch's tokens, or seq-mean-token-mean: each "
             "response normalised by its own length, Dr. GRPO's length bias.",
             choices=LOSS_AGGREGATIONS),
        knob("--rollout-precision", "The rollout side's precision; the trainer stays fp32.",
             choices=ROLLOUT_PRECISIONS),
        knob("--rollout-temperature", "The rollout side samples and scores at T while the trainer "
             "uses --temperature: a rollout/trainer mismatch.", float, metavar="T",
             shown_default="the same"),
        knob("--rollout-lag", "Rollouts from the policy K updates old, as an asynchronous rollout "
             "side.", int, metavar="K"),
        knob("--rollout-lag-growth", "The lag grows by one every N steps: a rollout side falling "
             "behind.", int, metavar="N", shown_default="0, no growth"),
        knob("--nan-reward-at", "The verifier returns NaN for one sample at this step.", int,
             metavar="STEP"),
        knob("--onset", "Apply the sickness knobs (--grader, --beta, --lr, --temperature, "
             "--group-size, --difficulty, --length-penalty, --loss-agg, --rollout-*, --slow-rank) "
             "only from this step; before it the defaults train.", int, metavar="STEP",
             shown_default="0, sick from the start"),
        knob("--cured-by-rollback", "Turn the sickness knobs off at the first rollback (the fix a "
             "person makes before resuming): the steps trained again are healthy.",
             action="store_true"),
        knob("--slow-rank", "Log extra ranks' perf signals (simulated from rank 0's step time), "
             "the last one slowed by --slow-factor.", action="store_true"),
        knob("--ranks", "Ranks logged with --slow-rank, at least 2; 3+ lets GRPORankStraggler "
             "compare.", int, shown_default="2 with --slow-rank"),
        knob("--slow-factor", "Step-time factor of the slow rank.", float),
        knob("--checkpoint-every", "Save a checkpoint (and log a checkpoint_save event) every N "
             "steps.", int),
        knob("--checkpoint-dir", "Where checkpoints go.", Path,
             shown_default="serialised in memory only"),
        knob("--threads", "torch threads.", int),
        knob("--step-seconds", "Each step lasts at least this long, so that a card can arrive (and "
             "pause the loop) while it trains; 0: as fast as the CPU goes (300 steps in ~10 s).",
             float),
        knob("--pause-poll-s", "While a red card pauses the loop, look for the resume this often.",
             float, metavar="SECONDS"),
    ]


def cmd_train_demo(args: argparse.Namespace) -> int:
    """A real, tiny GRPO training loop on the CPU (a ~5k-parameter GRU learning single-digit
    addition) that writes its signals to the snapshot folder; its knobs make the sicknesses of
    docs/background.md happen for real. Every step passes PauseGate: a red card holds the loop
    until `grpo-monitor resume` rolls it back to the last healthy checkpoint. Needs the torch
    extra."""
    import time

    from grpo_monitor.tools import train_demo

    require("train-demo", "torch", "torch")
    try:
        cfg = train_demo.config_from_args(args, args.snapshot_dir)
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

    print(f"training run {cfg.run!r}: {cfg.steps} steps of at least {cfg.step_seconds} s, "
          f"snapshots under {Path(args.snapshot_dir) / cfg.run}", flush=True)
    start = time.perf_counter()
    try:
        train_demo.train(cfg, progress, note=lambda line: print(line, flush=True))
    except ValueError as exc:
        print(f"grpo-monitor train-demo: {exc}", file=sys.stderr)
        return 2
    print(f"trained {cfg.steps} steps in {time.perf_counter() - start:.1f} s; snapshots under "
          f"{Path(args.snapshot_dir) / cfg.run}")
    return 0


def _report_flags() -> list[Flag]:
    return [
        Flag("RUN_DIR", "run_dir", "The run's folder (<snapshot_dir>/<run>)."),
        Flag("--out", "out", "Output folder.", metavar="DIR",
             shown_default="RUN_DIR/.report, which ingest ignores"),
        Flag("--format", "format", "What to print: the text report, JSON, or the report.html path.",
             "text", choices=("text", "json", "html")),
    ]


def cmd_report(args: argparse.Namespace) -> int:
    """Offline post-mortem of one run folder (numpy and matplotlib: the report extra). Exit 0,
    or 2 when the folder has no records."""
    # report.py imports numpy at module level; check first so that a plain install gets one line.
    require("report", "report", "numpy", "matplotlib")
    from grpo_monitor.tools.report import cmd_report as run_report

    return run_report(args)


def _replay_flags() -> list[Flag]:
    return [
        _snapshot_dir("The snapshot folder."),
        _run_name(),
        Flag("--step", "step", "Step.", type=int,
             shown_default="the newest with samples; else the nearest earlier one"),
    ]


def cmd_replay(args: argparse.Namespace) -> int:
    """Print a run's replayed samples: prompts with their G responses, rewards and lengths."""
    from grpo_monitor.runtime.replay import print_replay

    if not Path(args.snapshot_dir).is_dir():
        print(f"grpo-monitor replay: no snapshot folder {args.snapshot_dir}", file=sys.stderr)
        return 2
    return print_replay(args.snapshot_dir, args.run, args.step)


def _rebaseline_flags() -> list[Flag]:
    return [
        _snapshot_dir("The exporter's snapshot folder."),
        _run_name(),
        Flag("--baseline-steps", "baseline_steps", "Length of the new baseline in steps.",
             BASELINE_STEPS, type=int, old_names=("--steps",)),
        Flag("--at-step", "at_step", "Last step of the new baseline.", type=int,
             shown_default="the newest step on disk"),
    ]


def cmd_rebaseline(args: argparse.Namespace) -> int:
    """Make a run's last N steps its new baseline: a long run's normal drifts from its first
    steps' (recalibrate around step 2000, say)."""
    from grpo_monitor.runtime.rebaseline import request_rebaseline

    try:
        path, at_step = request_rebaseline(args.snapshot_dir, args.run, steps=args.baseline_steps,
                                           at_step=args.at_step)
    except ValueError as exc:
        print(f"grpo-monitor rebaseline: {exc}", file=sys.stderr)
        return 2
    print(f"run {args.run!r}: the {args.baseline_steps} steps up to step {at_step} become the "
          f"baseline ({printable(path)}); the exporter applies it on its next read, and after a "
          "restart")
    return 0


def _resume_flags() -> list[Flag]:
    return [
        _snapshot_dir("The exporter's snapshot folder."),
        _run_name(),
        Flag("--rollback-to", "rollback_to", "Go on from this step's checkpoint instead of the last "
             "healthy one.", type=int, metavar="STEP", exclusive="rollback"),
        Flag("--no-rollback", "no_rollback", "Go on from where the run stopped (default: from the "
             "last healthy checkpoint, the newest saved before the card's onset).", False,
             action="store_true", exclusive="rollback"),
        Flag("--force", "force", "Write a running record even though this folder holds no pause "
             "of the run: for a fleet whose red card paused the run in another node's folder (a "
             "resume written here reaches every rank all the same).", False, action="store_true"),
        Flag("--wait", "wait", "Wait this long for the trainer's answer (its rollback mark, or "
             "its next step) and say what it did; 0s: say what was asked and return.", 0.0,
             type=_parse_duration, show=_format_duration),
    ]


def _parse_duration(text: str) -> float:
    from grpo_monitor.runtime.config import parse_duration

    return parse_duration(text)


def _format_duration(seconds: float) -> str:
    from grpo_monitor.runtime.config import format_duration

    return format_duration(seconds)


def cmd_resume(args: argparse.Namespace) -> int:
    """Lift a red-card pause: set the run's control record to "running". Every rank of the run
    goes on together (sdk PauseGate), by default from the last healthy checkpoint: the newest one
    saved before the card's onset. On a fleet with node-local snapshot folders, run it on any
    node that holds ranks of the run."""
    from grpo_monitor.contract.control import (
        ControlRecord,
        now_rfc3339,
        read_control,
        run_folder_here,
        write_control,
    )
    from grpo_monitor.contract.run_layout import folder_name, is_run_label
    from grpo_monitor.tools.trainer_marks import file_sizes, ranks_waiting

    snapshot_dir = args.snapshot_dir
    # A name that cannot be a run folder is the caller's typo, not a damaged record: say so, as
    # replay does, before read_control turns it into a ValueError. A label with \udcXX escapes
    # names a folder whose name is not UTF-8 (run_layout.folder_name).
    if not is_run_label(args.run):
        print(f"grpo-monitor resume: invalid run name {args.run!r}", file=sys.stderr)
        return 2
    try:
        record = read_control(snapshot_dir, args.run)
    except ValueError as exc:
        print(f"grpo-monitor resume: run {args.run!r}: bad control record: {exc}", file=sys.stderr)
        return 2
    if record is None and not run_folder_here(snapshot_dir, args.run):
        print(f"grpo-monitor resume: no run {args.run!r} under {snapshot_dir}", file=sys.stderr)
        return 2
    run_dir = Path(snapshot_dir) / folder_name(args.run)
    waiting = ranks_waiting(run_dir)
    if (record is None or record.state != "paused") and not waiting and not args.force:
        # Nothing to lift: saying "resumed" would send a person looking for a pause that is not
        # there.
        why = ("has no pause record here" if record is None
               else f"is not paused (running since {record.resumed_at or 'its start'})")
        print(f"grpo-monitor resume: run {args.run!r} {why} and none of its ranks here waits; "
              "nothing to resume (--force writes a running record all the same)", file=sys.stderr)
        return 2
    if record is not None and record.state == "paused":
        was = "paused"
    else:
        # The card's record went to another node's folder (node-local snapshot folders), but the
        # ranks here wait: a resume written here reaches every rank of the run all the same (the
        # newest resume wins across the process group). Or --force.
        was = (f"paused (rank {', '.join(map(str, waiting))} waits here; the card's record lies "
               "in another node's folder)" if waiting else "not paused (--force)")
        record = record or ControlRecord(state="running", run=args.run)
    if args.no_rollback:
        rollback, what = "none", "asks its trainer to go on where it stopped"
    elif args.rollback_to is not None:
        rollback, what = "step", f"asks its trainer to roll back to the checkpoint of step {args.rollback_to}"
    else:
        rollback, what = "last_healthy", ("asks its trainer to roll back to the last healthy "
                                          "checkpoint, if one was saved before the card's onset")
    record = record.model_copy(update={"state": "running", "resumed_at": now_rfc3339(),
                                       "rollback": rollback, "rollback_to": args.rollback_to})
    before = file_sizes(run_dir)  # the answer comes after this
    path = write_control(snapshot_dir, args.run, record)
    print(f"run {args.run!r}: {was} -> running; {what} ({printable(path)})")
    if args.wait > 0:
        return _report_answer(run_dir, args.run, args.wait, before)
    return 0


def _report_answer(run_dir: Path, run: str, wait_s: float, since: dict[Path, int]) -> int:
    """Wait up to ``wait_s`` for the trainer's answer to a resume and print it: 0 once it
    answered, 1 when it did not in time."""
    import time

    from grpo_monitor.tools.trainer_marks import trainer_answer

    deadline = time.monotonic() + wait_s
    while (answer := trainer_answer(run_dir, since)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if answer is None:
        print(f"run {run!r}: its trainer has not answered in {wait_s:g} s (it reads the record at "
              "its next pause poll)", file=sys.stderr)
        return 1
    if answer.to_step is not None:
        print(f"run {run!r}: its trainer rolled back to the checkpoint of step {answer.to_step} "
              f"(rank {answer.rank})")
    else:
        print(f"run {run!r}: its trainer went on without a rollback, at step {answer.step} "
              f"(rank {answer.rank})")
    return 0


# -- compose-init --------------------------------------------------------------------------------


def _compose_init_flags() -> list[Flag]:
    # Inside the exporter image, whose environment sets GRPO_MONITOR_SNAPSHOT_DIR for serve: the
    # init service's folder is its own flag's, not read from the environment.
    return [
        _snapshot_dir("The snapshot folder, mounted read-write.", required=False, env=False,
                      default=Path("/snapshots")),
        Flag("--webhook-token", "webhook_token", "Where the webhook's bearer token lives.",
             Path("/run/grpo/webhook/webhook-token"), type=Path),
        Flag("--grafana-password", "grafana_password", "Where Grafana's admin password lives.",
             Path("/run/grpo/grafana/admin-password"), type=Path),
        Flag("--owner", "owner", "UID:GID that owns the snapshot folder when the engine had to "
             "create it.", os.environ.get("GRPO_OWNER", "1000:1000"),
             shown_default="env GRPO_OWNER, else 1000:1000"),
        Flag("--alertmanager-gid", "alertmanager_gid", "Group of Alertmanager's user, which reads "
             "the token.", 65534, type=int, shown_default="65534, nobody"),
        Flag("--grafana-uid", "grafana_uid", "Grafana's uid, which reads the password.", 472,
             type=int, shown_default="472, the image's"),
    ]


def cmd_compose_init(args: argparse.Namespace) -> int:
    """Create the stack's secrets when missing (webhook token, Grafana admin password) and let the
    exporter (uid 10001) write pause records into the snapshot folder's run folders."""
    from grpo_monitor.tools.compose_init import run

    return run(args)


# -- the command table ---------------------------------------------------------------------------


def _check_flags() -> list[Flag]:
    return [Flag("RUN_DIR", "run_dir", "A run's folder (<snapshot_dir>/<run>), or a snapshot folder "
                 "of runs: each is checked.")]


def cmd_check(args: argparse.Namespace) -> int:
    """What the exporter makes of a run folder: its shape, each key read as which signal (and the
    names that map to none, with what they most likely meant), the minimum curves, and which
    cards are armed on it and why the others are not. Exit 0; 1 when a run lacks a minimum curve
    (reward, KL, entropy, response length, grad norm); 2 when there is nothing to check."""
    from grpo_monitor.tools.check import check

    return check(Path(args.run_dir))


def _no_flags() -> list[Flag]:
    return []


# Groups of two-word commands: name -> (help, description).
COMMAND_GROUPS: dict[str, tuple[str, str]] = {
    "stack": ("The native stack for machines without Docker.", inspect.getdoc(cmd_stack) or ""),
}

COMMANDS: tuple[Command, ...] = (
    Command("serve", "Run the exporter: watch the snapshot folder, serve /metrics.",
            _serve_flags, cmd_serve),
    Command("schema", "Print the JSON Schema of a snapshot record (contract v1).", _no_flags, cmd_schema),
    Command("stack up", "Start exporter, Prometheus, Alertmanager (and Grafana).",
            _stack_up_flags, cmd_stack),
    Command("demo", "The native stack and a synthetic run that turns sick.", _demo_flags, cmd_demo),
    Command("check", "What the exporter makes of a run folder: keys, minimum curves, armed cards.",
            _check_flags, cmd_check),
    Command("replay", "Print a run's logged samples (prompts and responses).", _replay_flags, cmd_replay),
    Command("report", "Offline post-mortem of one run folder: summary, verdicts, reward-vs-step.csv, "
            "curves.png, report.html (the report extra).", _report_flags, cmd_report),
    Command("simulate", "Write a synthetic run (healthy or sick) to a snapshot folder.",
            _simulate_flags, cmd_simulate),
    Command("train-demo", "A real tiny GRPO training loop on the CPU (needs torch).",
            _train_demo_flags, cmd_train_demo),
    Command("rebaseline", "Make a run's last N steps its new baseline.", _rebaseline_flags,
            cmd_rebaseline),
    Command("compose-init", "docker-compose.yml's init service: secrets and snapshot-folder "
            "permissions before the stack starts (as root).", _compose_init_flags, cmd_compose_init),
    Command("resume", "Resume a run a red card paused.", _resume_flags, cmd_resume),
)


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in one line: a mistyped flag names the closest one there is,
    instead of the whole usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the flags)\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        # A mistyped flag first: argparse would complain about the required flag it hides.
        self._subparser(argv)._check_flags(argv)
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            self._subparser(argv)._unknown(extras[0])
        return parsed

    def _subparser(self, argv: Sequence[str]) -> _Parser:
        """The parser of the (sub)command that ``argv`` names, as far as it names one."""
        parser: _Parser = self
        words = iter(a for a in argv if not a.startswith("-"))
        while sub := next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None):
            name = next(words, None)
            if name not in sub.choices:
                break
            parser = sub.choices[name]
        return parser

    def _check_flags(self, argv: Sequence[str]) -> None:
        for arg in argv:
            if arg == "--":
                return
            name = arg.partition("=")[0]
            if (arg.startswith("--") and name not in self._option_string_actions
                    and len(self._get_option_tuples(name)) != 1):  # nor a unique abbreviation
                self._unknown(arg)

    def _unknown(self, arg: str) -> NoReturn:
        if not arg.startswith("-"):
            self.error(f"unexpected argument {arg!r}")
        flags = [o for a in self._actions for o in a.option_strings
                 if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        close = difflib.get_close_matches(arg.partition("=")[0], flags, n=1, cutoff=0.6)
        self.error(f"unknown flag {arg}" + (f"; did you mean {close[0]}?" if close else ""))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="grpo-monitor", description="Signal-health monitoring for GRPO / PPO-style RL post-training.")
    parser.add_argument("--version", action="version", version=f"grpo-monitor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    group_actions: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        group, _, action = command.name.partition(" ")
        target = sub
        if action:
            if group not in group_actions:
                group_help, description = COMMAND_GROUPS[group]
                group_parser = sub.add_parser(group, help=group_help, description=description)
                group_actions[group] = group_parser.add_subparsers(
                    dest="action", required=True, metavar="ACTION")
            target = group_actions[group]
        p = target.add_parser(action or group, help=command.help, description=command.description)
        register(p, command.flags())
        p.set_defaults(func=command.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``grpo-monitor`` command: ``main(["report", RUN_DIR])`` runs ``grpo-monitor report``."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except MissingExtra as exc:
        print(exc, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a trainer-side install (--no-deps) running a command
        command = " ".join(a for a in (argv if argv is not None else sys.argv[1:])[:1]) or "--help"
        line = missing_dependency(exc, command)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
