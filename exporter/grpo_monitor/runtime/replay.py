"""Sample replay (background.md#reading-samples): the prompts, responses and rewards a trainer logged.

Numbers say that something is wrong; the logged samples show what. This module reads a run's
snapshot files on request (it keeps no state and serves no HTTP itself):

* ``find_samples`` / ``available_steps``: which steps of a run carry ``samples``, and those of one
  step. Files are streamed line by line with a bounded line size; bad lines are skipped. Every
  file is opened through safe_io, within the snapshot folder: a run folder that is a link is
  refused (``LinkedRun``), and a link, FIFO or device among its files is skipped unread; the
  ingest counts both.
* ``render_json`` / ``render_html``: the payloads. Prompts and responses are model output, i.e.
  hostile text: the HTML page escapes every string and loads nothing from outside.
* ``replay_http``: ``/replay?run=R&step=S[&format=json|html]`` as (status, content type, body).
* ``print_replay``: the same as readable terminal text (``grpo-monitor replay RUN --step S``).
"""

from __future__ import annotations

import html
import json
import math
import os
import sys
from bisect import bisect_right, insort
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from grpo_monitor.contract.run_layout import (
    DEFAULT_RUN,
    is_appended,
    folder_name,
    is_run_label,
    run_files,
)
from grpo_monitor.contract.safe_io import Refused, lines, open_regular
from grpo_monitor.contract.samples import reward_sort_key
from grpo_monitor.contract.snapshot import (
    RecordError,
    Sample,
    Snapshot,
    Timeline,
    identity_from_path,
    parse_record,
)

__all__ = ["LinkedRun", "available_steps", "find_samples", "print_replay", "render_html",
           "render_json", "replay_http"]

MAX_LINE_BYTES = 4 << 20  # a samples line is larger than a metrics line; still bounded
MAX_JSON_FILE_BYTES = 16 << 20
_MARK = b'"samples"'  # cheap pre-filter: most lines are metrics only
_ROLLBACK = b'"rollback"'  # a rollback mark: the steps after its to_step are undone

# (step, rank) -> where the record lies: (path, byte offset or -1 for a whole *.json file)
_Index = dict[tuple[int, int], tuple[Path, int]]
# (first undone step, last undone step, the step the run went back to) of samples undone
Undone = list[tuple[int, int, int]]


# -- reading --------------------------------------------------------------------------------


class LinkedRun(ValueError):
    """The run's folder is a symbolic link: never followed (docs/security.md)."""

    def __init__(self, run: str) -> None:
        super().__init__(f"run {run!r} is a symbolic link in the snapshot folder; links are never "
                         "followed")


