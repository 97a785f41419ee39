"""Part 2: TransformerSampler, its decoding methods one by one and the sampling loop.

How the tests judge:

* Deterministic pieces (greedy, temperature, frequency penalty) are compared exactly with
  an oracle computed here: ``argmax``, Hugging Face's logits processors, a ``Counter`` loop.
* Every method takes one position's logits, shape ``(d_vocab,)``, and returns one token
  id: a Python ``int`` (a 0-d integer tensor is accepted too).
* Random pieces are tested statistically on hand-made logits, one draw per call. The expected distribution
  is computed independently in float64 (softmax, then an explicit top-k / nucleus in plain
  Python). **Support** (which tokens may ever appear) is checked separately from
  **frequencies**: a token outside the expected support is a failure as soon as it is
  drawn once; each in-support token's count must lie in its exact binomial acceptance
  interval, with a Bonferroni correction over tokens and both tails, so that a correct
  implementation fails a test with probability at most ``ALPHA`` = 1e-6.
* The loop ``sample`` is compared token for token with Hugging Face ``generate`` on the
  same weights (greedy), with a replay of your own ``sample_next_token`` under the same
  seed (seeded sampling: any correct way of drawing passes), and with small fake models
  that make EOS, the token budget and the n_ctx window observable. The solutions are
  also checked against Hugging Face's seeded sampling, draw for draw.

Every statistical test takes the ``seed`` fixture and seeds torch with it. The seed comes
from the environment variable ``SAMPLING_COURSE_TEST_SEED``: one non-negative integer
(default 0), an inclusive range such as ``1-200`` or a list such as ``1,5,9-12``; several
seeds run each statistical test once per seed (``scripts/stress_statistical.py`` does that).
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
import torch

from sampling_course.beside import made_apart, made_beside
from sampling_course.counted_model import ForceEOSAfter
from sampling_course.repeat import repeat

from doubles import NeverEOSModel, counted
from quantiles import binom_isf, binom_ppf, norm_isf

ALPHA = 1e-6  # the false-failure probability of every statistical test below


def draws_needed(delta: float = 0.07, alpha: float = ALPHA, beta: float = 1e-6, n_tokens: int = 10) -> int:
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


# ---------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def Sampler(impl):
    """The TransformerSampler class under test (its static methods need no model)."""
    return impl.sampling.TransformerSampler


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
    d_vocab = expected.shape[-1]
    assert draws.min() >= 0 and draws.max() < d_vocab, f"{what}: token ids outside [0, {d_vocab})"
    observed = torch.bincount(draws.flatten(), minlength=d_vocab)
    support = (expected > 0).nonzero().flatten().tolist()
    outside = {t: int(observed[t]) for t in range(d_vocab) if observed[t] > 0 and t not in support}
    assert not outside, (
        f"{what}: drew tokens that must never appear (token: count) {outside}; allowed tokens {support}"
    )
    q = alpha / (2 * len(support))
    problems = []
    for token in support:
        p = expected[token].item()
        low, high = binom_ppf(q, n, p), binom_isf(q, n, p)
        if not low <= observed[token] <= high:
            problems.append(
                f"token {token}: frequency {observed[token].item() / n:.4f}, expected {p:.4f} "
                f"(acceptable count range [{low:.0f}, {high:.0f}] of {n})"
            )
    assert not problems, f"{what}: frequencies differ from the expected distribution\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------
# The oracles used below agree with Hugging Face's logits processors
# ---------------------------------------------------------------------------------------


def hf_processor(name: str, settings: dict, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's logits processor ``name`` (e.g. "TopKLogitsWarper"), built with ``settings``."""
    import transformers

    return getattr(transformers, name)(**settings)(input_ids, scores.clone())


def test_oracles_agree_with_hugging_face(oracle):
    """This file's top-k and nucleus oracles keep the same tokens as HF's TopK/TopP warpers."""
    ids = torch.zeros(1, 1, dtype=torch.long)
    for logits in (LOGITS, LOGITS_2, NUCLEUS_LOGITS):
        probs = softmax64(logits)
        for k in (1, 3, 5):
            hf = oracle(hf_processor, "TopKLogitsWarper", dict(top_k=k), ids, logits[None])[0]
            assert torch.equal(top_k_probs(probs, k) > 0, hf > float("-inf")), k
        for top_p, keep in ((0.3, 1), (0.5, 1), (0.79, 1), (0.81, 1), (0.96, 1), (0.3, 3), (1.0, 1)):
            hf = oracle(hf_processor, "TopPLogitsWarper", dict(top_p=top_p, min_tokens_to_keep=keep), ids, logits[None])[0]
            assert torch.equal(top_p_probs(probs, top_p, keep) > 0, hf > float("-inf")), (top_p, keep)


