"""The words of metric names, and the one rule by which a name nobody listed maps onto a signal.

Authors spell one signal many ways: ``train/mean_completion_len``, ``policy_entropy``,
``truncated_fraction``, ``frac_zero_adv``. A name's *form* is the set of its words after the
vocabulary below: split at ``/ _ - . @``, spaces and camelCase; lower case; the prefixes that
only say where a metric was logged dropped from its front (``train``, ``actor``, ``rollout``,
``policy``, ...); synonyms made one word (completion and response, len and length, frac, ratio,
rate and share, avg and mean, ...); and ``mean`` added when no statistic is named (a bare
``reward`` is the reward's mean). Word order is ignored.

**The rule.** Every canonical key and every listed alias has a form. A name that is neither
maps automatically to a key only when its form equals the form of names of exactly that one key,
and the form holds a word beyond ``mean``. Anything else is a *proposal*, never applied: several
keys with that form (ambiguous), or keys whose forms merely share most of its words.
``grpo-monitor check`` prints the proposals as lines for a key map (contract/key_map.py). A name
a framework always logs and the project leaves unmapped on purpose (keys.KNOWN_UNMAPPED) is
never matched. Why so strict: a wrong automatic mapping feeds a card a signal it does not mean,
which is worse than the coverage card's plain "this run does not log it".

Standard library only: the trainer side imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Leading words that say where a metric was logged, not what it is.
PREFIXES = frozenset({"train", "training", "trainer", "actor", "rollout", "rollouts", "policy",
                      "metrics", "metric", "charts", "stats", "batch"})
# word -> the words it stands for.
SYNONYMS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("completion", "completions", "response", "responses", "gen", "generation",
                     "generations", "output", "outputs", "answer", "answers"), ("response",)),
    **dict.fromkeys(("len", "length", "lengths", "lens"), ("length",)),
    **dict.fromkeys(("frac", "fraction", "fractions", "ratio", "ratios", "rate", "share", "pct",
                     "percent", "percentage", "proportion", "prop"), ("ratio",)),
    **dict.fromkeys(("avg", "average", "mean"), ("mean",)),
    **dict.fromkeys(("std", "stddev", "stdev", "sd"), ("std",)),
    **dict.fromkeys(("adv", "advs", "advantage", "advantages"), ("advantage",)),
    **dict.fromkeys(("ent", "entropy", "entropies"), ("entropy",)),
    **dict.fromkeys(("clip", "clipped", "clipping"), ("clip",)),
    # Truncation is always the response's: a policy's PPO clip is never called that.
    # A bare truncation word is the truncated share (OpenRLHF's truncated, a loop's trunc_rate).
    **dict.fromkeys(("truncated", "truncation", "truncate", "trunc"), ("response", "clip", "ratio")),
    **dict.fromkeys(("rewards", "reward", "rew"), ("reward",)),
    **dict.fromkeys(("grad", "grads", "gradient", "gradients"), ("grad",)),
    **dict.fromkeys(("kl", "kld", "kl_div"), ("kl",)),
    **dict.fromkeys(("zero", "zeros", "zeroed"), ("zero",)),
}
# Words that name a statistic; a form without one is the signal's mean.
STATISTICS = frozenset({"mean", "std", "min", "max", "median", "sum", "count", "total", "var",
                        "p10", "p25", "p50", "p75", "p90", "p95", "p99", "low", "high"})
# Words that say nothing about which signal it is.
# ("overall": EasyR1's reward/overall, a loop's reward_overall: the whole reward, not a part.)
FILLERS = frozenset({"per", "of", "the", "value", "values", "div", "divergence", "overall"})

_SPLIT = re.compile(r"[/_\-.@\s()]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

Form = frozenset[str]


def words(name: str) -> list[str]:
    """The words of a name, lower case, camelCase split: ``train/meanCompletionLen`` ->
    ``['train', 'mean', 'completion', 'len']``."""
    return [w for w in _SPLIT.split(_CAMEL.sub(" ", name).lower()) if w]


# A name that says both rollout and train compares the two: the rollout-vs-trainer mismatch
# (rollout_train_kl, train_rollout_logprob_abs_diff), never the signal of either alone.
ROLLOUT_WORDS = frozenset({"rollout", "rollouts", "infer", "inference", "sampler", "sampling"})
TRAIN_WORDS = frozenset({"train", "training", "trainer", "learner"})


def form(name: str) -> Form:
    """The name's form: its words after the vocabulary (the module's docstring)."""
    ws = words(name)
    if ROLLOUT_WORDS & set(ws) and TRAIN_WORDS & set(ws):
        ws = ["mismatch", *(w for w in ws if w not in ROLLOUT_WORDS | TRAIN_WORDS)]
    while len(ws) > 1 and ws[0] in PREFIXES:
        ws = ws[1:]
    out: set[str] = set()
    for w in ws:
        if w in FILLERS:
            continue
        out.update(SYNONYMS.get(w, (w,)))
    if not out & STATISTICS:
        out.add("mean")
    return frozenset(out)


def index(names_by_key: Mapping[str, Iterable[str]]) -> dict[Form, frozenset[str]]:
    """form -> the keys that have a name of that form, over each key's names."""
    found: dict[Form, set[str]] = {}
    for key, names in names_by_key.items():
        for name in names:
            found.setdefault(form(name), set()).add(key)
    return {f: frozenset(keys) for f, keys in found.items()}


def auto_match(name: str, forms: Mapping[Form, frozenset[str]]) -> str | None:
    """The one key a name's form proves it stands for (the module's rule), or None."""
    f = form(name)
    if f <= {"mean"}:
        return None
    keys = forms.get(f)
    if keys is None or len(keys) != 1:
        return None
    return next(iter(keys))


def proposals(name: str, forms: Mapping[Form, frozenset[str]], n: int = 3) -> list[str]:
    """Keys a name may stand for, nearest first, for a person to confirm: the keys of its own
    form when several share it, else those whose forms share at least half of the words of the
    two forms together (Jaccard >= 0.5) and all but one of its words that name no statistic
    (``mean_completion_chars`` proposes ``response/len_mean``: chars want a scale)."""
    f = form(name)
    if f <= {"mean"}:
        return []
    same = forms.get(f)
    if same:
        return sorted(same)[:n]
    scored: dict[str, float] = {}
    for other, keys in forms.items():
        if len((f - STATISTICS) - other) > 1:
            # Two words of the name that the other form lacks (topics, not statistics): a name
            # about something else.
            continue
        jaccard = len(f & other) / len(f | other)
        if jaccard >= 0.5:
            for key in keys:
                scored[key] = max(scored.get(key, 0.0), jaccard)
    return sorted(scored, key=lambda k: (-scored[k], k))[:n]