def _lines(fh: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of each complete line that mentions samples or a rollback; oversized lines
    skipped."""
    for start, line in lines(fh, MAX_LINE_BYTES):
        if line is not None and (_MARK in line or _ROLLBACK in line):
            yield start, line


def _read_at(snapshot_dir: Path, path: Path, offset: int) -> bytes:
    with open_regular(snapshot_dir, path) as fh:
        if offset < 0:
            return fh.read(MAX_JSON_FILE_BYTES + 1)
        fh.seek(offset)
        return fh.readline(MAX_LINE_BYTES + 1)


def _snapshot(raw: bytes, path: Path, snapshot_dir: Path, mtime: float) -> Snapshot | None:
    try:
        obj = json.loads(raw)
        _, rank = identity_from_path(path, snapshot_dir)
        return parse_record(obj, run="", rank=rank, mtime=mtime)
    except (ValueError, RecordError, RecursionError):
        return None


def _parse(raw: bytes, path: Path, snapshot_dir: Path, mtime: float) -> tuple[int, int, list[Sample]] | None:
    snap = _snapshot(raw, path, snapshot_dir, mtime)
    return (snap.step, snap.rank, snap.samples) if snap is not None and snap.samples else None


def _index(snapshot_dir: Path, run: str, undone: Undone | None = None) -> _Index:
    """Each (step, rank) with samples -> where its record lies, on the run's surviving timeline
    (docs/signals.md#a-runs-timeline): a rollback mark undoes the samples after its to_step, a
    sample record older than the rank's newest those from its step on; ``undone`` gets the
    spans undone."""
    index: _Index = {}
    timeline = Timeline()
    spans = undone if undone is not None else []
    # Each rank's indexed steps, ascending: a rewind cuts its tail (bisect), so that a run with
    # a rollback on every record is indexed in time linear in its records.
    steps: dict[int, list[int]] = {}

    def add(step: int, rank: int, where: tuple[Path, int]) -> None:
        if (step, rank) not in index:
            ranked = steps.setdefault(rank, [])
            if not ranked or step > ranked[-1]:
                ranked.append(step)
            else:
                insort(ranked, step)  # a *.json record: no timeline of its own
        index[(step, rank)] = where

    def rewind(rank: int, keep_through: int) -> None:
        ranked = steps.get(rank, [])
        cut = bisect_right(ranked, keep_through)
        gone = ranked[cut:]
        if gone:
            spans.append((gone[0], gone[-1], keep_through))
            del ranked[cut:]
        for step in gone:
            del index[(step, rank)]

    # In the order written: a later record of the same step and rank replaces an earlier one.
    try:
        files = run_files(snapshot_dir / folder_name(run), root=snapshot_dir)
    except Refused:
        raise LinkedRun(run) from None
    if run == DEFAULT_RUN:  # the loose files of the snapshot folder are run "default" too
        files += run_files(snapshot_dir, nested=False)
    for path in files:
        try:
            with open_regular(snapshot_dir, path) as fh:
                st = os.fstat(fh.fileno())
                if not is_appended(path):
                    if st.st_size > MAX_JSON_FILE_BYTES:
                        continue
                    found = _parse(fh.read(MAX_JSON_FILE_BYTES + 1), path, snapshot_dir, st.st_mtime)
                    if found:
                        add(found[0], found[1], (path, -1))
                    continue
                for offset, line in _lines(fh):
                    snap = _snapshot(line, path, snapshot_dir, st.st_mtime)
                    if snap is None:
                        continue
                    # Only the lines with samples or a rollback mark are read: the sample steps
                    # stand for the rank's steps.
                    keep = timeline.undone_after(snap.rank, snap.step, bool(snap.samples), snap.events)
                    if keep is not None:
                        rewind(snap.rank, keep)
                    if snap.samples:
                        add(snap.step, snap.rank, (path, offset))
        except OSError:
            continue  # vanished, unreadable, a link or a FIFO (Refused): skip the file
    return index


def available_steps(snapshot_dir: Path, run: str) -> list[int]:
    """The steps of ``run`` whose records carry samples, ascending; [] for an invalid run
    (LinkedRun for a linked run folder)."""
    if not is_run_label(run):
        return []
    return sorted({step for step, _ in _index(Path(snapshot_dir), run)})


def find_samples(snapshot_dir: Path, run: str, step: int | None) -> tuple[int, list[Sample]] | None:
    """The samples logged at ``step`` of ``run``, as (chosen step, samples).

    ``step=None`` picks the newest step with samples; a step without samples falls back to the
    nearest earlier step with samples (the returned step says which was chosen). Samples that
    several ranks logged at that step are joined in rank order. None when there is none (or the
    run name is invalid); LinkedRun when the run's folder is a link.
    """
    found = _find(Path(snapshot_dir), run, step)
    return None if found is None else (found[0], found[1])


def _find(snapshot_dir: Path, run: str, step: int | None) -> tuple[int, list[Sample], Undone] | None:
    """find_samples, with the spans undone whose steps hold the chosen step (its samples are
    then those of the pass that stands)."""
    if not is_run_label(run):
        return None
    undone: Undone = []
    index = _index(snapshot_dir, run, undone)
    steps = {s for s, _ in index if step is None or s <= step}
    if not steps:
        return None
    chosen = max(steps)
    samples: list[Sample] = []
    for (s, rank), (path, offset) in sorted(index.items()):
        if s != chosen:
            continue
        try:
            found = _parse(_read_at(snapshot_dir, path, offset), path, snapshot_dir, 0.0)
        except OSError:  # gone or swapped since the index was made
            continue
        if found:
            samples.extend(found[2])
    return (chosen, samples, [u for u in undone if u[0] <= chosen <= u[1]]) if samples else None


# -- rendering ------------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _sorted_responses(sample: Sample) -> list[Any]:
    return sorted(sample.responses, key=lambda r: reward_sort_key(r.reward))


def undone_note(step: int, undone: Sequence[tuple[int, int, int]]) -> str:
    """The line that says the chosen step was logged again after the run went back."""
    back = ", ".join(str(b) for _, _, b in undone)
    return (f"Step {step} was logged again after the run went back to step {back}: these are "
            "the samples of the pass that stands; the undone pass's are left out.")


def _payload(run: str, step: int, samples: list[Sample], requested: int | None,
             undone: Sequence[tuple[int, int, int]] = ()) -> dict[str, Any]:
    return {
        "run": run,
        "step": step,
        "requested_step": requested,
        "undone": [{"steps": [lo, hi], "back_to": back} for lo, hi, back in undone],
        "samples": [
            {"prompt": s.prompt, "prompt_type": s.prompt_type,
             "responses": [{"text": r.text, "reward": _finite(r.reward), "length": r.length}
                           for r in _sorted_responses(s)]}
            for s in samples],
    }


def render_json(run: str, step: int, samples: list[Sample], *, requested: int | None = None,
                undone: Sequence[tuple[int, int, int]] = ()) -> bytes:
    """The samples as strict JSON (a non-finite reward becomes null), responses best first;
    ``undone``: the spans undone that held the step."""
    # surrogatepass would emit invalid UTF-8; a lone surrogate a trainer logged becomes "?".
    return json.dumps(_payload(run, step, samples, requested, undone), ensure_ascii=False,
                      allow_nan=False).encode("utf-8", errors="replace")


def _fmt_reward(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.4g}"


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;background:#fafafa}
h1{font-size:1.3rem}.note{color:#a60}
.prompt{background:#fff;border:1px solid #ccc;border-radius:6px;margin:1rem 0;padding:.8rem}
.ptype{display:inline-block;background:#e3ecf7;border-radius:4px;padding:0 .4rem;font-size:.85rem}
pre{white-space:pre-wrap;word-break:break-word;margin:.3rem 0;font-size:.9rem}
table{border-collapse:collapse;width:100%}td,th{border-top:1px solid #eee;padding:.3rem;vertical-align:top;text-align:left}
td.num{white-space:nowrap;font-variant-numeric:tabular-nums;width:6rem}
"""


def render_html(run: str, step: int, samples: list[Sample], *, requested: int | None = None,
                undone: Sequence[tuple[int, int, int]] = ()) -> bytes:
    """A self-contained page (inline CSS, no scripts, no external assets); every string escaped."""
    e = html.escape
    out = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
           f"<title>replay {e(run)} step {step}</title><style>{_CSS}</style></head><body>",
           f"<h1>Sample replay: run <code>{e(run)}</code>, step {step}</h1>"]
    if requested is not None and requested != step:
        out.append(f"<p class=\"note\">Step {requested} has no samples; showing the nearest "
                   f"earlier step with samples, {step}.</p>")
    if undone:
        out.append(f"<p class=\"note\">{e(undone_note(step, undone))}</p>")
    out.append(f"<p>{len(samples)} prompt(s); responses sorted by reward, best first.</p>")
    for i, s in enumerate(samples, 1):
        rewards = [r.reward for r in s.responses if _finite(r.reward) is not None]
        gap = f", reward gap {_fmt_reward(max(rewards) - min(rewards))}" if len(rewards) > 1 else ""
        ptype = f" <span class=\"ptype\">{e(s.prompt_type)}</span>" if s.prompt_type else ""
        out.append(f"<div class=\"prompt\"><h2>Prompt {i}{ptype}</h2>"
                   f"<pre>{e(s.prompt)}</pre><p>{len(s.responses)} response(s){gap}</p>"
                   "<table><tr><th>reward</th><th>length</th><th>response</th></tr>")
        for r in _sorted_responses(s):
            length = "—" if r.length is None else str(r.length)
            out.append(f"<tr><td class=\"num\">{e(_fmt_reward(r.reward))}</td>"
                       f"<td class=\"num\">{length}</td><td><pre>{e(r.text)}</pre></td></tr>")
        out.append("</table></div>")
    out.append("</body></html>\n")
    return "".join(out).encode("utf-8", errors="replace")  # a lone surrogate: "?", see above


# -- HTTP -----------------------------------------------------------------------------------

_TEXT = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"
HTML_TYPE = "text/html; charset=utf-8"


def replay_http(snapshot_dir: Path, query: dict[str, list[str]], accept: str) -> tuple[int, str, bytes]:
    """``/replay?run=R[&step=S][&format=json|html]`` as (status, content type, body).

    ``query`` is ``urllib.parse.parse_qs`` output. Without ``format`` the ``Accept`` header
    decides: HTML when it names ``text/html``, else JSON. 400 on a missing or invalid run, step
    or format; 404 when the run has no samples at or before the step.
    """
    def first(name: str) -> str | None:
        values = query.get(name) or []
        return values[0] if values else None

    run = first("run")
    if run is None or not is_run_label(run):
        return 400, _TEXT, b"invalid or missing run: a run is a snapshot folder name\n"
    raw_step = first("step")
    step: int | None = None
    if raw_step not in (None, ""):
        try:
            step = int(raw_step)  # type: ignore[arg-type]
        except ValueError:
            step = -1
        if step < 0:
            return 400, _TEXT, b"step must be a non-negative integer\n"
    fmt = first("format")
    if fmt in (None, ""):
        fmt = "html" if "text/html" in (accept or "") else "json"
    if fmt not in ("json", "html"):
        return 400, _TEXT, b"format must be json or html\n"
    try:
        found = _find(Path(snapshot_dir), run, step)
    except LinkedRun as exc:
        return 404, _TEXT, f"{exc}\n".encode()
    if found is None:
        where = f"at or before step {step}" if step is not None else "at any step"
        return 404, _TEXT, f"run {run!r} has no samples {where}\n".encode()
    chosen, samples, undone = found
    if fmt == "html":
        return 200, HTML_TYPE, render_html(run, chosen, samples, requested=step, undone=undone)
    return 200, JSON_TYPE, render_json(run, chosen, samples, requested=step, undone=undone)


# -- terminal -------------------------------------------------------------------------------


def _safe(text: str) -> str:
    """Control characters (ANSI escapes included) made visible, so model output cannot drive
    the terminal; newlines and tabs kept."""
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in _safe(text).split("\n"))


