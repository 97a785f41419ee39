"""The staged frequency test (``tests/grading/sequential.py``): its bounds checked with ``scipy.stats``,
its verdicts on samplers that are right and wrong."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
from sequential import LOOKS, assert_follows_sequentially, plan  # noqa: E402

ALPHA = BETA = 1e-6
# Distributions of part 2's tests: one token; two near 1/2; a skewed nucleus; a 10-token softmax.
CASES = [
    ((0.0, 1.0, 0.0), 0.15),
    ((0.0, 0.625, 0.0, 0.375, 0.0), 0.15),
    ((0.0, 0.5435, 0.0, 0.3261, 0.1304), 0.15),
    ((0.064, 0.014, 0.349, 0.116, 0.032, 0.212, 0.004, 0.047, 0.142, 0.020), 0.07),
]


@pytest.mark.parametrize("expected, delta", CASES)
def test_the_plan_keeps_its_bounds(expected, delta):
    """The last look is the fixed-size test (false failure <= alpha); every look accepts a token
    off by delta with probability <= beta / (looks), all of them together <= beta."""
    steps = plan(expected, delta, ALPHA, BETA)
    support = [t for t, p in enumerate(expected) if p > 0]
    assert list(steps.support) == support
    assert list(steps.looks) == sorted(set(steps.looks)) and len(steps.looks) <= len(LOOKS) + 1
    n_final = steps.looks[-1]
    q = ALPHA / (2 * len(support))
    for t, (low, high) in zip(support, steps.accepted[-1]):
        assert (low, high) == (stats.binom.ppf(q, n_final, expected[t]), stats.binom.isf(q, n_final, expected[t]))
    beta_each = BETA / (len(LOOKS) + 1)
    for n, accepted in zip(steps.looks, steps.accepted):
        for t, (low, high) in zip(support, accepted):
            p = expected[t]
            if p + delta <= 1:  # a token delta likelier lands at or below `high` rarely
                assert stats.binom.cdf(high, n, p + delta) <= beta_each * (1 + 1e-9), (n, t)
            if p - delta >= 0:  # ... and one delta less likely at or above `low`
                assert stats.binom.sf(low - 1, n, p - delta) <= beta_each * (1 + 1e-9), (n, t)
    # A token that should never appear, with probability delta, shows before the first look.
    assert (1 - delta) ** steps.looks[0] <= beta_each


def test_the_plan_is_no_larger_than_the_normal_bound():
    """N, searched exactly for the distribution's own probabilities, stays near or below the
    worst-case normal bound ((z_alpha + z_beta) / 2 / delta)^2 with z_beta shared over the looks."""
    for expected, delta in CASES:
        m = sum(p > 0 for p in expected)
        z = stats.norm.isf(ALPHA / (2 * m)) + stats.norm.isf(BETA / (len(LOOKS) + 1))
        assert plan(expected, delta, ALPHA, BETA).looks[-1] <= 1.05 * (z / 2 / delta) ** 2 + 10


def _sampler(probs, seed):
    generator = torch.Generator().manual_seed(seed)
    probs = torch.tensor(probs, dtype=torch.float64)
    return lambda n: torch.multinomial(probs, n, replacement=True, generator=generator)


@pytest.mark.parametrize("expected, delta", CASES)
def test_a_right_sampler_passes_early(expected, delta):
    steps = plan(expected, delta, ALPHA, BETA)
    made = [assert_follows_sequentially(_sampler(expected, seed), torch.tensor(expected), "right", delta, ALPHA, BETA)
            for seed in range(20)]
    assert all(n in steps.looks for n in made)
    if len(steps.looks) > 1:
        assert sum(made) / len(made) < 0.6 * steps.looks[-1], made


def test_a_token_off_by_delta_fails_at_the_last_look():
    expected = (0.0, 0.625, 0.0, 0.375, 0.0)
    wrong = (0.0, 0.475, 0.0, 0.525, 0.0)  # token 1 less likely by 0.15
    with pytest.raises(AssertionError, match=r"frequencies differ(.|\n)*token 1: frequency 0\.4"):
        assert_follows_sequentially(_sampler(wrong, 0), torch.tensor(expected), "wrong", 0.15, ALPHA, BETA)


def test_a_token_outside_the_support_fails_at_once():
    expected = (0.0, 0.625, 0.0, 0.375, 0.0)
    wrong = (0.0, 0.6, 0.0, 0.3, 0.1)
    asked: list[int] = []

    def draw(n):
        asked.append(n)
        return _sampler(wrong, 1)(n)

    with pytest.raises(AssertionError, match=r"must never appear \(token: count\) \{4: "):
        assert_follows_sequentially(draw, torch.tensor(expected), "wrong", 0.15, ALPHA, BETA)
    assert len(asked) == 1


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="must lie in"):
        plan((0.5, 0.5), 0.0, ALPHA, BETA)
    assert math.isfinite(plan((0.5, 0.5), 0.2, ALPHA, BETA).looks[-1])
