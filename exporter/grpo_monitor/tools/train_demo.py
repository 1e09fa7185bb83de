"""A real, tiny GRPO training loop on the CPU that writes snapshots through the SDK.

Nothing here is simulated except the extra ranks of ``--slow-rank``: a ~5k-parameter GRU policy,
warm-started by a short supervised phase (like the pretrained model every RL run starts from),
learns single-digit addition ("3+4=" -> "7" EOS) from a verifier's reward, with G sampled
answers per prompt, group-normalised advantages, the PPO/GRPO clipped surrogate against the
trainer's own log-probs of the samples, a k3 KL penalty to a frozen reference copy, and every
step's signals logged with ``grpo_stats`` + ``SnapshotWriter``. A rollout side samples the
answers and keeps its own log-probs, as vLLM or SGLang do, so that the rollout/trainer mismatch
and the rollouts' staleness are measured, not assumed. The knobs make the sicknesses of
docs/background.md happen for real, in the training dynamics, never by editing the logged numbers:

* ``--grader loose``: the reward also pays for every generated token, whether or not the answer
  is right -> reward hacking with a length surge, sample accuracy flat or falling (background.md#reward-hacking).
* ``--beta 0 --lr 0.03``: no KL anchor and a too-large step -> KL to the reference blows up.
* ``--group-size 2`` / ``--temperature 0.3``: groups of identical answers (zero-std groups) and
  entropy collapse.
* ``--nan-reward-at STEP``: the verifier returns NaN for one sample; it reaches the loss and the
  gradient norm, and the optimizer step is skipped (as mixed-precision trainers do).
* ``--rollout-temperature T`` / ``--rollout-precision bf16|fp16``: the rollout side samples and
  scores the tokens with its own temperature or precision -> a rollout/trainer mismatch.
* ``--rollout-lag K`` / ``--rollout-lag-growth N``: rollouts come from the policy K updates old,
  K growing by one every N steps (an asynchronous rollout side falling behind) -> stale
  rollouts and a slowly rising mismatch.
* ``--difficulty hard|easy``: prompts the policy cannot solve (two-digit operands) or has
  solved (``a+0=``) -> dead groups by cause.
* ``--length-penalty X``: the reward charges X per answer token, which a two-digit answer pays
  twice -> the policy gives up on the carry prompts while the no-carry ones improve
  (shortcut learning by prompt type).
* ``--loss-agg seq-mean-token-mean``: per-response length normalisation (Dr. GRPO's length bias).
* ``--slow-rank``: extra ranks (``--ranks``, at least 2) whose perf signals mirror rank 0's
  measured step time, the last one slowed by ``--slow-factor`` -- the one simulated part.

``--onset STEP`` applies the sickness knobs only from that step, so a run first has a healthy
baseline (the exporter's baseline is the first 200 steps) and then turns sick;
``--cured-by-rollback`` turns them off at the first rollback, the fix a person makes before
resuming, so that the steps trained again are healthy.

Like a real trainer it passes every step through ``PauseGate``: a red card's pause record holds
the loop at its next step boundary until ``grpo-monitor resume``, which rolls it back in place to
the last healthy checkpoint (policy, optimizer, the sampling stream). ``--step-seconds`` paces
the steps (at least that long each, 0.5 s by default), so that a card can arrive while it trains:
at full speed 300 steps take ~10 s, less than one scrape of a 15 s Prometheus.

The trajectory is the same on a busy host or an idle one: one torch thread, seeded streams, and
nothing in the training depends on the clock (the pacing and the step times only are wall-clock).

torch is the ``torch`` extra: it is imported only when training starts, so the CLI can build its
parser (and say what is missing) without it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_monitor.sdk.pause import PauseGate, ResumeDecision
from grpo_monitor.sdk.writer import SnapshotWriter

if TYPE_CHECKING:
    import torch

__all__ = ["Config", "StepResult", "config_from_args", "train"]

# Vocabulary: digits 0-9, "+", "=", EOS.
PLUS, EQUALS, EOS = 10, 11, 12
VOCAB = 13
DIFFICULTIES = ("mixed", "easy", "hard")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")  # verl's loss_agg_mode names
ROLLOUT_PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class Config:
    snapshot_dir: Path
    run: str = "train-demo"
    steps: int = 300
    seed: int = 0
    prompts: int = 16  # prompts per step
    group_size: int = 8  # G: sampled answers per prompt
    temperature: float = 1.0
    max_new_tokens: int = 10
    lr: float = 3e-3
    beta: float = 0.3  # KL coefficient (k3 estimate to the frozen reference)
    clip_eps: float = 0.2
    inner_epochs: int = 2  # optimisation passes over each batch (ratio vs the sampling policy)
    max_grad_norm: float = 1.0
    # Supervised warm start on right answers before RL: the policy starts able to solve some
    # prompts (~20% of samples), as a pretrained model does; from a random policy nine groups in
    # ten would have no right answer, which is the "prompts too hard" sickness itself.
    pretrain_steps: int = 50
    pretrain_lr: float = 2e-2
    pretrain_batch: int = 64
    grader: str = "strict"  # strict | loose
    length_bonus: float = 1.0  # loose grader: reward per generated token, right or wrong
    nan_reward_at: int | None = None  # once: a run rolled back past it does not meet it again
    onset: int = 0  # the sickness knobs below apply from this step
    # The sickness knobs stop at the first rollback: the fix a person makes before resuming.
    cured_by_rollback: bool = False
    sick_beta: float | None = None
    sick_lr: float | None = None
    sick_temperature: float | None = None
    sick_group_size: int | None = None
    difficulty: str = "mixed"  # mixed | easy (a+0=) | hard (two-digit operands)
    length_penalty: float = 0.0  # reward charged per answer token beyond length_budget
    length_budget: int = 1  # answer tokens free of the length penalty
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean
    rollout_precision: str = "fp32"  # the rollout side's dtype: fp32 | bf16 | fp16
    rollout_temperature: float | None = None  # the rollout side's; None: the trainer's
    rollout_lag: int = 0  # rollouts from the policy this many updates old
    rollout_lag_growth: int = 0  # ... plus one every this many steps (0: no growth)
    slow_rank: bool = False
    ranks: int = 1
    slow_factor: float = 1.6
    checkpoint_every: int = 100
    checkpoint_dir: Path | None = None
    hidden: int = 32
    embed: int = 16
    threads: int = 1  # the tensors are tiny: a second thread only spins, and stalls a loaded host
    eps: float = 1e-4
    # Each step lasts at least this long (0: as fast as the CPU goes): a card can then arrive,
    # and pause the loop, while the run is still training.
    step_seconds: float = 0.5
    pause_poll_s: float = 0.5  # how often a paused loop looks for the resume


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]
    events: list[dict[str, object]] = field(default_factory=list)
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)


def _make_policy(embed: int, hidden: int) -> Any:
    """Embedding -> one GRU layer -> logits over the vocabulary (~5k parameters)."""
    import torch
    from torch import nn

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, embed)
            self.gru = nn.GRU(embed, hidden, batch_first=True)
            self.head = nn.Linear(hidden, VOCAB)
            with torch.no_grad():
                # Like a pretrained model that answers briefly: EOS is likely from the start, so
                # responses begin about as long as a right answer (1-2 digits + EOS).
                self.head.bias.zero_()
                self.head.bias[EOS] = 2.0
                self.head.bias[PLUS] = self.head.bias[EQUALS] = -2.0

        def forward(self, tokens, h=None):  # type: ignore[no-untyped-def]
            out, h = self.gru(self.emb(tokens), h)
            return self.head(out), h

    return Policy()


def _digits(x: torch.Tensor, width: int) -> torch.Tensor:
    """Numbers as digit tokens, most significant first, right-aligned in ``width`` columns."""
    import torch

    places = 10 ** torch.arange(width - 1, -1, -1)
    return (x[:, None] // places) % 10


def _make_prompts(n: int, difficulty: str, gen: torch.Generator
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt tokens [n, L] and the operands. mixed: a, b in 0-9 ("a+b="); easy: "a+0=";
    hard: two-digit operands ("ab+cd="), which the policy never learned."""
    import torch

    if difficulty == "hard":
        a = torch.randint(10, 100, (n,), generator=gen)
        b = torch.randint(10, 100, (n,), generator=gen)
        plus, equals = torch.full((n, 1), PLUS), torch.full((n, 1), EQUALS)
        return torch.cat([_digits(a, 2), plus, _digits(b, 2), equals], dim=1), a, b
    a = torch.randint(0, 10, (n,), generator=gen)
    if difficulty == "easy":
        b = torch.zeros_like(a)
    elif difficulty == "mixed":
        b = torch.randint(0, 10, (n,), generator=gen)
    else:
        raise ValueError(f"unknown difficulty {difficulty!r}: one of {', '.join(DIFFICULTIES)}")
    return torch.stack([a, torch.full_like(a, PLUS), b, torch.full_like(a, EQUALS)], dim=1), a, b


