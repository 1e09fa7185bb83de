"""A snapshot folder anyone can write into, on real processes: what a user places there (a FIFO,
a socket, a link to a device, a link out of the tree, a linked run folder) never blocks, never
leads elsewhere, and is counted; a file rotated away while the exporter lags is read to its
end; a burst of new run folders, one that overflows inotify's queue included, is served.

One `grpo-monitor serve` subprocess holds every hostile placement, some there before it starts
(its start-up replay must get past them) and some made while it runs; each check then asks
that it still ingests the other runs, answers /metrics and /-/healthy, and counted the reject.
The readers outside the exporter (the SDK's pause gate, resume, rebaseline, report) meet the same
placements, each in a thread that must finish.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from conftest import value
from polling import wait_for
from test_faults import INGESTED, ExporterProcess, progress, snapshot_errors

from grpo_monitor.contract.control import read_control
from grpo_monitor.contract.run_layout import PAUSE_RECORD, REBASELINE_REQUEST
from grpo_monitor.runtime.rebaseline import request_rebaseline
from grpo_monitor.sdk.pause import PauseGate

T = TypeVar("T")
TOKEN = "hostile-folder-token-0123456789"
HOOK = "/-/alertmanager/webhook"
KINDS = ("fifo", "socket", "devlink")
# What each placement is counted as.
REASON = {"fifo": "not_regular", "socket": "not_regular", "devlink": "symlink"}


def place(kind: str, path: Path) -> None:
    """A FIFO (no writer: an open without O_NONBLOCK waits forever), a bound unix socket, or a
    link to a device that never ends (a read of it would never stop)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the socket file stays after close
    else:
        path.symlink_to("/dev/zero")


def record(step: int, **extra: Any) -> str:
    return json.dumps({"step": step, "time": 1_764_400_000.0 + step, "metrics": {"loss": 0.5},
                       **extra}) + "\n"


def samples(text: str) -> list[dict[str, Any]]:
    return [{"prompt": text, "responses": [{"text": f"{text} answer", "reward": 1.0}]}]


