"""Student-t quantiles and confidence intervals (evaluation/stats.py), against published values."""

import math
import statistics

import pytest

from evaluation.stats import Estimate, clearly_different, mean_ci, t_critical

# t_{0.975, df} from standard tables (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2), and the normal 1.95996.
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    29: 2.045,
    30: 2.042,
    60: 2.000,
    100: 1.984,
}


@pytest.mark.parametrize("df, expected", T_975.items())
def test_t_critical_matches_the_tables(df, expected):
    assert t_critical(df) == pytest.approx(expected, abs=6e-4)


def test_t_critical_at_other_levels_and_towards_the_normal():
    assert t_critical(1, 0.5) == pytest.approx(1.0, abs=1e-12)  # Cauchy: P(|T| < 1) = 1/2
    assert t_critical(2, 0.90) == pytest.approx(2.920, abs=6e-4)
    assert t_critical(10, 0.99) == pytest.approx(3.169, abs=6e-4)
    assert t_critical(5000) == pytest.approx(1.95996, abs=1e-3)
    assert t_critical(5000) > t_critical(100000) > 1.959963


def test_t_critical_has_the_closed_forms_of_one_and_two_degrees_of_freedom():
    """df=1 (Cauchy): P(|T| < t) = (2/pi) atan(t); df=2: P(|T| < t) = t / sqrt(2 + t^2). Inverted at 95%."""
    assert t_critical(1) == pytest.approx(math.tan(0.95 * math.pi / 2), rel=1e-12)
    assert t_critical(2) == pytest.approx(math.sqrt(2 * 0.95**2 / (1 - 0.95**2)), rel=1e-12)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_critical(0)


def test_mean_ci_on_known_data():
    values = [20.1, 21.3, 19.8, 20.6]  # mean 20.45, sample sd 0.6557
    estimate = mean_ci(values)
    assert estimate.n == 4 and estimate.mean == pytest.approx(20.45)
    half = 3.182446 * statistics.stdev(values) / 2
    assert estimate.half_width == pytest.approx(half, rel=1e-6) and estimate.half_width == pytest.approx(
        1.0434, abs=1e-4
    )
    assert (estimate.low, estimate.high) == pytest.approx((20.45 - half, 20.45 + half))


def test_one_value_has_no_interval_and_none_is_an_error():
    assert mean_ci([25.9]) == Estimate(25.9, None, 1)
    with pytest.raises(ValueError):
        mean_ci([])


def test_clearly_different_means_intervals_that_do_not_overlap():
    assert clearly_different(Estimate(10, 1, 3), Estimate(12.5, 1, 3))
    assert not clearly_different(Estimate(10, 1, 3), Estimate(11.5, 1, 3))
    assert not clearly_different(Estimate(10, None, 1), Estimate(50, 1, 3))  # no interval: no claim
