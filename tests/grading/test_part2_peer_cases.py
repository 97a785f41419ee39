"""Part 2 on the cases other samplers publish: Hugging Face's and llama.cpp's own tests.

Hugging Face's ``tests/generation/test_logits_process.py`` and llama.cpp's
``tests/test-sampling.cpp`` check their temperature, top-k, top-p and penalty code on small
literal rows. The cases below keep their inputs and expected outputs, written in this
course's terms: a row of probabilities becomes logits ``log(p)``, and where they compare a
filtered distribution, we compare which tokens our method may still draw.

Which tokens a sampler may draw is observed without randomness: ``sample_basic`` (and
``torch.multinomial``, for a method that draws directly) is replaced by a stand-in that
returns the least likely token it is allowed to pick (``LeastLikelyKept``). A nucleus is a
prefix of the sorted tokens, so its least likely member says how many tokens it holds; a
token of probability 2e-8 that a rounding error drops shows up here, where no number of
draws would ever reach it.

Where the course's convention differs from the peer's, the test says so and asserts ours:

* llama.cpp treats ``top_k=0`` as "no filter" and temperature 0 as greedy inside the
  sampler. Here ``sample_top_k`` takes k in [1, d_vocab] (``sample_next_token`` is where
  ``top_k=0`` means off) and ``apply_temperature`` refuses 0 (``sample_next_token`` turns
  temperature 0 into ``greedy_search``).
* llama.cpp's penalties sampler combines repetition, frequency and presence penalties;
  part 2 has the frequency penalty alone, so its cases are matched with the presence
  penalty subtracted by the test itself, and the repetition-penalty-only cases do not map.
* Hugging Face's ``TopKLogitsWarper`` takes ``min_tokens_to_keep``; part 2's
  ``sample_top_k`` does not (k itself is at least 1), so that case does not map.
"""

from __future__ import annotations

import math

import pytest
import torch

# Nothing here is drawn at random, so no test has a false-failure probability.


@pytest.fixture(scope="module")
def Sampler(impl):
    """The TransformerSampler class under test (its static methods need no model)."""
    return impl.sampling.TransformerSampler


class LeastLikelyKept:
    """Stands in for the draw: it picks the least likely token it is allowed to pick.

    ``sample_basic(logits)`` gets logits in which a filtered token is -inf or a large
    negative mask (-1e10, float32's minimum): the smallest logit above -1e9 is the least
    likely allowed token. ``torch.multinomial(weights, n)`` gets weights in which a filtered
    token is 0: the smallest positive weight is. ``calls`` counts how often either ran.
    """

    def __init__(self) -> None:
        self.calls = 0

    def sample_basic(self, logits: torch.Tensor) -> int:
        self.calls += 1
        allowed = logits > -1e9
        return int(logits.masked_fill(~allowed, float("inf")).argmin())

    def multinomial(self, weights: torch.Tensor, num_samples: int = 1, *args, **kwargs) -> torch.Tensor:
        self.calls += 1
        least = weights.masked_fill(weights <= 0, float("inf")).argmin(dim=-1, keepdim=True)
        return least.expand(*least.shape[:-1], num_samples).clone()


def least_likely_kept(Sampler, monkeypatch, method: str, logits: torch.Tensor, *args, **kwargs) -> int:
    """The least likely token that ``Sampler.<method>`` may still draw from ``logits``.

    Also checks that the method leaves ``logits`` alone. Skips when the method draws in a
    way the stand-in cannot see (neither sample_basic nor torch.multinomial): the
    statistical tests in test_part2_sampling.py judge such code.
    """
    spy = LeastLikelyKept()
    monkeypatch.setattr(Sampler, "sample_basic", staticmethod(spy.sample_basic))
    monkeypatch.setattr(torch, "multinomial", spy.multinomial)
    given = logits.clone()
    token = getattr(Sampler, method)(given, *args, **kwargs)
    monkeypatch.undo()
    assert torch.equal(given, logits), f"{method} changed the logits it was given (in place); work on a copy"
    if spy.calls == 0:
        pytest.skip(f"{method} draws without sample_basic or torch.multinomial, so which tokens it keeps cannot be seen here")
    return int(token)


