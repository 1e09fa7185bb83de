"""Runs played through the exporter and the real rules, with promtool as the evaluator.

A run (a simulated scenario here, ``play``; a real run in real_runs.py; the training demo) is
written step by step into real files; the exporter's ingest and store read them; every so many
steps the exposition is "scraped" (rendered and parsed) into one sample of each series
(``Recorder``). Those samples become a promtool unit test whose evaluation interval stands for
one scrape, and promtool evaluates the project's rule files on them (``promtool_test``). Which
cards fired, and when, is read back from the ALERTS series: asserted (``check_cards``) or
reported (``fired_at``, ``fired``).

A test session keeps what is slow to make and the same for every test that asks
(``session_cached``): a real run's play (real_runs.play_real) and promtool's evaluation of a play
(``fired_at``), so that each is made once however many test files read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from grpo_monitor.runtime.config import parse_duration
from grpo_monitor.runtime.exposition import format_value
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.simulate import Step, generate, write_steps

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "prometheus" / "rules"
# Every rule file of the project, whatever it is called: a file added there is loaded by the
# tests the day it is added, not the day someone remembers a list.
RULE_FILES: list[Path] = sorted(RULES_DIR.glob("*.yml"))


# A folder the test session's processes share (conftest sets it), for ``session_cached``.
PLAY_CACHE_ENV = "GRPO_PLAY_CACHE"
T = TypeVar("T")


def session_cached(what: str, key: Iterable[str], compute: Callable[[], T]) -> T:
    """``compute()``, kept in the session's cache ($GRPO_PLAY_CACHE) under ``what`` and ``key``
    (everything the value depends on) when one is set: another test, in this worker or another,
    reads back a copy of its own. A worker that asks while another computes the same value
    waits for it under a lock instead of computing it too: the values kept here take up to a
    minute and a half of a core."""
    cache = os.environ.get(PLAY_CACHE_ENV)
    if not cache:
        return compute()
    digest = hashlib.sha256(what.encode())
    for part in key:
        data = part.encode()
        digest.update(f"\0{len(data)}:".encode() + data)
    kept = Path(cache) / f"{what}-{digest.hexdigest()}.pickle"
    with open(kept.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if kept.exists():
            return pickle.loads(kept.read_bytes())
        value = compute()
        partial = kept.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(partial, kept)  # whole or absent, should this process die while writing
        return value


def rules(*names: str) -> list[dict[str, Any]]:
    """Every rule (recording and alerting), in file order, of the rule files ``names`` (file
    names in prometheus/rules/), or of all of RULE_FILES. Parsed afresh: a caller may edit them."""
    paths = [RULES_DIR / n for n in names] if names else RULE_FILES
    return [r for path in paths for g in yaml.safe_load(path.read_text())["groups"]
            for r in g["rules"]]


def alerts(*names: str) -> list[dict[str, Any]]:
    """The alerting rules of ``rules(*names)``."""
    return [r for r in rules(*names) if "alert" in r]


# The series the rules read; the rest of a scrape only slows promtool down.
RULE_INPUTS = ("grpo_step{", "grpo_kl_mean{", "grpo_baseline_", "grpo_initial_", "grpo_window_",
               "grpo_run_window_", "grpo_rising_windows{", "grpo_forecast_", "grpo_prompt_type_",
               "grpo_records_", "grpo_run_signal_logged{", "grpo_run_logged_steps{", "grpo_run_info{",
               "grpo_first_records_", "grpo_heldout_", "grpo_card_armed{", "grpo_trend_")


@dataclass
class Played:
    series: dict[str, list[str]]  # series -> one value per scrape ("_" when absent)
    scrape_steps: list[int]  # the step of rank 0 at each scrape


class Recorder:
    """The exporter's ingest and store over a snapshot folder; each scrape is one sample of every
    series the rules read."""

    def __init__(self, root: Path) -> None:
        self.store = RunStore()
        self.ingestor = Ingestor(root, self.store, ExporterHealth())
        self.series: dict[str, list[str]] = {}
        self.steps: list[int] = []

    def scrape(self, step: int, paths: list[Path]) -> None:
        """Read what is new in ``paths``, then take one sample of the exposition."""
        for path in paths:
            self.ingestor.process(path)
        self.store.flush()
        self.add("".join(self.store.render()), step)

    def add(self, exposition: str, step: int) -> None:
        """One sample from exposition text (a real scrape's body, or the store's rendering)."""
        index = len(self.steps)
        self.steps.append(step)
        for line in exposition.splitlines():
            if line.startswith("#") or not line.startswith(RULE_INPUTS):
                continue
            name, _, value = line.rpartition(" ")
            values = self.series.setdefault(name, ["_"] * index)
            values.extend(["_"] * (index - len(values)))
            values.append(format_value(float(value)))

    def played(self) -> Played:
        for values in self.series.values():
            values.extend(["_"] * (len(self.steps) - len(values)))
        return Played(self.series, self.steps)


def play(scenario: str, *, scrape_every: int, steps: int | None = None, onset: int | None = None,
         ranks: int = 4, step_seconds: float = 5.0, log_every: int = 1,
         end_mark: bool = False) -> Played:
    """A simulated scenario, scraped every ``scrape_every`` steps. ``log_every``: the trainer
    logs every k-th step only (TRL's ``logging_steps``). ``end_mark``: one more scrape after the
    writers closed (the run's run_end mark), at the last step."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recorder = Recorder(root)
        writers = [SnapshotWriter(root, scenario, rank=r, world_size=ranks) for r in range(ranks)]

        def scrape(st: Step) -> None:
            if st.step % scrape_every == 0:
                recorder.scrape(st.step, [Path(w.path) for w in writers])

        write_steps(writers, (st for st in generate(scenario, steps=steps, onset=onset, ranks=ranks,
                                                     step_seconds=step_seconds)
                              if st.step % log_every == 0), after=scrape)
        for w in writers:
            w.close()
        if end_mark:
            recorder.scrape(recorder.steps[-1], [Path(w.path) for w in writers])
    return recorder.played()


FIRED = 'group by (alertname, severity) (max_over_time(ALERTS{{alertstate="firing"{only}}}[{minutes}m]))'
FIRING_NOW = 'group by (alertname, severity) (ALERTS{{alertstate="firing"{only}}})'


@dataclass(frozen=True)
class Check:
    """One expectation: exactly ``cards`` at scrape ``at``. ``now``: the cards firing at that
    scrape, rather than at any scrape up to it; ``only``: extra label matchers for ALERTS
    (e.g. ``,severity="critical"``)."""

    at: int
    cards: set[str]
    now: bool = False
    only: str = ""

    def expected(self) -> set[tuple[str, str]]:
        """The (alertname, severity) pairs the check expects, each card at its rules' severity."""
        return {(a, SEVERITIES[a]) for a in self.cards}

    def test(self) -> dict[str, object]:
        return {
            "expr": (FIRING_NOW if self.now else FIRED).format(minutes=self.at + 1, only=self.only),
            "eval_time": f"{self.at}m",
            "exp_samples": [{"labels": f'{{alertname="{a}",severity="{s}"}}', "value": 1}
                            for a, s in sorted(self.expected())],
        }

    def seen(self, at: list[set[tuple[str, str]]]) -> set[tuple[str, str]]:
        """What ``test()``'s expression gives, read from ``fired_at``'s answer ``at`` instead of
        asked of promtool: the pairs firing at scrape ``self.at`` (``now``), or at any scrape up
        to it (FIRED's range reaches minute 0: all of them), that ``only`` admits."""
        firing = at[self.at] if self.now else set().union(*at[:self.at + 1])
        matchers = _ONLY.findall(self.only)
        # fired_at keeps (alertname, severity) of each alert: a matcher on any other label
        # cannot be answered from it.
        if "".join(f',{label}{op}"{value}"' for label, op, value in matchers) != self.only:
            raise ValueError(f"only={self.only!r}: from fired_at, match alertname and severity "
                             "with = or != only")
        return {(a, s) for a, s in firing
                if all(({"alertname": a, "severity": s}[label] == value) == (op == "=")
                       for label, op, value in matchers)}


_ONLY = re.compile(r',(alertname|severity)(=|!=)"([^"\\]*)"')


def promtool_test(played: Played, expr_tests: list[dict[str, object]], path: Path, *,
                  stale_markers: bool = False, timeout: float = 300,
                  rule_files: list[Path] | None = None) -> subprocess.CompletedProcess[str]:
    """promtool's unit test of the rule files (``rule_files``, the project's by default) on
    ``played``, one scrape a minute, with ``expr_tests`` (its promql_expr_test entries), written
    to ``path``.

    ``stale_markers``: a series missing from a scrape after being present gets a staleness
    marker, as the real Prometheus writes one; with a bare gap promtool keeps its last value for
    5 minutes, and a card would seem to fire for five scrapes after its signal went away."""
    def values(samples: list[str]) -> str:
        if stale_markers:
            samples = ["stale" if v == "_" and i and samples[i - 1] != "_" else v
                       for i, v in enumerate(samples)]
        return " ".join(samples)

    test = {
        "rule_files": [str(p) for p in (RULE_FILES if rule_files is None else rule_files)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": values(samples)}
                             for name, samples in played.series.items()],
            "promql_expr_test": expr_tests,
        }],
    }
    path.write_text(json.dumps(test))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=timeout)


