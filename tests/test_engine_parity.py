"""The cards under a second rule engine: vmalert on VictoriaMetrics raises exactly what
Prometheus raises, on the same runs at the same steps.

One exporter reads a snapshot folder holding every synthetic scenario of `grpo-monitor simulate` and every shared real run, as their frameworks logged them. Two engines scrape
what it exposes and evaluate the committed rule files: Prometheus, and vmagent +
victoria-metrics + vmalert (tests/victoria_harness.py; the flags `grpo-monitor stack up
--stack.engine=victoriametrics` runs). The runs are written in STATES parts, all runs at once;
once the exporter has read a part, its exposition is frozen (FrozenScrape) until both stores hold
the new steps of every rank and both engines have evaluated every rule group on them until their
cards stop changing; then the cards each engine holds firing must be the same, label for label.
The step resolution is one state: a card that both engines raise must come at the same state, one
that only one raises fails the test.

At the end vmalert is restarted: the cards it held come back from the store (a card held by its
own ALERTS series included), and still equal Prometheus'.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import Running
from polling import wait_for
from prometheus_harness import AlertStack, ExpositionServer, alert_stack
from real_runs import load, run_label, run_names, split_runs, write_snapshots
from victoria_harness import VictoriaStack, group_counters, victoria_stack

from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.simulate import SCENARIOS, generate, write_steps

# The suite compares three states of every run (before the onset, where the first card must
# have come, the end); GRPO_PARITY_STATES=N compares N, a finer step resolution after the
# onset (docs/scaling.md#victoriametrics has what it measured and what it cost).
STATES = max(3, int(os.environ.get("GRPO_PARITY_STATES", "3")))
# The scenarios whose cards compare a run's ranks have four; the others one (their cards read
# rank 0's training signals, and the parts are read faster).
RANK_SCENARIOS = ("rank_stalled", "straggler")
RANKS = 4
# Labels that say which engine holds an alert, not what it says: vmalert adds the configured
# external labels to its alerts' labels, Prometheus only when it sends them.
ENGINE_LABELS = ("monitor",)
# Cards on the wall clock, not on the runs' steps: a run whose last record is minutes old (the
# short ones finish early here) is judged hung by each engine at its own evaluation's time.
WALL_CLOCK = ("GRPORunHung",)
# The run whose red card is held across vmalert's restart by its ALERTS series alone: the jump
# that raised it (JUMP_NOW, the card's first branch) is over by the run's last step.
HELD_RUN = "kl_explosion"
JUMP_NOW = (f'grpo_window_p10{{run="{HELD_RUN}",key="kl/mean",window_steps="20"}} > on(run, rank, key) '
            f'group_left() (grpo_window_mean{{run="{HELD_RUN}",key="kl/mean",window_steps="50",'
            'offset_steps="200"} * scalar(grpo:threshold:kl_jump_ratio))')


@dataclass
class Feed:
    """One run written in STATES parts: ``write(i)`` writes part ``i`` (0-based)."""

    run: str
    write: Callable[[int], None]
    ranks: dict[str, int] = field(default_factory=dict)  # rank -> step of its last record


def _part_end(total: int, i: int) -> int:
    return math.ceil(total * (i + 1) / STATES)


def scenario_ends(name: str) -> list[int]:
    """Where a scenario's parts end: the step before its onset, the step its first card must
    have come by (tests/test_scenarios.py holds Prometheus to it), then evenly to its end."""
    sc = SCENARIOS[name]
    caught = min(sc.onset + sc.caught_within, sc.steps)
    ends = [max(1, sc.onset - 1), *(caught + math.ceil((sc.steps - caught) * i / (STATES - 2))
                                    for i in range(STATES - 1))]
    return [min(e, sc.steps) for e in ends]


def synthetic_feed(root: Path, name: str) -> Feed:
    steps = SCENARIOS[name].steps
    ranks = RANKS if name in RANK_SCENARIOS else 1
    writers = [SnapshotWriter(root, name, rank=r, world_size=ranks) for r in range(ranks)]
    records = generate(name, ranks=ranks)
    ends = scenario_ends(name)
    feed = Feed(name, lambda i: None)
    done = [0]

    def write(i: int) -> None:
        end = ends[i]
        written = write_steps(writers, itertools.islice(records, end - done[0]))
        done[0] = end
        feed.ranks.update({str(r): s for r, s in written.last_step.items()})
        if end == steps:
            for w in writers:  # the run's end mark, as a trainer's close() writes it
                w.close()

    feed.write = write
    return feed


def real_feeds(root: Path, name: str) -> list[Feed]:
    feeds = []
    for run, records in split_runs(load(name), run_label(name)).items():
        feed = Feed(run, lambda i: None)

        def write(i: int, records: list[dict[str, Any]] = records, feed: Feed = feed) -> None:
            start, end = _part_end(len(records), i - 1) if i else 0, _part_end(len(records), i)
            if end > start:
                write_snapshots(records[start:end], root, feed.run)
                feed.ranks["0"] = records[end - 1]["step"]

        feed.write = write
        feeds.append(feed)
    return feeds


# -- reading the two engines ----------------------------------------------------------------------


def steps_by_rank(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(r["metric"]["run"], r["metric"]["rank"]): float(r["value"][1]) for r in result}


def card_set(alerts: list[dict[str, Any]]) -> set[tuple[tuple[str, str], ...]]:
    """The firing alerts, each as its sorted labels less ENGINE_LABELS and WALL_CLOCK cards."""
    return {tuple(sorted((k, v) for k, v in a["labels"].items() if k not in ENGINE_LABELS))
            for a in alerts if a["state"] == "firing"
            and a["labels"].get("alertname") not in WALL_CLOCK}


@dataclass
class Engines:
    prometheus: AlertStack
    victoria: VictoriaStack

    def prometheus_query(self, promql: str) -> list[dict[str, Any]]:
        return self.prometheus.query(promql)["data"]["result"]

    def evaluations(self) -> tuple[dict[str, float], dict[str, float]]:
        prom = requests.get(f"{self.prometheus.prom_url}/metrics", timeout=10).text
        return (group_counters(prom, "prometheus_rule_group_iterations_total"),
                self.victoria.evaluations())

    def wait_evaluated(self, times: int, timeout: float = 120) -> None:
        """Until every rule group of both engines has started ``times`` more evaluations (the
        first may have begun before the data arrived)."""
        before = self.evaluations()
        wait_for(lambda: all(all(now.get(g, 0) - n >= times for g, n in was.items())
                             for was, now in zip(before, self.evaluations())),
                 timeout, interval=0.1, what=f"{times} more evaluations of every rule group",
                 diagnose=self.diagnose)

    def cards(self) -> tuple[set[Any], set[Any]]:
        prom = requests.get(f"{self.prometheus.prom_url}/api/v1/alerts", timeout=10).json()
        return card_set(prom["data"]["alerts"]), card_set(self.victoria.alerts())

    def held_in_store(self, cards: tuple[set[Any], set[Any]]) -> bool:
        """Every firing card of each engine is in its own store's ALERTS, where the cards that
        hold themselves read it. VictoriaMetrics makes a new series searchable seconds after
        it is written; at the stack's 15 s interval the next evaluation finds it, at this test's
        1 s it may not, and the runs must not move on before it does."""
        for cards_of, query in zip(cards, (self.prometheus_query, self.victoria.query)):
            stored = card_set([{"state": "firing", "labels": {
                k: v for k, v in r["metric"].items() if k not in ("__name__", "alertstate")}}
                for r in query('ALERTS{alertstate="firing"}')])
            if not cards_of <= stored:
                return False
        return True

    def settled_cards(self, timeout: float = 120) -> tuple[set[Any], set[Any]]:
        """Both engines' firing cards once they are the same two evaluations in a row and in
        the stores' ALERTS: a card that reads a recording rule (the thresholds, a run's
        readiness, the rank lag) sees it a write and a read after the rule's own evaluation,
        and a card that holds itself reads its own ALERTS series."""
        deadline = time.monotonic() + timeout
        self.wait_evaluated(3)
        last = self.cards()
        while True:
            self.wait_evaluated(1)
            now = self.cards()
            if now == last and self.held_in_store(now):
                return now
            assert time.monotonic() < deadline, f"cards still changing after {timeout} s: {now}"
            last = now

    def diagnose(self) -> str:
        return "\n".join([self.prometheus.logs(), self.victoria.logs()])


class FrozenScrape(ExpositionServer):
    """The exporter's exposition as it was at the last ``freeze()``, served over HTTP to both
    engines. The exporter reads a state's records over seconds, and a scrape in between sees a
    step inside the state (a jump that is over by its end, say), which one engine may catch and
    the other not; frozen, both scrape the same bytes, the exporter's own."""

    def __init__(self, exporter_url: str) -> None:
        super().__init__()
        self.exporter_url = exporter_url

    def freeze(self, expected: dict[tuple[str, str], float]) -> None:
        """Once the exporter shows every rank at its ``expected`` step, serve what it shows."""
        def scraped() -> bytes | None:
            body = requests.get(f"{self.exporter_url}/metrics", timeout=30).content
            steps = {(s.labels["run"], s.labels["rank"]): s.value
                     for family in text_string_to_metric_families(body.decode())
                     if family.name == "grpo_step" for s in family.samples}
            return body if all(steps.get(k) == v for k, v in expected.items()) else None

        self.body = wait_for(scraped, 120, interval=0.2, what="every rank's last step in the exporter")


