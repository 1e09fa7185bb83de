"""Aliases of older and other frameworks: what each name means, its unit, and which name wins.

Each alias is checked against what the framework's source logs under that name (the comments in
exporter/grpo_monitor/keys.py say where); the shared real runs show them in the wild
(tests/test_real_runs.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from grpo_monitor.keys import canonical_key, match_key
from grpo_monitor.snapshot import parse_record


def metrics(**logged: Any) -> dict[str, float]:
    """The canonical values a flat record with these keys yields."""
    return parse_record({"step": 1, **logged}, run="r", rank=0, mtime=0.0).metrics


def unknown(**logged: Any) -> dict[str, float]:
    return parse_record({"step": 1, **logged}, run="r", rank=0, mtime=0.0).unknown


@pytest.mark.parametrize(("name", "key"), [
    ("completion_length", "response/len_mean"),  # TRL GRPO, Jan-Apr 2025; Unsloth notebooks
    ("critic/kl", "kl/mean"),  # verl before Apr 2025: KL to the reference, in the reward
    ("actor/reward_kl_penalty", "kl/mean"),  # its later name
    ("actor/entropy_loss", "entropy/mean"),  # verl before June 2025: the entropy itself
    ("policy/entropy", "entropy/mean"),  # Tinker-style and many PPO loops
    ("Training Loss", "loss"),  # Hugging Face's notebook table (Unsloth)
    ("actor_grad_norm", "grad/norm"),  # OpenRLHF
    ("ppo_clip_ratio", "policy/clip_frac"),  # OpenRLHF
    ("timing/step_total", "perf/step_time_s"),  # OpenRLHF
    ("actor/lr(1e-4)", "train/lr"),  # verl before 2025, scaled (below)
])
def test_added_alias_maps_onto_its_key(name: str, key: str) -> None:
    assert canonical_key(name) == key
    assert set(metrics(**{name: 0.5})) == {key}


@pytest.mark.parametrize("name", [
    "actor/ppo_kl", "ppo_kl",  # KL between the rollout policy and the updated one, not to the reference
    "entropy_loss",  # +entropy in OpenRLHF, -entropy in Stable-Baselines3: ambiguous
    "critic/kl_coeff", "actor/kl_coef",  # the coefficients, not the KL
    "critic/lr(1e-4)",  # the critic's learning rate, not the policy's
    "timing/gen", "timing_s/gen",  # one phase of a step, not the step
    "critic/advantages/mean",  # ~0 by construction; |advantage| cannot be derived from it
    "critic/rewards/mean",  # score minus the KL penalty: not the reward the cards judge
])
def test_look_alike_names_stay_unmapped(name: str) -> None:
    assert canonical_key(name) is None
    assert unknown(**{name: 0.25}) == {name: 0.25}


def test_an_alias_logged_in_other_units_is_converted() -> None:
    # verl's fsdp_workers logged lr * 1e4 as actor/lr(1e-4): 0.01 there is a learning rate of 1e-6.
    assert metrics(**{"actor/lr(1e-4)": 0.01})["train/lr"] == pytest.approx(1e-6)
    # A plain name of the same key outranks the scaled one.
    assert metrics(**{"actor/lr(1e-4)": 0.01, "actor/lr": 2e-6})["train/lr"] == 2e-6


def test_entropy_loss_keeps_its_sign() -> None:
    # verl's compute_entropy_loss returned masked_mean(entropy): positive, the entropy itself.
    assert metrics(**{"actor/entropy_loss": 0.526}) == {"entropy/mean": 0.526}


@pytest.mark.parametrize("order", [1, -1])
def test_reference_kl_precedence_does_not_depend_on_key_order(order: int) -> None:
    # Recent verl logs actor/kl_loss = 0.0 even with use_kl_loss off; the reward penalty, present
    # only when it is computed, is the KL to trust. actor/ppo_kl is never the reference KL.
    logged = [("actor/kl_loss", 0.0), ("actor/reward_kl_penalty", 0.03), ("actor/ppo_kl", 0.7)]
    assert metrics(**dict(logged[::order]))["kl/mean"] == 0.03
    older = [("critic/kl", 0.21), ("actor/kl_loss", 0.05)]
    assert metrics(**dict(older[::order]))["kl/mean"] == 0.21
    assert metrics(**dict([("actor/ppo_kl", 0.7), ("actor/kl_loss", 0.05)][::order]))["kl/mean"] == 0.05


@pytest.mark.parametrize("order", [1, -1])
def test_entropy_precedence_does_not_depend_on_key_order(order: int) -> None:
    logged = [("actor/entropy_loss", 0.40), ("actor/entropy", 0.41)]
    assert metrics(**dict(logged[::order]))["entropy/mean"] == 0.41
    canonical = [("policy/entropy", 0.3), ("entropy/mean", 0.2)]
    assert metrics(**dict(canonical[::order]))["entropy/mean"] == 0.2


@pytest.mark.parametrize("order", [1, -1])
def test_bare_name_outranks_its_train_prefixed_form(order: int) -> None:
    logged = [("train/kl", 0.9), ("kl", 0.1)]
    assert metrics(**dict(logged[::order]))["kl/mean"] == 0.1
    assert metrics(**{"train/completion_length": 88.0}) == {"response/len_mean": 88.0}


def test_spaces_around_a_slash_are_ignored_for_matching_only() -> None:
    # Hugging Face's notebook table writes "rewards / check_answer" for rewards/check_answer.
    assert canonical_key("completions / mean_length") == "response/len_mean"
    assert match_key("train / kl") == match_key("train/kl")
    assert canonical_key("rewards / check_answer") is None
    # An unknown key is exported as it was logged.
    assert unknown(**{"rewards / check_answer": 1.0}) == {"rewards / check_answer": 1.0}


def test_ranks_are_the_listed_order() -> None:
    # keys.py documents precedence by the order of the aliases; pin the decisions made there.
    ranks = {n: match_key(n).rank for n in (  # type: ignore[union-attr]
        "kl/mean", "kl", "actor/reward_kl_penalty", "critic/kl", "actor/kl_loss", "train/kl")}
    assert sorted(ranks, key=ranks.__getitem__) == [
        "kl/mean", "kl", "actor/reward_kl_penalty", "critic/kl", "actor/kl_loss", "train/kl"]
