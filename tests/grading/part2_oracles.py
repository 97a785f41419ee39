"""Part 2's statistical bounds, oracles and helpers, shared by test_part2_sampling.py (the
methods one by one) and test_part2_sample.py (the loop, and the methods end to end).

Random pieces are tested one draw per call against an expected distribution computed
independently in float64; ``assert_draws_follow`` checks support first, then each token's
count against its exact binomial interval (Bonferroni over tokens and both tails), so that a
correct implementation fails a test with probability at most ``ALPHA``.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import torch

from sampling_course.repeat import repeat

from quantiles import binom_isf, binom_ppf, norm_isf
from sequential import assert_counts_within, assert_follows_sequentially, assert_in_support, counts_of

ALPHA = 1e-6  # the false-failure probability of every statistical test of part 2
BETA = 1e-6  # the probability that a frequency test misses a token whose probability is off by its delta


def draws_needed(delta: float = 0.07, alpha: float = ALPHA, beta: float = BETA, n_tokens: int = 10) -> int:
    """How many draws a frequency test needs, derived from its bounds rather than picked.

    Each token's count is accepted within its binomial interval at level alpha / (2 n_tokens).
    With n draws (normal approximation, worst case p = 1/2), a token whose probability is off
    by ``delta`` or more falls outside its interval with probability >= 1 - beta when
    n >= ((z_alpha + z_beta) / 2 / delta)^2. Every classic mistake shifts some token's
    probability by more than 0.07 on the logits below, so it is caught almost surely.
    """
    z_alpha, z_beta = norm_isf(alpha / (2 * n_tokens)), norm_isf(beta)
    return int(((z_alpha + z_beta) / 2 / delta) ** 2) + 1


@cache
def n_draws(delta: float = 0.07) -> int:
    """The draws of a frequency test: ``draws_needed(delta)``, about 5,200 for the default
    (one call per draw); tests whose mistakes move more probability pass a larger ``delta``."""
    return draws_needed(delta)


# Every classic top-p mistake changes which tokens are kept, and on at least one setting of
# each top-p test below that moves 0.15 or more of probability (an exclusive cutoff at
# top_p = 0.79 drops a token of probability .375; ignoring min_tokens_to_keep = 3 at 0.3
# drops .457; sorting ascending or returning the rank puts mass on tokens never allowed).
# So these tests are sized for delta = 0.15: about 1,100 draws instead of 5,200.
NUCLEUS_DELTA = 0.15


# Hand-made logits over a 10-token vocabulary, deliberately unsorted so that an index
# into the sorted order (a forgotten gather) shows up as a wrong token.
# softmax: ~[.064 .014 .349 .116 .032 .212 .004 .047 .142 .021]
LOGITS = torch.tensor([0.3, -1.2, 2.0, 0.9, -0.4, 1.5, -2.5, 0.0, 1.1, -0.8])
# The same values in other positions, for a second group of rows in one batch.
LOGITS_2 = LOGITS[torch.tensor([7, 2, 9, 5, 0, 1, 8, 3, 6, 4])]

# Probabilities chosen for the nucleus: sorted .5, .3, .12, .05, .03 (cumulative .5, .8,
# .92, .97, 1.0), placed out of order.
NUCLEUS_PROBS = torch.tensor([0.05, 0.5, 0.03, 0.3, 0.12], dtype=torch.float64)
NUCLEUS_LOGITS = NUCLEUS_PROBS.log().float()


def softmax64(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), dim=-1)


def top_k_probs(probs: torch.Tensor, k: int) -> torch.Tensor:
    """The distribution renormalised over the k most likely tokens (no tie at the k-th)."""
    values = probs.sort(descending=True).values
    assert k == len(values) or values[k - 1] > values[k], "oracle: tie at the k-th value"
    kept = probs >= values[k - 1]
    return torch.where(kept, probs, 0.0) / probs[kept].sum()


def top_p_probs(probs: torch.Tensor, top_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """The nucleus, written out: keep tokens in order while the mass above them is < top_p."""
    kept: list[int] = []
    mass_above = 0.0
    for token in probs.argsort(descending=True).tolist():
        if mass_above >= top_p and len(kept) >= min_tokens_to_keep:
            break
        kept.append(token)
        mass_above += probs[token].item()
    out = torch.zeros_like(probs)
    out[kept] = probs[kept] / probs[kept].sum()
    return out


def counts_of(input_ids: list[int], d_vocab: int) -> torch.Tensor:
    """How often each token id occurs, counted with a plain Counter."""
    counts = torch.zeros(d_vocab, dtype=torch.float64)
    for token, count in Counter(input_ids).items():
        counts[token] = count
    return counts


def as_token(value, what: str = "the method") -> int:
    """A returned token id as an int: a Python int, or a 0-d integer tensor."""
    if isinstance(value, torch.Tensor):
        assert value.ndim == 0 and not value.dtype.is_floating_point, (
            f"{what} must return one token id (an int), got a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
        )
        return int(value)
    assert isinstance(value, int) and not isinstance(value, bool), (
        f"{what} must return one token id as an int, got {type(value).__name__}"
    )
    return value


def assert_left_alone(given: torch.Tensor, original: torch.Tensor, name: str) -> None:
    """``given`` (the tensor handed to ``name``) still equals ``original``: nothing was written into it.

    A caller keeps using its logits after a filter or penalty (part 5 reports their
    log-probabilities), so a method that writes -inf or a penalty into its argument
    corrupts them. Hugging Face's tests check the same of every logits processor.
    """
    assert torch.equal(given, original), (
        f"{name} changed the tensor it was given (in place); work on a copy, or use out-of-place "
        f"operations (masked_fill, not masked_fill_ or logits[...] = ...)"
    )


def draws_of(method, logits: torch.Tensor, n: int, *args, before: tuple = (), **kwargs) -> torch.Tensor:
    """``n`` calls ``method(*before, logits, *args, **kwargs)`` on one copy of one position's logits: a (n,)
    tensor of token ids. The calls are one ``repeat``, so that a submission graded in another process
    makes them there, in one request.

    The copy must be left as it was (``assert_left_alone``).
    """
    name = getattr(method, "__name__", "the method")
    given = logits.clone()
    draws = torch.tensor([as_token(token, name) for token in repeat(method, n, *before, given, *args, **kwargs)])
    assert_left_alone(given, logits, name)
    return draws


def assert_draws_follow(draws: torch.Tensor, expected: torch.Tensor, what: str, alpha: float = ALPHA) -> None:
    """Support first, then frequencies against exact binomial bounds.

    Support: a token whose expected probability is 0 must never be drawn. Frequencies:
    each supported token's count lies in [ppf(q), isf(q)] of Binomial(n, p) with
    q = alpha / (2 * number of supported tokens), so a correct sampler fails with
    probability at most alpha (Bonferroni over tokens and both tails).
    """
    n = draws.numel()
    observed = counts_of(draws, expected.shape[-1], what)
    support = (expected > 0).nonzero().flatten().tolist()
    assert_in_support(observed, support, what)
    q = alpha / (2 * len(support))
    probs = expected.tolist()
    bounds = [(binom_ppf(q, n, probs[t]), binom_isf(q, n, probs[t])) for t in support]
    assert_counts_within(observed, probs, n, support, bounds, what)


def assert_sampler_follows(method, logits: torch.Tensor, expected: torch.Tensor, what: str, *args,
                           delta: float = 0.07, before: tuple = (), **kwargs) -> int:
    """Calls of ``method`` (as in ``draws_of``) follow ``expected``: ``assert_draws_follow``'s rule,
    drawn in stages that stop once the verdict is certain (sequential.py); returns the calls made.

    Same false-failure probability (``ALPHA``), and a token whose probability is off by ``delta``
    or more is missed with probability at most ``BETA``, exactly: at most ``draws_needed(delta)``
    calls or so, and about 0.4 of that for a correct sampler.
    """
    def draw(n: int) -> torch.Tensor:
        return draws_of(method, logits, n, *args, before=before, **kwargs)

    return assert_follows_sequentially(draw, expected, what, delta, ALPHA, BETA)


# ---------------------------------------------------------------------------------------
# An oracle from Hugging Face's logits processors (test_oracles_agree_with_hugging_face checks the others)
# ---------------------------------------------------------------------------------------


def hf_processor(name: str, settings: dict, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's logits processor ``name`` (e.g. "TopKLogitsWarper"), built with ``settings``."""
    import transformers

    return getattr(transformers, name)(**settings)(input_ids, scores.clone())


# ---------------------------------------------------------------------------------------
# sample_next_token's expected distribution: the whole pipeline for one position, in float64
# ---------------------------------------------------------------------------------------


def pipeline_probs(logits, input_ids, temperature=1.0, top_k=0, top_p=0.0, frequency_penalty=0.0):
    """temperature, then frequency penalty, then top-k or top-p: the expected distribution."""
    z = logits.double() / temperature - frequency_penalty * counts_of(input_ids, len(logits))
    probs = softmax64(z)
    if top_k:
        return top_k_probs(probs, top_k)
    if top_p:
        return top_p_probs(probs, top_p)
    return probs