def check_cards(played: Played, checks: list[tuple[int, set[str]] | Check], tmp: Path, *,
                now: bool = False, only: str = "") -> None:
    """Assert with promtool that exactly the given cards had fired by each given scrape.

    ``checks`` holds (scrape index, expected card names) pairs, which take ``now`` and ``only``
    (see Check), or Checks of their own; each scrape is one minute of promtool's clock. One
    promtool run evaluates them all. Raises AssertionError with promtool's report, which names
    the cards that did fire, when a set differs.
    """
    checks = _checks(checks, now, only)
    proc = promtool_test(played, [c.test() for c in checks], tmp / "scenario.test.json")
    if proc.returncode != 0:
        raise AssertionError(f"cards differ from {checks}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")


def _checks(checks: list[tuple[int, set[str]] | Check], now: bool, only: str) -> list[Check]:
    return [c if isinstance(c, Check) else Check(c[0], c[1], now, only) for c in checks]


def check_fired(played: Played, checks: list[tuple[int, set[str]] | Check], tmp: Path, *,
                now: bool = False, only: str = "", what: str = "") -> None:
    """``check_cards``, answered from ``fired_at``: the play's one evaluation in promtool, which
    the session keeps for every test that reads the same play (a real run's verdict, its report)
    instead of a promtool run of each check's own. Its input has staleness markers, as the real
    Prometheus writes them. ``only`` may match alertname and severity only (see Check.seen).
    Raises AssertionError naming ``what`` (the run), and each check that failed: its scrape and
    step, the cards expected, the cards that fired."""
    at = fired_at(played, tmp)
    wrong = []
    for c in _checks(checks, now, only):
        got, expected = c.seen(at), c.expected()
        if got != expected:
            wrong.append(f"  scrape {c.at} (step {played.scrape_steps[c.at]}), "
                         f"{'firing then' if c.now else 'fired by then'}"
                         f"{f' ({c.only[1:]})' if c.only else ''}: expected {sorted(expected)}, "
                         f"fired {sorted(got)}")
    if wrong:
        raise AssertionError(f"{what or 'the play'}: cards differ\n" + "\n".join(wrong))