def _answers(a: torch.Tensor, b: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right answers as token rows padded with EOS, and their lengths without EOS."""
    import torch

    s = a + b
    n_digits = 1 + (s >= 10).long() + (s >= 100).long()
    ans = torch.full((len(s), width), EOS, dtype=torch.long)
    for k in range(3):  # the k-th digit from the left, where the answer has one
        place = 10 ** (n_digits - 1 - k).clamp(min=0)
        ans[:, k] = torch.where(k < n_digits, (s // place) % 10, ans[:, k])
    return ans, n_digits


def _prompt_types(a: torch.Tensor, b: torch.Tensor, difficulty: str) -> list[str]:
    """The type of each prompt, for the per-type breakdown (``by_type``)."""
    if difficulty == "hard":
        return ["two_digit"] * len(a)
    return ["carry" if s >= 10 else "no_carry" for s in (a + b).tolist()]


def _sample(policy: Any, prompts: torch.Tensor, max_new: int, temperature: float,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rollout side: sample responses and keep its own log-probs of them, as a rollout
    engine does. Returns tokens [B, max_new] (EOS-padded), the response mask (the tokens up to
    and including the first EOS) and the per-token log-probs under the sampler's temperature
    (0 on padding). A policy in bf16 / fp16 computes in that precision; its logits are turned
    into probabilities in fp32, as rollout engines do."""
    import torch

    with torch.no_grad():
        return _sample_no_grad(torch, policy, prompts, max_new, temperature, gen)


def _sample_no_grad(torch: Any, policy: Any, prompts: torch.Tensor, max_new: int,
                    temperature: float, gen: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, h = policy(prompts)
    last = logits[:, -1].float()
    out = torch.full((prompts.shape[0], max_new), EOS, dtype=torch.long)
    logp = torch.zeros(prompts.shape[0], max_new)
    done = torch.zeros(prompts.shape[0], dtype=torch.bool)
    mask = torch.zeros(prompts.shape[0], max_new, dtype=torch.bool)
    for t in range(max_new):
        probs = torch.softmax(last / temperature, dim=-1)
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, EOS), tok)
        out[:, t] = tok
        mask[:, t] = ~done
        token_logp = torch.log_softmax(last / temperature, dim=-1).gather(1, tok[:, None]).squeeze(1)
        logp[:, t] = torch.where(done, torch.zeros_like(token_logp), token_logp)
        done = done | (tok == EOS)
        if bool(done.all()):
            break
        logits, h = policy(tok[:, None], h)
        last = logits[:, -1].float()
    return out, mask, logp


