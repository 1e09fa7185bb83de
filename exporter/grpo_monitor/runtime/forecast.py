"""The entropy–reward law of RL post-training, fitted online: R = -a·exp(H) + b.

Across models and tasks, a policy's reward R and its token entropy H follow this curve tightly
(arXiv 2505.22617): a policy trades entropy for reward at a fixed exchange rate, so the reward a
run can still reach is bounded by the entropy it has left. Fitted on a run's early steps the
curve predicts its later reward, and at H = 0 it gives the run's ceiling, b - a: the reward of a
policy that has stopped exploring.

The fit is an ordinary least-squares line of R on x = exp(H) over *block means*: the mean entropy
and the mean reward of each full block of BLOCK_STEPS consecutive steps. A step's reward is the
mean over a small batch and noisy; averaging ten steps keeps the fit quality (R²) about the law
rather than about batch noise, and makes a run logged every step and one logged every tenth
comparable. Standard library only: the exporter keeps running sums per run; the report and the
forecast benchmark fit recorded histories with the same function, and judge a fit on a run's
later blocks with the same scoring (score_forecast). One difference: the exporter adds a block
once the next one starts, while block_means also returns the block a recorded run ended in, so
on a finished run the report's fit can hold one partial block more than the exporter's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BLOCK_STEPS", "MIN_BLOCKS", "MIN_ENTROPY_SPREAD", "ForecastScore", "LawFit", "LawSums",
           "block_means", "fit_law", "score_forecast"]

# Steps per block mean. Ten steps of a 16-prompt batch average out most of the reward's batch
# noise and still give a 100-step run ten points.
BLOCK_STEPS = 10
# Blocks before a fit is published: fewer points make a line that any two blocks can tilt.
MIN_BLOCKS = 5
# The entropy must have moved by at least this fraction of its largest block mean: a run whose
# entropy sits still (0.077 to 0.083) gives a line through noise, whatever its R², and a
# ceiling far from anything the run can reach.
MIN_ENTROPY_SPREAD = 0.1


@dataclass(frozen=True)
class LawFit:
    """R = -a·exp(H) + b fitted on ``points`` (entropy, reward) pairs."""

    a: float
    b: float
    r_squared: float  # coefficient of determination of the fit on its own points
    points: int

    @property
    def ceiling(self) -> float:
        """The reward the law predicts at zero entropy."""
        return self.b - self.a

    def predict(self, entropy: float) -> float:
        return self.b - self.a * math.exp(entropy)


@dataclass
class LawSums:
    """Running sums of a least-squares fit of R on exp(H): O(1) memory for a run of any length."""

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0
    h_min: float = math.inf
    h_max: float = -math.inf

    def add(self, entropy: float, reward: float) -> None:
        # exp() of an entropy past ~709 overflows: no policy has such an entropy, so such a point
        # is garbage in, and it is left out rather than poisoning every later fit.
        if not (math.isfinite(entropy) and math.isfinite(reward)) or entropy > 700:
            return
        x = math.exp(entropy)
        self.h_min, self.h_max = min(self.h_min, entropy), max(self.h_max, entropy)
        self.n += 1
        self.sx += x
        self.sy += reward
        self.sxx += x * x
        self.sxy += x * reward
        self.syy += reward * reward

    def fit(self, min_points: int = MIN_BLOCKS) -> LawFit | None:
        """The fit, or None with fewer than ``min_points`` points or an entropy that has not moved
        by MIN_ENTROPY_SPREAD of its largest value."""
        n = self.n
        if n < max(min_points, 2) or self.h_max - self.h_min < MIN_ENTROPY_SPREAD * abs(self.h_max):
            return None
        vxx = self.sxx - self.sx * self.sx / n
        vxy = self.sxy - self.sx * self.sy / n
        vyy = self.syy - self.sy * self.sy / n
        # Relative to the values' size: a constant entropy leaves only rounding in vxx.
        if vxx <= 1e-12 * max(self.sxx, 1e-300):
            return None
        slope = vxy / vxx
        intercept = (self.sy - slope * self.sx) / n
        # R² = squared correlation; a constant reward is fitted exactly by a flat line.
        r_squared = 1.0 if vyy <= 1e-12 * max(self.syy, 1e-300) else min(1.0, max(0.0, vxy * vxy / (vxx * vyy)))
        return LawFit(a=-slope, b=intercept, r_squared=r_squared, points=n)


def block_means(steps: Sequence[int], values: Sequence[float],
                block: int = BLOCK_STEPS) -> dict[int, float]:
    """Mean of the finite values of each block of ``block`` consecutive steps (block index ->
    mean), the last block included even when the run ended inside it."""
    sums: dict[int, list[float]] = {}
    for step, value in zip(steps, values):
        if math.isfinite(value):
            acc = sums.setdefault(step // block, [0.0, 0])
            acc[0] += value
            acc[1] += 1
    return {b: s / k for b, (s, k) in sums.items()}


def fit_law(entropy: Iterable[float], reward: Iterable[float],
            min_points: int = MIN_BLOCKS) -> LawFit | None:
    """Fit R = -a·exp(H) + b on paired (entropy, reward) points, e.g. the block means of
    :func:`block_means` over the blocks where both were logged."""
    sums = LawSums()
    for h, r in zip(entropy, reward):
        sums.add(h, r)
    return sums.fit(min_points)


@dataclass(frozen=True)
class ForecastScore:
    """A fit on a run's first blocks, judged on the blocks after them (:func:`score_forecast`)."""

    fit_blocks: tuple[int, ...]  # the block indices fitted, ascending
    forecast_blocks: tuple[int, ...]  # the block indices after the cut, ascending
    fit: LawFit | None  # None where fit_law refuses: too few blocks, or an entropy that sat still
    scored: tuple[int, ...]  # the forecast blocks given a prediction, ascending
    errors: tuple[float, ...]  # predicted - observed reward, one per scored block
    # The naive forecast a law must beat: the last fitted block's reward held flat, minus the
    # observed reward, one per scored block.
    flat_errors: tuple[float, ...]
    reward_range: float  # max - min of every finite block reward of the run; NaN without any

    @property
    def mae(self) -> float:
        """Mean absolute error of the law's predictions; NaN with none."""
        return _mean_abs(self.errors)

    @property
    def flat_mae(self) -> float:
        """Mean absolute error of holding the last fitted block's reward flat; NaN with none."""
        return _mean_abs(self.flat_errors)

    @property
    def mae_pct_of_range(self) -> float | None:
        """``mae`` as a percentage of ``reward_range``: None where the reward never moved, NaN
        where no block was scored."""
        return 100 * self.mae / self.reward_range if self.reward_range > 0 else None


