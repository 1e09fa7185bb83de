"""Faults, each on real processes: nothing written is lost, nothing is served twice.

The exporter runs as `grpo-monitor serve`, a child process that is killed (SIGKILL), frozen
(SIGSTOP: it lags behind the writers as a loaded exporter does, and finds the files changed
under it when it goes on) and started again on the same folder; trainers write through the
real SnapshotWriter (or verl's file logger); a full disk is a real 256 KiB tmpfs; Prometheus
and Alertmanager are the real binaries on the committed configs (tests/prometheus_harness.py);
the exporter that meets an unreadable folder runs as an unprivileged user.

What a restart must serve again is what the files hold: every `*.jsonl` counter (records
ingested, events, non-finite values, snapshot errors) is rebuilt from them, so after a crash
it equals what the files hold, neither less (lost) nor more (served twice).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from conftest import Running, Samples, scrape, value
from fleet import exporter_env
from polling import wait_for
from processes import log_tail, start_child, start_listening, wait_ready
from prometheus_harness import prometheus_config, server_state, start_alertmanager, start_prometheus
from test_integration_verl import FileLogger, verl_metrics

from grpo_monitor.contract.control import read_control
from grpo_monitor.runtime.health import ERROR_REASONS
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.stack import Child

SERVE = [sys.executable, "-m", "grpo_monitor.cli", "serve"]
INGESTED = "grpo_snapshots_ingested_total"
# Root reads any folder whatever its mode: without these two capabilities it cannot, as a
# normal user cannot. (Not another uid: it could not enter the clone's own folder, which may be
# private to root, to run the virtualenv's python.)
WITHOUT_DAC_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]



def _task_state(task: Path) -> str:
    """A thread's state letter (/proc/PID/task/TID/stat, after the parenthesised name); "T" once
    a gone thread can no longer run."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "T"

class ExporterProcess(Running):
    """`grpo-monitor serve` as a child process that can be killed, frozen and started again on
    the same folder (each start on a new port, with its own log). Running's scrape helpers
    need only ``url``."""

    def __init__(self, stack: ExitStack, workdir: Path, snapshot_dir: Path, *flags: str,
                 user: Sequence[str] = ()) -> None:
        self._stack = stack
        self._workdir = workdir
        self._argv = [*user, *SERVE, "--snapshot.dir", str(snapshot_dir), "--no-collector.gpu", *flags]
        self.starts = 0
        self.process: Child | None = None
        self.url = ""

    def start(self) -> ExporterProcess:
        """Start and wait until ready: the files on disk have been replayed."""
        self.starts += 1
        self.process, port = start_listening(
            self._stack, f"exporter-{self.starts}",
            lambda port: [*self._argv, "--web.listen-address", f"127.0.0.1:{port}"],
            self._workdir, env=exporter_env())
        self.url = f"http://127.0.0.1:{port}"
        self._stack.callback(self.thaw)  # a frozen process cannot stop on SIGTERM
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.proc.pid

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.process is not None
        self.process.proc.kill()
        self.process.proc.wait(10)

    def stop(self) -> None:
        assert self.process is not None
        self.process.stop()

    def freeze(self) -> None:
        """SIGSTOP, and back once every thread of the exporter is stopped: the signal is only
        queued by kill(), and on a busy machine a thread may run on (read a file) for a while."""
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(lambda: all(_task_state(task) in ("T", "t") for task in Path(f"/proc/{self.pid}/task").iterdir()),
                 timeout=10, what=f"every thread of {self.pid} stopped")

    def thaw(self) -> None:
        if self.process is not None and self.process.alive():
            os.kill(self.pid, signal.SIGCONT)

    def log(self) -> str:
        assert self.process is not None
        return self.process.log.read_text(errors="replace")

    def caught_up(self, records: int, timeout: float = 20.0, **run_ended: str) -> Samples:
        """Wait until ``records`` records are ingested (and, given ``run=``, the run's end is
        seen: the last record of its files); the scrape of that moment."""
        def done() -> Samples | None:
            s = self.scrape()
            ingested = value(s, INGESTED, shape="native") or 0
            ended = not run_ended or value(s, "grpo_run_ended", **run_ended) == 1
            return s if ingested >= records and ended else None

        return wait_for(done, timeout, what=f"{records} records ingested",
                        diagnose=lambda: f"{progress(self.scrape())}\n--- log ---\n{self.log()}")