def _token_logprobs(model: Any, prompts: torch.Tensor, resp: torch.Tensor, temperature: float,
                    with_entropy: bool = False):  # type: ignore[no-untyped-def]
    """The trainer's per-token log-probabilities of ``resp`` (and the per-token entropy) under
    the temperature-scaled policy, as TRL computes them: one forward pass over the whole
    sequence, where the rollout side stepped token by token."""
    import torch

    seq = torch.cat([prompts, resp[:, :-1]], dim=1)
    logits, _ = model(seq)
    logits = logits[:, prompts.shape[1] - 1:] / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, resp[:, :, None]).squeeze(-1)
    if not with_entropy:
        return logp
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _grade(resp: torch.Tensor, mask: torch.Tensor, answers: torch.Tensor, ans_len: torch.Tensor,
           grader: str, length_bonus: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and exact-answer correctness for each response.

    strict: 1 for the exact answer then EOS, else 0 (a verifiable reward, as for GSM8K).
    loose: strict plus ``length_bonus`` per generated token before EOS, which pays for length
    whether the answer is right or not."""
    width = answers.shape[1]
    lengths = mask.sum(-1)
    exact = (resp[:, :width] == answers).all(-1) & (lengths == ans_len + 1)
    reward = exact.float()
    if grader == "loose":
        reward = reward + length_bonus * _answer_tokens(resp, mask)
    elif grader != "strict":
        raise ValueError(f"unknown grader {grader!r}: strict or loose")
    return reward, exact.float()


def _answer_tokens(resp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Generated tokens before EOS, per response."""
    return (mask & (resp != EOS)).sum(-1).float()


def _pretrain(cfg: Config, policy: Any, gen: torch.Generator) -> None:
    """Supervised warm start: ``pretrain_steps`` steps of cross-entropy on right answers (the
    digits and the EOS after them) of random single-digit prompts."""
    import torch

    if cfg.pretrain_steps <= 0:
        return
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.pretrain_lr)
    for _ in range(cfg.pretrain_steps):
        prompts, a, b = _make_prompts(cfg.pretrain_batch, "mixed", gen)
        answers, ans_len = _answers(a, b, 3)
        logp = _token_logprobs(policy, prompts, answers, 1.0)
        target = (torch.arange(3)[None, :] <= ans_len[:, None]).float()  # digits and EOS
        loss = -(logp * target).sum() / target.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