def logits_of(*probs: float) -> torch.Tensor:
    """The logits of a row of probabilities, log(p), in float32 as both peers build them."""
    return torch.tensor(probs, dtype=torch.float32).log()


# ---------------------------------------------------------------------------------------
# sample_top_p: Hugging Face's test_top_p_dist_warper and llama.cpp's test_top_p
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("sample_top_p")
@pytest.mark.parametrize(
    "probs, top_p, min_tokens_to_keep, kept",
    [
        # Hugging Face: [0.3, 0.1, 0.1, 0.5] at 0.8 keeps 0.5 and 0.3 (0.5 + 0.3 reaches 0.8
        # exactly, and the cutoff is inclusive); [0.15, 0.3, 0.3, 0.25] keeps 0.3, 0.3, 0.25.
        pytest.param((0.3, 0.1, 0.1, 0.5), 0.8, 1, {3, 0}, id="hf-row-1"),
        pytest.param((0.15, 0.3, 0.3, 0.25), 0.8, 1, {1, 2, 3}, id="hf-row-2"),
        # llama.cpp: {0.1, 0.2, 0.3, 0.4} at p = 0, 0.7, 0.8, 1.
        pytest.param((0.1, 0.2, 0.3, 0.4), 0.0, 1, {3}, id="llama-p0"),
        pytest.param((0.1, 0.2, 0.3, 0.4), 0.7, 1, {3, 2}, id="llama-p0.7"),
        pytest.param((0.1, 0.2, 0.3, 0.4), 0.8, 1, {3, 2, 1}, id="llama-p0.8"),
        pytest.param((0.1, 0.2, 0.3, 0.4), 1.0, 1, {3, 2, 1, 0}, id="llama-p1"),
    ],
)
def test_sample_top_p_peer_rows(Sampler, monkeypatch, probs, top_p, min_tokens_to_keep, kept):
    """The nucleus of each peer's literal row is the set their test expects (inclusive cutoff)."""
    logits = logits_of(*probs)
    least = min(kept, key=lambda t: probs[t])
    got = least_likely_kept(Sampler, monkeypatch, "sample_top_p", logits, top_p, min_tokens_to_keep=min_tokens_to_keep)
    assert got in range(len(probs)), f"sample_top_p returned {got}, not a token id of this {len(probs)}-token row"
    assert got == least, (
        f"probabilities {list(probs)} at top_p={top_p}: the nucleus is tokens {sorted(kept)}, so the least likely "
        f"token that may be drawn is {least} (p={probs[least]}), but sample_top_p allowed token {got} "
        f"(p={probs[got]})" + (": it keeps a token too many" if probs[got] < probs[least] else ": it keeps too few")
    )


@pytest.mark.exercise("sample_top_p")
@pytest.mark.parametrize("row, expected", [(0, 3), (1, 2)], ids=["ramp", "ramp-x100"])
def test_sample_top_p_hf_ramp_with_min_tokens_to_keep(Sampler, monkeypatch, row, expected):
    """Hugging Face's ramp rows: logits arange(10) - 5 (and the same times 100), top_p=0.9,
    min_tokens_to_keep=2: the first keeps 3 tokens, the second would keep 1 and keeps 2."""
    logits = torch.arange(10, dtype=torch.float32) - 5
    if row == 1:
        logits = logits * 100.0
    got = least_likely_kept(Sampler, monkeypatch, "sample_top_p", logits, 0.9, min_tokens_to_keep=2)
    assert got == 10 - expected, f"expected the {expected} largest logits (tokens {10 - expected} to 9) kept, but token {got} may be drawn"


def llama_queue_nucleus(n_vocab: int, top_p: float) -> int:
    """llama.cpp's test_sampler_queue rule for the nucleus of logits log(id): the least likely kept id.

    Probabilities are id / (n(n-1)/2); walking down from the top id, ids are added until
    their sum reaches ceil(top_p * divisor). Token 0 has probability 0 and is never drawn,
    so the least likely drawable id is at least 1. Exact integer arithmetic.
    """
    divisor = n_vocab * (n_vocab - 1) // 2
    target = math.ceil(top_p * divisor)
    token, total = n_vocab, 0
    while True:
        token -= 1
        total += token
        if total >= target:
            return max(token, 1)


