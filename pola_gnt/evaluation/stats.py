"""Small-sample statistics for seeded studies: mean, sample standard deviation, Student t intervals.

The t distribution is scipy's: the quantile is `scipy.special.stdtrit`, the function behind
`scipy.stats.t.ppf` (called directly: importing `scipy.stats` would more than double the start-up
time of `python -m pola_gnt.report`); the CDF is written with scipy's regularised incomplete beta
function `betainc`, which keeps full precision near t = 0, where `stdtr` (`t.cdf`) is off by up to
1.6e-9 (scipy 1.17, df = 1).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import special


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """`I_x(a, b)` for `0 <= x <= 1`, `a, b > 0`."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    return float(special.betainc(a, b, x))


def _check_df(df: float) -> None:
    if not df > 0:  # scipy answers nan instead
        raise ValueError(f"degrees of freedom must be positive, got {df}")


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    _check_df(df)
    if math.isnan(t):
        raise ValueError("t must be a number, got nan")
    if t * t < df:  # near the centre: P(|T| < |t|) = I_{t^2 / (df + t^2)}(1/2, df/2), no cancellation
        central = 0.5 * regularized_incomplete_beta(t * t / (df + t * t), 0.5, df / 2.0)
        return 0.5 + central if t >= 0 else 0.5 - central
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The `t` with `P(T <= t) = p` (e.g. `p = 0.975` for a two-sided 95% interval)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    _check_df(df)
    return float(special.stdtrit(df, p))


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
