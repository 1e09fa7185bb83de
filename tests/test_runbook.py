"""docs/runbook.md is what every card links to: the links resolve, the page is served where
they point by default, the PromQL it tells a person to run works against a real Prometheus, and
every `grpo-monitor` command the docs name exists with the flags they give it."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from conftest import DOCS, Running
from fake_pynvml import FakeDevice, FakeNVML
from polling import wait_for
from prometheus_harness import alert_stack, find_binary
from promtool_harness import alerts

from grpo_monitor.cli import build_parser
from grpo_monitor.runtime import runbook
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import DEFAULT_RUNBOOK_URL, ExporterConfig
from grpo_monitor.tools.simulate import write_run

ROOT = Path(__file__).resolve().parents[1]
RUNBOOK = ROOT / "docs" / "runbook.md"
# The run and rank the runbook's queries name ("replace exp-42 with the alert's run label").
RUN = "exp-42"
GPU_UUIDS = ("GPU-5f2a9c3e-1b7d-4e80-a6f1-3c9d2b8e7a10", "GPU-c81e4d07-92ab-4f3c-b5d6-0e7f18a29c44")


# -- the links -------------------------------------------------------------------------------

def test_every_runbook_url_is_the_base_and_a_section_of_the_runbook() -> None:
    """One form for every card: the external label's runbook URL, else the default, then the
    card's section; and that section exists (GitHub's anchors, which the served page shares)."""
    sections = set(runbook.anchors(RUNBOOK.read_text()))
    cards = alerts()
    assert cards
    for rule in cards:
        anchor = rule["alert"].lower()
        expected = f'{{{{ or $externalLabels.{runbook.LABEL} "{DEFAULT_RUNBOOK_URL}" }}}}#{anchor}'
        assert rule["annotations"].get("runbook_url") == expected, rule["alert"]
        assert anchor in sections, f"docs/runbook.md has no section #{anchor}"


def test_the_default_base_is_the_exporter_on_its_default_address() -> None:
    default_listen = next(f.default for f in dataclasses.fields(ExporterConfig)
                          if f.name == "listen_address")
    url = urlsplit(DEFAULT_RUNBOOK_URL)
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "http", "localhost", int(str(default_listen).rpartition(":")[2]), runbook.PATH)


def test_the_runbooks_own_links_resolve() -> None:
    text = RUNBOOK.read_text()
    sections = set(runbook.anchors(text))
    targets = re.findall(r"\]\(#([^)\s]+)\)", text)
    assert targets
    assert not sorted(set(targets) - sections), "links to sections docs/runbook.md lacks"


def test_promtool_applies_the_configured_base(tmp_path: Path) -> None:
    """The template as Prometheus renders it: the default without the external label, the
    label's URL with it."""
    stalled = next(r for r in alerts() if r["alert"] == "GRPORankStalled")
    template = stalled["annotations"]["runbook_url"]
    hosted = "https://docs.example.org/grpo-monitor/docs/runbook.md"
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{
        "alert": "GRPORankStalled", "expr": "vector(1)", "labels": {"severity": "critical"},
        "annotations": {"runbook_url": template}}]}]}))

    def case(external: dict[str, str] | None, url: str) -> dict[str, Any]:
        group: dict[str, Any] = {"interval": "1m", "input_series": [], "alert_rule_test": [{
            "eval_time": "1m", "alertname": "GRPORankStalled", "exp_alerts": [{
                "exp_labels": {"severity": "critical"},
                "exp_annotations": {"runbook_url": url + "#grporankstalled"}}]}]}
        if external is not None:
            group["external_labels"] = external
        return group

    test = tmp_path / "test.yml"
    test.write_text(yaml.safe_dump({
        "rule_files": [str(rules)], "evaluation_interval": "1m",
        "tests": [case(None, DEFAULT_RUNBOOK_URL), case({runbook.LABEL: hosted}, hosted)]}))
    res = subprocess.run([find_binary("promtool"), "test", "rules", str(test)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    # And a wrong expectation fails: the test can tell the two apart.
    test.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                    "tests": [case({runbook.LABEL: hosted}, DEFAULT_RUNBOOK_URL)]}))
    res = subprocess.run([find_binary("promtool"), "test", "rules", str(test)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode != 0, res.stdout + res.stderr


# -- the page --------------------------------------------------------------------------------

def served(exporter: Running, name: str) -> str:
    resp = requests.get(f"{exporter.url}/docs/{name}", timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    assert "<script" not in resp.text
    return resp.text


def test_the_exporter_serves_the_runbook_where_the_cards_point(exporter: Running) -> None:
    assert f"/docs/{RUNBOOK.name}" == runbook.PATH
    page = served(exporter, RUNBOOK.name)
    ids = set(re.findall(r'<h[1-6] id="([^"]+)"', page))
    assert ids == set(runbook.anchors(RUNBOOK.read_text()))
    for rule in alerts():
        assert rule["alert"].lower() in ids, rule["alert"]
    # Its links to the background lead to the page beside it, and to the sections there.
    background = served(exporter, "background.md")
    sections = set(re.findall(r'<h[1-6] id="([^"]+)"', background))
    linked = set(re.findall(r'<a href="background\.md#([^"]+)"', page))
    assert linked and linked <= sections
    # The landing page leads there; other files of docs/ are not served.
    assert f'href="{runbook.PATH[1:]}"' in requests.get(exporter.url + "/", timeout=10).text
    assert requests.get(f"{exporter.url}/docs/security.md", timeout=10).status_code == 404
    assert requests.get(f"{exporter.url}/docs/../pyproject.toml", timeout=10).status_code == 404


def test_the_wheel_carries_the_runbook(tmp_path: Path) -> None:
    """What `pip install .` and the image install: grpo_monitor/runtime/runbook.md and background.md,
    symbolic links in the checkout, are in the wheel as the text of the docs they link."""
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "docs/runbook.md", "docs/background.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "exporter", src / "exporter", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    assert (src / "exporter" / "grpo_monitor" / "runtime" / "runbook.md").is_symlink()
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "--disable-pip-version-check",
                          "-w", str(tmp_path / "dist"), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    [wheel] = (tmp_path / "dist").glob("grpo_monitor-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for name in runbook.PAGES:
            assert z.read(f"grpo_monitor/runtime/{name}").decode() == (ROOT / "docs" / name).read_text()


def test_the_page_escapes_and_renders_the_markdown_it_uses() -> None:
    page = runbook.render_html(
        "# A <b>title</b>\n\nText with `code <x>`, **bold**, *em* and [a link](#a-btitleb),"
        " [another doc](signals.md#features).\n\n"
        "| a | b |\n|---|---|\n| `x \\| y` | <i> |\n\n"
        "1. first\n   continued\n\n   ```promql\n   up{job=\"x\"} # why\n   ```\n\n2. second\n"
        "- item\n\n## A <b>title</b>\n").decode()
    assert '<h1 id="a-btitleb">A &lt;b&gt;title&lt;/b&gt;</h1>' in page
    assert '<h2 id="a-btitleb-1">' in page  # GitHub's suffix for a repeated anchor
    assert "<code>code &lt;x&gt;</code>" in page and "<strong>bold</strong>" in page
    assert "<em>em</em>" in page and '<a href="#a-btitleb">a link</a>' in page
    assert 'title="docs/signals.md#features">another doc</span>' in page  # not served: no link
    assert "<td><code>x | y</code></td><td>&lt;i&gt;</td>" in page
    # A block indented under an item stays inside it.
    assert ('<ol>\n<li value="1">first continued\n<pre><code class="language-promql">'
            'up{job=&quot;x&quot;} # why</code></pre>\n</li>\n<li value="2">second\n</li></ol>') in page
    assert "<b>" not in page and "<i>" not in page


def test_github_anchors() -> None:
    assert runbook.slug("GRPOKLExplosion") == "grpoklexplosion"
    assert runbook.slug("The entropy–reward law") == "the-entropyreward-law"  # the dash goes
    assert runbook.slug("`grpo-monitor report`: the offline post-mortem") == \
        "grpo-monitor-report-the-offline-post-mortem"
    assert runbook.slug("Settings (`.env`, all optional)") == "settings-env-all-optional"
    assert runbook.slug("Which cards need the baseline, and which do not") == \
        "which-cards-need-the-baseline-and-which-do-not"


# -- the PromQL, against a real Prometheus -----------------------------------------------------

def promql_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line number, expressions) of every ```promql block. A block holds one expression per
    line; a line indented deeper than the block, or starting with a binary operator, continues
    the expression above it."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)```promql\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, start, exprs = len(m.group(1)), i + 1, []
        i += 1
        while lines[i].strip() != "```":
            body = lines[i][indent:]
            if body.strip():
                continues = body[0].isspace() or re.match(r"[-+*/%^<>=!)]|(and|or|unless)\b", body)
                if exprs and continues:
                    exprs[-1] += "\n" + body
                else:
                    exprs.append(body)
            i += 1
        blocks.append((start, exprs))
        i += 1
    return blocks


BLOCKS = promql_blocks(RUNBOOK.read_text())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus with the project's rules, scraping a real exporter that holds run
    exp-42 (a KL explosion, prompt types, two ranks on two fake GPUs): the queries meet the
    series, labels and joins they were written for."""
    work = tmp_path_factory.mktemp("runbook")
    snapshots = work / "snapshots"
    snapshots.mkdir()
    gpus = itertools.cycle(enumerate(GPU_UUIDS))

    def next_gpu(local_rank: int | None) -> tuple[str, str]:
        index, uuid = next(gpus)
        return str(index), uuid

    with ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        # Each rank's writer records the GPU it trains on, as on a real node: here, in turn.
        patch.setattr("grpo_monitor.sdk.writer._gpu_identity", next_gpu)
        write_run(snapshots, RUN, "kl_explosion", ranks=2)
        fake = FakeNVML([FakeDevice(GPU_UUIDS[0], nvlink_links=1, nvlink={0: (0, 0, 0, 0)}),
                         FakeDevice(GPU_UUIDS[1])])
        exporter = Exporter(ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0",
                                           gpu_nvml=fake, gpu_interval=0.2)).start()
        stack.callback(exporter.stop)
        wait_for(exporter.watcher.ready.is_set, timeout=60, what="exporter replayed the run")
        s = stack.enter_context(alert_stack(work / "stack", exporter.url, interval="1s"))
        s.wait_scraping()

        def result(q: str) -> list[Any]:
            return requests.get(f"{s.prom_url}/api/v1/query", params={"query": q},
                                timeout=10).json()["data"]["result"]

        # Recording rules and alerts need a few evaluations after the first scrape.
        wait_for(lambda: all(result(q) for q in (
            f'grpo_rank_info{{run="{RUN}"}}', "grpo_gpu_utilization_ratio",
            f'run_rank_key:grpo_window_mean:ratio_baseline{{run="{RUN}"}}',
            f'ALERTS{{run="{RUN}"}}')),
                 timeout=60, interval=0.5, what="rank info, GPUs, recording rules and a card",
                 diagnose=s.diagnose)
        yield s.prom_url


def test_the_runbook_has_promql() -> None:
    assert sum(len(exprs) for _, exprs in BLOCKS) > 100


@pytest.mark.parametrize(("line", "exprs"), BLOCKS, ids=[f"line{n}" for n, _ in BLOCKS])
def test_promql_block_runs(prometheus: str, line: int, exprs: list[str]) -> None:
    """Each expression exactly as a person pastes it, trailing comment included."""
    for expr in exprs:
        body = requests.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body.get("status") == "success", f"docs/runbook.md:{line}: {expr}\n-> {body}"


def test_the_queries_find_the_run(prometheus: str) -> None:
    """Not only valid: most of them find data (the rest need series the run does not log, such
    as the rollout engine's or by-type KL)."""
    exprs = [e for _, block in BLOCKS for e in block]
    found = sum(bool(requests.get(f"{prometheus}/api/v1/query", params={"query": e},
                                  timeout=10).json()["data"]["result"]) for e in exprs)
    assert found >= len(exprs) // 2, f"{found} of {len(exprs)} runbook queries return series"


# -- the commands the docs name ------------------------------------------------------------------

def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def named_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) for every `grpo-monitor ...` in a code span or a shell block; not its
    messages (``grpo-monitor serve: ...``)."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^\s*```(\w*)", line)
        if m:
            fence = None if fence is not None else m.group(1)
            continue
        if fence in ("sh", "bash", "console", ""):
            cmd = re.sub(r"^\s*\$?\s*", "", line)
            if cmd.startswith("grpo-monitor "):
                out.append((n, cmd))
        elif fence is None:
            out += [(n, c) for c in re.findall(r"`(grpo-monitor [^`]+)`", line)]
    return [(n, c) for n, c in out if not re.match(r"grpo-monitor [\w-]+:", c)]


def _check(cmd: str, parser: argparse.ArgumentParser) -> list[str]:
    words = re.split(r"\s+", re.split(r"\s(?:#|\||&&|;)", cmd)[0].strip())[1:]
    problems: list[str] = []
    commands = _commands(parser)
    while words and commands:
        word = words.pop(0)
        if word.startswith("-"):
            continue  # a top-level flag (--version, --help)
        if word not in commands:
            return [f"no command {word!r}"]
        parser = commands[word]
        commands = _commands(parser)
    # The flags its help shows: an old spelling kept working but hidden is no flag to document.
    shown = {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}
    for word in words:
        flag = word.strip("[]()`,.").split("=", 1)[0]
        if flag.startswith("--") and flag not in shown:
            problems.append(f"{flag} is not among its flags")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_command_exists(path: Path) -> None:
    parser = build_parser()
    problems = [f"{path.name}:{n}: `{cmd}`: {p}" for n, cmd in named_commands(path)
                for p in _check(cmd, parser)]
    assert not problems, "\n".join(problems)


def test_the_docs_name_commands() -> None:
    named = [c for path in DOCS for _, c in named_commands(path)]
    assert len(named) > 30 and any(c.startswith("grpo-monitor replay ") for c in named)
    assert not any("peek.py" in path.read_text() for path in DOCS), "peek.py does not exist"


def test_the_index_of_cards_is_the_catalogs() -> None:
    # Generated from contract/cards.py by `make docs`: a card added to the catalog is in the
    # index, in catalog order, by its severity.
    from grpo_monitor.contract.cards import CARDS
    from grpo_monitor.tools import runbook_index

    text = RUNBOOK.read_text()
    assert runbook_index.render(text) == text, "the runbook's index of cards is stale: run `make docs`"
    block = "\n".join(runbook_index.index())
    assert [c.name for c in CARDS if f"[{c.name}](#{c.name.lower()})" in block] == [c.name for c in CARDS]


def test_the_cards_table_of_the_signals_doc_names_every_card() -> None:
    """docs/signals.md's tables of cards ("The cards" and the cluster table under it) name every
    declared card: a card added to contract/cards.py without its line there fails here."""
    from grpo_monitor.contract.cards import CARDS

    text = (ROOT / "docs" / "signals.md").read_text()
    section = text[text.index("## The cards"):text.index("## Which cards need the baseline")]
    assert [c.name for c in CARDS if c.name not in section] == []