# ---------------------------------------------------------------------------------------
# greedy_search
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("greedy_search")
def test_greedy_search_is_argmax(Sampler):
    """greedy_search returns the id of the largest logit, as an int."""
    generator = torch.Generator().manual_seed(0)
    for row in torch.randn(20, 50, generator=generator):
        assert as_token(Sampler.greedy_search(row.clone()), "greedy_search") == int(row.argmax())
    assert as_token(Sampler.greedy_search(LOGITS.clone()), "greedy_search") == 2


@pytest.mark.exercise("greedy_search")
def test_greedy_search_takes_the_first_of_tied_tokens(Sampler):
    """Among several maximal logits, the lowest token id wins (as torch.argmax and HF do)."""
    logits = torch.tensor([0.0, 3.0, 1.0, 3.0, 3.0])
    assert as_token(Sampler.greedy_search(logits), "greedy_search") == 1


# ---------------------------------------------------------------------------------------
# apply_temperature
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("apply_temperature")
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0, 0.01])
def test_apply_temperature_matches_hf(Sampler, oracle, temperature):
    """apply_temperature divides the logits by the temperature, like HF's TemperatureLogitsWarper."""
    for logits in (LOGITS, LOGITS_2):
        expected = oracle(hf_processor, "TemperatureLogitsWarper", dict(temperature=temperature),
                          torch.zeros(1, 1, dtype=torch.long), logits[None])[0]
        given = logits.clone()
        actual = Sampler.apply_temperature(given, temperature)
        assert_left_alone(given, logits, "apply_temperature")
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(actual, logits / temperature)


@pytest.mark.exercise("apply_temperature")
def test_apply_temperature_sharpens_below_one_and_flattens_above(Sampler):
    """Temperature 0.5 lowers the entropy of softmax(logits), temperature 2 raises it."""

    def entropy(logits):
        probs = softmax64(logits)
        return -(probs * probs.log()).sum().item()

    base = entropy(LOGITS)
    assert entropy(Sampler.apply_temperature(LOGITS.clone(), 0.5)) < base - 0.1
    assert entropy(Sampler.apply_temperature(LOGITS.clone(), 2.0)) > base + 0.1


# ---------------------------------------------------------------------------------------
# apply_frequency_penalty
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("apply_frequency_penalty")
@pytest.mark.parametrize("penalty", [0.7, 2.0, -0.3])
def test_frequency_penalty_is_per_occurrence(Sampler, penalty):
    """Each token loses penalty x (its number of occurrences): a token seen 3 times loses 3 x penalty."""
    input_ids = [4, 7, 4, 1, 4, 7, 9]  # 4 three times, 7 twice, 1 and 9 once
    logits = torch.linspace(-2, 2, 12)
    expected = logits.double() - penalty * counts_of(input_ids, 12)
    given = logits.clone()
    actual = Sampler.apply_frequency_penalty(torch.tensor(input_ids), given, penalty)
    assert_left_alone(given, logits, "apply_frequency_penalty")
    torch.testing.assert_close(actual.double(), expected, atol=1e-5, rtol=1e-5)
    assert actual[4].item() == pytest.approx(logits[4].item() - 3 * penalty, abs=1e-5)