def progress(samples: Samples) -> str:
    """What a failure message needs of a scrape: how far the exporter got, and its errors."""
    wanted = (INGESTED, "grpo_step", "grpo_run_ended", "grpo_snapshot_errors_total")
    return repr({k: v for k, v in samples.items() if k[0] in wanted})


def run_series(samples: Samples, run: str) -> dict[tuple[str, frozenset[tuple[str, str]]], str]:
    """Every run family sample of ``run``, its value as repr (NaN != NaN)."""
    return {k: repr(v) for k, v in samples.items() if k[0].startswith("grpo_") and ("run", run) in k[1]}


def snapshot_errors(samples: Samples) -> dict[str, float]:
    """The non-zero grpo_snapshot_errors_total reasons."""
    return {r: n for r in ERROR_REASONS if (n := value(samples, "grpo_snapshot_errors_total", reason=r))}


class Rank:
    """What one rank wrote, to judge the exporter by: its records, steps and values."""

    CHECKPOINT_EVERY = 100
    NAN_AT = 123  # every 400 steps from here: a NaN loss (counted, left out of the windows)

    def __init__(self, writer: SnapshotWriter) -> None:
        self.writer = writer
        self.rank = writer.rank
        self.steps: list[int] = []
        self.loss: dict[int, float] = {}
        self.checkpoints = 0
        self.nans = 0

    def log(self, step: int) -> None:
        loss = math.nan if step % 400 == self.NAN_AT else self.rank + step / 1000
        events = None
        if step % self.CHECKPOINT_EVERY == 0:
            events = [{"type": "checkpoint_save", "duration_s": 1.5}]
            self.checkpoints += 1
        metrics = {"loss": loss, "reward/mean": step / 10_000, "kl/mean": 0.01 * self.rank,
                   "perf/step_time_s": 1.0 + self.rank}
        assert self.writer.log(metrics, step, events=events, timestamp=1_764_400_000.0 + step)
        self.steps.append(step)
        self.loss[step] = loss
        self.nans += math.isnan(loss)

    def window_mean(self, key_values: dict[int, float], window: int) -> float:
        """grpo_window_mean over the last ``window`` steps: the finite values' mean."""
        last = self.steps[-1]
        chunk = [v for s, v in key_values.items() if s > last - window and math.isfinite(v)]
        return sum(chunk) / len(chunk)

    def assert_served(self, s: Samples, run: str) -> None:
        lbl = {"run": run, "rank": str(self.rank)}
        last = self.steps[-1]
        assert value(s, "grpo_step", **lbl) == last
        assert value(s, "grpo_loss", **lbl) == self.loss[last]
        assert value(s, "grpo_window_mean", key="loss", window_steps="20", offset_steps="0",
                     **lbl) == pytest.approx(self.window_mean(self.loss, 20), rel=1e-12)
        assert value(s, "grpo_events_total", type="checkpoint_save", **lbl) == self.checkpoints
        assert (value(s, "grpo_nonfinite_values_total", key="loss", **lbl) or 0) == self.nans


# -- 1. the exporter killed mid-ingest, and started again --------------------------------------


def ingested(exporter: Running) -> float:
    return value(exporter.scrape(), INGESTED, shape="native") or 0


