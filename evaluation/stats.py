"""Means over seeds with Student-t confidence intervals, computed exactly without scipy.

For n values x_1..x_n with mean m and sample standard deviation s (n - 1 in the denominator), the 95%
confidence interval of the mean is

    m ± t_{0.975, n-1} · s / √n

where t_{0.975, ν} is the quantile of Student's t with ν degrees of freedom that leaves 2.5% in each tail.
One value has no interval: it is reported as such, never with a made-up width. A value that is inf (the
perplexity of a diverged run, too large for a float) makes the mean inf and the interval unbounded on both
sides, so it is never "clearly different" from anything: a diverged seed is shown, not averaged away.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass


def t_two_sided_probability(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` (integer >= 1) degrees of freedom, by the closed forms
    (Abramowitz & Stegun 26.7.3-4), with θ = atan(t / √ν):

        ν odd:  A = (2/π) [θ + sin θ (cos θ + (2/3) cos³θ + ... + (2·4···(ν−3))/(1·3···(ν−2)) cos^(ν−2)θ)]
        ν even: A = sin θ [1 + (1/2) cos²θ + ... + (1·3···(ν−3))/(2·4···(ν−2)) cos^(ν−2)θ]
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1 (got {df})")
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):  # the term of cos^k θ is the previous one times (k-1)/k · cos²θ
                term *= (k - 1) / k * cos2
                total += term
        return 2 / math.pi * (theta + sin * total)
    term = total = 1.0
    for k in range(2, df - 1, 2):  # the term of cos^k θ is the previous one times (k-1)/k · cos²θ
        term *= (k - 1) / k * cos2
        total += term
    return sin * total


@functools.cache
def t_critical(df: int, confidence: float = 0.95) -> float:
    """The t such that P(|T| < t) = ``confidence`` for ``df`` degrees of freedom (12.706 for df=1 at 95%).

    Found by bisection on the exact two-sided probability, which increases with t; once per (df, confidence) in a
    process (a comparison asks for the same few thousands of times).
    """
    low, high = 0.0, 1.0
    while t_two_sided_probability(high, df) < confidence:
        high *= 2
    for _ in range(100):  # far below float resolution: the interval halves each time
        middle = (low + high) / 2
        if t_two_sided_probability(middle, df) < confidence:
            low = middle
        else:
            high = middle
    return (low + high) / 2


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