@pytest.mark.exercise("sample_top_p")
@pytest.mark.parametrize("top_p", [1.0, 0.0, 0.0003, 0.8])
def test_sample_top_p_llama_queue_on_10000_tokens(Sampler, monkeypatch, top_p):
    """llama.cpp's sampler queue: 10,000 tokens with logits log(id), one nucleus at a time.

    At top_p = 1 nothing may be dropped: token 1 has probability 1/49,995,000 (2e-8), and a
    running total that rounds up to 1 before reaching it drops it.
    """
    n_vocab = 10_000
    logits = torch.arange(n_vocab, dtype=torch.float32).log()
    least = llama_queue_nucleus(n_vocab, top_p)
    got = least_likely_kept(Sampler, monkeypatch, "sample_top_p", logits, top_p)
    assert got == least, (
        f"logits log(id) over {n_vocab} tokens at top_p={top_p}: the nucleus is tokens {least} to {n_vocab - 1}, "
        f"but the least likely token sample_top_p allowed is {got}"
    )


# ---------------------------------------------------------------------------------------
# sample_top_k: Hugging Face's test_top_k_dist_warper and llama.cpp's test_top_k
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("sample_top_k")
@pytest.mark.parametrize(
    "logits, k, least",
    [
        # Hugging Face: the ramp arange(10) keeps 7, 8, 9 at k = 3; with 10 added to its first
        # half it keeps 2, 3, 4.
        pytest.param(torch.arange(10.0), 3, 7, id="hf-ramp"),
        pytest.param(torch.cat([torch.arange(5.0) + 10, torch.arange(5.0, 10.0)]), 3, 2, id="hf-ramp-shifted"),
        # llama.cpp: {0.1, 0.2, 0.3, 0.4} at k = 1, 3, 4.
        pytest.param(logits_of(0.1, 0.2, 0.3, 0.4), 1, 3, id="llama-k1"),
        pytest.param(logits_of(0.1, 0.2, 0.3, 0.4), 3, 1, id="llama-k3"),
        pytest.param(logits_of(0.1, 0.2, 0.3, 0.4), 4, 0, id="llama-k4"),
        # llama.cpp's sampler queue: 10,000 tokens with logits log(id) at k = 10,000, 1, 100
        # (token 0 has probability 0, so the least likely drawable token is 1 at k = 10,000).
        pytest.param(torch.arange(10_000.0).log(), 10_000, 1, id="llama-queue-k10000"),
        pytest.param(torch.arange(10_000.0).log(), 1, 9_999, id="llama-queue-k1"),
        pytest.param(torch.arange(10_000.0).log(), 100, 9_900, id="llama-queue-k100"),
    ],
)
def test_sample_top_k_peer_rows(Sampler, monkeypatch, logits, k, least):
    """The k kept tokens of each peer's literal row; the least likely of them may be drawn."""
    got = least_likely_kept(Sampler, monkeypatch, "sample_top_k", logits, k)
    assert got == least, f"top-{k}: the least likely token that may be drawn is {least}, but sample_top_k allowed {got}"


# Not graded as the learner's (no exercise marker): the check is given code, above the
# learner's region, and a sample_top_k written whole (as the classic course has it) need not
# repeat it; sample_next_token never passes k = 0 on.
def test_sample_top_k_refuses_zero(Sampler):
    """llama.cpp's top_k = 0 leaves the row unchanged. Our convention: sample_top_k takes k in
    [1, d_vocab] and refuses 0 (sample_next_token is where top_k=0 means off)."""
    with pytest.raises(ValueError, match="k must be"):
        Sampler.sample_top_k(logits_of(0.1, 0.2, 0.3, 0.4), 0)


# ---------------------------------------------------------------------------------------
# apply_temperature: Hugging Face's test_temperature_dist_warper and llama.cpp's test_temp
# ---------------------------------------------------------------------------------------


def hf_temperature_rows() -> torch.Tensor:
    """Hugging Face's two rows: uniform 1/20, and the same with a peak at 5 and a valley at 10."""
    scores = torch.full((2, 20), 1 / 20)
    scores[1, 5] = 1 / 20 + 0.1
    scores[1, 10] = 1 / 20 - 0.4
    return scores