@pytest.mark.exercise("apply_frequency_penalty")
def test_frequency_penalty_on_a_real_vocabulary(Sampler, tiny):
    """On the stand-in's vocabulary, with many repeats, every token loses penalty x its count."""
    generator = torch.Generator().manual_seed(1)
    d_vocab = tiny.cfg.d_vocab
    input_ids = torch.randint(0, 40, (60,), generator=generator)  # plenty of repeats
    logits = torch.randn(d_vocab, generator=generator)
    expected = logits.double() - 0.5 * counts_of(input_ids.tolist(), d_vocab)
    given = logits.clone()
    actual = Sampler.apply_frequency_penalty(input_ids, given, 0.5)
    assert_left_alone(given, logits, "apply_frequency_penalty")
    assert actual.shape == logits.shape
    torch.testing.assert_close(actual.double(), expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# sample_basic
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("sample_basic")
def test_sample_basic_frequencies_match_softmax(Sampler, seed):
    """Draws follow softmax(logits), not the argmax; a -inf logit is never drawn.

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    logits = LOGITS.clone()
    logits[6] = float("-inf")
    draws = draws_of(Sampler.sample_basic, logits, n_draws())
    assert_draws_follow(draws, softmax64(logits), "sample_basic")


def _one_hot_logits(token: int, d_vocab: int) -> torch.Tensor:
    """Logits that allow exactly one token: 0 there, -inf elsewhere."""
    logits = torch.full((d_vocab,), float("-inf"))
    logits[token] = 0.0
    return logits


@pytest.mark.parametrize(
    "method, args",
    [
        pytest.param("greedy_search", (), marks=pytest.mark.exercise("greedy_search"), id="greedy_search"),
        pytest.param("sample_basic", (), marks=pytest.mark.exercise("sample_basic"), id="sample_basic"),
        pytest.param("sample_top_k", (3,), marks=pytest.mark.exercise("sample_top_k"), id="sample_top_k"),
        pytest.param("sample_top_p", (0.9,), marks=pytest.mark.exercise("sample_top_p"), id="sample_top_p"),
    ],
)
def test_methods_return_the_token_id(Sampler, method, args):
    """Logits that allow a single token give that token's id, as an int, wherever it sits."""
    for token in (5, 0, 17, 19):
        drawn = as_token(getattr(Sampler, method)(_one_hot_logits(token, 20), *args), method)
        assert drawn == token, f"{method}: drew {drawn}, the only possible token is {token}"


# ---------------------------------------------------------------------------------------
# sample_top_k
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("sample_top_k")
@pytest.mark.parametrize("k", [3, 5, 10])
def test_sample_top_k_support_and_frequencies(Sampler, k, seed):
    """Only the k most likely tokens appear, with their softmax renormalised over the k.

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    draws = draws_of(Sampler.sample_top_k, LOGITS_2, n_draws(), k)
    assert_draws_follow(draws, top_k_probs(softmax64(LOGITS_2), k), f"top-{k}")


@pytest.mark.exercise("sample_top_k")
def test_sample_top_k_of_one_is_greedy(Sampler):
    """With k = 1 the draw is always the argmax."""
    for row in torch.randn(200, 50, generator=torch.Generator().manual_seed(2)):
        assert as_token(Sampler.sample_top_k(row.clone(), 1), "sample_top_k") == int(row.argmax())


@pytest.mark.exercise("sample_top_k")
def test_sample_top_k_with_a_tie_at_the_kth_value(Sampler, seed):
    """A tie at the k-th value may keep exactly k tokens (torch.topk) or every tied token
    (Hugging Face's TopKLogitsWarper); both are correct, nothing else is.

    Logits [.5, 2, 1, -1, 1, 1, -.5, 0], k = 2: only token 1 and the tied tokens 2, 4, 5 may
    appear. Token 1 has probability e^2 / (e^2 + e) = 0.731 when exactly k are kept, and
    e^2 / (e^2 + 3e) = 0.475 when all tied tokens are kept; its count must fall in the binomial
    interval of one of the two. Each interval has false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    logits = torch.tensor([0.5, 2.0, 1.0, -1.0, 1.0, 1.0, -0.5, 0.0])
    draws = draws_of(Sampler.sample_top_k, logits, n_draws(), 2)
    allowed = {1, 2, 4, 5}
    assert set(draws.unique().tolist()) <= allowed, f"drew {sorted(set(draws.tolist()) - allowed)} outside {allowed}"
    e1, e2 = torch.tensor(1.0).exp().item(), torch.tensor(2.0).exp().item()
    top_count = int((draws == 1).sum())
    accepted = []
    for p_top in (e2 / (e2 + e1), e2 / (e2 + 3 * e1)):
        low, high = binom_ppf(ALPHA / 2, n_draws(), p_top), binom_isf(ALPHA / 2, n_draws(), p_top)
        accepted.append((low, high))
        if low <= top_count <= high:
            return
    assert False, (
        f"token 1 drawn with frequency {top_count / n_draws():.4f}: keeping exactly k = 2 tokens gives 0.731 "
        f"(counts {accepted[0]}), keeping every tied token gives 0.475 (counts {accepted[1]})"
    )


# ---------------------------------------------------------------------------------------
# sample_top_p
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("sample_top_p")
@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.3, 1),  # the top token alone already has mass .5 >= .3
        (0.79, 2),  # .5 < .79, so the token that takes the total to .8 is kept: inclusive
        (0.81, 3),  # .8 < .81: the third token (.12) is needed as well
        (0.96, 4),
        (1.0, 5),
    ],
)
def test_sample_top_p_inclusive_cutoff(Sampler, top_p, kept, seed):
    """The nucleus is the smallest top set with mass >= top_p; draws are renormalised over it.

    Sorted probabilities .5, .3, .12, .05, .03 (cumulative .5, .8, .92, .97, 1). Binomial
    bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    expected = top_p_probs(NUCLEUS_PROBS, top_p)
    assert int((expected > 0).sum()) == kept  # the oracle itself
    draws = draws_of(Sampler.sample_top_p, NUCLEUS_LOGITS, n_draws(NUCLEUS_DELTA), top_p)
    assert_draws_follow(draws, expected, f"top_p={top_p}")


@pytest.mark.exercise("sample_top_p")
@pytest.mark.parametrize("top_p, min_tokens_to_keep", [(0.3, 3), (0.79, 4), (0.96, 2)])
def test_sample_top_p_min_tokens_to_keep(Sampler, top_p, min_tokens_to_keep, seed):
    """At least min_tokens_to_keep tokens stay in the nucleus; a larger nucleus is unchanged.

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    expected = top_p_probs(NUCLEUS_PROBS, top_p, min_tokens_to_keep)
    draws = draws_of(Sampler.sample_top_p, NUCLEUS_LOGITS, n_draws(NUCLEUS_DELTA), top_p, min_tokens_to_keep=min_tokens_to_keep)
    assert_draws_follow(draws, expected, f"top_p={top_p}, min_tokens_to_keep={min_tokens_to_keep}")