@pytest.fixture
def frozen(exporter: Running) -> Iterator[FrozenScrape]:
    scrape = FrozenScrape(exporter.url)
    yield scrape
    scrape.close()


@pytest.fixture
def engines(frozen: FrozenScrape, tmp_path: Path) -> Iterator[Engines]:
    with alert_stack(tmp_path / "prometheus", frozen.url) as prom, \
            victoria_stack(tmp_path / "victoria", frozen.url, prom.am_url) as victoria:
        yield Engines(prom, victoria)
        print(prom.logs())
        print(victoria.logs())


def _describe(cards: set[Any]) -> list[str]:
    return sorted(", ".join(f"{k}={v}" for k, v in c) for c in cards)


def test_vmalert_raises_the_cards_prometheus_raises_at_the_same_steps(
        engines: Engines, frozen: FrozenScrape, snapshot_dir: Path) -> None:
    # The healthy scenario (3,000 steps) left out: the shared real runs include healthy ones.
    feeds = [synthetic_feed(snapshot_dir, name) for name in SCENARIOS if name != "healthy"]
    feeds += [f for name in run_names() for f in real_feeds(snapshot_dir, name)]
    raised: dict[str, set[str]] = {}
    timings = []
    for i in range(STATES):
        t0 = time.monotonic()
        for feed in feeds:
            feed.write(i)
        expected = {(f.run, rank): float(step) for f in feeds for rank, step in f.ranks.items()}
        frozen.freeze(expected)

        def arrived(query: Callable[[str], list[dict[str, Any]]]) -> bool:
            got = steps_by_rank(query("grpo_step"))
            return all(got.get(k) == v for k, v in expected.items())

        wait_for(lambda: arrived(engines.prometheus_query), 120, interval=0.2,
                 what="every rank's last step in Prometheus", diagnose=engines.diagnose)
        wait_for(lambda: arrived(engines.victoria.query), 120, interval=0.2,
                 what="every rank's last step in VictoriaMetrics", diagnose=engines.diagnose)
        t1 = time.monotonic()
        prom, victoria = engines.settled_cards()
        timings.append((t1 - t0, time.monotonic() - t1))
        assert prom == victoria, (
            f"state {i + 1} of {STATES}: Prometheus only {_describe(prom - victoria)}; "
            f"vmalert only {_describe(victoria - prom)}")
        for card in prom:
            labels = dict(card)
            raised.setdefault(labels["alertname"], set()).add(labels.get("run", ""))
    print("per state: data in both stores, then cards settled (s):",
          [(round(a, 1), round(b, 1)) for a, b in timings])
    print("cards raised:", {k: sorted(v) for k, v in sorted(raised.items())})
    # The comparison had cards to compare: red and yellow, on synthetic and real runs.
    assert {"GRPONonFiniteValues", "GRPOKLExplosion", "GRPOEntropyCollapse", "GRPOTrainingBlowUp",
            "GRPOAdvantageVanishing", "GRPORankStalled", "GRPORankStraggler"} <= raised.keys()

    # vmalert restarted: what it held comes back, the KL explosion held by its own ALERTS series
    # alone (its jump is 800 steps old, its 50-step mean still over the line) among them.
    held = {c for c in prom if dict(c)["alertname"] == "GRPOKLExplosion"
            and dict(c)["run"] == HELD_RUN}
    assert held, _describe(prom)
    assert not engines.prometheus_query(JUMP_NOW), "the KL jump still holds: nothing tests the hold"
    engines.victoria.restart_ruler()
    prom_after, victoria_after = engines.settled_cards()
    assert prom_after == prom
    assert victoria_after == prom_after, (
        f"after vmalert's restart: lost {_describe(prom_after - victoria_after)}; "
        f"new {_describe(victoria_after - prom_after)}")