class _RolloutSide:
    """The rollout engine's copy of the policy: the trainer's weights as of ``lag`` updates ago,
    in the rollout's precision. Synchronous fp32 rollouts sample from the trainer's own module."""

    def __init__(self, cfg: Config, policy: Any) -> None:
        import torch

        self.policy = policy
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16,
                      "fp16": torch.float16}[cfg.rollout_precision]
        self.copy = _make_policy(cfg.embed, cfg.hidden).to(self.dtype)
        self.copy.requires_grad_(False)
        # Weight versions, newest last: what a lagging rollout side still runs.
        self.versions: deque[dict[str, torch.Tensor]] = deque(maxlen=_max_lag(cfg) + 1)
        self.versions.append(self._weights())

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def updated(self) -> None:
        """The trainer took an optimizer step: a new policy version exists."""
        self.versions.append(self._weights())

    def reset(self) -> None:
        """The trainer's weights were restored (a rollback): the versions after them are gone."""
        self.versions.clear()
        self.versions.append(self._weights())

    def sampler(self, lag: int, low_precision: bool) -> tuple[Any, int]:
        """The module that samples this step, ``lag`` versions behind the trainer (as far back
        as versions exist) and in the rollout's precision when ``low_precision``, and the age
        of its weights in policy versions."""
        import torch

        dtype = self.dtype if low_precision else torch.float32
        if lag == 0 and dtype == torch.float32:
            return self.policy, 0
        age = min(lag, len(self.versions) - 1)
        if self.copy.head.weight.dtype != dtype:
            self.copy.to(dtype)
        self.copy.load_state_dict(self.versions[-1 - age])  # cast to the copy's dtype
        return self.copy, age


def _max_lag(cfg: Config) -> int:
    return _lag_at(cfg, max(cfg.steps, cfg.onset))


def _lag_at(cfg: Config, step: int) -> int:
    """The rollout side's lag behind the trainer at ``step``, in policy versions."""
    if step < cfg.onset:
        return 0
    growth = (step - cfg.onset) // cfg.rollout_lag_growth if cfg.rollout_lag_growth > 0 else 0
    return cfg.rollout_lag + growth


def _check(cfg: Config) -> None:
    if cfg.group_size < 2 or (cfg.sick_group_size is not None and cfg.sick_group_size < 2):
        raise ValueError("group size must be >= 2")
    if cfg.difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {cfg.difficulty!r}: one of {', '.join(DIFFICULTIES)}")
    if cfg.loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {cfg.loss_agg!r}: one of "
                         f"{', '.join(LOSS_AGGREGATIONS)}")
    if cfg.rollout_precision not in ROLLOUT_PRECISIONS:
        raise ValueError(f"unknown rollout precision {cfg.rollout_precision!r}: one of "
                         f"{', '.join(ROLLOUT_PRECISIONS)}")
    if cfg.rollout_lag < 0 or cfg.rollout_lag_growth < 0 or cfg.length_budget < 0:
        raise ValueError("the rollout lag, its growth interval and the length budget must be >= 0")
    if cfg.max_new_tokens < 4:
        raise ValueError("max_new_tokens must be >= 4: a three-digit answer and its EOS")


