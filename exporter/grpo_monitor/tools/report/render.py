"""The report's outputs, and ``grpo-monitor report``'s command.

report.txt, verdicts.json, summary.json, reward-vs-step.csv, curves.png, law.png and report.html
(self-contained, opens offline).

matplotlib (the ``report`` extra) is imported only to draw the plots: the CLI checks for it
first and names the extra in one line when it is missing.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import html
import io
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.run_layout import REPORT_FOLDER, runs_in
from grpo_monitor.contract.safe_io import printable, replace_file
from grpo_monitor.runtime.forecast import BLOCK_STEPS
from grpo_monitor.runtime.signals import HELDOUT_KEY, LAW_ENTROPY, LAW_REWARD
from grpo_monitor.tools.report.load import RunData, load_run
from grpo_monitor.tools.report.statistics import RunView, law_blocks
from grpo_monitor.tools.report.summary import summarize
from grpo_monitor.tools.report.verdicts import VERDICTS, diagnose

CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reward", "reward/mean"), ("kl", "kl/mean"), ("loss", "loss"),
    ("sample_acc", "eval/sample_acc"), ("reward_std", "reward/std"),
    ("reward_p25", "reward/p25"), ("reward_p50", "reward/p50"), ("reward_p75", "reward/p75"),
    ("kl_p95", "kl/p95"), ("entropy", "entropy/mean"), ("response_len", "response/len_mean"),
    ("response_clip_ratio", "response/clip_ratio"), ("grad_norm", "grad/norm"),
    ("group_zero_std_frac", "group/zero_std_frac"), ("adv_mean_abs", "adv/mean_abs"),
    ("lr", "train/lr"),
)
# The verdicts the rollout-vs-trainer section points to.
ROLLOUT_VERDICTS: tuple[str, ...] = ("rollout_mismatch", "rollout_mismatch_rising", "stale_rollouts")


def csv_text(data: RunData) -> str:
    """reward-vs-step.csv: one row per logged step."""
    cols = [c for c, key in CSV_COLUMNS if data.has(key) or c in ("reward", "kl", "loss",
                                                                   "sample_acc")]
    keys = dict(CSV_COLUMNS)
    buf = io.StringIO(newline="")
    wr = csv.writer(buf)
    wr.writerow(["step", *cols])
    for st in data.steps:
        m = data.train[st]
        wr.writerow([st, *(repr(m[keys[c]]) if keys[c] in m else "" for c in cols)])
    return buf.getvalue()


# -- text --------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _cell(v: Any) -> str:
    return "-" if v is None else _fmt(v)


def _explanation(verdict: dict[str, Any]) -> str:
    return VERDICTS[verdict["id"]].explanation


def _rollout_lines(section: dict[str, Any] | None, verdicts: list[dict[str, Any]]) -> list[str]:
    """The rollout-vs-trainer section in words."""
    if section is None:
        return ["rollout vs trainer: the run logs no mismatch/* or staleness/* key"]
    fs, ls = section["first_steps"], section["last_steps"]
    lines = [f"rollout vs trainer (window medians: first steps {fs[0]}-{fs[1]}, last steps "
             f"{ls[0]}-{ls[1]}):",
             f"  {'key':<30}{'first':>10}{'last':>10}{'ratio':>9}  {'trend':<9}card line"]
    for key, row in section["keys"].items():
        lines.append(f"  {key:<30}{_cell(row['first_median']):>10}{_cell(row['last_median']):>10}"
                     f"{_cell(row['ratio']):>9}  {row['trend']:<9}{row['card_line'] or ''}".rstrip())
    fired = [f"{v['id']} steps {v['steps'][0]}-{v['steps'][1]}" for v in verdicts
             if v["id"] in ROLLOUT_VERDICTS]
    lines.append("  verdicts: " + ("; ".join(fired) if fired else "none, no card fired"))
    return lines


def _law_lines(section: dict[str, Any]) -> list[str]:
    """The entropy-reward law section in words."""
    lines = [f"entropy-reward law R = -a*exp(H) + b ({section['block_steps']}-step block means of "
             f"{section['entropy_key']} and {section['reward_key']}, {section['blocks']} blocks):"]
    if not section["fitted"]:
        lines.append(f"  not fitted: {section['reason']}")
    else:
        f, p = section["first_half"], section["prediction"]
        holds = (f"the law holds: a > 0, R^2 >= {th.value('forecast_min_r2'):g}" if f["law_holds"]
                 else f"the law does not hold here: it needs a > 0 and R^2 >= "
                      f"{th.value('forecast_min_r2'):g}")
        lines += [
            f"  fit on the first half (steps {f['steps'][0]}-{f['steps'][1]}, {f['points']} blocks):"
            f" a = {_cell(f['a'])}, b = {_cell(f['b'])}, ceiling b - a = {_cell(f['ceiling'])}, "
            f"R^2 = {_cell(f['r_squared'])} ({holds})",
            f"  its prediction of the rest (steps {p['steps'][0]}-{p['steps'][1]}, {p['blocks']} "
            f"blocks): mean absolute error {_cell(p['mean_abs_error'])} = "
            f"{_cell(p['error_pct_of_range'])}% of the reward's range {_cell(p['reward_range'])} "
            f"(holding the last fitted block's reward instead: {_cell(p['flat_mean_abs_error'])})"]
    if "whole_run" in section:
        w = section["whole_run"]
        lines.append(f"  fit on the whole run (the exporter's at the end): a = {_cell(w['a'])}, "
                     f"b = {_cell(w['b'])}, ceiling b - a = {_cell(w['ceiling'])}, "
                     f"R^2 = {_cell(w['r_squared'])}, {w['points']} blocks")
    if "end" in section:
        e = section["end"]
        verdict = "near its ceiling" if e["near_ceiling"] else "not near its ceiling"
        lines.append(
            f"  at the end (step {e['step']}): headroom (exp(H) - 1) / (exp(H0) - 1) = "
            f"{_cell(e['headroom_ratio'])} (H 50-step mean {_cell(e['entropy_window_mean'])}, "
            f"initial {_cell(e['entropy_initial'])}, slope {_cell(e['entropy_slope_per_step'])} "
            f"per step): {verdict} (near: headroom < {th.value('ceiling_headroom_ratio'):g}, "
            f"R^2 >= {th.value('forecast_min_r2'):g}, a > 0, entropy falling)")
    return lines


def _not_judged_lines(summary: dict[str, Any]) -> list[str]:
    """The minimum curves the run never logged, and the verdicts it could not have been given,
    and why (what their cards read that the run does not have)."""
    missing = summary.get("missing_curves", [])
    lines = [f"minimum curves never logged: {', '.join(missing)} (GRPOSignalMissing)"] if missing else []
    not_judged = summary.get("not_judged", [])
    if not not_judged:
        return lines + ["not judged: none; every card's verdict could be judged on this run"]
    return lines + ["not judged (the run does not have what their cards read):",
                    *(f"  {n['verdict']} ({n['card']}): {n['reason']}, {n['why']}" for n in not_judged)]


def _not_judged_html(summary: dict[str, Any]) -> str:
    """The not-judged lines as HTML: each heading line a paragraph, its indented items a list."""
    out, items = [], []
    for line in _not_judged_lines(summary):
        if line.startswith("  "):
            items.append(f"<li>{html.escape(line.strip())}</li>")
            continue
        if items:
            out.append(f"<ul>{''.join(items)}</ul>")
            items = []
        out.append(f"<p>{html.escape(line)}</p>")
    if items:
        out.append(f"<ul>{''.join(items)}</ul>")
    return "".join(out)



def _capped(items: Sequence[Any], shown: int, say: Callable[[Any], str], more: str) -> list[str]:
    """``say`` of the first ``shown`` of ``items``, then how many more there are."""
    return ([say(x) for x in items[:shown]]
            + ([f"and {len(items) - shown:,} more {more}"] if len(items) > shown else []))


def _undone_lines(summary: dict[str, Any], said: int = 10) -> list[str]:
    """A line per span of steps the run undid (a rollback, a resume from an older step), for the
    first ``said`` of them: a run that rolls back at every step would otherwise get a line per
    record (summary.json lists every one). Presentation, not a threshold."""
    return _capped(summary.get("undone", []), said,
                   lambda u: f"steps {u['steps'][0]}-{u['steps'][1]} were undone (the run went back "
                             f"to step {u['back_to']}): their first records are left out, the steps "
                             "logged again judged",
                   "spans were undone (summary.json lists every one)")


def text_report(summary: dict[str, Any], verdicts: list[dict[str, Any]]) -> str:
    lines = [f"run {summary['run']}: {summary['logged_steps']} logged steps "
             f"{_fmt(summary['steps'])}, {summary['records']} records, ranks "
             f"{_fmt(summary['ranks'])}, {summary['bad_lines']} bad lines skipped",
             *_undone_lines(summary), "", "verdicts:"]
    for v in verdicts:
        lines.append(f"  [{v['severity']}] {v['id']} steps {v['steps'][0]}-{v['steps'][1]}: "
                     f"{_explanation(v)}")
        for k, x in v["evidence"].items():
            lines.append(f"      {k} = {_fmt(x)}")
    lines += ["", *_not_judged_lines(summary), "",
              *_rollout_lines(summary.get("rollout_vs_trainer"), verdicts), "",
              *_law_lines(summary["entropy_reward_law"])]
    lines += ["", f"summary (whole run; window stddev over {summary['window_steps']}-step windows):",
              f"  {'signal':<20}{'p5':>10}{'p50':>10}{'p95':>10}{'p99':>10}{'mean':>10}"
              f"{'stddev':>10}{'win sd first':>14}{'win sd last':>13}"]
    for key, sig in summary["signals"].items():
        r, ws = sig["run"], sig["window_stddev"]
        lines.append(f"  {key:<20}" + "".join(f"{_fmt(r[c]):>10}" for c in
                                              ("p5", "p50", "p95", "p99", "mean", "stddev"))
                     + f"{_fmt(ws['first']):>14}{_fmt(ws['last']):>13}")
    return "\n".join(lines) + "\n"


# -- plots -------------------------------------------------------------------------------------


def _drawable(values: np.ndarray) -> np.ndarray:
    """``values`` as a plot can show them: matplotlib cannot lay out an axis for a value within
    a few powers of two of the largest float (its tick locator overflows), so such a value is
    left out of the plot, as NaN and inf are. The CSV and the summary keep it."""
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(values) <= np.finfo(float).max / 16, values, math.nan)


def _png(fig: Any, path: Path | None) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    png = buf.getvalue()
    if path is not None:
        path.write_bytes(png)
    return png


# The card colours of the shaded spans (docs/report.md): one per severity, as the live cards.
SPAN_COLOURS: dict[str, tuple[str, str]] = {"critical": ("red card", "#d62728"),
                                            "warning": ("yellow card", "#e6b800")}
# Verdicts about the hosts, not the curves drawn: a slow host's span would cover the plots.
HOST_VERDICTS = frozenset({"throughput_drop", "step_time_drift", "rank_straggler"})


Span = tuple[float, float]


def _merged(spans: list[Span]) -> list[Span]:
    """Overlapping spans as one: a colour shades each step once, however many verdicts."""
    out: list[Span] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _without(spans: list[Span], cut: list[Span]) -> list[Span]:
    """``spans`` less the steps ``cut`` covers: where a red span lies, no yellow is drawn, so
    that each shaded step has one card colour, never a blend."""
    for c_lo, c_hi in cut:
        spans = [part for lo, hi in spans
                 for part in ((lo, min(hi, c_lo)), (max(lo, c_hi), hi)) if part[0] < part[1]]
    return spans


def _went_back(backs: np.ndarray, plotted: np.ndarray,
               resolution: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """The steps the run went back to as the plot can tell them apart: the lone ones (lines),
    and (first, last) of each run of ones closer than 1/``resolution`` of the x range that they
    and the ``plotted`` steps span (bands). 1/200 is 4 of curves.png's 800 pixels, below which
    dashed lines blur into a grey that hides the curve: a panel holds about 200 lines and bands
    at most. Presentation, not a threshold."""
    backs = np.unique(backs)
    if not backs.size:
        return backs, np.empty((0, 2))
    span = np.concatenate([backs, plotted])
    width = (span.max() - span.min()) / resolution
    cuts = np.flatnonzero(np.diff(backs) > width) + 1
    first, last = backs[np.r_[0, cuts]], backs[np.r_[cuts, backs.size] - 1]
    lone = first == last
    return first[lone], np.column_stack([first[~lone], last[~lone]])


def plot_curves(data: RunData, verdicts: list[dict[str, Any]], path: Path | None = None) -> bytes:
    """curves.png: reward (p25-p75 band), the held-out score, KL, loss, entropy, length; each
    sick verdict's steps
    shaded in its card's colour (red for critical, yellow for warning; red where both), with a
    legend naming the verdicts of each colour. Host verdicts are not shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    steps = np.array(data.steps, dtype=float)
    # The three curves (reward, KL, loss), the held-out score beside the reward (its own sparse
    # points: the truth the reward stands in for), entropy and length.
    panels = [k for k in ("reward/mean", HELDOUT_KEY, "kl/mean", "loss", "entropy/mean",
                          "response/len_mean") if data.has(k)] or ["reward/mean"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 * len(panels)), sharex=True,
                             squeeze=False)
    shaded = {sev: [v for v in verdicts if v["severity"] == sev and v["id"] not in HOST_VERDICTS]
              for sev in ("critical", "warning")}
    spans = {sev: _merged([(v["steps"][0], max(v["steps"][1], v["steps"][0] + 1)) for v in found])
             for sev, found in shaded.items()}
    spans["warning"] = _without(spans["warning"], spans["critical"])
    back_lines, back_bands = _went_back(np.array([b for _, _, b in data.undone], dtype=float),
                                        np.concatenate([steps[:1], steps[-1:]]))
    for ax, key in zip(axes[:, 0], panels):
        y = _drawable(data.series(key)) if steps.size else np.array([])
        if key == "reward/mean" and data.has("reward/p25") and data.has("reward/p75"):
            ax.fill_between(steps, _drawable(data.series("reward/p25")),
                            _drawable(data.series("reward/p75")), alpha=0.25, color="tab:blue",
                            label="p25-p75")
        if key == HELDOUT_KEY:  # one point per evaluation: joined over the steps between
            at = np.isfinite(y)
            ax.plot(steps[at], y[at], lw=0.8, marker="o", ms=2.5, color="tab:green", label=key)
        else:
            ax.plot(steps, y, lw=0.8, color="tab:blue", label=key)
        for sev, parts in spans.items():
            for lo, hi in parts:
                ax.axvspan(lo, hi, alpha=0.18, color=SPAN_COLOURS[sev][1], lw=0)
        # Where the run went back (the curve is the second pass): at most one collection of
        # lines and one of bands a panel, however many rollbacks (an artist each cost a GiB and a
        # minute for a run that rolled back at every step).
        if back_lines.size:
            ax.vlines(back_lines, 0, 1, transform=ax.get_xaxis_transform(), colors="0.3", lw=0.8,
                      linestyles="--")
        if back_bands.size:  # each band's ends, then the first point of the gap after it, unfilled
            gap = np.nextafter(back_bands[:, 1], math.inf)
            edges = np.column_stack([back_bands, gap]).ravel()[:-1]
            ax.fill_between(edges, 0, 1, where=np.arange(edges.size) % 3 != 2, color="0.3",
                            alpha=0.15, lw=0, transform=ax.get_xaxis_transform())
        ax.set_ylabel(key, fontsize=8)
        ax.legend(loc="upper left", fontsize=7)
    cards = [Patch(color=SPAN_COLOURS[sev][1], alpha=0.35,
                   label=f"{SPAN_COLOURS[sev][0]}: {', '.join(v['id'] for v in found)}"[:110])
             for sev, found in shaded.items() if found]
    if cards:
        fig.legend(handles=cards, loc="lower center", ncol=1, fontsize=7, frameon=False)
    if data.undone:
        axes[0, 0].annotate(
            "; ".join(_capped(data.undone, 2,  # the plot's note names two, then counts
                              lambda u: f"went back to {u[2]}, undoing {u[0]}-{u[1]}", "undone spans")),
            xy=(0.99, 0.95), xycoords="axes fraction", ha="right", va="top", fontsize=7, color="0.3")
    axes[-1, 0].set_xlabel("step")
    title = f"{data.run}: " + ", ".join(v["id"] for v in verdicts)
    fig.suptitle(title[:120], fontsize=9)
    fig.tight_layout(rect=(0, 0.03 * len(cards), 1, 1))
    return _png(fig, path)


