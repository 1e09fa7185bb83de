"""Shared fixtures: a real exporter on a free loopback port, scraped over real HTTP."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from polling import wait_for
from prometheus_client.parser import text_string_to_metric_families

from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

ROOT = Path(__file__).resolve().parents[1]
# The docs a person reads: their links must resolve and the commands they name must exist.
DOCS: list[Path] = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                    *sorted((ROOT / "examples").glob("*.md"))]


def parse_samples(text: str) -> Samples:
    """Exposition text parsed with prometheus-client's parser: {(name, labels): value}."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape(url: str) -> Samples:
    """GET /metrics, parsed (parse_samples)."""
    resp = requests.get(f"{url}/metrics", timeout=5)
    resp.raise_for_status()
    return parse_samples(resp.text)


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class Running:
    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.url = exporter.url

    def scrape(self) -> Samples:
        return scrape(self.url)

    def wait_value(self, name: str, expected: Callable[[float | None], bool] | float,
                   timeout: float = 10.0, **labels: str) -> float | None:
        """Scrape until the series has the expected value (or satisfies a predicate)."""
        check = expected if callable(expected) else (lambda v: v == expected)
        box: list[float | None] = [None]

        def ok() -> bool:
            box[0] = value(self.scrape(), name, **labels)
            return bool(check(box[0]))

        try:
            wait_for(ok, timeout)
        except AssertionError:
            raise AssertionError(f"{name}{labels} = {box[0]!r}, expected {expected!r}") from None
        return box[0]

    def errors(self, reason: str) -> float:
        return value(self.scrape(), "grpo_snapshot_errors_total", reason=reason) or 0.0


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    d = tmp_path / "snapshots"
    d.mkdir()
    return d


@pytest.fixture
def start_exporter(snapshot_dir: Path) -> Iterator[Callable[..., Running]]:
    """Start an exporter (several may run, e.g. to test a restart); all stop at teardown."""
    started: list[Exporter] = []

    def start(**overrides: object) -> Running:
        # The default rescan interval (30 s) stays: tests must see inotify events work, not the
        # safety net.
        config = ExporterConfig(snapshot_dir=snapshot_dir, listen_address="127.0.0.1:0",
                                **overrides)  # type: ignore[arg-type]
        exporter = Exporter(config).start()
        started.append(exporter)
        wait_for(exporter.watcher.ready.is_set)
        return Running(exporter)

    yield start
    for exporter in started:
        exporter.stop()


@pytest.fixture
def exporter(start_exporter: Callable[..., Running]) -> Running:
    return start_exporter()


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A folder outside pytest's tmp_path (which lies under a 0700 folder), for an exporter that
    runs without root's permission override and must still reach what it is meant to read."""
    d = Path(tempfile.mkdtemp(prefix="grpo-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Captured output as UTF-8 text: the fuzz tests name folders by bytes that are not UTF-8,
    and a report travels from the suite's worker processes (pytest-xdist) to the main one as
    UTF-8, which a surrogate in it would stop."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
                       for title, text in report.sections]


def pytest_configure(config: pytest.Config) -> None:
    """The session's cache of real-run plays and their promtool evaluations
    (promtool_harness.session_cached), made by the main process before it starts the workers,
    which inherit its environment; removed at the end of the session."""
    from promtool_harness import PLAY_CACHE_ENV

    if not hasattr(config, "workerinput") and PLAY_CACHE_ENV not in os.environ:
        config.play_cache = tempfile.mkdtemp(prefix="grpo-plays-")  # type: ignore[attr-defined]
        os.environ[PLAY_CACHE_ENV] = config.play_cache  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    from promtool_harness import PLAY_CACHE_ENV

    made = getattr(config, "play_cache", None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(PLAY_CACHE_ENV, None)