def train(cfg: Config, on_step: Callable[[StepResult], None] | None = None,
          note: Callable[[str], None] | None = None) -> list[StepResult]:
    """Run the loop for ``cfg.steps`` steps, logging every step; returns the logged metrics of
    each step (after a rollback, those of the steps trained again). ``note`` hears what a person
    should know: a resume, and the rollback it caused."""
    import torch

    _check(cfg)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy = _make_policy(cfg.embed, cfg.hidden)
    _pretrain(cfg, policy, gen)
    ref = _make_policy(cfg.embed, cfg.hidden)
    ref.load_state_dict(policy.state_dict())  # the reference is the warm-started policy
    ref.requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    rollout = _RolloutSide(cfg, policy)
    ranks = max(cfg.ranks, 2 if cfg.slow_rank else 1)
    results: list[StepResult] = []
    saved: dict[int, bytes] = {}  # step -> the training state, for a rollback
    say = note or (lambda _line: None)
    # Each writer as a context manager: the run's end is marked when the loop finishes (or is
    # interrupted by a person), not when it crashes (docs/sdk.md).
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(SnapshotWriter(cfg.snapshot_dir, cfg.run, rank=r, world_size=ranks))
                   for r in range(ranks)]
        # One process: no process group to agree with (group=False).
        gate = PauseGate(writers[0], group=False, poll_interval=cfg.pause_poll_s)
        state = _LoopState(nan_pending=cfg.nan_reward_at is not None)
        step = 1
        while step <= cfg.steps:
            decision = gate.check(step)
            if decision is not None:
                went_on = step
                step = _after_pause(cfg, decision, step, saved, policy, opt, gen, rollout, writers, say)
                state.cured = state.cured or (cfg.cured_by_rollback and step < went_on)
                results = [r for r in results if r.step < step]
                continue
            started = time.perf_counter()
            res = _step(cfg, step, policy, ref, opt, gen, rollout, state)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                res.events.append(_checkpoint(cfg, step, policy, opt, gen, saved))
            metrics = res.metrics
            writers[0].log(metrics, step, by_type=res.by_type or None, events=res.events or None)
            for r in range(1, ranks):
                slow = cfg.slow_rank and r == ranks - 1 and step >= cfg.onset
                st = metrics["perf/step_time_s"] * (cfg.slow_factor if slow else 1.0)
                writers[r].log({"perf/step_time_s": st,
                                "perf/samples_per_s": metrics["perf/samples_per_s"] * metrics["perf/step_time_s"] / st},
                               step, events=res.events or None)
            results.append(res)
            if on_step is not None:
                on_step(res)
            # The pace: the rest of the step's time, after its work (which perf/step_time_s is).
            pause = cfg.step_seconds - (time.perf_counter() - started)
            if pause > 0:
                time.sleep(pause)
            step += 1
    return results


@dataclass
class _LoopState:
    nan_pending: bool  # the verifier's one NaN is still to come
    cured: bool = False  # rolled back with cfg.cured_by_rollback: the sickness knobs are off


def _after_pause(cfg: Config, decision: ResumeDecision, step: int, saved: dict[int, bytes],
                 policy: Any, opt: torch.optim.Optimizer, gen: torch.Generator,
                 rollout: _RolloutSide, writers: list[SnapshotWriter],
                 say: Callable[[str], None]) -> int:
    """A person resumed the paused loop: restore the checkpoint they chose, in place, and return
    the step to go on from."""
    import torch

    target = decision.rollback_step
    if target is None:
        say(f"resumed at step {step} after {decision.waited_s:.0f} s paused, no rollback")
        return step
    blob = saved.get(target)
    if blob is None and decision.rollback_path:
        blob = Path(decision.rollback_path).read_bytes()
    if blob is None:
        say(f"resumed at step {step}: no checkpoint of step {target} to roll back to; going on")
        return step
    state = torch.load(io.BytesIO(blob))
    policy.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    gen.set_state(state["gen"])
    rollout.reset()
    for w in writers:  # the steps after the checkpoint are trained again, and replace these
        w.log({}, target, events=[{"type": "rollback", "from_step": step, "to_step": target}])
    say(f"resumed after {decision.waited_s:.0f} s paused: rolled back from step {step} to the "
        f"checkpoint of step {target}; training steps {target + 1}-{step - 1} again")
    return target + 1