def test_sigkill_mid_ingest_then_restart_loses_nothing_and_counts_nothing_twice(
        tmp_path: Path, snapshot_dir: Path) -> None:
    run, world, phases, steps_per_phase = "killed", 4, 4, 300
    ranks = [Rank(SnapshotWriter(snapshot_dir, run, rank=r, world_size=world,
                                 max_bytes=8 << 10, keep_segments=1000)) for r in range(world)]
    go = [threading.Event() for _ in range(phases)]

    def train(rank: Rank) -> None:
        for phase in range(phases):
            go[phase].wait()
            for step in range(phase * steps_per_phase, (phase + 1) * steps_per_phase):
                rank.log(step)
                if step % 10 == 9:
                    time.sleep(0.01)  # a trainer's pace, not a synchronisation

    def written() -> int:
        return min(len(r.steps) for r in ranks)

    threads = [threading.Thread(target=train, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    with ExitStack() as stack:
        # The reference is never killed, but it lags: frozen while the ranks write and rotate
        # (SIGSTOP), it goes on amid their renames.
        (tmp_path / "lagging").mkdir()
        (tmp_path / "killed").mkdir()
        lagging = ExporterProcess(stack, tmp_path / "lagging", snapshot_dir).start()
        killed = ExporterProcess(stack, tmp_path / "killed", snapshot_dir)
        for phase in range(phases):
            killed.start()  # replays what is there while the ranks go on
            at_start = ingested(killed)
            go[phase].set()
            lagging.freeze()
            wait_for(lambda: written() >= phase * steps_per_phase + steps_per_phase // 2)
            lagging.thaw()
            # Killed while it reads what the ranks write.
            wait_for(lambda: ingested(killed) > at_start)
            killed.kill()
        for t in threads:
            t.join(30)
        for r in ranks:
            r.writer.close()  # run_end: the last record of each file
        assert [r.writer.dropped_records for r in ranks] == [0] * world
        records = sum(len(r.steps) + 1 for r in ranks)
        assert records == world * (phases * steps_per_phase + 1)
        assert len(list((snapshot_dir / run).glob("rank-0.*.jsonl"))) >= 10  # it rotated

        killed.start()
        after = killed.caught_up(records, run=run)
        assert value(after, INGESTED, shape="native") == records  # nothing read twice
        assert snapshot_errors(after) == {}
        for r in ranks:
            r.assert_served(after, run)
            assert value(after, "grpo_events_total", run=run, rank=str(r.rank), type="run_end") == 1
        assert killed.starts == phases + 1

        # The same series as the exporter that read it all as it came, however late.
        live = lagging.caught_up(records, run=run)
        assert value(live, INGESTED, shape="native") == records
        assert run_series(after, run) == run_series(live, run)


# -- 2. a file truncated and rewritten under the exporter -------------------------------------


def test_truncated_and_rewritten_files_are_followed(tmp_path: Path, snapshot_dir: Path) -> None:
    run = "verl-resumed"
    (snapshot_dir / run).mkdir()
    path = snapshot_dir / run / "verl.jsonl"
    lbl = {"run": run, "rank": "0"}
    with ExitStack() as stack:
        exporter = ExporterProcess(stack, tmp_path, snapshot_dir).start()
        logger = FileLogger(path)
        for step in range(1, 7):
            logger.log(verl_metrics(step), step)
        # verl dies mid-line: the half line is never parsed.
        half = logger.line(verl_metrics(7), 7)
        logger.fp.write(half[: len(half) // 2])
        exporter.wait_value("grpo_step", 6, **lbl)
        logger.finish()

        # Resumed from the step-3 checkpoint, while the exporter does not look: verl truncates
        # its log ("wb") and writes steps 4..9 past where the exporter had read, so only the
        # changed bytes say that this is not an append.
        exporter.freeze()
        logger = FileLogger(path)
        for step in range(4, 10):
            logger.log(verl_metrics(step), step)
        assert path.stat().st_size > len(b"".join(logger.line(verl_metrics(s), s) for s in range(1, 7)))
        exporter.thaw()
        exporter.wait_value("grpo_step", 9, **lbl)
        s = exporter.scrape()
        data = verl_metrics(9)
        assert value(s, "grpo_reward_mean", **lbl) == data["critic/score/mean"]
        assert value(s, "grpo_entropy_mean", **lbl) == data["actor/entropy"]
        # What the exporter read: steps 1..6, then 4..9 of the rewrite. Nothing counted lost.
        assert value(s, INGESTED, shape="verl") == 12
        assert snapshot_errors(s) == {}

        # Resumed again from step 2, the exporter looking: the file is shorter than before.
        logger.finish()
        logger = FileLogger(path)
        for step in (3, 4):
            logger.log(verl_metrics(step), step)
        exporter.wait_value("grpo_step", 4, **lbl)
        s = exporter.scrape()
        assert value(s, "grpo_reward_mean", **lbl) == verl_metrics(4)["critic/score/mean"]
        assert value(s, INGESTED, shape="verl") == 14
        assert snapshot_errors(s) == {}
        logger.finish()

        # A whole-file record rewritten in place to the same size within one tick of the file
        # system's clock (coarse timestamps, NFS): size and mtime say "unchanged", the content
        # does not. Both versions get one mtime, ahead of our clock as a file server's may be:
        # however late the exporter read the first, that read fell within the tick.
        latest = snapshot_dir / "rewritten" / "latest.json"
        latest.parent.mkdir()
        tick = time.time_ns() + 60 * 10**9
        scratch = latest.with_name("latest.json.tmp")  # no half-written file for the first read
        scratch.write_text(json.dumps({"step": 20, "custom/score": 0.25}))
        os.utime(scratch, ns=(tick, tick))
        scratch.rename(latest)
        exporter.wait_value("grpo_metric_value", 0.25, run="rewritten", rank="0", key="custom/score")
        size = latest.stat().st_size
        exporter.freeze()
        latest.write_text(json.dumps({"step": 21, "custom/score": 0.75}))
        os.utime(latest, ns=(tick, tick))
        assert latest.stat().st_size == size
        exporter.thaw()
        exporter.wait_value("grpo_metric_value", 0.75, run="rewritten", rank="0", key="custom/score")
        assert snapshot_errors(exporter.scrape()) == {}

        # Deleted and begun afresh under the same name (a new trainer process, a fresh log)
        # while the exporter does not look: it reads the new file for the change events queued
        # before the delete event, which must then not make it read that file again.
        fresh = snapshot_dir / "restarted" / "rank-0.jsonl"
        fresh.parent.mkdir()
        fresh.write_text("".join(json.dumps({"step": s, "metrics": {"loss": 1.0}}) + "\n" for s in (1, 2)))
        exporter.wait_value("grpo_step", 2, run="restarted", rank="0")
        exporter.freeze()
        with fresh.open("a") as fh:  # a change event, queued before the delete event
            fh.write(json.dumps({"step": 3, "metrics": {"loss": 1.0}}) + "\n")
        os.link(fresh, tmp_path / "old-log")  # keeps its inode number taken
        fresh.unlink()
        fresh.write_text("".join(json.dumps({"step": s, "metrics": {"loss": 2.0}}) + "\n" for s in (1, 2)))
        exporter.thaw()
        exporter.wait_value("grpo_loss", 2.0, run="restarted", rank="0")
        s = exporter.caught_up(2 + 2)
        # Step 3 left with the deleted file before anyone read it.
        assert value(s, INGESTED, shape="native") == 2 + 2
        assert value(s, "grpo_step", run="restarted", rank="0") == 2


# -- 3. rotation the exporter did not see happen ---------------------------------------------


def _rotate_unseen(tmp_path: Path, snapshot_dir: Path, unseen: Callable[[ExporterProcess], None],
                   seen: Callable[[ExporterProcess], None]) -> None:
    run = "rotated"
    rank = Rank(SnapshotWriter(snapshot_dir, run, rank=0, world_size=1, max_bytes=8 << 10,
                               keep_segments=1000))
    with ExitStack() as stack:
        exporter = ExporterProcess(stack, tmp_path, snapshot_dir).start()
        for step in range(50):
            rank.log(step)
        exporter.caught_up(50)
        unseen(exporter)
        for step in range(50, 400):  # past several rotations
            rank.log(step)
        assert len(list((snapshot_dir / run).glob("rank-0.*.jsonl"))) >= 3
        seen(exporter)
        rank.writer.close()
        s = exporter.caught_up(401, run=run)
        assert value(s, INGESTED, shape="native") == 401  # every record once
        assert snapshot_errors(s) == {}
        rank.assert_served(s, run)


def test_rotation_while_the_exporter_is_down(tmp_path: Path, snapshot_dir: Path) -> None:
    _rotate_unseen(tmp_path, snapshot_dir, ExporterProcess.stop, ExporterProcess.start)


def test_rotation_while_the_exporter_lags(tmp_path: Path, snapshot_dir: Path) -> None:
    # Frozen, it keeps its offsets and its inotify watches: when it goes on, the name it was
    # reading holds a new file and the file it was reading has another name.
    _rotate_unseen(tmp_path, snapshot_dir, ExporterProcess.freeze, ExporterProcess.thaw)


# -- 4. a full disk under the writer ----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted at teardown whatever happened."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mnt)], check=True)


def test_full_disk_drops_and_counts_records_and_resumes_without_a_torn_line(
        tmp_path: Path, small_disk: Path) -> None:
    run = "full"
    filler = small_disk / ".filler"
    filler.write_bytes(b"\0" * (200 << 10))  # a dotfile: no snapshot

    # Records of one odd length (4-digit steps, one clock format): the space left, some number
    # of 4 KiB pages, is no multiple of it, so the disk fills in the middle of a record.
    def metrics(pad: str) -> dict[str, float]:
        return {"loss": 0.5, "reward/mean": 0.25, pad: 1.0}

    def append(writer: SnapshotWriter, step: int, pad: str) -> bool:
        return writer.log(metrics(pad), step, timestamp=1_764_400_000.0 + step)

    pad = "pad"
    with SnapshotWriter(tmp_path / "measure", run, rank=0, world_size=1) as measure:
        append(measure, 1000, pad)
        if os.path.getsize(measure.path) % 2 == 0:
            pad += "d"
    writer = SnapshotWriter(small_disk, run, rank=0, world_size=1)
    path = Path(writer.path)
    written: list[int] = []
    failed: list[int] = []

    def log() -> bool:
        step = 1000 + len(written) + len(failed)
        size = path.stat().st_size
        ok = append(writer, step, pad)
        (written if ok else failed).append(step)
        if not ok and len(failed) == 1:
            # The disk filled mid-record: tmpfs took the bytes that fit in the file's last page
            # and refused the rest. The writer took the fragment back.
            assert size % 4096 != 0, "the first failed record fit in no page: no torn write"
            assert path.stat().st_size == size
        return ok

    with ExitStack() as stack:
        exporter = ExporterProcess(stack, tmp_path, small_disk).start()
        while not failed:
            log()
        for _ in range(20):  # still full: dropped and counted, never raised
            assert not log()
        assert writer.write_errors >= 1
        assert writer.dropped_records == len(failed)
        exporter.caught_up(len(written))

        filler.unlink()  # space returns: the writer goes on by itself (retried once a second)
        wait_for(log, timeout=10)
        for _ in range(10):
            assert log()
        writer.close()
        assert writer.dropped_records == len(failed)

        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b""
        records = [json.loads(line) for line in lines[:-1]]  # whole lines only
        assert [r["step"] for r in records][:-1] == written
        s = exporter.caught_up(len(written) + 1, run=run)
        assert value(s, INGESTED, shape="native") == len(written) + 1
        assert snapshot_errors(s) == {}  # no torn fragment reached the exporter
        assert value(s, "grpo_step", run=run, rank="0") == written[-1]


def test_torn_tail_taken_back_after_the_exporter_saw_it(tmp_path: Path, snapshot_dir: Path) -> None:
    """The writer takes a torn record back at once, but the exporter may have looked between
    the write and the truncation: the half line it saw must neither count nor move it."""
    run = "torn"
    rank = Rank(SnapshotWriter(snapshot_dir, run, rank=0, world_size=1))
    with ExitStack() as stack:
        exporter = ExporterProcess(stack, tmp_path, snapshot_dir).start()
        for step in range(20):
            rank.log(step)
        exporter.caught_up(20)
        path = Path(rank.writer.path)
        whole = path.stat().st_size
        with path.open("ab") as fh:  # what the disk had room for
            fh.write(b'{"run":"torn","rank":0,"step":20,"time":1764400020.0,"metrics":{"lo')
        # Files are read in the order their events came, on one thread: once a later file is
        # read, so is the fragment.
        marker = snapshot_dir / "marker" / "rank-0.jsonl"
        marker.parent.mkdir()
        marker.write_text(json.dumps({"step": 1, "metrics": {}}) + "\n")
        exporter.caught_up(21)
        os.truncate(path, whole)  # taken back
        for step in range(20, 30):
            rank.log(step)
        rank.writer.close()
        s = exporter.caught_up(21 + 11, run=run)
        assert value(s, INGESTED, shape="native") == 32  # nothing read twice
        assert snapshot_errors(s) == {}
        rank.assert_served(s, run)


# -- 5. Prometheus or Alertmanager down when a red card happens ------------------------------


HOOK = "/-/alertmanager/webhook"


def test_red_card_pauses_the_run_after_alertmanager_or_prometheus_comes_back(
        tmp_path: Path, snapshot_dir: Path) -> None:
    workdir = tmp_path / "alerting"
    workdir.mkdir()
    token_file = workdir / "webhook-token"
    token_file.write_text("faults-token-0123456789abcdef\n")
    token_file.chmod(0o600)
    writers = {run: SnapshotWriter(snapshot_dir, run, rank=0, world_size=1)
               for run in ("am-down", "prom-down")}
    for w in writers.values():
        for step in range(1, 4):
            w.log({"loss": 0.5, "reward/mean": 0.4}, step)
    with ExitStack() as stack:
        exporter = ExporterProcess(stack, workdir, snapshot_dir,
                                   "--web.webhook-token-file", str(token_file)).start()
        am, am_url, _ = start_alertmanager(stack, workdir, exporter.url + HOOK, token_file)
        # Prometheus re-sends a firing alert every --rules.alert.resend-delay (1m by default):
        # that is how a card fired while Alertmanager was away reaches it when it is back.
        prom, prom_url = start_prometheus(
            stack, workdir, prometheus_config(exporter.url.split("://")[1], am_url.split("://")[1], "1s"),
            flags=["--rules.alert.resend-delay=1s"])
        processes = [am, prom]

        def diagnose() -> str:
            return "\n".join([*server_state(prom_url, am_url, ("grpo_window_nonfinite",)),
                              *(f"--- {p.name} ---\n{log_tail(p)}" for p in processes),
                              f"--- exporter ---\n{exporter.log()[-3000:]}"])

        def query(promql: str) -> list[dict]:
            return requests.get(f"{prom_url}/api/v1/query", params={"query": promql},
                                timeout=5).json()["data"]["result"]

        def restart(process: Child) -> Child:
            """The same command line: the same port and storage."""
            again = start_child(stack, process.name, list(process.proc.args), workdir,
                                url=process.url, log=workdir / f"{process.name}-2.log")
            processes.append(again)
            wait_ready(again)
            return again

        def paused(run: str) -> bool:
            rec = read_control(snapshot_dir, run)
            return rec is not None and rec.state == "paused" and rec.alertname == "GRPONonFiniteValues"

        wait_for(lambda: len(query('grpo_step{run=~"am-down|prom-down"}')) == 2, 30,
                 what="both runs scraped", diagnose=diagnose)

        # Alertmanager is down when the loss turns NaN: the card fires, its delivery fails.
        am.stop()
        writers["am-down"].log({"loss": math.nan, "reward/mean": 0.4}, 4)
        wait_for(lambda: query('ALERTS{alertname="GRPONonFiniteValues",run="am-down",alertstate="firing"}'),
                 30, what="the card firing in Prometheus", diagnose=diagnose)
        wait_for(lambda: sum(v for (name, _), v in scrape(prom_url).items()
                             if name == "prometheus_notifications_errors_total") > 0,
                 30, what="a failed delivery (Prometheus' own counter)", diagnose=diagnose)
        assert read_control(snapshot_dir, "am-down") is None
        restart(am)
        wait_for(lambda: paused("am-down"), 30, what="am-down paused", diagnose=diagnose)

        # Prometheus is down when the loss turns NaN: the exporter holds the window (steps, not
        # time), and the first evaluation after the restart fires the card.
        prom.stop()
        writers["prom-down"].log({"loss": math.nan, "reward/mean": 0.4}, 4)
        exporter.wait_value("grpo_window_nonfinite", 1, run="prom-down", rank="0", key="loss",
                            window_steps="50")
        restart(prom)
        wait_for(lambda: paused("prom-down"), 40, what="prom-down paused", diagnose=diagnose)
        assert paused("am-down")
        for w in writers.values():
            assert w.should_pause()  # what the trainer sees


# -- 6. links and a folder the exporter may not read ------------------------------------------


def test_links_and_unreadable_folder_are_counted_once_and_the_rest_served(
        tmp_path: Path, world_readable_dir: Path) -> None:
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to drop root's read override"
    snap = world_readable_dir / "snapshots"
    outside = world_readable_dir / "outside"
    for d in (snap / "healthy", snap / "loops", snap / "denied", outside):
        d.mkdir(parents=True)
    with SnapshotWriter(snap, "healthy", rank=0, world_size=1) as w:
        w.log({"loss": 0.25}, 7)
    with SnapshotWriter(snap, "denied", rank=0, world_size=1) as w:
        w.log({"loss": 0.5}, 3)
    locked = SnapshotWriter(snap, "locked", rank=0, world_size=1)
    locked.log({"loss": 0.5}, 1)
    (snap / "loops" / "rank-0.jsonl").symlink_to("rank-0.jsonl")  # itself
    (snap / "loops" / "up").symlink_to("..", target_is_directory=True)  # the whole tree
    (snap / "denied").chmod(0)
    # A record only a rescan can see: appended through a hard link from outside the tree
    # (inotify reports a change under the name it was made by). Its arrival is the sign that
    # a rescan has run, and the errors it finds have been counted again or not.
    probe = outside / "probe.jsonl"
    probe.write_text("")
    (snap / "probe").mkdir()
    os.link(probe, snap / "probe" / "rank-0.jsonl")
    for p in (world_readable_dir, snap, outside):
        p.chmod(0o755)

    with ExitStack() as stack:
        stack.callback((snap / "denied").chmod, 0o755)
        exporter = ExporterProcess(stack, tmp_path, snap, "--snapshot.rescan-interval", "200ms",
                                   user=WITHOUT_DAC_OVERRIDE).start()
        probes = 0

        def rescanned() -> None:
            """Return once a rescan has run since the call."""
            nonlocal probes
            probes += 1
            with probe.open("a") as fh:
                fh.write(json.dumps({"step": probes, "metrics": {"loss": 1.0}}) + "\n")
            exporter.wait_value("grpo_step", probes, run="probe", rank="0")

        exporter.wait_value("grpo_step", 7, run="healthy", rank="0")
        exporter.wait_value("grpo_step", 1, run="locked", rank="0")
        for _ in range(3):
            rescanned()
        s = exporter.scrape()
        # The folder, once; the two links (never followed, looping or not), once each.
        assert snapshot_errors(s) == {"read_error": 1, "symlink": 2}
        assert value(s, "grpo_step", run="denied", rank="0") is None
        assert value(s, INGESTED, shape="native") == 2 + 1 + probes  # healthy's step and end
        log = exporter.log()
        assert log.count(str(snap / "denied")) == 1, log
        assert log.count(str(snap / "loops" / "rank-0.jsonl")) == 1, log
        assert value(s, "grpo_exporter_internal_errors_total") == 0

        # A file made unreadable while its writer goes on: every write is an event and a failed
        # read, counted once; readable again, every record is read.
        Path(locked.path).chmod(0)
        for step in (2, 3, 4):
            locked.log({"loss": 0.5}, step)
        rescanned()
        assert exporter.errors("read_error") == 2
        Path(locked.path).chmod(0o644)
        exporter.wait_value("grpo_step", 4, run="locked", rank="0")

        # The folder readable: read by the next rescan.
        (snap / "denied").chmod(0o755)
        exporter.wait_value("grpo_step", 3, run="denied", rank="0")
        # Unreadable again while its trainer goes on: counted again; readable again, read on
        # from where it was, not from the top.
        (snap / "denied").chmod(0)
        with SnapshotWriter(snap, "denied", rank=0, world_size=1) as w:
            w.log({"loss": 0.5}, 4)
        rescanned()
        assert exporter.errors("read_error") == 3
        (snap / "denied").chmod(0o755)
        exporter.wait_value("grpo_step", 4, run="denied", rank="0")
        rescanned()
        s = exporter.scrape()
        assert value(s, INGESTED, shape="native") == 2 + 4 + probes + 2 + 2
        assert snapshot_errors(s) == {"read_error": 3, "symlink": 2}
        locked.close()