# -- which cards fired, asked of promtool --------------------------------------------------------

FIRING = FIRING_NOW.format(only="")
Intervals = dict[str, list[tuple[int, int]]]


def fired_at(played: Played, tmp: Path, *, stale_markers: bool = True,
             rule_files: list[Path] | None = None) -> list[set[tuple[str, str]]]:
    """For each scrape, the (alertname, severity) pairs firing then, per the real promtool
    (``stale_markers``, ``rule_files``: see promtool_test); kept for the session
    (``session_cached``), since several test files evaluate the same real-run plays."""
    n = len(played.scrape_steps)
    files = RULE_FILES if rule_files is None else rule_files
    # The rules as read now, evaluated from copies: what the session keeps is the answer for
    # these texts, even if a rule file is edited during the session.
    texts = [p.read_text() for p in files]

    def evaluate() -> list[set[tuple[str, str]]]:
        copies = []
        for i, (path, text) in enumerate(zip(files, texts)):
            copies.append(tmp / "fired-rules" / f"{i}-{path.name}")
            copies[-1].parent.mkdir(exist_ok=True)
            copies[-1].write_text(text)
        # promtool only asserts: expecting nothing at every scrape makes it print what was
        # there instead, wherever something was.
        proc = promtool_test(played, [{"expr": FIRING, "eval_time": f"{i}m", "exp_samples": []}
                                      for i in range(n)],
                             tmp / "fired.test.json", stale_markers=stale_markers, timeout=900,
                             rule_files=copies)
        by_minute = parse_promtool_report(proc.stdout + proc.stderr, proc.returncode, FIRING)
        if any(m >= n for m in by_minute):
            raise ValueError(f"promtool reported minute {max(by_minute)} of a {n}-scrape play")
        return [by_minute.get(i, set()) for i in range(n)]

    return session_cached("fired", [str(stale_markers), str(n), json.dumps(played.series), *texts],
                          evaluate)