@dataclass(frozen=True)
class _Knobs:
    """One step's settings: the sickness knobs apply from ``cfg.onset``, the defaults before."""

    sick: bool
    beta: float
    lr: float
    temperature: float
    group: int
    grader: str
    difficulty: str
    length_penalty: float
    loss_agg: str
    rollout_temperature: float

    @classmethod
    def at(cls, cfg: Config, step: int, cured: bool = False) -> _Knobs:
        sick = step >= cfg.onset and not cured

        def knob(sick_value: Any, default: Any) -> Any:
            return sick_value if sick and sick_value is not None else default

        temperature = knob(cfg.sick_temperature, cfg.temperature)
        return cls(sick=sick, beta=knob(cfg.sick_beta, cfg.beta), lr=knob(cfg.sick_lr, cfg.lr),
                   temperature=temperature, group=knob(cfg.sick_group_size, cfg.group_size),
                   grader=cfg.grader if sick else "strict",
                   difficulty=cfg.difficulty if sick else "mixed",
                   length_penalty=cfg.length_penalty if sick else 0.0,
                   loss_agg=cfg.loss_agg if sick else "token-mean",
                   rollout_temperature=knob(cfg.rollout_temperature, temperature))


@dataclass(frozen=True)
class _Rollouts:
    """The step's samples: P prompts (operands ``a`` + ``b``), each repeated G times in
    ``prompts``, the answers the rollout side sampled and its own log-probs of them."""

    a: torch.Tensor
    b: torch.Tensor
    prompts: torch.Tensor
    resp: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor
    age: int  # of the rollout side's weights, in policy versions


@dataclass(frozen=True)
class _Grades:
    score: torch.Tensor  # the verifier's, per sample
    correct: torch.Tensor
    rewards: torch.Tensor  # the training reward, (P, G)
    adv: torch.Tensor  # group-normalised, (P * G, 1)


@dataclass(frozen=True)
class _Update:
    """What the optimisation measured: loss, grad norm and per-token KL and entropy of its first
    pass, the clip fraction of its last, and the trainer's log-probs of the samples."""

    loss: float
    grad_norm: float
    clip_frac: float
    kl_tok: torch.Tensor
    ent_tok: torch.Tensor
    old_logp: torch.Tensor
    tokens: float
    skipped: bool  # a NaN / Inf gradient: no optimizer step


def _step(cfg: Config, step: int, policy: Any, ref: Any, opt: torch.optim.Optimizer,
          gen: torch.Generator, rollout: _RolloutSide, state: _LoopState) -> StepResult:
    t0 = time.perf_counter()
    knobs = _Knobs.at(cfg, step, cured=state.cured)
    samples = _roll_out(cfg, step, knobs, rollout, gen)
    nan = state.nan_pending and step == cfg.nan_reward_at
    state.nan_pending = state.nan_pending and not nan
    grades = _grade_rollouts(cfg, knobs, samples, nan)
    update = _update(cfg, knobs, policy, ref, opt, samples, grades)
    if not update.skipped:
        rollout.updated()
    events: list[dict[str, object]] = []
    if update.skipped:
        events.append({"type": "skipped_step", "step": step, "reason": "nonfinite_grad"})
    metrics = _metrics(cfg, knobs, samples, grades, update, t0)
    return StepResult(step, metrics, events, _by_type(samples.a, samples.b, knobs.difficulty,
                                                      knobs.group, grades.score, grades.correct))