@pytest.mark.exercise("sample_top_p")
def test_sample_top_p_on_unsorted_logits(Sampler, seed):
    """The nucleus of logits in no particular order (top_p = 0.6 keeps 3 of 10 tokens).

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    draws = draws_of(Sampler.sample_top_p, LOGITS_2, n_draws(NUCLEUS_DELTA), 0.6)
    assert_draws_follow(draws, top_p_probs(softmax64(LOGITS_2), 0.6), "top_p=0.6")


# ---------------------------------------------------------------------------------------
# sample_next_token: the whole pipeline for one position
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


PENALISED_IDS = [2, 9, 2, 5, 9, 9]  # token 2 twice, 5 once, 9 three times


@pytest.mark.exercise("sample_next_token")
@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(temperature=2.0),
        dict(temperature=0.5),
        dict(temperature=2.0, frequency_penalty=1.0),
        dict(temperature=0.5, top_k=3),
        # The penalty comes first: token 2 (logit 2, seen twice) falls out of the top 3.
        dict(top_k=3, frequency_penalty=0.8),
        # The temperature comes first: the nucleus of softmax(logits / 2) at .5 has 3 tokens.
        dict(temperature=2.0, top_p=0.5),
        dict(temperature=0.5, top_p=0.9, frequency_penalty=0.5),
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "defaults",
)
def test_sample_next_token_distribution(Sampler, settings, seed):
    """Repeated calls follow softmax after temperature, frequency penalty and top-k/top-p, in that order.

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    input_ids = torch.tensor(PENALISED_IDS)
    draws = draws_of(Sampler.sample_next_token, LOGITS, n_draws(), before=(input_ids,), **settings)
    expected = pipeline_probs(LOGITS, PENALISED_IDS, **settings)
    assert_draws_follow(draws, expected, f"sample_next_token({settings})")


@pytest.mark.exercise("sample_next_token")
def test_sample_next_token_temperature_zero_is_greedy(Sampler):
    """temperature=0 returns the argmax as an int, whatever the other settings."""
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, 50, (12,), generator=generator)
    for _ in range(5):
        logits = torch.randn(50, generator=generator)
        for extra in (dict(), dict(top_k=5), dict(top_p=0.5), dict(frequency_penalty=1.0)):
            token = as_token(Sampler.sample_next_token(input_ids, logits, temperature=0.0, **extra), "sample_next_token")
            assert token == int(logits.argmax()), extra


# ---------------------------------------------------------------------------------------
# Bad input: a ValueError that says what is allowed
# ---------------------------------------------------------------------------------------

BAD_SETTINGS = [
    (dict(temperature=-0.5), r"temperature must be >= 0"),
    (dict(top_p=1.5), r"top_p must be in \[0, 1\]"),
    (dict(top_p=-0.1), r"top_p must be in \[0, 1\]"),
    (dict(top_k=-1), r"top_k must be an integer in \[0, d_vocab"),
    (dict(top_k=10**6), r"top_k must be an integer in \[0, d_vocab"),
    (dict(top_k=5, top_p=0.9), r"top_k or top_p, not both"),
]