def plot_law(data: RunData, section: dict[str, Any], path: Path | None = None) -> bytes | None:
    """law.png: the block means of reward against entropy (the fitted half and the predicted
    half), the law fitted on the first half and its ceiling b - a; None when nothing was fitted."""
    if not section.get("fitted"):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks, entropy, reward, _ = law_blocks(data)
    fitted = blocks[:len(blocks) // 2]
    f = section["first_half"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for part, color, label in ((fitted, "tab:blue", "fitted (first half)"),
                               (blocks[len(fitted):], "tab:orange", "predicted (second half)")):
        ax.scatter(_drawable(np.array([entropy[b] for b in part], dtype=float)),
                   _drawable(np.array([reward[b] for b in part], dtype=float)), s=14, color=color,
                   label=label)
    finite = [entropy[b] for b in blocks if math.isfinite(entropy[b])]
    if finite and f["a"] is not None and f["b"] is not None:
        hs = np.linspace(0, max(max(finite), 0), 100)
        with np.errstate(over="ignore", invalid="ignore"):
            ax.plot(hs, f["b"] - f["a"] * np.exp(hs), color="black", lw=1,
                    label=f"R = -{f['a']:.3g} exp(H) + {f['b']:.3g}, R² {_cell(f['r_squared'])}")
        ax.axhline(f["b"] - f["a"], color="tab:red", ls="--", lw=1,
                   label=f"ceiling b - a = {f['b'] - f['a']:.3g}")
    ax.set_xlabel(f"{LAW_ENTROPY} ({BLOCK_STEPS}-step block mean)", fontsize=8)
    ax.set_ylabel(f"{LAW_REWARD} ({BLOCK_STEPS}-step block mean)", fontsize=8)
    ax.legend(loc="best", fontsize=7)
    ax.set_title(f"{data.run}: entropy-reward law"[:80], fontsize=9)
    fig.tight_layout()
    return _png(fig, path)


# -- HTML --------------------------------------------------------------------------------------


def html_report(summary: dict[str, Any], verdicts: list[dict[str, Any]], png: bytes,
                law_png: bytes | None = None) -> str:
    e = html.escape
    rows = []
    for key, sig in summary["signals"].items():
        r = sig["run"]
        rows.append("<tr><td>" + e(key) + "</td>" + "".join(
            f"<td>{e(_fmt(r[c]))}</td>" for c in ("p5", "p50", "p95", "p99", "mean", "stddev"))
            + f"<td>{e(_fmt(sig['window_stddev']['first']))}</td>"
              f"<td>{e(_fmt(sig['window_stddev']['last']))}</td></tr>")
    items = []
    for v in verdicts:
        ev = "".join(f"<li>{e(k)} = {e(_fmt(x))}</li>" for k, x in v["evidence"].items())
        items.append(f"<li class='{e(v['severity'])}'><b>{e(v['id'])}</b> ({e(v['severity'])}), "
                     f"steps {v['steps'][0]}-{v['steps'][1]}: {e(_explanation(v))}"
                     f"<ul>{ev}</ul></li>")
    img = base64.b64encode(png).decode("ascii")
    rollout = summary.get("rollout_vs_trainer")
    if rollout is None:
        rollout_html = f"<p>{e(_rollout_lines(None, verdicts)[0])}.</p>"
    else:
        trs = "".join(
            f"<tr><td>{e(k)}</td><td>{e(_cell(r['first_median']))}</td>"
            f"<td>{e(_cell(r['last_median']))}</td><td>{e(_cell(r['ratio']))}</td>"
            f"<td>{e(r['trend'])}</td><td>{e(r['card_line'] or '')}</td></tr>"
            for k, r in rollout["keys"].items())
        rollout_html = (f"<p>Window medians, first steps {rollout['first_steps'][0]}-"
                        f"{rollout['first_steps'][1]}, last steps {rollout['last_steps'][0]}-"
                        f"{rollout['last_steps'][1]}. {e(_rollout_lines(rollout, verdicts)[-1].strip())}"
                        "</p><table><tr><th>key</th><th>first</th><th>last</th><th>ratio</th>"
                        f"<th>trend</th><th>card line</th></tr>{trs}</table>")
    law = "".join(f"<li>{e(line.strip())}</li>" for line in
                  _law_lines(summary["entropy_reward_law"])[1:])
    law_img = ("" if law_png is None else "<img alt='reward against entropy' "
               f"src='data:image/png;base64,{base64.b64encode(law_png).decode('ascii')}'>")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>grpo-monitor report: {e(summary['run'])}</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}"
        ".critical{color:#b00}.warning{color:#a60}.info{color:#060}</style></head><body>"
        f"<h1>Run {e(summary['run'])}</h1><p>{summary['logged_steps']} logged steps, "
        f"{summary['records']} records, {summary['bad_lines']} bad lines skipped.</p>"
        f"{''.join(f'<p>{e(line)}</p>' for line in _undone_lines(summary))}"
        f"<h2>Verdicts</h2><ul>{''.join(items)}</ul>"
        f"<h2>Not judged</h2>{_not_judged_html(summary)}"
        f"<h2>Curves</h2><img alt='curves' src='data:image/png;base64,{img}'>"
        f"<h2>Rollout vs trainer</h2>{rollout_html}"
        f"<h2>Entropy-reward law</h2><p>{e(_law_lines(summary['entropy_reward_law'])[0])}</p>"
        f"<ul>{law}</ul>{law_img}"
        f"<h2>Summary</h2><p>Linear-interpolation percentiles; window stddev over "
        f"{summary['window_steps']}-step windows.</p><table><tr><th>signal</th><th>p5</th>"
        "<th>p50</th><th>p95</th><th>p99</th><th>mean</th><th>stddev</th>"
        f"<th>window sd first</th><th>window sd last</th></tr>{''.join(rows)}</table>"
        "</body></html>\n")


