"""Part 5: the peers' own published cases, with their literal inputs and expected outputs.

Hugging Face's ``tests/generation/test_logits_process.py`` and llama.cpp's
``tests/test-sampling.cpp`` test their processors on small hand-made rows. The same rows run
here through the course's functions, with the peers' expected outputs. Where the course's
documented convention differs from a peer's, the test says so and asserts the course's rule:

* ``top_p=0`` keeps one token in llama.cpp; here (Hugging Face's convention) it is refused,
  and ``top_p=1.0`` is off. ``min_p`` above 1 is accepted by llama.cpp (it keeps the top
  token); here min-p is in [0, 1] and 1.05 is refused.
* llama.cpp's XTC draws with probability 0.99 from its own seeded generator; here the
  probability is 1.0, so the cut always applies and the case does not hang on a draw.
* llama.cpp's top-p, min-p and typical run with ``min_keep=0``; here ``min_tokens_to_keep``
  is at least 1 (Hugging Face's rule), which changes none of these cases.

Every call also checks that the function leaves the tensors it is given unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

from sampling_course.sampling_settings import SamplerSettings

from part5_shared import Part5


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


def log_of(*rows: list[float]) -> torch.Tensor:
    """Rows of probabilities as logits (log 0 is -inf), the way both peers build their cases."""
    return torch.tensor(rows, dtype=torch.float32).log()


def kept_probs(filtered: torch.Tensor) -> list[float]:
    """The probabilities left in a one-row result after renormalising (llama.cpp's ``dist`` step), sorted."""
    return sorted(filtered[0].softmax(dim=-1)[torch.isfinite(filtered[0])].tolist())


def assert_llama_case(filtered: torch.Tensor, expected: list[float], what: str) -> None:
    """llama.cpp compares each kept token's probability with its expected one to within 1e-5."""
    got = kept_probs(filtered)
    assert len(got) == len(expected), f"{what}: kept {len(got)} tokens, llama.cpp keeps {len(expected)}"
    for g, e in zip(got, sorted(expected)):
        assert abs(g - e) < 1e-5, f"{what}: kept probabilities {got}, llama.cpp expects {sorted(expected)}"


def n_kept(filtered: torch.Tensor) -> list[int]:
    return torch.isfinite(filtered).sum(dim=-1).tolist()


def hf_ramp() -> torch.Tensor:
    """Hugging Face's edge case: a ramp of logits -5 .. 4 in two rows, the second made extreme (times 100)."""
    ramp = (torch.arange(10, dtype=torch.float32) - 5).repeat(2, 1)
    ramp[1] = ramp[1] * 100.0
    return ramp


LLAMA_ROW = [0.1, 0.2, 0.3, 0.4]


# ---------------------------------------------------------------------------------------
# Top-k, top-p, min-p
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("top_k_filter")
def test_top_k_hugging_face_ramp(gen):
    """HF test_top_k_dist_warper: a ramp 0..9, its second row lifted by 10 on the first half; k = 3."""
    ramp = torch.arange(10, dtype=torch.float32).repeat(2, 1)
    ramp[1:, :5] = ramp[1:, :5] + 10
    removed = torch.isinf(gen.top_k_filter(ramp.clone(), 3)).tolist()
    assert removed == [7 * [True] + 3 * [False], 2 * [True] + 3 * [False] + 5 * [True]]


@pytest.mark.exercise("top_k_filter")
@pytest.mark.parametrize("k, expected", [(1, [1.0]), (3, [0.44444, 0.33333, 0.22222]), (4, [0.4, 0.3, 0.2, 0.1]),
                                         (0, [0.1, 0.2, 0.3, 0.4])])
def test_top_k_llama_cpp(gen, k, expected):
    """llama.cpp test_top_k on [0.1, 0.2, 0.3, 0.4]; k = 0 is off in both."""
    assert_llama_case(gen.top_k_filter(log_of(LLAMA_ROW), k), expected, f"top_k_filter(k={k})")


@pytest.mark.exercise("top_p_filter")
def test_top_p_hugging_face_rows(gen):
    """HF test_top_p_dist_warper: at top_p = 0.8, [0.3, 0.1, 0.1, 0.5] keeps 0.5 and 0.3 (exactly 0.8: the
    inclusive rule stops there) and [0.15, 0.3, 0.3, 0.25] keeps three."""
    kept = gen.top_p_filter(log_of([0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]), 0.8).exp()
    torch.testing.assert_close(kept, torch.tensor([[0.3, 0.0, 0.0, 0.5], [0.0, 0.3, 0.3, 0.25]]), rtol=1e-3, atol=1e-3)


@pytest.mark.exercise("top_p_filter")
def test_top_p_hugging_face_min_tokens_to_keep(gen):
    """HF: top_p = 0.9 on the ramp keeps 3 tokens of the first row; the extreme row would keep 1, but
    min_tokens_to_keep = 2 keeps 2."""
    assert n_kept(gen.top_p_filter(hf_ramp(), 0.9, min_tokens_to_keep=2)) == [3, 2]


@pytest.mark.exercise("top_p_filter")
@pytest.mark.parametrize("p, expected", [(0.7, [0.571429, 0.428571]), (0.8, [0.44444, 0.33333, 0.22222]),
                                         (1.0, [0.1, 0.2, 0.3, 0.4])])
def test_top_p_llama_cpp(gen, p, expected):
    """llama.cpp test_top_p on [0.1, 0.2, 0.3, 0.4] (0.7 is reached exactly by 0.4 + 0.3)."""
    assert_llama_case(gen.top_p_filter(log_of(LLAMA_ROW), p), expected, f"top_p_filter(p={p})")


@pytest.mark.exercise("top_p_filter")
def test_top_p_zero_is_refused_where_llama_cpp_keeps_one(gen):
    """llama.cpp's test_top_p(..., 0) keeps the top token; the course follows Hugging Face, where 1.0 is off
    and 0 is no nucleus at all, so it refuses 0 (as the sampler settings do)."""
    with pytest.raises(ValueError, match="top_p"):
        gen.top_p_filter(log_of(LLAMA_ROW), 0.0)


@pytest.mark.exercise("top_p_filter")
def test_top_p_one_drops_nothing_on_a_long_row(gen):
    """top_p = 1.0 keeps every token, even on 10,000 tokens whose smallest have probabilities near 1e-8,
    where a running total rounded in float32 reaches 1.0 early."""
    generator = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(2, 10_000, generator=generator)
    assert n_kept(gen.top_p_filter(logits.clone(), 1.0)) == [10_000, 10_000]


@pytest.mark.exercise("min_p_filter")
def test_min_p_hugging_face_rows(gen):
    """HF test_min_p_dist_warper at min_p = 0.05: 0.047 > 0.9 x 0.05 stays; a flat row keeps all."""
    dist = log_of([0.9, 0.0274, 0.047, 0.0274], [0.15, 0.3, 0.3, 0.25], [0.97, 0.01, 0.01, 0.01])
    expected = torch.tensor([[0.9, 0.0, 0.047, 0.0], [0.15, 0.3, 0.3, 0.25], [0.97, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(gen.min_p_filter(dist, 0.05).exp(), expected, rtol=1e-3, atol=1e-3)
    assert n_kept(gen.min_p_filter(hf_ramp(), 0.9, min_tokens_to_keep=2)) == [2, 2]


@pytest.mark.exercise("min_p_filter")
@pytest.mark.parametrize("min_p, expected", [
    (0.00, [0.1, 0.2, 0.3, 0.4]), (0.24, [0.1, 0.2, 0.3, 0.4]), (0.26, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (0.49, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]), (0.51, [0.3 / 0.7, 0.4 / 0.7]), (0.74, [0.3 / 0.7, 0.4 / 0.7]),
    (0.76, [1.0]), (1.00, [1.0]),
])
def test_min_p_llama_cpp(gen, min_p, expected):
    """llama.cpp test_min_p on [0.1, 0.2, 0.3, 0.4]."""
    assert_llama_case(gen.min_p_filter(log_of(LLAMA_ROW), min_p), expected, f"min_p_filter(min_p={min_p})")


@pytest.mark.exercise("min_p_filter")
def test_min_p_above_one_is_refused(gen):
    """llama.cpp's test_min_p(..., 1.05) keeps the top token; here min-p is a fraction in [0, 1] (Hugging Face's
    range), so 1.05 is refused."""
    with pytest.raises(ValueError, match="min_p"):
        gen.min_p_filter(log_of(LLAMA_ROW), 1.05)


# ---------------------------------------------------------------------------------------
# Temperature (through warp_logits)
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("warp_logits")
def test_temperature_hugging_face_rows(gen):
    """HF test_temperature_dist_warper: a uniform row stays uniform; a row with a peak and a valley gets
    sharper at 0.5 and smoother at 1.3."""
    scores = torch.full((2, 20), 1 / 20)
    scores[1, 5] = 1 / 20 + 0.1
    scores[1, 10] = 1 / 20 - 0.4
    probs = scores.softmax(dim=-1)
    sharp = gen.warp_logits(scores.clone(), temperature=0.5).softmax(dim=-1)
    smooth = gen.warp_logits(scores.clone(), temperature=1.3).softmax(dim=-1)
    torch.testing.assert_close(probs[0], sharp[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(probs[0], smooth[0], rtol=1e-3, atol=1e-3)
    assert probs[1].max() < sharp[1].max() and probs[1].min() > sharp[1].min()
    assert probs[1].max() > smooth[1].max() and probs[1].min() < smooth[1].min()


@pytest.mark.exercise("batched_sample")
def test_temperature_zero_llama_cpp(gen):
    """llama.cpp test_temp(..., 0): temperature 0 is the argmax (here ``sample`` does it)."""
    assert gen.sample(log_of(LLAMA_ROW), temperature=0.0).tolist() == [3]


# ---------------------------------------------------------------------------------------
# Typical, epsilon, eta, XTC, top-n-sigma
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("typical_filter")
def test_typical_hugging_face_rows(gen):
    """HF test_typical_dist_warper (and llama.cpp's test_typical, the same two rows) at typical_p = 0.5."""
    dist = log_of([0.97, 0.01, 0.01, 0.01], [0.4, 0.2, 0.2, 0.2])
    expected = torch.tensor([[0.97, 0.0, 0.0, 0.0], [0.0, 0.2, 0.2, 0.2]])
    torch.testing.assert_close(gen.typical_filter(dist, 0.5).exp(), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.exercise("typical_filter")
def test_typical_keeps_tokens_tied_with_the_cut_token(gen):
    """HF: on a uniform row every token is equally typical, so typical_p = 0.5 keeps all five (the cut
    token's ties stay), with min_tokens_to_keep = 3 or not; on the ramp, 0.7 keeps 2 per row with
    min_tokens_to_keep = 2."""
    uniform = torch.full((2, 5), 1 / 5)
    assert n_kept(gen.typical_filter(uniform.clone(), 0.5, min_tokens_to_keep=3)) == [5, 5]
    assert n_kept(gen.typical_filter(uniform.clone(), 0.5)) == [5, 5]
    assert n_kept(gen.typical_filter(hf_ramp(), 0.7, min_tokens_to_keep=2)) == [2, 2]


@pytest.mark.exercise("epsilon_filter")
def test_epsilon_hugging_face_rows(gen):
    """HF test_epsilon_dist_warper: epsilon 0.1 keeps only probabilities >= 0.1; 5e-2 on the ramp keeps 3,
    and 2 of the extreme row with min_tokens_to_keep = 2."""
    dist = log_of([0.87, 0.099, 0.001, 0.03], [0.4, 0.299, 0.101, 0.2])
    expected = torch.tensor([[0.87, 0, 0, 0], [0.4, 0.299, 0.101, 0.2]])
    torch.testing.assert_close(gen.epsilon_filter(dist, 0.1).exp(), expected, rtol=1e-3, atol=1e-3)
    assert n_kept(gen.epsilon_filter(hf_ramp(), 5e-2, min_tokens_to_keep=2)) == [3, 2]


@pytest.mark.exercise("eta_filter")
def test_eta_hugging_face_rows(gen):
    """HF test_eta_dist_warper: eta 0.0625 gives the bars min(0.0625, 0.1320) and min(0.0625, 0.1644); a
    probability of 0 (a logit of -inf) stays removed. 0.1 on the ramp keeps 2 per row with min_tokens_to_keep = 2."""
    dist = log_of([0.0, 0.1, 0.8, 0.1], [0.01, 0.04, 0.9, 0.05])
    expected = torch.tensor([[0.0, 0.1, 0.8, 0.1], [0.0, 0.0, 0.9, 0.0]])
    torch.testing.assert_close(gen.eta_filter(dist, 0.0625).exp(), expected, rtol=1e-3, atol=1e-3)
    assert n_kept(gen.eta_filter(hf_ramp(), 0.1, min_tokens_to_keep=2)) == [2, 2]


@pytest.mark.exercise("xtc_filter")
@pytest.mark.parametrize("threshold, expected", [(0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]),
                                                 (0.39, [0.4, 0.3, 0.2, 0.1])])
def test_xtc_llama_cpp(gen, threshold, expected, device):
    """llama.cpp test_xtc on [0.4, 0.3, 0.2, 0.1]: every token at or above the threshold goes but the least
    likely of them; at 0.39 only one token is above, so nothing goes. (llama.cpp's probability is 0.99 with its
    own seed; here 1.0.) Its expected values are the probabilities before renormalising."""
    logits = log_of([0.4, 0.3, 0.2, 0.1]).to(device)
    filtered = gen.xtc_filter(logits, threshold, 1.0, torch.Generator(device=device).manual_seed(0)).cpu()
    kept = sorted(filtered[0].exp()[torch.isfinite(filtered[0])].tolist())
    assert len(kept) == len(expected) and all(abs(a - b) < 1e-5 for a, b in zip(kept, sorted(expected))), (
        f"xtc_filter(threshold={threshold}) kept {kept}, llama.cpp keeps {sorted(expected)}")


@pytest.mark.exercise("top_n_sigma_filter")
@pytest.mark.parametrize("n, expected", [(1.0, [0.428571, 0.571429]), (0.0, [0.1, 0.2, 0.3, 0.4]),
                                         (3.0, [0.1, 0.2, 0.3, 0.4])])
def test_top_n_sigma_llama_cpp(gen, n, expected):
    """llama.cpp test_top_n_sigma on [0.1, 0.2, 0.3, 0.4]; n = 0 is off in both."""
    assert_llama_case(gen.top_n_sigma_filter(log_of(LLAMA_ROW), n), expected, f"top_n_sigma_filter(n={n})")


# ---------------------------------------------------------------------------------------
# Penalties and bans
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("apply_repetition_penalty")
def test_repetition_penalty_hugging_face_rows(gen):
    """HF test_repetition_penalty_dist_process: rows [0, 1] and [5, 0], penalty 2: a negative seen logit is
    doubled, a positive one halved."""
    scores = torch.full((2, 10), 1 / 10)
    scores[0, 0] = -(1 / 10)
    scores[1, 5] = 4 / 10
    out = gen.apply_repetition_penalty(scores.clone(), torch.tensor([[0, 1], [5, 0]]), 2.0)
    expected = {(0, 0): -(1 / 10) * 2, (0, 1): (1 / 10) / 2, (1, 0): (1 / 10) / 2, (1, 5): (4 / 10) / 2}
    for (row, token), value in expected.items():
        assert math.isclose(out[row, token].item(), value, abs_tol=1e-7), f"token {token} of row {row}"


@pytest.mark.exercise("apply_repetition_penalty")
@pytest.mark.parametrize("history, expected", [([0], [0, 0.25, 0.25, 0.25, 0.25]), ([0, 1, 2], [0, 0, 0, 0.5, 0.5]),
                                               ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5])])
def test_repetition_penalty_llama_cpp(gen, history, expected):
    """llama.cpp test_penalties with repeat_penalty 50 on five tokens of 0.2 (its window holds the whole history)."""
    out = gen.apply_repetition_penalty(log_of([0.2] * 5), torch.tensor([history]), 50.0)
    got = out[0].softmax(dim=-1).tolist()
    assert all(abs(g - e) < 1e-5 for g, e in zip(got, expected)), f"history {history}: {got}, llama.cpp {expected}"


@pytest.mark.exercise("apply_presence_and_frequency_penalty")
@pytest.mark.parametrize("history, expected", [
    ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997]),
    ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966]),
    ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977]),
])
def test_presence_and_frequency_llama_cpp(gen, history, expected):
    """llama.cpp test_penalties with alpha_frequency 5 and alpha_presence 5 (OpenAI's rule) on five tokens of 0.2."""
    out = gen.apply_presence_and_frequency_penalty(log_of([0.2] * 5), torch.tensor([history]), 5.0, 5.0)
    got = out[0].softmax(dim=-1).tolist()
    assert all(abs(g - e) < 1e-5 for g, e in zip(got, expected)), f"history {history}: {got}, llama.cpp {expected}"