@pytest.mark.parametrize("settings, message", BAD_SETTINGS, ids=[str(s) for s, _ in BAD_SETTINGS])
def test_sample_next_token_rejects_bad_settings(Sampler, settings, message):
    """Out-of-range settings raise a ValueError naming the setting and its allowed range."""
    with pytest.raises(ValueError, match=message):
        Sampler.sample_next_token(torch.tensor([1, 2]), LOGITS.clone(), **settings)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        *BAD_SETTINGS,
        (dict(prompt=""), r"prompt must be a non-empty string"),
        (dict(max_tokens_generated=-1), r"max_tokens_generated must be an integer >= 0"),
    ],
    ids=[str(s) for s, _ in BAD_SETTINGS] + ["empty prompt", "max_tokens_generated=-1"],
)
def test_sample_rejects_bad_input(Sampler, tiny, kwargs, message):
    """sample() validates everything before generating anything."""
    kwargs = {"prompt": "Hello", "max_tokens_generated": 3, **kwargs}
    sampler = Sampler(made_beside(Sampler, NeverEOSModel, tiny.cfg, tiny.tokenizer.eos_token_id), tiny.tokenizer)
    with pytest.raises(ValueError, match=message):
        sampler.sample(**kwargs)


def test_static_methods_reject_bad_arguments(Sampler):
    """The building blocks check their own arguments too."""
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Sampler.apply_temperature(LOGITS.clone(), 0.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Sampler.apply_temperature(LOGITS.clone(), -1.0)
    with pytest.raises(ValueError, match="k must be between 1 and d_vocab=10"):
        Sampler.sample_top_k(LOGITS.clone(), 0)
    with pytest.raises(ValueError, match="k must be between 1 and d_vocab=10"):
        Sampler.sample_top_k(LOGITS.clone(), 11)
    with pytest.raises(ValueError, match=r"top_p must be in \[0, 1\]"):
        Sampler.sample_top_p(LOGITS.clone(), 1.01)
    with pytest.raises(ValueError, match="min_tokens_to_keep must be >= 1"):
        Sampler.sample_top_p(LOGITS.clone(), 0.5, min_tokens_to_keep=0)


# ---------------------------------------------------------------------------------------
# sample: the loop, against Hugging Face generate and against fake models
# ---------------------------------------------------------------------------------------

PROMPTS = [
    "John and Mary went to the",
    "Jingle bells, jingle bells, jingle all the way",
    "When I was a kid, the cat sat on the mat",
]


def hf_generate_ids(reference, prompt: str, max_new_tokens: int, processors: tuple = (), seed: int | None = None,
                    **kwargs) -> list[int]:
    """Oracle: prompt and continuation token ids from Hugging Face generate on the reference.

    ``processors`` describes extra logits processors (see ``hf_logits_processors``); a ``seed``
    seeds torch's global generator first, as for seeded sampling."""
    from transformers import LogitsProcessorList

    tokenizer = reference.tokenizer
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    if seed is not None:
        torch.manual_seed(seed)
    out = reference.hf_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.eos_token_id,
        logits_processor=LogitsProcessorList(hf_logits_processors(processors)),
        **kwargs,
    )
    return out[0].tolist()


def hf_generate(oracle, reference, prompt: str, max_new_tokens: int, **kwargs) -> str:
    return reference.tokenizer.decode(oracle(hf_generate_ids, reference, prompt, max_new_tokens, **kwargs))


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("sample")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_sample_greedy_matches_hf_generate(Sampler, parity_demo, parity_reference, oracle, prompt):
    """sample(temperature=0) gives exactly Hugging Face's greedy generate(do_sample=False)."""
    sampler = Sampler(parity_demo, parity_reference.tokenizer)
    actual = sampler.sample(prompt, max_tokens_generated=24, temperature=0.0)
    expected = hf_generate(oracle, parity_reference, prompt, 24, do_sample=False)
    assert actual == expected