# -- every output, and the command -------------------------------------------------------------


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


def build_report(run_dir: Path | str, out: Path | str | None = None,
                 plots: bool = True) -> dict[str, Any]:
    """Load, summarise, diagnose and write every output (in ``out``, default
    ``RUN_DIR/.report``: a dot folder, which the exporter's ingest ignores); returns the
    summary, the verdicts, the text report, the output paths and the run's data."""
    run_dir = Path(run_dir)
    out_dir = Path(out) if out is not None else run_dir / REPORT_FOLDER
    data = load_run(run_dir)
    view = RunView(data)
    summary = _json_safe(summarize(view))
    verdicts = _json_safe(diagnose(view))
    # The run folder is a tree others write into: the default .report is made there only as a
    # plain folder, and every output replaces its name through safe_io (a link or a FIFO there
    # is replaced, never written through or opened; Refused, an OSError, for a linked .report).
    # An --out folder is the caller's own: only its files are guarded so.
    root = out_dir if out is not None else run_dir
    if out is None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(out_dir)
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}

    def write(key: str, name: str, data: bytes | str) -> None:
        paths[key] = out_dir / name
        replace_file(root, paths[key], data.encode("utf-8") if isinstance(data, str) else data)

    write("summary", "summary.json", json.dumps(summary, indent=1) + "\n")
    write("verdicts", "verdicts.json", json.dumps(verdicts, indent=1) + "\n")
    write("csv", "reward-vs-step.csv", csv_text(data))
    text = text_report(summary, verdicts)
    write("text", "report.txt", text)
    if plots:
        png = plot_curves(data, verdicts)
        write("png", "curves.png", png)
        law_png = plot_law(data, summary["entropy_reward_law"])
        if law_png is not None:
            write("law_png", "law.png", law_png)
        write("html", "report.html", html_report(summary, verdicts, png, law_png))
    return {"summary": summary, "verdicts": verdicts, "text": text,
            "outputs": {k: str(v) for k, v in paths.items()}, "data": data}


