"""A frequency test that stops drawing once its verdict is certain: group-sequential binomial bounds.

A fixed-size frequency test (``assert_draws_follow`` in part2_oracles.py) draws N times and
accepts when every supported token's count lies in its binomial interval at level
q = alpha / (2 m), m supported tokens. N must be large enough to catch a token whose
probability is off by ``delta``, and a correct sampler pays for all N draws.

This test draws the same N at most, in stages ("looks" at n_1 < n_2 < ... < N draws):

* **Support**, at every look: a token whose expected probability is 0 fails the test as
  soon as it has been drawn.
* **Early acceptance**, at each look before the last: the test passes when every supported
  token's count lies where a token whose probability is off by ``delta`` would put it with
  probability at most beta_j (one-sided binomial tails of p - delta and p + delta).
* **Final verdict**, at N: the fixed-size test's own rule, each count in
  [binom_ppf(q, N, p), binom_isf(q, N, p)].

Guarantees, exact (binomial tails, no normal approximation):

* False failure: the test fails only at the last look, on the fixed-size test's rejection
  event, so a correct sampler fails with probability at most ``alpha``, as before.
* Power: the betas of the looks add up to ``beta``, so a token whose probability is off by
  ``delta`` or more passes (early or at N) with probability at most ``beta``; a token that
  should never appear and has probability ``delta`` or more is drawn before the first look
  except with probability (1 - delta)^n_1 <= ``beta``.

N is the smallest size (searched exactly, for this distribution's own probabilities rather
than the worst case p = 1/2) whose final intervals keep their share of the power; the
looks sit at fixed fractions of it. A correct sampler usually stops at about 0.4 of N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch

from quantiles import binom_isf, binom_ppf

# The looks before the last, as fractions of N. A correct sampler passes at the first look
# where delta * sqrt(n) / sigma exceeds z(beta_j) plus the largest of its m tokens' standard
# normal deviations: on part 2's distributions mostly at 0.33-0.43 of N (simulated: about
# 0.38 of N on average), so the looks are closest there; each look costs power (beta is
# shared between them), so there are few.
LOOKS = (0.33, 0.38, 0.43, 0.5, 0.6)


@dataclass(frozen=True)
class Plan:
    """The looks (draw counts, the last is N) and, per look, each supported token's accepted counts."""

    support: tuple[int, ...]
    looks: tuple[int, ...]
    accepted: tuple[tuple[tuple[int, int], ...], ...]  # [look][token of support] -> (lowest, highest)


def _off_by_delta_accepted(n: int, p: float, delta: float, beta: float) -> tuple[int, int]:
    """The counts of n draws where a token of probability p - delta and one of p + delta each land
    with probability at most ``beta``: (lowest, highest), empty when lowest > highest."""
    # Largest count that p + delta reaches with probability <= beta: below its beta-quantile.
    highest = binom_ppf(beta, n, p + delta) - 1 if p + delta <= 1 else n
    # Smallest count that p - delta reaches (or exceeds) with probability <= beta.
    lowest = binom_isf(beta, n, p - delta) + 1 if p - delta >= 0 else 0
    return lowest, highest


def _final_keeps_power(n: int, probs: tuple[float, ...], q: float, delta: float, beta: float) -> bool:
    """Whether the fixed-size intervals at n draws are inside the off-by-delta acceptance counts."""
    for p in probs:
        lowest, highest = _off_by_delta_accepted(n, p, delta, beta)
        if binom_ppf(q, n, p) < lowest or binom_isf(q, n, p) > highest:
            return False
    return True