def _roll_out(cfg: Config, step: int, knobs: _Knobs, rollout: _RolloutSide,
              gen: torch.Generator) -> _Rollouts:
    """P prompts, G samples each, by the rollout side's copy of the policy."""
    prompt, a, b = _make_prompts(cfg.prompts, knobs.difficulty, gen)
    prompts = prompt.repeat_interleave(knobs.group, dim=0)
    sampler, age = rollout.sampler(_lag_at(cfg, step), low_precision=knobs.sick)
    resp, mask, logp = _sample(sampler, prompts, cfg.max_new_tokens, knobs.rollout_temperature, gen)
    return _Rollouts(a, b, prompts, resp, mask, logp, age)


def _grade_rollouts(cfg: Config, knobs: _Knobs, samples: _Rollouts, nan: bool) -> _Grades:
    """The verifier's score, the training reward and the group-normalised advantages; ``nan``:
    the verifier fails on one sample."""
    group = knobs.group
    answers, ans_len = _answers(samples.a.repeat_interleave(group),
                                samples.b.repeat_interleave(group), cfg.max_new_tokens)
    score, correct = _grade(samples.resp, samples.mask, answers, ans_len, knobs.grader,
                            cfg.length_bonus)
    # An overlong penalty (DAPO's reward shaping, here with a budget too tight for two-digit
    # answers) shapes the training reward; the verifier's score is what the task asks.
    overlong = (_answer_tokens(samples.resp, samples.mask) - cfg.length_budget).clamp(min=0)
    reward = score - knobs.length_penalty * overlong
    if nan:
        reward[0] = float("nan")  # the verifier crashed on one sample and returned NaN
    rewards = reward.view(cfg.prompts, group)
    mean = rewards.mean(1, keepdim=True)
    std = rewards.std(1, keepdim=True)
    adv = ((rewards - mean) / (std + cfg.eps)).reshape(-1, 1)
    return _Grades(score, correct, rewards, adv)


def _update(cfg: Config, knobs: _Knobs, policy: Any, ref: Any, opt: torch.optim.Optimizer,
            samples: _Rollouts, grades: _Grades) -> _Update:
    """The clipped surrogate with a k3 KL penalty, ``cfg.inner_epochs`` passes over the batch,
    aggregated per token (token-mean) or per response then over responses
    (seq-mean-token-mean, Dr. GRPO's length bias)."""
    import torch

    for g in opt.param_groups:
        g["lr"] = knobs.lr
    prompts, resp, adv = samples.prompts, samples.resp, grades.adv
    maskf = samples.mask.float()
    ntok = maskf.sum()
    seq_tokens = maskf.sum(-1).clamp(min=1)

    with torch.no_grad():
        # The trainer recomputes the samples' log-probs with its own weights and temperature
        # (verl's old_log_prob): the ratio's denominator, and one side of the mismatch.
        old_logp = _token_logprobs(policy, prompts, resp, knobs.temperature)
        ref_logp = _token_logprobs(ref, prompts, resp, knobs.temperature)

    loss_v = grad_norm = clip_frac = 0.0
    kl_tok = ent_tok = None
    skipped = False
    for epoch in range(cfg.inner_epochs):
        logp, entropy = _token_logprobs(policy, prompts, resp, knobs.temperature, with_entropy=True)
        ratio = torch.exp(logp - old_logp)
        surr = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
        d = ref_logp - logp
        k3 = torch.exp(d) - d - 1
        per_tok = (-surr + knobs.beta * k3) * maskf
        if knobs.loss_agg == "token-mean":
            loss = per_tok.sum() / ntok
        else:
            loss = (per_tok.sum(-1) / seq_tokens).mean()
        if epoch == 0:
            kl_tok, ent_tok = k3.detach(), entropy.detach()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        with torch.no_grad():
            clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
            clip_frac = float((clipped * maskf).sum() / ntok)
        if epoch == 0:
            loss_v, grad_norm = float(loss.detach()), float(norm)
        if not math.isfinite(float(norm)):
            skipped = True  # a NaN / Inf gradient: skip the update, as AMP trainers do
            opt.zero_grad(set_to_none=True)
            break
        opt.step()
    assert kl_tok is not None and ent_tok is not None
    return _Update(loss_v, grad_norm, clip_frac, kl_tok, ent_tok, old_logp, float(ntok), skipped)


