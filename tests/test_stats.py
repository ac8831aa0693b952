"""`pola_gnt.evaluation.stats`: Student t distribution and the summaries of seeded studies."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from pola_gnt.evaluation.stats import regularized_incomplete_beta, student_t_cdf, student_t_quantile, summarize

# Two-sided 95% quantiles t_{0.975, df} (standard tables, 10 digits).
T_975 = {3: 3.182446305, 4: 2.776445105, 5: 2.570581836, 10: 2.228138852, 30: 2.042272456}


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995, 0.025])
def test_t_quantile_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(p):
    assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
    assert student_t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)


@pytest.mark.parametrize("t", [-40.0, -2.0, -1e-5, 0.0, 0.3, 1.0, 7.5])
def test_t_cdf_matches_the_closed_forms(t):
    assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-15)
    assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-15)


def test_t_quantile_matches_tables_and_the_normal_limit():
    for df, expected in T_975.items():
        assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-9)
    assert student_t_quantile(0.975, 1e7) == pytest.approx(1.959963985, abs=1e-6)


def test_t_quantile_and_cdf_are_scipys_t_distribution():
    for df in (1, 2, 3, 7, 12.5, 100):
        for p in (0.001, 0.2, 0.55, 0.8, 0.975, 0.999):
            quantile = student_t_quantile(p, df)
            assert quantile == pytest.approx(float(stats.t.ppf(p, df)), rel=1e-12)
            assert student_t_cdf(quantile, df) == pytest.approx(p, rel=1e-12)
            assert type(quantile) is float


@pytest.mark.parametrize("x, a, b", [(0.3, 1.0, 1.0), (0.3, 2.5, 1.0), (0.8, 1.0, 3.0)])
def test_incomplete_beta_matches_closed_forms(x, a, b):
    # I_x(a, 1) = x^a and I_x(1, b) = 1 - (1 - x)^b
    expected = x**a if b == 1.0 else 1.0 - (1.0 - x) ** b
    assert regularized_incomplete_beta(x, a, b) == pytest.approx(expected, rel=1e-12)
    assert (regularized_incomplete_beta(0.0, a, b), regularized_incomplete_beta(1.0, a, b)) == (0.0, 1.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: student_t_quantile(1.0, 3), "p must be in"),
        (lambda: student_t_quantile(0.0, 3), "p must be in"),
        (lambda: student_t_quantile(0.5, 0), "degrees of freedom"),
        (lambda: student_t_cdf(1.0, -1), "degrees of freedom"),
        (lambda: student_t_cdf(math.nan, 3), "t must be a number"),
        (lambda: regularized_incomplete_beta(1.5, 1.0, 1.0), "x must be in"),
        (lambda: summarize([]), "no values"),
    ],
)
def test_out_of_range_arguments_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_summary_by_hand():
    summary = summarize([1.0, 2.0, 3.0, 4.0])
    std = math.sqrt(5 / 3)
    half = T_975[3] * std / 2.0
    assert (summary.n, summary.mean, summary.std) == (4, 2.5, pytest.approx(std))
    assert summary.low == pytest.approx(2.5 - half, abs=1e-8) and summary.high == pytest.approx(2.5 + half, abs=1e-8)
    single = summarize([7.0])
    assert single.mean == 7.0 and single.std is None and single.low is None


def test_summary_level_sets_the_quantile():
    values = [0.1, 0.4, 0.35, 0.2, 0.3]
    for level in (0.9, 0.95, 0.99):
        summary = summarize(values, level)
        assert summary.std is not None
        half = student_t_quantile(0.5 + level / 2, 4) * summary.std / math.sqrt(5)
        assert summary.level == level and summary.high == pytest.approx(summary.mean + half, rel=1e-15)