def cmd_report(args: argparse.Namespace) -> int:
    """Offline post-mortem of one run folder, or of each run of a snapshot folder. Exit 0, or 2
    when there is no record to report on."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"grpo-monitor report: {printable(run_dir)} is not a folder", file=sys.stderr)
        return 2
    runs = runs_in(run_dir)
    if runs:
        # A snapshot folder: one report per run, never one merged from several runs.
        names = ", ".join(printable(r.name) for r in runs)
        print(f"{printable(run_dir)} holds {len(runs)} runs ({names}): one report each",
              file=sys.stderr)
    fmt = getattr(args, "format", "text") or "text"
    results = []
    for one in runs or [run_dir]:
        out = Path(args.out) / one.name if args.out is not None and runs else args.out
        try:
            res = build_report(one, out, plots=True)
        except OSError as exc:  # the output folder: not writable, a file in its way, a full disk
            print(f"grpo-monitor report: cannot write the report: {printable(str(exc))}", file=sys.stderr)
            return 2
        if not res["data"].records:
            print(f"grpo-monitor report: no records in {printable(one)}", file=sys.stderr)
            continue
        results.append(res)
        if fmt == "text":
            if runs:
                print(f"{'=' * 20} {printable(one.name)} {'=' * 20}")
            sys.stdout.write(res["text"])
            # The page a person opens first, then the files tools read.
            first = sorted(res["outputs"].items(), key=lambda kv: kv[0] != "html")
            written = ", ".join(Path(p).name for _, p in first)
            where = printable(Path(res["outputs"]["verdicts"]).parent)  # a name not UTF-8: escaped
            print(f"\nreport written to {where} ({written})\n")
        elif fmt == "html":
            print(printable(res["outputs"]["html"]))
    if not results:
        return 2
    if fmt == "json":
        docs = [{"run": r["data"].run, "summary": r["summary"], "verdicts": r["verdicts"],
                 "outputs": r["outputs"]} for r in results]
        print(json.dumps(docs if runs else docs[0], indent=1))
    elif fmt != "text":
        for r in results:
            print(f"report written to {printable(Path(r['outputs']['verdicts']).parent)}", file=sys.stderr)
    return 0
