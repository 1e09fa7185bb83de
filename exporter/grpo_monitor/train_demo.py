"""A real, tiny GRPO training loop on the CPU that writes snapshots through the SDK.

Nothing here is simulated except the extra ranks of ``--slow-rank``: a ~5k-parameter GRU policy
learns single-digit addition ("3+4=" -> "7" EOS) from a verifier's reward, with G sampled answers
per prompt, group-normalised advantages, the PPO/GRPO clipped surrogate against the sampling
policy, a k3 KL penalty to a frozen reference copy, and every step's signals logged with
``grpo_stats`` + ``SnapshotWriter``. The knobs make the seeds' sicknesses happen for real, in
the training dynamics, never by editing the logged numbers:

* ``--grader loose``: the reward also pays for every generated token, whether or not the answer
  is right -> reward hacking with a length surge, sample accuracy flat or falling (seed 4.1).
* ``--beta 0 --lr 0.03``: no KL anchor and a too-large step -> KL to the reference blows up.
* ``--group-size 2`` / ``--temperature 0.3``: groups of identical answers (zero-std groups) and
  entropy collapse.
* ``--nan-reward-at STEP``: the verifier returns NaN for one sample; it reaches the loss and the
  gradient norm, and the optimizer step is skipped (as mixed-precision trainers do).
* ``--slow-rank``: extra ranks (``--ranks``, at least 2) whose perf signals mirror rank 0's
  measured step time, the last one slowed by ``--slow-factor`` -- the one simulated part.

``--onset STEP`` applies the sickness knobs only from that step, so a run first has a healthy
baseline (the exporter's baseline is the first 200 steps) and then turns sick.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_monitor.sdk.writer import SnapshotWriter

if TYPE_CHECKING:
    import torch

__all__ = ["Config", "StepResult", "add_arguments", "config_from_args", "train"]

# Vocabulary: digits 0-9, "+", "=", EOS.
PLUS, EQUALS, EOS = 10, 11, 12
VOCAB = 13
PROMPT_LEN = 4  # "a+b="


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
    beta: float = 0.1  # KL coefficient (k3 estimate to the frozen reference)
    clip_eps: float = 0.2
    inner_epochs: int = 2  # optimisation passes over each batch (ratio vs the sampling policy)
    max_grad_norm: float = 1.0
    grader: str = "strict"  # strict | loose
    length_bonus: float = 0.15  # loose grader: reward per generated token, right or wrong
    nan_reward_at: int | None = None
    onset: int = 0  # the sickness knobs below apply from this step
    sick_beta: float | None = None
    sick_lr: float | None = None
    sick_temperature: float | None = None
    sick_group_size: int | None = None
    slow_rank: bool = False
    ranks: int = 1
    slow_factor: float = 1.6
    checkpoint_every: int = 100
    checkpoint_dir: Path | None = None
    hidden: int = 32
    embed: int = 16
    threads: int = 2
    eps: float = 1e-4


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]
    events: list[dict[str, object]] = field(default_factory=list)


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


def _answers(a: torch.Tensor, b: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right answers as token rows padded with EOS, and their lengths without EOS."""
    import torch

    s = a + b
    two = s >= 10
    ans = torch.full((len(s), width), EOS, dtype=torch.long)
    ans[:, 0] = torch.where(two, s // 10, s)
    ans[:, 1] = torch.where(two, s % 10, torch.full_like(s, EOS))
    return ans, 1 + two.long()


def _sample(policy: Any, prompts: torch.Tensor, max_new: int, temperature: float,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample responses; returns tokens [B, max_new] (EOS-padded) and the response mask (the
    tokens up to and including the first EOS)."""
    import torch

    with torch.no_grad():
        return _sample_no_grad(torch, policy, prompts, max_new, temperature, gen)


def _sample_no_grad(torch: Any, policy: Any, prompts: torch.Tensor, max_new: int,
                    temperature: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits, h = policy(prompts)
    last = logits[:, -1]
    out = torch.full((prompts.shape[0], max_new), EOS, dtype=torch.long)
    done = torch.zeros(prompts.shape[0], dtype=torch.bool)
    mask = torch.zeros(prompts.shape[0], max_new, dtype=torch.bool)
    for t in range(max_new):
        probs = torch.softmax(last / temperature, dim=-1)
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, EOS), tok)
        out[:, t] = tok
        mask[:, t] = ~done
        done = done | (tok == EOS)
        if bool(done.all()):
            break
        logits, h = policy(tok[:, None], h)
        last = logits[:, -1]
    return out, mask


def _token_logprobs(model: Any, prompts: torch.Tensor, resp: torch.Tensor, temperature: float,
                    with_entropy: bool = False):  # type: ignore[no-untyped-def]
    """Per-token log-probabilities of ``resp`` (and the per-token entropy) under the
    temperature-scaled policy, as TRL computes them."""
    import torch

    seq = torch.cat([prompts, resp[:, :-1]], dim=1)
    logits, _ = model(seq)
    logits = logits[:, PROMPT_LEN - 1:] / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, resp[:, :, None]).squeeze(-1)
    if not with_entropy:
        return logp
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _grade(resp: torch.Tensor, mask: torch.Tensor, answers: torch.Tensor, ans_len: torch.Tensor,
           grader: str, length_bonus: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and exact-answer correctness for each response.

    strict: 1 for the exact answer then EOS; else partial credit 0.3 x the share of the
    answer's digits right in place. loose: strict plus ``length_bonus`` per generated token
    before EOS, which pays for length whether the answer is right or not."""
    import torch

    width = answers.shape[1]
    head = resp[:, :width]
    lengths = mask.sum(-1)
    exact = (head == answers).all(-1) & (lengths == ans_len + 1)
    pos = torch.arange(width)[None, :]
    digit_ok = ((head == answers) & (pos < ans_len[:, None])).sum(-1).float() / ans_len.float()
    reward = torch.where(exact, torch.ones_like(digit_ok), 0.3 * digit_ok)
    if grader == "loose":
        emitted = (mask & (resp != EOS)).sum(-1).float()
        reward = reward + length_bonus * emitted
    elif grader != "strict":
        raise ValueError(f"unknown grader {grader!r}: strict or loose")
    return reward, exact.float()


def train(cfg: Config, on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
    """Run the loop for ``cfg.steps`` steps, logging every step; returns the logged metrics."""
    import torch

    if cfg.group_size < 2 or (cfg.sick_group_size is not None and cfg.sick_group_size < 2):
        raise ValueError("group size must be >= 2")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy = _make_policy(cfg.embed, cfg.hidden)
    ref = _make_policy(cfg.embed, cfg.hidden)
    ref.load_state_dict(policy.state_dict())
    ref.requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    ranks = max(cfg.ranks, 2 if cfg.slow_rank else 1)
    results: list[StepResult] = []
    # Each writer as a context manager: the run's end is marked when the loop finishes (or is
    # interrupted by a person), not when it crashes (docs/sdk.md).
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(SnapshotWriter(cfg.snapshot_dir, cfg.run, rank=r, world_size=ranks))
                   for r in range(ranks)]
        for step in range(1, cfg.steps + 1):
            res = _step(cfg, step, policy, ref, opt, gen)
            metrics = res.metrics
            writers[0].log(metrics, step, events=res.events or None)
            for r in range(1, ranks):
                slow = cfg.slow_rank and r == ranks - 1 and step >= cfg.onset
                st = metrics["perf/step_time_s"] * (cfg.slow_factor if slow else 1.0)
                writers[r].log({"perf/step_time_s": st,
                                "perf/samples_per_s": metrics["perf/samples_per_s"] * metrics["perf/step_time_s"] / st},
                               step, events=res.events or None)
            results.append(res)
            if on_step is not None:
                on_step(res)
    return results


def _step(cfg: Config, step: int, policy: Any, ref: Any, opt: torch.optim.Optimizer,
          gen: torch.Generator) -> StepResult:
    import torch

    from grpo_monitor.sdk.torch import grpo_stats

    t0 = time.perf_counter()
    sick = step >= cfg.onset
    beta = cfg.sick_beta if sick and cfg.sick_beta is not None else cfg.beta
    lr = cfg.sick_lr if sick and cfg.sick_lr is not None else cfg.lr
    temperature = cfg.sick_temperature if sick and cfg.sick_temperature is not None else cfg.temperature
    group = cfg.sick_group_size if sick and cfg.sick_group_size is not None else cfg.group_size
    grader = cfg.grader if sick else "strict"
    for g in opt.param_groups:
        g["lr"] = lr

    # Rollout: P prompts, G samples each.
    P = cfg.prompts
    a = torch.randint(0, 10, (P,), generator=gen)
    b = torch.randint(0, 10, (P,), generator=gen)
    prompt = torch.stack([a, torch.full_like(a, PLUS), b, torch.full_like(a, EQUALS)], dim=1)
    prompts = prompt.repeat_interleave(group, dim=0)
    resp, mask = _sample(policy, prompts, cfg.max_new_tokens, temperature, gen)
    answers, ans_len = _answers(a.repeat_interleave(group), b.repeat_interleave(group), cfg.max_new_tokens)
    reward, correct = _grade(resp, mask, answers, ans_len, grader, cfg.length_bonus)
    if cfg.nan_reward_at is not None and step == cfg.nan_reward_at:
        reward[0] = float("nan")  # the verifier crashed on one sample and returned NaN
    rewards = reward.view(P, group)
    mean = rewards.mean(1, keepdim=True)
    std = rewards.std(1, keepdim=True)
    adv = ((rewards - mean) / (std + cfg.eps)).reshape(-1, 1)
    maskf = mask.float()
    ntok = maskf.sum()

    with torch.no_grad():
        old_logp = _token_logprobs(policy, prompts, resp, temperature)
        ref_logp = _token_logprobs(ref, prompts, resp, temperature)

    # Optimisation: the clipped surrogate with a k3 KL penalty, token-level mean.
    loss_v = grad_norm = clip_frac = 0.0
    kl_tok = ent_tok = None
    skipped = False
    for epoch in range(cfg.inner_epochs):
        logp, entropy = _token_logprobs(policy, prompts, resp, temperature, with_entropy=True)
        ratio = torch.exp(logp - old_logp)
        surr = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
        d = ref_logp - logp
        k3 = torch.exp(d) - d - 1
        per_tok = -surr + beta * k3
        loss = (per_tok * maskf).sum() / ntok
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

    events: list[dict[str, object]] = []
    if skipped:
        events.append({"type": "skipped_step", "step": step, "reason": "nonfinite_grad"})
    if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
        t_ckpt = time.perf_counter()
        if cfg.checkpoint_dir is not None:
            os.makedirs(cfg.checkpoint_dir, exist_ok=True)
            torch.save({"step": step, "model": policy.state_dict(), "optim": opt.state_dict()},
                       Path(cfg.checkpoint_dir) / f"{cfg.run}-step-{step}.pt")
        else:
            torch.save({"step": step, "model": policy.state_dict(), "optim": opt.state_dict()},
                       io.BytesIO())
        events.append({"type": "checkpoint_save", "step": step,
                       "duration_s": time.perf_counter() - t_ckpt})

    assert kl_tok is not None and ent_tok is not None
    metrics = grpo_stats(rewards, kl=kl_tok, entropy=ent_tok, mask=mask,
                         max_length=cfg.max_new_tokens, eps=cfg.eps)
    step_time = time.perf_counter() - t0
    metrics.update({
        "loss": loss_v,
        "grad/norm": grad_norm,
        "train/lr": lr,
        "policy/clip_frac": clip_frac,
        "eval/sample_acc": float(correct.mean()),
        "perf/step_time_s": step_time,
        "perf/samples_per_s": P * group / step_time,
        "perf/tokens_per_s": float(ntok) / step_time,
    })
    return StepResult(step, metrics, events)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``train-demo`` flags (also used by ``grpo-monitor train-demo``)."""
    d = Config(snapshot_dir=Path("."))
    p.add_argument("--run", default=d.run, help=f"Run name (default: {d.run}).")
    p.add_argument("--steps", type=int, default=d.steps, help=f"Training steps (default: {d.steps}).")
    p.add_argument("--seed", type=int, default=d.seed, help=f"Random seed (default: {d.seed}).")
    p.add_argument("--prompts", type=int, default=d.prompts, help=f"Prompts per step (default: {d.prompts}).")
    p.add_argument("--group-size", type=int, default=d.group_size,
                   help=f"G, sampled answers per prompt; 2 starves the advantage (default: {d.group_size}).")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help=f"Sampling temperature; 0.3 collapses entropy (default: {d.temperature}).")
    p.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default: {d.lr}).")
    p.add_argument("--beta", type=float, default=d.beta,
                   help=f"KL coefficient; 0 with a high --lr blows KL up (default: {d.beta}).")
    p.add_argument("--inner-epochs", type=int, default=d.inner_epochs,
                   help=f"Optimisation passes per batch (default: {d.inner_epochs}).")
    p.add_argument("--grader", choices=("strict", "loose"), default=d.grader,
                   help="strict: pays for the right answer; loose: also pays per generated token "
                   "(reward hacking with a length surge) (default: strict).")
    p.add_argument("--nan-reward-at", type=int, default=None, metavar="STEP",
                   help="The verifier returns NaN for one sample at this step.")
    p.add_argument("--onset", type=int, default=d.onset, metavar="STEP",
                   help="Apply the sickness knobs (--grader, --beta, --lr, --temperature, "
                   "--group-size, --slow-rank) only from this step; before it the defaults train "
                   "(default: 0, sick from the start).")
    p.add_argument("--slow-rank", action="store_true",
                   help="Log extra ranks' perf signals (simulated from rank 0's step time), the last "
                   "one slowed by --slow-factor.")
    p.add_argument("--ranks", type=int, default=d.ranks,
                   help="Ranks logged with --slow-rank, at least 2; 3+ lets GRPORankStraggler compare "
                   "(default: 2 with --slow-rank).")
    p.add_argument("--slow-factor", type=float, default=d.slow_factor,
                   help=f"Step-time factor of the slow rank (default: {d.slow_factor}).")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help=f"Save a checkpoint (and log a checkpoint_save event) every N steps (default: {d.checkpoint_every}).")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="Where checkpoints go (default: serialised in memory only).")
    p.add_argument("--threads", type=int, default=d.threads, help=f"torch threads (default: {d.threads}).")


def config_from_args(args: argparse.Namespace, snapshot_dir: Path) -> Config:
    """Turn the parsed flags into a Config. A flag that differs from the healthy default is a
    sickness knob: with ``--onset`` it applies only from that step."""
    d = Config(snapshot_dir=snapshot_dir)
    onset = args.onset
    cfg = Config(
        snapshot_dir=snapshot_dir, run=args.run, steps=args.steps, seed=args.seed,
        prompts=args.prompts, inner_epochs=args.inner_epochs, grader=args.grader,
        nan_reward_at=args.nan_reward_at, onset=onset, slow_rank=args.slow_rank, ranks=args.ranks,
        slow_factor=args.slow_factor, checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir, threads=args.threads)
    for name, sick_name in (("beta", "sick_beta"), ("lr", "sick_lr"),
                            ("temperature", "sick_temperature"), ("group_size", "sick_group_size")):
        value = getattr(args, name)
        if onset > 0:
            setattr(cfg, sick_name, value if value != getattr(d, name) else None)
        else:
            setattr(cfg, name, value)
    return cfg