def _mean_abs(values: Sequence[float]) -> float:
    return math.fsum(abs(v) for v in values) / len(values) if values else math.nan


def score_forecast(entropy: Mapping[int, float], reward: Mapping[int, float],
                   fit_blocks: int) -> ForecastScore:
    """Fit the law on a run's first ``fit_blocks`` blocks and predict the reward of every later
    block from that block's *observed* mean entropy: the law claims an exchange rate of entropy
    for reward, not when the entropy will fall.

    ``entropy`` and ``reward`` are block means (:func:`block_means`) over the same steps; a block
    in one only is left out. The cut counts blocks, not steps: it falls after the run's first
    ``fit_blocks`` blocks that hold a point, in block order. "The first half of a run" is
    therefore ``len(blocks) // 2`` of its blocks, whatever step it starts at and whatever blocks
    it skipped, and a cut "before step N" is the number of blocks whose index is below
    N // BLOCK_STEPS. A forecast block whose entropy is past exp()'s range gets no prediction and
    is not scored, as LawSums leaves such a point out of a fit.
    """
    blocks = sorted(entropy.keys() & reward.keys())
    fitted, rest = blocks[:max(fit_blocks, 0)], blocks[max(fit_blocks, 0):]
    finite = [reward[b] for b in blocks if math.isfinite(reward[b])]
    span = max(finite) - min(finite) if finite else math.nan
    fit = fit_law([entropy[b] for b in fitted], [reward[b] for b in fitted])
    scored: list[int] = []
    errors: list[float] = []
    flat: list[float] = []
    if fit is not None:
        for b in rest:
            try:
                predicted = fit.predict(entropy[b])
            except OverflowError:
                continue
            scored.append(b)
            errors.append(predicted - reward[b])
            flat.append(reward[fitted[-1]] - reward[b])
    return ForecastScore(fit_blocks=tuple(fitted), forecast_blocks=tuple(rest), fit=fit,
                         scored=tuple(scored), errors=tuple(errors), flat_errors=tuple(flat),
                         reward_range=span)