def replay(Sampler, model, tokenizer, prompt: str, max_tokens: int, seed: int, **settings) -> list[int]:
    """The token ids ``sample(prompt, max_tokens, seed=seed, **settings)`` must produce, from your own
    ``sample_next_token``: seed once, then one call per step on the model's logits for the last
    n_ctx tokens, stopping right after EOS. Any correct way of drawing gives the same text."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids[0]
    torch.manual_seed(seed)
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(ids[None, -model.cfg.n_ctx :])[0, -1]
            token = as_token(Sampler.sample_next_token(ids, logits, **settings), "sample_next_token")
            ids = torch.cat([ids, torch.tensor([token])])
            if token == tokenizer.eos_token_id:
                break
    return ids.tolist()


@pytest.mark.exercise("sample")
@pytest.mark.parametrize(
    "settings, torch_seed",
    [(dict(temperature=1.0), 0), (dict(temperature=0.7), 1), (dict(top_k=5), 2), (dict(top_p=0.8, frequency_penalty=0.5), 3)],
    ids=["t=1", "t=0.7", "top_k=5", "top_p=0.8,penalty"],
)
def test_sample_with_seed_replays_sample_next_token(Sampler, demo, reference, settings, torch_seed):
    """sample(seed=s) seeds once and draws each token with sample_next_token: the same as
    seeding, then calling sample_next_token step by step on the model's logits.

    A deterministic comparison, not a statistical one: whatever way of drawing your
    sample_next_token uses, the loop must give exactly its draws.
    """
    sampler = Sampler(demo, reference.tokenizer)
    prompt = PROMPTS[0]
    actual = sampler.sample(prompt, max_tokens_generated=16, seed=torch_seed, **settings)
    expected = replay(Sampler, demo, reference.tokenizer, prompt, 16, torch_seed, **settings)
    assert actual == reference.tokenizer.decode(expected)


@pytest.mark.parametrize("temperature, torch_seed", [(1.0, 0), (1.0, 1), (0.7, 2)])
def test_solution_seeded_sampling_matches_hf(impl, Sampler, demo, reference, oracle, temperature, torch_seed):
    """The solutions draw exactly as Hugging Face does: sample(seed=s) equals HF
    generate(do_sample=True, top_k=0) after torch.manual_seed(s), token for token.

    Both draw one torch.multinomial(softmax(logits / temperature)) per step. Other correct
    ways of drawing (inverse CDF, Categorical) give other tokens, so this checks the
    solutions only; your code is held to the replay test above.
    """
    if impl.package != "solutions":
        pytest.skip("draw-for-draw parity with Hugging Face is a property of the solutions, not a requirement")
    sampler = Sampler(demo, reference.tokenizer)
    prompt = PROMPTS[0]
    actual = sampler.sample(prompt, max_tokens_generated=16, temperature=temperature, seed=torch_seed)
    expected = hf_generate(oracle, reference, prompt, 16, seed=torch_seed, do_sample=True, top_k=0, top_p=1.0,
                           temperature=temperature)
    assert actual == expected


class FrequencyPenaltyProcessor:
    """Subtract penalty x (occurrences so far) from every token's score: the oracle for HF generate."""

    def __init__(self, penalty: float):
        self.penalty = penalty

    def __call__(self, input_ids, scores):
        counts = torch.stack([torch.bincount(row, minlength=scores.shape[-1]) for row in input_ids])
        return scores - self.penalty * counts.to(scores.dtype)


@pytest.mark.exercise("sample")
@pytest.mark.parametrize(
    "settings, processors",
    [
        (dict(top_k=1), ()),  # top-1 sampling is greedy
        (dict(top_p=1e-6), ()),  # so is a nucleus this small
        (dict(top_k=1, frequency_penalty=100.0), (("frequency penalty", 100.0),)),  # no token twice
    ],
    ids=["top_k=1", "top_p=1e-6", "top_k=1,frequency_penalty=100"],
)
def test_sample_passes_its_settings_on(Sampler, demo, reference, oracle, settings, processors):
    """sample() hands top_k, top_p and frequency_penalty to every step: settings that make
    sampling deterministic give HF's greedy generate (with the penalty as a logits processor)."""
    sampler = Sampler(demo, reference.tokenizer)
    prompt = PROMPTS[1]
    actual = sampler.sample(prompt, max_tokens_generated=20, seed=0, **settings)
    expected = hf_generate(oracle, reference, prompt, 20, processors=processors, do_sample=False)
    assert actual == expected


class ForceEOSProcessor:
    """The same rule for Hugging Face generate."""

    def __init__(self, eos: int, length: int):
        self.eos, self.length = eos, length

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] >= self.length:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, self.eos] = 0.0
        return scores


def hf_logits_processors(described: tuple) -> list:
    """Hugging Face logits processors from their description: ("frequency penalty", penalty), ("force EOS", eos, length)."""
    from transformers import LogitsProcessor

    kinds = {"frequency penalty": FrequencyPenaltyProcessor, "force EOS": ForceEOSProcessor}
    # Each rule as one of Hugging Face's own processors: generate takes those.
    return [type(kind.__name__, (kind, LogitsProcessor), {})(*args) for kind, *args in
            ((kinds[name], *args) for name, *args in described)]