@pytest.mark.exercise("apply_dry_penalty")
@pytest.mark.parametrize("probs, history, expected, multiplier, base, allowed, last_n, breakers", [
    ([0.25] * 4, [0, 1], [0.25, 0.25, 0.25, 0.25], 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [3]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
], ids=["too-short", "repeat-0-1", "breaker", "multiplier-2", "allowed-4"])
def test_dry_llama_cpp(gen, probs, history, expected, multiplier, base, allowed, last_n, breakers):
    """llama.cpp test_dry, its five cases (sequence breakers of one token each)."""
    breaker_mask = torch.zeros(len(probs), dtype=torch.bool)
    breaker_mask[breakers] = True
    out = gen.apply_dry_penalty(log_of(probs), torch.tensor([history]), multiplier, base, allowed, breaker_mask, last_n)
    got = out[0].softmax(dim=-1).tolist()
    assert all(abs(g - e) < 1e-5 for g, e in zip(got, expected)), f"{got}, llama.cpp {expected}"


@pytest.mark.exercise("ban_bad_words")
def test_bad_words_hugging_face_rows(gen):
    """HF test_no_bad_words_dist_processor: [[1], [4], [1, 0], [0, 1, 2], [1, 3, 1, 3]] with EOS 4 bans 0, 1, 3
    in row 0 and 0, 1, 2 in row 1; [4] (the end of the text) is left out, as Hugging Face leaves it out."""
    input_ids = torch.tensor([[0, 1, 3, 1], [0, 1, 0, 1]])
    scores = torch.full((2, 5), 1 / 5)
    banned = gen.ban_bad_words(scores.clone(), input_ids, [[1], [4], [1, 0], [0, 1, 2], [1, 3, 1, 3]], eos_token_id=4)
    assert torch.isinf(banned).tolist() == [[True, True, False, True, False], [True, True, True, False, False]]
    alone = gen.ban_bad_words(scores.clone(), input_ids, [[4]], eos_token_id=4)
    torch.testing.assert_close(alone, scores)


@pytest.mark.exercise("generate")
def test_min_new_tokens_hugging_face_steps(gen):
    """HF test_new_min_length_dist_processor: prompts of 5 tokens, min_new_tokens = 3, EOS 0: the end is held
    back at 5, 6 and 7 tokens (0, 1, 2 new) and allowed at 8 and 15 (``process_logits``, which generate runs)."""
    settings = SamplerSettings(min_new_tokens=3)
    for length, held in ((5, True), (6, True), (7, True), (8, False), (15, False)):
        scores = torch.full((4, 20), 1 / 20)
        ids = torch.randint(0, 20, (4, length), generator=torch.Generator().manual_seed(length))
        out = gen.process_logits(scores.clone(), ids, torch.ones_like(ids), length - 5, settings, 0)
        assert torch.isinf(out[:, 0]).all() == held and not torch.isinf(out[:, 1:]).any(), f"{length} tokens"


@pytest.mark.exercise("generate")
def test_logit_bias_hugging_face_single_tokens(gen):
    """HF test_bias_dist_processor's one-token biases {(1,): 100, (4,): 100} as logit_bias on zero scores (its
    longer sequences are Hugging Face's ``sequence_bias``, which has no counterpart here)."""
    out = gen.apply_logit_bias(torch.zeros(2, 5), {1: 100.0, 4: 100.0})
    assert out.tolist() == [[0.0, 100.0, 0.0, 0.0, 100.0]] * 2