_EXPR = re.compile(r'^    expr: (".*"), time: ([0-9a-z]+),$')
_GOT_ITEM = re.compile(r'\{alertname="([^"\\]+)", severity="([^"\\]*)"\} 1E\+00')


def _minutes(text: str) -> int:
    """A promtool evaluation time (``1h5m``) in whole minutes."""
    minutes, rest = divmod(parse_duration(text), 60)
    if rest:
        raise ValueError(f"promtool time {text!r} is not a whole minute")
    return int(minutes)


def parse_promtool_report(output: str, returncode: int, expr: str) -> dict[int, set[tuple[str, str]]]:
    """minute -> (alertname, severity) pairs, from ``promtool test rules`` output whose every
    expression test expected nothing.

    Strict on purpose: a line that is not part of the known report shape (another promtool
    version, a rule file error, an expression test that failed for another reason) raises
    ValueError instead of reading as "nothing fired".
    """
    lines = output.splitlines()
    meaningful = [ln for ln in lines if ln.strip()]
    if returncode == 0:
        if not any(ln.strip() == "SUCCESS" for ln in meaningful):
            raise ValueError(f"promtool exited 0 without SUCCESS:\n{output[-2000:]}")
        return {}
    if returncode != 1:
        raise ValueError(f"promtool exited {returncode}:\n{output[-3000:]}")
    try:
        start = next(i for i, ln in enumerate(meaningful) if ln.strip().endswith("FAILED:"))
    except StopIteration:
        raise ValueError(f"promtool failed without a FAILED: report:\n{output[-3000:]}") from None
    if not all(ln.startswith("Unit Testing:") for ln in meaningful[:start]):
        raise ValueError(f"unexpected promtool output before its report:\n{output[-3000:]}")
    body = meaningful[start + 1:]
    if not body or len(body) % 3:
        raise ValueError(f"promtool's report is not made of (expr, exp, got) triples:\n{output[-3000:]}")
    out: dict[int, set[tuple[str, str]]] = {}
    for i in range(0, len(body), 3):
        head, exp, got = body[i:i + 3]
        m = _EXPR.match(head)
        if not m or json.loads(m.group(1)) != expr:
            raise ValueError(f"unexpected promtool report line: {head!r}")
        if exp.strip() != "exp: nil" or not got.strip().startswith("got: "):
            raise ValueError(f"unexpected promtool report lines: {exp!r}, {got!r}")
        items = got.strip()[len("got: "):]
        pairs = _GOT_ITEM.findall(items)
        if ", ".join(f'{{alertname="{a}", severity="{s}"}} 1E+00' for a, s in pairs) != items:
            raise ValueError(f"cannot read promtool's got: list: {items!r}")
        minute = _minutes(m.group(2))
        if minute in out:
            raise ValueError(f"promtool reported minute {minute} twice")
        out[minute] = set(pairs)
    return out


def intervals(scrape_steps: list[int], at: list[set[tuple[str, str]]]) -> Intervals:
    """alertname -> (first step, last step) of each unbroken run of scrapes that saw it firing."""
    out: Intervals = {}
    for i, firing in enumerate(at):
        for alert in sorted({a for a, _ in firing}):
            spans = out.setdefault(alert, [])
            step = scrape_steps[i]
            if spans and alert in {a for a, _ in at[i - 1]}:
                spans[-1] = (spans[-1][0], step)
            else:
                spans.append((step, step))
    return out


def fired(played: Played, tmp: Path) -> Intervals:
    """For each alert that fired, the intervals of logged steps during which it was firing:
    (step of the first scrape that saw it firing, step of the last), in play order."""
    return intervals(played.scrape_steps, fired_at(played, tmp))


def _severities() -> dict[str, str]:
    return {r["alert"]: r["labels"]["severity"] for r in alerts()}


SEVERITIES = _severities()  # alert name -> severity, from the rule files


def scrape_index_before(played: Played, step: int) -> int:
    """The last scrape taken before ``step``."""
    return max(i for i, s in enumerate(played.scrape_steps) if s < step)


def scrape_index_at(played: Played, step: int) -> int:
    """The last scrape taken at or before ``step``."""
    return max(i for i, s in enumerate(played.scrape_steps) if s <= step)