@pytest.mark.exercise("sample")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0, seed=5)], ids=["greedy", "sampling"])
def test_sample_stops_right_after_eos(Sampler, demo, reference, oracle, settings):
    """Generation ends with the EOS token included, and the model is not called again after it.

    EOS is forced once the sequence has 5 new tokens; the expected text comes from HF
    generate with the same rule as a logits processor.
    """
    tokenizer = reference.tokenizer
    prompt = PROMPTS[2]
    prompt_len = len(tokenizer(prompt).input_ids)
    # its calls are counted apart, where sample cannot change the count
    model = made_apart(demo, ForceEOSAfter, tokenizer.eos_token_id, prompt_len + 5)
    actual = Sampler(model, tokenizer).sample(prompt, max_tokens_generated=20, **settings)

    if settings["temperature"] > 0:  # the draws are your sample_next_token's: replay them
        forced = ForceEOSAfter(demo, tokenizer.eos_token_id, prompt_len + 5)  # called here, by the replay
        seed = settings.pop("seed")
        expected_ids = replay(Sampler, forced, tokenizer, prompt, 20, seed, **settings)
    else:
        processors = (("force EOS", tokenizer.eos_token_id, prompt_len + 5),)
        expected_ids = oracle(hf_generate_ids, reference, prompt, 20, processors=processors, do_sample=False)
    assert expected_ids[-1] == tokenizer.eos_token_id and len(expected_ids) <= prompt_len + 6  # the oracle
    expected = tokenizer.decode(expected_ids)
    generated = len(expected_ids) - prompt_len
    assert actual == expected, "the text must end right after the EOS token, EOS included"
    assert model.calls == generated, f"the model was called {model.calls} times for {generated} generated tokens"


@pytest.mark.exercise("sample")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0)], ids=["greedy", "sampling"])
def test_sample_generates_exactly_max_tokens(Sampler, tiny, settings):
    """Without EOS, exactly max_tokens_generated tokens are added (7, 1, then 0), one model call each."""
    tokenizer = tiny.tokenizer
    prompt_ids = tokenizer(PROMPTS[0]).input_ids
    rule = NeverEOSModel(tiny.cfg, tokenizer.eos_token_id)  # the expected text is worked out on this twin
    for max_tokens_generated in (7, 1, 0):
        # made where sample calls it; the calls are recorded apart, where sample cannot change the record
        model = counted(made_beside(Sampler, NeverEOSModel, tiny.cfg, tokenizer.eos_token_id))
        actual = Sampler(model, tokenizer).sample(PROMPTS[0], max_tokens_generated=max_tokens_generated, **settings)
        expected = tokenizer.decode(rule.continuation(prompt_ids, max_tokens_generated))
        assert actual == expected, f"max_tokens_generated={max_tokens_generated}"
        assert len(model.inputs) == max_tokens_generated, (
            f"the model was called {len(model.inputs)} times for {max_tokens_generated} tokens"
        )


@pytest.mark.exercise("sample")
def test_sample_feeds_the_model_the_last_n_ctx_tokens(Sampler, tiny):
    """A prompt longer than n_ctx works: each step the model sees the last n_ctx tokens, and
    the returned text still starts with the whole prompt."""
    tokenizer = tiny.tokenizer
    n_ctx = tiny.cfg.n_ctx
    prompt = " ".join(["the cat sat on the mat"] * 40)
    prompt_ids = tokenizer(prompt).input_ids
    assert len(prompt_ids) > n_ctx + 10
    model = counted(made_beside(Sampler, NeverEOSModel, tiny.cfg, tokenizer.eos_token_id))
    actual = Sampler(model, tokenizer).sample(prompt, max_tokens_generated=4, temperature=0.0)
    full = NeverEOSModel(tiny.cfg, tokenizer.eos_token_id).continuation(prompt_ids, 4)  # on a twin
    assert actual == tokenizer.decode(full)
    assert len(model.inputs) == 4
    for step, seen in enumerate(model.inputs):
        expected = full[: len(prompt_ids) + step][-n_ctx:]
        assert seen.shape == (1, n_ctx), f"step {step}: the model got input of shape {tuple(seen.shape)}"
        assert seen[0].tolist() == expected, f"step {step}: not the last n_ctx tokens"


def hf_greedy_in_window(reference, ids: list[int], steps: int) -> list[int]:
    """Oracle: ``steps`` greedy tokens after ``ids``, each the argmax of HF's logits on the last n_ctx tokens."""
    n_ctx = reference.cfg.n_ctx
    expected = list(ids)
    for _ in range(steps):
        logits = reference.hf_model(torch.tensor([expected[-n_ctx:]])).logits[0, -1]
        expected.append(int(logits.argmax()))
    return expected