def print_replay(snapshot_dir: Path, run: str, step: int | None, *, file: TextIO | None = None) -> int:
    """Print the samples of ``run`` at ``step`` (None: newest) as text; exit status 0, 1 when
    there are none (a linked run folder's included), 2 for an invalid run name. Errors go to
    stderr."""
    out = file or sys.stdout
    if not is_run_label(run):
        print(f"grpo-monitor replay: invalid run name {run!r}", file=sys.stderr)
        return 2
    try:
        found = _find(Path(snapshot_dir), run, step)
    except LinkedRun as exc:
        print(f"grpo-monitor replay: {exc}", file=sys.stderr)
        return 1
    if found is None:
        where = f"at or before step {step}" if step is not None else "at any step"
        print(f"grpo-monitor replay: run {run!r} has no samples {where} in {snapshot_dir}",
              file=sys.stderr)
        steps = available_steps(Path(snapshot_dir), run)
        if steps:
            print(f"steps with samples: {', '.join(map(str, steps[-20:]))}", file=sys.stderr)
        return 1
    chosen, samples, undone = found
    header = f"run {_safe(run)}, step {chosen}"
    if step is not None and step != chosen:
        header += f" (step {step} has no samples; nearest earlier step shown)"
    print(f"{header}: {len(samples)} prompt(s), responses best reward first", file=out)
    if undone:
        print(undone_note(chosen, undone), file=out)
    for i, s in enumerate(samples, 1):
        ptype = f" [{_safe(s.prompt_type)}]" if s.prompt_type else ""
        print(f"\n=== prompt {i}{ptype} ===", file=out)
        print(_indent(s.prompt, "  "), file=out)
        for j, r in enumerate(_sorted_responses(s), 1):
            length = "—" if r.length is None else str(r.length)
            print(f"  --- response {j}: reward {_fmt_reward(r.reward)}, length {length}", file=out)
            print(_indent(r.text, "    "), file=out)
    return 0