def finishes(fn: Callable[[], T], timeout: float = 15.0) -> T:
    """``fn()`` on a thread of its own, which must end within ``timeout``: a reader that blocks
    on a FIFO would wait forever, and the test with it."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 -- re-raised on the test's thread
            box.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{fn} did not finish within {timeout}s: blocked"
    ok, result = box[0]
    if not ok:
        raise result
    return result  # type: ignore[no-any-return]


def red_card(*runs: str) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "grpo-webhook", "alerts": [
        {"status": "firing", "labels": {"alertname": "GRPONonFiniteValues", "severity": "critical",
                                        "run": run},
         "startsAt": "2025-11-29T10:00:00Z", "fingerprint": f"fp-{run}"} for run in runs]}


@dataclass
class Folder:
    root: Path
    snapshots: Path
    outside: Path
    exporter: ExporterProcess

    def healthy(self, step: int) -> None:
        """A record of the healthy run, and the exporter's ingest of it: every event before it
        (the placements) was handled without blocking the one ingest thread."""
        with (self.snapshots / "healthy" / "rank-0.jsonl").open("a") as fh:
            fh.write(record(step))
        self.exporter.wait_value("grpo_step", step, run="healthy", rank="0")

    def answers(self) -> None:
        assert requests.get(f"{self.exporter.url}/-/healthy", timeout=5).status_code == 200
        assert requests.get(f"{self.exporter.url}/-/ready", timeout=5).status_code == 200


def populate(snapshots: Path, outside: Path, suffix: str) -> None:
    """Every placement, in runs named ``<kind>-<place>-<suffix>``: a snapshot file (beside a
    healthy rank that logs samples), the re-baseline request, a link out of the tree, and a
    linked run folder whose target holds numbers and samples that must never be served."""
    for kind in KINDS:
        run = snapshots / f"{kind}-snap-{suffix}"
        place(kind, run / "rank-0.jsonl")
        run.joinpath("rank-1.jsonl").write_text(record(3, rank=1, samples=samples(f"{kind} ok")))
        place(kind, snapshots / f"{kind}-base-{suffix}" / REBASELINE_REQUEST)
    (outside / f"run-{suffix}").mkdir()
    (outside / f"run-{suffix}" / "rank-0.jsonl").write_text(
        record(999, samples=samples("secret")))
    (outside / f"secret-{suffix}.jsonl").write_text(record(999, samples=samples("secret")))
    (snapshots / f"outlink-{suffix}").mkdir()
    (snapshots / f"outlink-{suffix}" / "rank-0.jsonl").symlink_to(outside / f"secret-{suffix}.jsonl")
    (snapshots / f"linked-{suffix}").symlink_to(outside / f"run-{suffix}", target_is_directory=True)


# Per populate(): three snapshot files and three requests (two FIFOs and sockets, one device
# link each), the link out of the tree and the linked folder.
PER_POPULATE = {"not_regular": 4, "symlink": 2 + 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Folder]:
    root = tmp_path_factory.mktemp("hostile")
    snapshots, outside = root / "s", root / "outside"
    for d in (snapshots / "healthy", outside):
        d.mkdir(parents=True)
    (root / "token").write_text(TOKEN + "\n")
    populate(snapshots, outside, "before")  # met by the start-up replay
    with ExitStack() as stack:
        # No rescan while the module runs: what the exporter finds, inotify's events told it.
        exporter = ExporterProcess(stack, root, snapshots, "--web.webhook-token-file",
                                   str(root / "token"), "--web.enable-replay",
                                   "--snapshot.rescan-interval", "1h").start()
        yield Folder(root, snapshots, outside, exporter)


def test_nothing_placed_in_the_folder_blocks_leads_out_or_goes_uncounted(folder: Folder) -> None:
    exporter = folder.exporter
    folder.healthy(1)  # it got past the placements of its start-up replay
    assert snapshot_errors(exporter.scrape()) == PER_POPULATE
    populate(folder.snapshots, folder.outside, "after")  # met through file events
    folder.healthy(2)
    wait_for(lambda: snapshot_errors(exporter.scrape()) == {k: 2 * n for k, n in PER_POPULATE.items()},
             what="every placement counted once", diagnose=lambda: progress(exporter.scrape()))
    s = exporter.scrape()
    for suffix in ("before", "after"):
        for kind in KINDS:  # the healthy rank beside each placement is served
            assert value(s, "grpo_step", run=f"{kind}-snap-{suffix}", rank="1") == 3
        # Nothing from outside the tree: not the linked file, not the linked folder.
        assert value(s, "grpo_step", run=f"outlink-{suffix}", rank="0") is None
        assert value(s, "grpo_step", run=f"linked-{suffix}", rank="0") is None
    assert value(s, INGESTED, shape="native") == 2 + 2 * len(KINDS)
    assert value(s, "grpo_exporter_internal_errors_total") == 0
    log = exporter.log()
    for kind in KINDS:  # each named in the log once
        assert log.count(str(folder.snapshots / f"{kind}-snap-after" / "rank-0.jsonl")) == 1, log

    # /replay serves the samples beside a placement, and nothing of a linked run or file.
    def replay(run: str) -> requests.Response:
        return requests.get(f"{exporter.url}/replay", params={"run": run, "format": "json"},
                            timeout=10)

    for kind in KINDS:
        got = replay(f"{kind}-snap-after")
        assert got.status_code == 200 and got.json()["samples"][0]["prompt"] == f"{kind} ok"
    linked = replay("linked-after")
    assert linked.status_code == 404 and "symbolic link" in linked.text
    assert replay("outlink-after").status_code == 404
    assert "secret" not in linked.text
    folder.answers()


def test_a_red_card_replaces_what_sits_in_the_pause_records_place_in_time(folder: Folder) -> None:
    exporter = folder.exporter
    runs = [f"{kind}-ctl" for kind in KINDS]
    for kind, run in zip(KINDS, runs):
        place(kind, folder.snapshots / run / PAUSE_RECORD)
        (folder.snapshots / run / "rank-0.jsonl").write_text(record(5))
        # The trainer's gate reads the record at every step: no pause, and no wait.
        gate = PauseGate(run_dir=str(folder.snapshots / run), group=False)
        assert finishes(lambda gate=gate: gate.check(5)) is None
    before = snapshot_errors(exporter.scrape())
    # Alertmanager's POST, for the three runs at once; the webhook answers within its deadline.
    answer = requests.post(exporter.url + HOOK, json=red_card(*runs), timeout=30,
                           headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    assert answer.text.startswith("paused: ") and all(run in answer.text for run in runs)
    for run in runs:
        record_now = read_control(folder.snapshots, run)
        assert record_now is not None and record_now.state == "paused"
        assert (folder.snapshots / run / PAUSE_RECORD).is_file()
    after = snapshot_errors(exporter.scrape())
    assert {k: after.get(k, 0) - before.get(k, 0) for k in ("not_regular", "symlink")} == {
        "not_regular": 2, "symlink": 1}
    folder.healthy(3)
    folder.answers()


def test_resume_rebaseline_and_report_refuse_without_blocking(folder: Folder) -> None:
    from grpo_monitor.tools.report.load import load_run

    run_dir = folder.snapshots / "fifo-snap-after"  # a FIFO among its snapshot files
    place("fifo", run_dir / PAUSE_RECORD)
    place("fifo", run_dir / REBASELINE_REQUEST)
    # grpo-monitor resume, the real command: refuses the FIFO, says so, and does not wait on it.
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "resume", "--snapshot.dir",
                          str(folder.snapshots), run_dir.name], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 2 and "a FIFO" in res.stderr, res.stderr
    # rebaseline reads the run's newest step past the FIFO, and replaces the FIFO request.
    path, at_step = finishes(lambda: request_rebaseline(folder.snapshots, run_dir.name, steps=2,
                                                        at_step=None))
    assert at_step == 3 and path.is_file()
    with pytest.raises(ValueError, match="symbolic link"):
        finishes(lambda: request_rebaseline(folder.snapshots, "linked-after", steps=2, at_step=None))
    # The report reads the run's records, not the FIFO nor the link.
    data = finishes(lambda: load_run(run_dir))
    assert data.records == 1 and data.refused == [run_dir / "rank-0.jsonl"]
    assert finishes(lambda: load_run(folder.snapshots / "outlink-after")).records == 0
    folder.healthy(4)


def test_logrotate_rotation_while_the_exporter_lags_loses_no_line(folder: Folder) -> None:
    exporter = folder.exporter
    run = folder.snapshots / "logrotated"
    run.mkdir()
    live = run / "rank-0.jsonl"
    lines = 0

    def write(path: Path, steps: range) -> None:
        nonlocal lines
        with path.open("a") as fh:
            fh.write("".join(record(s, events=[{"type": "line"}]) for s in steps))
        lines += len(steps)

    def served(step: int) -> None:
        exporter.wait_value("grpo_step", step, run="logrotated", rank="0")
        s = exporter.scrape()
        assert value(s, "grpo_events_total", run="logrotated", rank="0", type="line") == lines

    errors_before = snapshot_errors(exporter.scrape())
    write(live, range(1, 11))
    served(10)
    # Frozen while the trainer writes on, and logrotate (delaycompress) rotates twice: the
    # oldest segment compressed to .2.gz, the file it was reading renamed to .1 with lines it
    # never read, a new file under its name.
    exporter.freeze()
    write(live, range(11, 21))
    live.rename(run / "rank-0.jsonl.1")
    write(live, range(21, 31))
    (run / "rank-0.jsonl.1").rename(run / "rank-0.jsonl.2")
    with gzip.open(run / "rank-0.jsonl.2.gz", "wb") as gz:
        gz.write((run / "rank-0.jsonl.2").read_bytes())
    (run / "rank-0.jsonl.2").unlink()
    live.rename(run / "rank-0.jsonl.1")
    write(live, range(31, 41))
    exporter.thaw()
    # Steps 11-20 went to .2.gz while it was frozen: compressed, never read (the .gz is ignored).
    # Steps 21-30 are in .1, renamed from the name it was reading: read to the end, in order.
    lines -= 10
    served(40)

    # Looking this time: a rename it sees, and a writer that appends to the renamed file before
    # it opens the new one (logrotate's create, then the trainer's reopen).
    live.rename(run / "rank-0.jsonl.1.old")
    write(run / "rank-0.jsonl.1.old", range(41, 46))
    write(live, range(46, 51))
    served(50)
    assert snapshot_errors(exporter.scrape()) == errors_before
    folder.answers()


def own_series(url: str) -> dict[str, float]:
    """The exporter's own unlabelled series, read off the text of a scrape (a body of thousands
    of runs is too big to parse whole at every poll)."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r"(?m)^(grpo_[a-z_]+|grpo_snapshot_errors_total"
                                                   r'\{reason="run_limit"\}) (\S+)$', text)}