def _checkpoint(cfg: Config, step: int, policy: Any, opt: torch.optim.Optimizer,
                gen: torch.Generator, saved: dict[int, bytes]) -> dict[str, object]:
    """Save the training state (policy, optimizer, sampling stream) to ``cfg.checkpoint_dir``,
    and to memory, which a rollback restores; the checkpoint_save event."""
    import torch

    t_ckpt = time.perf_counter()
    buf = io.BytesIO()
    torch.save({"step": step, "model": policy.state_dict(), "optim": opt.state_dict(),
                "gen": gen.get_state()}, buf)
    saved[step] = buf.getvalue()
    event: dict[str, object] = {"type": "checkpoint_save", "step": step}
    if cfg.checkpoint_dir is not None:
        os.makedirs(cfg.checkpoint_dir, exist_ok=True)
        path = Path(cfg.checkpoint_dir) / f"{cfg.run}-step-{step}.pt"
        path.write_bytes(saved[step])
        event["path"] = str(path)
    event["duration_s"] = time.perf_counter() - t_ckpt
    return event


def _metrics(cfg: Config, knobs: _Knobs, samples: _Rollouts, grades: _Grades, update: _Update,
             t0: float) -> dict[str, float]:
    """The step's logged signals: grpo_stats of the batch, then the update's, the accuracy and
    the step's performance, timed from ``t0``."""
    import torch

    from grpo_monitor.sdk.torch import grpo_stats

    n = cfg.prompts * knobs.group
    metrics = grpo_stats(grades.rewards, kl=update.kl_tok, entropy=update.ent_tok,
                         mask=samples.mask, max_length=cfg.max_new_tokens, eps=cfg.eps,
                         logprobs=update.old_logp, advantages=grades.adv,
                         rollout_logprobs=samples.logp,
                         correct=grades.correct.view(cfg.prompts, knobs.group),
                         trajectory_age=torch.full((n,), float(samples.age)))
    step_time = time.perf_counter() - t0
    metrics.update({
        "loss": update.loss,
        "grad/norm": update.grad_norm,
        "train/lr": knobs.lr,
        "policy/clip_frac": update.clip_frac,
        "eval/sample_acc": float(grades.correct.mean()),
        "perf/step_time_s": step_time,
        "perf/samples_per_s": n / step_time,
        "perf/tokens_per_s": update.tokens / step_time,
    })
    return metrics


def _by_type(a: torch.Tensor, b: torch.Tensor, difficulty: str, group: int, score: torch.Tensor,
             correct: torch.Tensor) -> dict[str, dict[str, float]]:
    """Per prompt type: the verifier's mean score (reward/mean, before any length bonus or
    penalty: what the task asks of that type) and the share of right answers."""
    types = _prompt_types(a, b, difficulty)
    per_prompt_score = score.view(-1, group).mean(1).tolist()
    per_prompt_acc = correct.view(-1, group).mean(1).tolist()
    out: dict[str, dict[str, float]] = {}
    for name in sorted(set(types)):
        idx = [i for i, t in enumerate(types) if t == name]
        out[name] = {"reward/mean": sum(per_prompt_score[i] for i in idx) / len(idx),
                     "eval/sample_acc": sum(per_prompt_acc[i] for i in idx) / len(idx)}
    return out


def config_from_args(args: argparse.Namespace, snapshot_dir: Path) -> Config:
    """Turn the parsed flags (``grpo-monitor train-demo``'s, in cli.py, each with its Config
    field as dest) into a Config. A flag that differs from the healthy default is a sickness
    knob: with ``--onset`` it applies only from that step."""
    d = Config(snapshot_dir=snapshot_dir)
    given = vars(args)
    knobs = {"beta": "sick_beta", "lr": "sick_lr", "temperature": "sick_temperature",
             "group_size": "sick_group_size"}
    cfg = Config(snapshot_dir=snapshot_dir, **{
        f.name: given[f.name] for f in fields(Config)
        if f.name in given and f.name not in knobs and f.name != "snapshot_dir"})
    for name, sick_name in knobs.items():
        value = given[name]
        if cfg.onset > 0:
            setattr(cfg, sick_name, value if value != getattr(d, name) else None)
        else:
            setattr(cfg, name, value)
    _check(cfg)
    return cfg