@pytest.mark.exercise("apply_temperature")
@pytest.mark.parametrize("temperature, sharper", [(0.5, True), (1.3, False)])
def test_apply_temperature_hf_peak_and_valley(Sampler, temperature, sharper):
    """A uniform row stays uniform; below 1 the peak rises and the valley falls, above 1 the opposite.
    The input is left alone (Hugging Face checks the same)."""
    for i, row in enumerate(hf_temperature_rows()):
        given = row.clone()
        warped = Sampler.apply_temperature(given, temperature)
        assert torch.equal(given, row), "apply_temperature changed the logits it was given (in place)"
        before, after = row.softmax(-1), warped.softmax(-1)
        if i == 0:
            torch.testing.assert_close(after, before, rtol=1e-3, atol=1e-3)
            continue
        peak_higher, valley_lower = after.max() > before.max(), after.min() < before.min()
        assert peak_higher == sharper and valley_lower == sharper, (
            f"temperature {temperature}: the peak's probability went {before.max():.4f} -> {after.max():.4f} and the "
            f"valley's {before.min():.4f} -> {after.min():.4f}; "
            + ("below 1 the peak must rise and the valley fall" if sharper else "above 1 the peak must fall and the valley rise")
        )


@pytest.mark.exercise("apply_temperature")
def test_apply_temperature_llama_rows(Sampler):
    """llama.cpp: {0.1, 0.2, 0.3, 0.4} at temperature 1 is unchanged (within its 1e-5)."""
    logits = logits_of(0.1, 0.2, 0.3, 0.4)
    probs = Sampler.apply_temperature(logits.clone(), 1.0).softmax(-1)
    torch.testing.assert_close(probs, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=1e-5, rtol=0)


# Not graded as the learner's (no exercise marker): the check is given code, above the learner's
# region; an apply_temperature written whole (logits / temperature) need not repeat it.
def test_apply_temperature_refuses_zero(Sampler):
    """llama.cpp's temperature 0 gives {0, 0, 0, 1}; ours refuses 0 in apply_temperature and
    sample_next_token turns it into greedy_search, which picks the 0.4 token."""
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Sampler.apply_temperature(logits_of(0.1, 0.2, 0.3, 0.4), 0.0)


@pytest.mark.exercise("sample_next_token")
def test_sample_next_token_llama_temperature_zero(Sampler):
    """llama.cpp's temperature 0 on {0.1, 0.2, 0.3, 0.4} keeps only the 0.4 token: ours is greedy."""
    logits = logits_of(0.1, 0.2, 0.3, 0.4)
    for _ in range(20):
        assert int(Sampler.sample_next_token(torch.tensor([0]), logits.clone(), temperature=0.0)) == 3


# ---------------------------------------------------------------------------------------
# apply_frequency_penalty: llama.cpp's test_penalties (frequency 5, presence 5, repeat 1)
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("apply_frequency_penalty")
@pytest.mark.parametrize(
    "last_tokens, expected",
    [
        ((0,), (0.000011, 0.249997, 0.249997, 0.249997, 0.249997)),
        ((0, 1, 2), (0.000023, 0.000023, 0.000023, 0.499966, 0.499966)),
        ((0, 1, 2, 0, 0), (0.000000, 0.000023, 0.000023, 0.499977, 0.499977)),
    ],
)
def test_frequency_penalty_llama_cases(Sampler, last_tokens, expected):
    """llama.cpp's rows: five tokens of 0.2 each, frequency penalty 5 and presence penalty 5.

    Part 2 has the frequency penalty alone; the test subtracts the presence penalty (5 once
    for every token that occurs) itself, then compares the probabilities with llama.cpp's
    literal ones within its 1e-5. The input is left alone.
    """
    logits = logits_of(0.2, 0.2, 0.2, 0.2, 0.2)
    input_ids = torch.tensor(last_tokens)
    given = logits.clone()
    penalised = Sampler.apply_frequency_penalty(input_ids, given, 5.0)
    assert torch.equal(given, logits), "apply_frequency_penalty changed the logits it was given (in place)"
    present = torch.zeros(5)
    present[list(set(last_tokens))] = 1.0
    probs = (penalised - 5.0 * present).softmax(-1)
    torch.testing.assert_close(probs, torch.tensor(expected), atol=1e-5, rtol=0)
