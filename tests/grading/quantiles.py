"""The binomial, normal and chi-square quantiles the statistical tests' bounds need, from ``scipy.special``.

``scipy.stats`` gives the same numbers (``binom.ppf`` and ``isf``, ``norm.isf``, ``chi2.isf`` and
``sf``, ``ncx2.sf``), but importing it imports most of scipy (optimisation, interpolation,
spatial, ...): on an idle 2-core machine about 0.9 s of a learner's first check, where
``scipy.special`` takes about a quarter of that. ``tests/course/test_quantiles.py`` compares
these with ``scipy.stats`` over grids.
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType


@cache
def _special() -> ModuleType:
    """``scipy.special``, imported by the first statistical test (the other tests never need scipy)."""
    from scipy import special

    return special


def _check(q: float, n: int, p: float) -> None:
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be a probability strictly between 0 and 1, got {q!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a whole number of draws, 0 or more, got {n!r}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")


def _check_df(df: int) -> None:
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be a whole number of degrees of freedom, 1 or more, got {df!r}")


def _start(q: float, n: int, p: float) -> int:
    """A count near the q-quantile of Binomial(n, p): cdflib's continuous inverse, clipped to [0, n]."""
    guess = float(_special().bdtrik(q, n, p))
    return min(max(math.floor(guess) if math.isfinite(guess) else round(n * p), 0), n)


# A computed tail probability within this (relative) of q counts as equal to it: P(X <= 3) for
# Binomial(7, 1/2) is exactly 1/2 and computes as 0.49999999999999994.
ROUNDING = 1e-12


def binom_ppf(q: float, n: int, p: float) -> int:
    """The smallest count k in [0, n] with P(X <= k) >= q, for X ~ Binomial(n, p) (``scipy.stats.binom.ppf``)."""
    _check(q, n, p)
    at_least = q * (1 - ROUNDING)
    k = _start(q, n, p)
    while k > 0 and _special().bdtr(k - 1, n, p) >= at_least:
        k -= 1
    while k < n and _special().bdtr(k, n, p) < at_least:
        k += 1
    return k


def binom_isf(q: float, n: int, p: float) -> int:
    """The smallest count k in [0, n] with P(X > k) <= q, for X ~ Binomial(n, p) (``scipy.stats.binom.isf``).

    ``bdtrc`` computes P(X > k) directly, so a tail of 1e-9 keeps its precision (1 - cdf would not)."""
    _check(q, n, p)
    at_most = q * (1 + ROUNDING)
    k = _start(1.0 - q, n, p)
    while k > 0 and _special().bdtrc(k - 1, n, p) <= at_most:
        k -= 1
    while k < n and _special().bdtrc(k, n, p) > at_most:
        k += 1
    return k


def norm_isf(q: float) -> float:
    """The z with P(Z > z) = q for a standard normal Z (``scipy.stats.norm.isf``)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be a probability strictly between 0 and 1, got {q!r}")
    return -float(_special().ndtri(q))


def chi2_isf(q: float, df: int) -> float:
    """The x with P(X > x) = q for X ~ chi-square(df) (``scipy.stats.chi2.isf``, the same cdflib routine)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be a probability strictly between 0 and 1, got {q!r}")
    _check_df(df)
    return float(_special().chdtri(df, q))


def ncx2_sf(x: float, df: int, nc: float) -> float:
    """P(X > x) for X ~ noncentral chi-square(df, nc) (``scipy.stats.ncx2.sf``, to 1e-9 relative)."""
    _check_df(df)
    if nc < 0:
        raise ValueError(f"nc must be >= 0, got {nc!r}")
    return 1.0 - float(_special().chndtr(x, df, nc))


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df) (``scipy.stats.chi2.sf``, the same cdflib routine)."""
    _check_df(df)
    return float(_special().chdtrc(df, x))


def chi2_sample_size(threshold: float, df: int, distance: float, power: float) -> int:
    """The sample size of a chi-square test that rejects above ``threshold``: the first n on a grid
    growing 5% a step whose chance of catching a law at chi-square distance ``distance`` (noncentral
    chi-square, noncentrality n * distance) is at least ``power``."""
    if not 0.0 < power < 1.0 or distance <= 0:
        raise ValueError(f"power must be in (0, 1) and distance > 0, got power={power!r}, distance={distance!r}")
    n = 1
    while ncx2_sf(threshold, df, n * distance) < power:
        n = math.ceil(n * 1.05) + 1
    return n
