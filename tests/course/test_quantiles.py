"""The statistical tests' quantiles (``tests/grading/quantiles.py``) against ``scipy.stats`` over grids."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
from quantiles import binom_isf, binom_ppf, chi2_isf, chi2_sample_size, chi2_sf, ncx2_sf, norm_isf  # noqa: E402

QS = [1e-12, 1e-9, 3.1e-8, 1e-6, 0.0025, 0.05, 0.5, 0.95, 0.9999]
NS = [0, 1, 2, 7, 50, 1_100, 5_200, 40_000]
PS = [0.0, 1e-4, 0.008, 0.03, 0.12, 0.5, 0.8, 0.99995, 1.0]


@pytest.mark.parametrize("n", NS)
def test_binomial_quantiles_are_scipy_stats_ones(n):
    for q, p in itertools.product(QS, PS):
        assert binom_ppf(q, n, p) == stats.binom.ppf(q, n, p), (q, n, p)
        assert binom_isf(q, n, p) == stats.binom.isf(q, n, p), (q, n, p)


def test_the_normal_tail_quantile_is_scipy_stats_one():
    for q in QS:
        assert norm_isf(q) == pytest.approx(stats.norm.isf(q), rel=1e-12, abs=1e-12)


def test_chi_square_quantiles_are_scipy_stats_ones():
    for q, df in itertools.product([1e-7, 1e-6, 0.05, 0.5], range(1, 121)):
        assert chi2_isf(q, df) == stats.chi2.isf(q, df), (q, df)
        assert chi2_sf(q * df * 10, df) == stats.chi2.sf(q * df * 10, df), (q, df)
    for x, df, nc in itertools.product([0.5, 7.0, 40.0, 150.0], [1, 3, 12, 60], [0.0, 0.3, 10.0, 400.0]):
        assert ncx2_sf(x, df, nc) == pytest.approx(stats.ncx2.sf(x, df, nc), rel=1e-9, abs=1e-12), (x, df, nc)


@pytest.mark.slow
def test_parts_7_and_8_sample_sizes_are_the_ones_scipy_stats_gives():
    """The search both parts run (the smallest n whose power reaches 0.999 at distance 0.1) ends at the same n."""
    def scipy_stats_sample_size(df):
        threshold, n = stats.chi2.isf(1e-7, df), 1
        while stats.ncx2.sf(threshold, df, n * 0.1) < 0.999:
            n = math.ceil(n * 1.05) + 1
        return n

    for df in range(1, 121):
        assert chi2_sample_size(chi2_isf(1e-7, df), df, 0.1, 0.999) == scipy_stats_sample_size(df), df


@pytest.mark.parametrize("call, message", [
    (lambda: binom_ppf(0.0, 10, 0.5), "q must be"),
    (lambda: binom_isf(1.0, 10, 0.5), "q must be"),
    (lambda: binom_ppf(0.5, -1, 0.5), "n must be"),
    (lambda: binom_ppf(0.5, 2.5, 0.5), "n must be"),
    (lambda: binom_isf(0.5, 10, 1.5), "p must be"),
    (lambda: norm_isf(0.0), "q must be"),
    (lambda: chi2_isf(0.5, 0), "df must be"),
    (lambda: chi2_sf(1.0, 0), "df must be"),
    (lambda: chi2_sample_size(10.0, 3, 0.1, 1.0), "power must be"),
    (lambda: ncx2_sf(1.0, 2, -1.0), "nc must be"),
])
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