def test_a_burst_of_new_run_folders_and_an_inotify_overflow_are_served(tmp_path: Path) -> None:
    snapshots = tmp_path / "s"
    noise = snapshots / "noise"  # a watched folder, to flood inotify's queue (16384 events)
    noise.mkdir(parents=True)

    def new_runs(names: range) -> None:
        for i in names:
            (snapshots / f"burst-{i}").mkdir()
            (snapshots / f"burst-{i}" / "rank-0.jsonl").write_text(record(1))

    with ExitStack() as stack:
        # No periodic rescan: the new folders' events, or the overflow, must bring them.
        exporter = ExporterProcess(stack, tmp_path, snapshots, "--snapshot.rescan-interval", "1h",
                                   "--metrics.max-runs", "1200").start()

        def runs() -> float:
            return own_series(exporter.url).get("grpo_runs", 0)

        new_runs(range(1000))
        wait_for(lambda: runs() == 1000, 60, interval=0.2, what="1000 new runs served",
                 diagnose=lambda: repr(own_series(exporter.url)))
        # Frozen, it reads no event: 9000 files made in the watched folder (two events each)
        # overflow the queue, and the 500 run folders made after them are events the kernel
        # dropped. The overflow's rescan alone finds them.
        exporter.freeze()
        for i in range(9000):
            os.close(os.open(noise / f"n{i}", os.O_CREAT | os.O_WRONLY))
        new_runs(range(1000, 1500))
        exporter.thaw()

        def accounted() -> bool:
            own = own_series(exporter.url)
            return (own.get("grpo_runs") == 1200 and own.get("grpo_snapshot_event_overflows_total", 0) >= 1
                    and own.get('grpo_snapshot_errors_total{reason="run_limit"}') == 300)

        wait_for(accounted, 60, interval=0.2, what="the overflow's rescan: 200 runs more, 300 "
                 "over --metrics.max-runs", diagnose=lambda: repr(own_series(exporter.url)))
        assert requests.get(f"{exporter.url}/-/healthy", timeout=5).status_code == 200
        assert "Inotify queue overflowed" in exporter.log()
