"""Means over seeds with Student-t confidence intervals, the quantiles from scipy.stats.

For n values x_1..x_n with mean m and sample standard deviation s (n - 1 in the denominator), the 95%
confidence interval of the mean is

    m ± t_{0.975, n-1} · s / √n

where t_{0.975, ν} is the quantile of Student's t with ν degrees of freedom that leaves 2.5% in each tail
(``scipy.stats.t.ppf``; it agrees with the closed forms of Abramowitz & Stegun 26.7.3-4, which posgpt computed
itself before, to 1.4e-14 relative for ν < 300, so no printed interval changed).
One value has no interval: it is reported as such, never with a made-up width. A value that is inf (the
perplexity of a diverged run, too large for a float) makes the mean inf and the interval unbounded on both
sides, so it is never "clearly different" from anything: a diverged seed is shown, not averaged away.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@functools.cache
def t_critical(df: int, confidence: float = 0.95) -> float:
    """The t such that P(|T| < t) = ``confidence`` for ``df`` degrees of freedom (12.706 for df=1 at 95%); once
    per (df, confidence) in a process (a comparison asks for the same few thousands of times)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1 (got {df})")
    # Imported on the first call: scipy.stats takes about a second to import, and every training and evaluation
    # process imports this module (for its estimates' types) without asking for an interval.
    from scipy import stats

    return float(stats.t.ppf((1 + confidence) / 2, df))


@dataclass(frozen=True)
class Estimate:
    """The mean of ``n`` values and the half-width of its 95% confidence interval (None when n = 1)."""

    mean: float
    half_width: float | None
    n: int

    @property
    def low(self) -> float:
        if self.half_width == math.inf:  # inf - inf would be nan: an unbounded interval reaches -inf
            return -math.inf
        return self.mean - (self.half_width or 0.0)

    @property
    def high(self) -> float:
        return self.mean + (self.half_width or 0.0)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean ± t_{(1+c)/2, n−1} · s/√n over ``values`` (at least one)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to average")
    if any(math.isinf(value) for value in values):
        return Estimate(math.inf, math.inf if n > 1 else None, n)
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, None, 1)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return Estimate(mean, t_critical(n - 1, confidence) * math.sqrt(variance / n), n)


def clearly_different(a: Estimate, b: Estimate) -> bool:
    """True when both have intervals and they do not overlap: the rule compare.py reports differences by.

    Conservative: two 95% intervals that do not overlap imply a difference well beyond 95% confidence.
    """
    if a.half_width is None or b.half_width is None:
        return False
    return a.high < b.low or b.high < a.low
