"""Small-sample statistics for seeded studies: mean, sample standard deviation, Student t intervals.

No scipy: the t distribution's CDF is the regularised incomplete beta function (continued fraction,
as in Numerical Recipes' `betacf`), and its quantile is found by bisection to machine precision.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def _incomplete_beta_fraction(x: float, a: float, b: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return result


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """`I_x(a, b)` for `0 <= x <= 1`, `a, b > 0`."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _incomplete_beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(1.0 - x, b, a) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if t * t < df:  # near the centre: P(|T| < |t|) = I_{t^2 / (df + t^2)}(1/2, df/2), no cancellation
        central = 0.5 * regularized_incomplete_beta(t * t / (df + t * t), 0.5, df / 2.0)
        return 0.5 + central if t >= 0 else 0.5 - central
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The `t` with `P(T <= t) = p` (e.g. `p = 0.975` for a two-sided 95% interval)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation (n - 1) and a two-sided t interval for the mean."""

    n: int
    mean: float
    std: float | None  # None for n < 2
    low: float | None  # interval bounds, None for n < 2
    high: float | None
    level: float = 0.95


def summarize(values: Sequence[float], level: float = 0.95) -> Summary:
    """`mean +- t_{(1 + level) / 2, n - 1} * std / sqrt(n)` over `values` (at least one)."""
    if not values:
        raise ValueError("no values to summarize")
    n, mean = len(values), float(statistics.fmean(values))
    if n < 2:
        return Summary(n, mean, None, None, None, level)
    std = float(statistics.stdev(values))
    half = student_t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half, level)