@pytest.mark.exercise("sample")
def test_sample_past_n_ctx_on_the_real_model(Sampler, demo, reference, oracle):
    """Greedy decoding of a prompt longer than n_ctx equals HF's argmax on the last n_ctx tokens."""
    tokenizer = reference.tokenizer
    n_ctx = reference.cfg.n_ctx
    words = "the cat sat on the mat and John and Mary went to the church"
    prompt = " ".join([words] * (n_ctx // 10 + 5))
    ids = tokenizer(prompt).input_ids
    assert len(ids) > n_ctx
    if len(ids) > n_ctx + 200:  # keep GPT-2's version short
        prompt = tokenizer.decode(ids[-(n_ctx + 50) :])
        ids = tokenizer(prompt).input_ids
    expected = oracle(hf_greedy_in_window, reference, list(ids), 3)
    actual = Sampler(demo, tokenizer).sample(prompt, max_tokens_generated=3, temperature=0.0)
    assert actual == tokenizer.decode(expected)


@pytest.mark.exercise("sample")
def test_sample_verbose_prints_the_text(Sampler, demo, tiny, capsys):
    """verbose=True prints the text as it grows; verbose=False prints nothing."""
    sampler = Sampler(demo, tiny.tokenizer)
    quiet = sampler.sample(PROMPTS[0], max_tokens_generated=5, temperature=0.0)
    assert capsys.readouterr().out == ""
    loud = sampler.sample(PROMPTS[0], max_tokens_generated=5, temperature=0.0, verbose=True)
    printed = capsys.readouterr().out
    assert loud == quiet
    assert PROMPTS[0] in printed and loud in printed.replace("\r", "")


# ---------------------------------------------------------------------------------------
# End to end: the reference model's own next-token distribution
# ---------------------------------------------------------------------------------------


def next_token_logits(model, tokenizer, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids)
    logits = logits.logits if hasattr(logits, "logits") else logits
    return ids[0], logits[0, -1]


def hf_next_token_logits(reference, prompt: str) -> torch.Tensor:
    """Oracle: Hugging Face's logits for the token after ``prompt``."""
    return next_token_logits(reference.hf_model, reference.tokenizer, prompt)[1]


def frequencies_of(Sampler, input_ids, logits, n: int) -> torch.Tensor:
    draws = draws_of(Sampler.sample_next_token, logits, n, before=(input_ids,))
    return torch.bincount(draws, minlength=logits.shape[-1])


@pytest.mark.exercise("sample_next_token")
def test_next_token_frequencies_match_the_reference(Sampler, demo, reference, oracle, seed):
    """Sampling after "John and Mary went to the" gives its two likeliest next tokens (" church"
    and " house" on GPT-2) as often as the reference's own softmax says.

    n_draws() calls of sample_next_token on the logits of the model under test; binomial bounds
    for the two tokens (Bonferroni): false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    prompt = "John and Mary went to the"
    input_ids, logits = next_token_logits(demo, reference.tokenizer, prompt)
    hf_logits = oracle(hf_next_token_logits, reference, prompt)
    probs = softmax64(hf_logits)
    top = probs.topk(2).indices.tolist()
    observed = frequencies_of(Sampler, input_ids, logits, n_draws())
    q = ALPHA / 4
    for token in top:
        p = probs[token].item()
        low, high = binom_ppf(q, n_draws(), p), binom_isf(q, n_draws(), p)
        assert low <= observed[token] <= high, (
            f"{reference.tokenizer.decode(token)!r}: frequency {observed[token].item() / n_draws():.4f}, "
            f"reference probability {p:.4f}"
        )


# ---------------------------------------------------------------------------------------
# Real GPT-2: the published expectations
# ---------------------------------------------------------------------------------------


@pytest.mark.gpt2
@pytest.mark.exercise("sample")
def test_gpt2_jingle_bells_greedy(Sampler, gpt2_demo, gpt2):
    """GPT-2 greedily continues "Jingle bells, jingle bells, jingle all the way" with
    " up to the top of the mountain."."""
    sampler = Sampler(gpt2_demo, gpt2.tokenizer)
    prompt = "Jingle bells, jingle bells, jingle all the way"
    text = sampler.sample(prompt, max_tokens_generated=8, temperature=0.0)
    assert text == prompt + " up to the top of the mountain."


@pytest.mark.gpt2
@pytest.mark.exercise("sample_next_token")
def test_gpt2_church_and_house_frequencies(Sampler, gpt2_demo, gpt2, seed):
    """After "John and Mary went to the", GPT-2 samples " church" 6.48% and " house" 3.67% of the time.

    10000 calls of sample_next_token. The published values are rounded to 4 digits, so the
    true probability lies within +-0.00005 of them: the lower bound is the binomial quantile
    at the low end of that interval and the upper bound the one at the high end, q = 1e-6/4
    per tail and token. False-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    n = 10_000
    input_ids, logits = next_token_logits(gpt2_demo, gpt2.tokenizer, "John and Mary went to the")
    observed = frequencies_of(Sampler, input_ids, logits, n)
    q = ALPHA / 4
    for word, published in ((" church", 0.0648), (" house", 0.0367)):
        (token,) = gpt2.tokenizer.encode(word)
        low = binom_ppf(q, n, published - 0.00005)
        high = binom_isf(q, n, published + 0.00005)
        assert low <= observed[token] <= high, (
            f"{word!r}: frequency {observed[token].item() / n:.4f}, published {published}"
        )
