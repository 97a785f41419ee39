"""Part 2: TransformerSampler's decoding methods, one by one.

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
  implementation fails a test with probability at most ``ALPHA`` = 1e-6 (part2_oracles.py).
  The draws are made in stages and stop once the verdict is certain (sequential.py): a
  token whose probability is off by the test's delta is still missed with probability at
  most 1e-6, and a correct sampler is usually accepted after about 0.4 of the draws.

The sampling loop ``sample`` is graded in test_part2_sample.py.

Every statistical test takes the ``seed`` fixture and seeds torch with it. The seed comes
from the environment variable ``SAMPLING_COURSE_TEST_SEED``: one non-negative integer
(default 0), an inclusive range such as ``1-200`` or a list such as ``1,5,9-12``; several
seeds run each statistical test once per seed (``scripts/stress_statistical.py`` does that).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.beside import made_beside

from doubles import NeverEOSModel
from part2_oracles import (
    ALPHA, LOGITS, LOGITS_2, NUCLEUS_DELTA, NUCLEUS_LOGITS, NUCLEUS_PROBS, as_token, assert_left_alone,
    assert_sampler_follows, counts_of, draws_of, hf_processor, n_draws, pipeline_probs, softmax64, top_k_probs,
    top_p_probs,
)
from quantiles import binom_isf, binom_ppf


# ---------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def Sampler(impl):
    """The TransformerSampler class under test (its static methods need no model)."""
    return impl.sampling.TransformerSampler


# ---------------------------------------------------------------------------------------
# The oracles used below agree with Hugging Face's logits processors
# ---------------------------------------------------------------------------------------


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
    assert_sampler_follows(Sampler.sample_basic, logits, softmax64(logits), "sample_basic")


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
    assert_sampler_follows(Sampler.sample_top_k, LOGITS_2, top_k_probs(softmax64(LOGITS_2), k), f"top-{k}", k)


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
    assert_sampler_follows(Sampler.sample_top_p, NUCLEUS_LOGITS, expected, f"top_p={top_p}", top_p, delta=NUCLEUS_DELTA)


@pytest.mark.exercise("sample_top_p")
@pytest.mark.parametrize("top_p, min_tokens_to_keep", [(0.3, 3), (0.79, 4), (0.96, 2)])
def test_sample_top_p_min_tokens_to_keep(Sampler, top_p, min_tokens_to_keep, seed):
    """At least min_tokens_to_keep tokens stay in the nucleus; a larger nucleus is unchanged.

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    expected = top_p_probs(NUCLEUS_PROBS, top_p, min_tokens_to_keep)
    what = f"top_p={top_p}, min_tokens_to_keep={min_tokens_to_keep}"
    assert_sampler_follows(Sampler.sample_top_p, NUCLEUS_LOGITS, expected, what, top_p, delta=NUCLEUS_DELTA,
                           min_tokens_to_keep=min_tokens_to_keep)


@pytest.mark.exercise("sample_top_p")
def test_sample_top_p_on_unsorted_logits(Sampler, seed):
    """The nucleus of logits in no particular order (top_p = 0.6 keeps 3 of 10 tokens).

    Binomial bounds with Bonferroni over tokens: false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    assert_sampler_follows(Sampler.sample_top_p, LOGITS_2, top_p_probs(softmax64(LOGITS_2), 0.6), "top_p=0.6", 0.6,
                           delta=NUCLEUS_DELTA)


# ---------------------------------------------------------------------------------------
# sample_next_token: the whole pipeline for one position
# ---------------------------------------------------------------------------------------

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
    expected = pipeline_probs(LOGITS, PENALISED_IDS, **settings)
    assert_sampler_follows(Sampler.sample_next_token, LOGITS, expected, f"sample_next_token({settings})",
                           before=(input_ids,), **settings)


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