@cache
def plan(expected: tuple[float, ...], delta: float, alpha: float, beta: float) -> Plan:
    """The looks and accepted counts for draws expected to follow ``expected`` (probabilities by token id)."""
    if not 0 < delta < 1 or not 0 < alpha < 1 or not 0 < beta < 1:
        raise ValueError(f"delta, alpha and beta must lie in (0, 1), got {delta!r}, {alpha!r}, {beta!r}")
    support = tuple(t for t, p in enumerate(expected) if p > 0)
    probs = tuple(expected[t] for t in support)
    q = alpha / (2 * len(support))
    beta_each = beta / (len(LOOKS) + 1)
    # The smallest N whose final intervals keep their power, by bisection between a size that
    # surely does not (1) and one that does (doubling). Power is not monotone in N to the draw
    # (the counts are whole numbers), so the N found is checked, not assumed.
    high = 64
    while not _final_keeps_power(high, probs, q, delta, beta_each):
        high *= 2
    low = 1
    while high - low > 1:
        middle = (low + high) // 2
        if _final_keeps_power(middle, probs, q, delta, beta_each):
            high = middle
        else:
            low = middle
    n_final = high
    # An unexpected token of probability delta is drawn before the first look, except with probability <= beta_each.
    first = math.ceil(math.log(beta_each) / math.log1p(-delta))
    looks = sorted({max(first, math.ceil(f * n_final)) for f in LOOKS if max(first, math.ceil(f * n_final)) < n_final})
    accepted = tuple(tuple(_off_by_delta_accepted(n, p, delta, beta_each) for p in probs) for n in looks)
    final = tuple((binom_ppf(q, n_final, p), binom_isf(q, n_final, p)) for p in probs)
    return Plan(support, (*looks, n_final), (*accepted, final))


def counts_of(draws: torch.Tensor, d_vocab: int, what: str) -> list[int]:
    """How often each token id in [0, d_vocab) was drawn; an id outside that range fails."""
    draws = draws.flatten()
    assert draws.numel() == 0 or (draws.min() >= 0 and draws.max() < d_vocab), (
        f"{what}: token ids outside [0, {d_vocab})")
    return torch.bincount(draws, minlength=d_vocab).tolist()


def assert_in_support(observed: list[int], support: tuple[int, ...] | list[int], what: str) -> None:
    """No token outside ``support`` was drawn (``observed``: counts by token id)."""
    outside = {t: c for t, c in enumerate(observed) if c > 0 and t not in support}
    assert not outside, (
        f"{what}: drew tokens that must never appear (token: count) {outside}; allowed tokens {list(support)}"
    )


def assert_counts_within(observed: list[int], expected: list[float], n: int, support, bounds, what: str) -> None:
    """The fixed-size verdict: each supported token's count of ``n`` draws lies in its (lowest, highest) of ``bounds``."""
    problems = [
        f"token {t}: frequency {observed[t] / n:.4f}, expected {expected[t]:.4f} "
        f"(acceptable count range [{low}, {high}] of {n})"
        for t, (low, high) in zip(support, bounds) if not low <= observed[t] <= high
    ]
    assert not problems, f"{what}: frequencies differ from the expected distribution\n" + "\n".join(problems)


def assert_follows_sequentially(draw, expected: torch.Tensor, what: str, delta: float, alpha: float,
                                beta: float) -> int:
    """Draw in stages with ``draw(k)`` (a (k,) tensor of token ids) until the verdict is certain; return the draws made.

    Fails (AssertionError) on a token outside the support at once, and at N on a count outside
    the fixed-size test's interval, with the same message as ``assert_draws_follow``.
    """
    probs = expected.double().tolist()
    steps = plan(tuple(probs), delta, alpha, beta)
    observed = [0] * len(probs)
    made = 0
    for look, accepted in zip(steps.looks, steps.accepted):
        new = counts_of(draw(look - made), len(probs), what)
        made = look
        observed = [a + b for a, b in zip(observed, new)]
        assert_in_support(observed, steps.support, what)
        if all(low <= observed[t] <= high for t, (low, high) in zip(steps.support, accepted)):
            return made
    assert_counts_within(observed, probs, made, steps.support, steps.accepted[-1], what)
    raise AssertionError(f"{what}: the last look's bounds are the fixed-size test's, so it cannot pass early there")
