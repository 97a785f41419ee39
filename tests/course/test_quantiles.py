"""The frequency tests' quantiles (``tests/grading/quantiles.py``) against ``scipy.stats`` over a grid."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
from quantiles import binom_isf, binom_ppf, norm_isf  # noqa: E402

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


@pytest.mark.parametrize("call, message", [
    (lambda: binom_ppf(0.0, 10, 0.5), "q must be"),
    (lambda: binom_isf(1.0, 10, 0.5), "q must be"),
    (lambda: binom_ppf(0.5, -1, 0.5), "n must be"),
    (lambda: binom_ppf(0.5, 2.5, 0.5), "n must be"),
    (lambda: binom_isf(0.5, 10, 1.5), "p must be"),
    (lambda: norm_isf(0.0), "q must be"),
])
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
