"""Part 5b: the processors: repetition, presence and frequency penalties, DRY, logit bias and banned words."""

from __future__ import annotations

import math

import pytest
import torch

from part5_shared import Part5, VALUE_TOL, assert_same_filter, hf_processor, random_logits


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# Penalties
# ---------------------------------------------------------------------------------------


def random_history(seed: int, batch: int, length: int, d_vocab: int) -> torch.Tensor:
    """Token histories with plenty of repeats."""
    generator = torch.Generator().manual_seed(seed + 100)
    return torch.randint(0, d_vocab // 4, (batch, length), generator=generator)


@pytest.mark.exercise("apply_repetition_penalty")
def test_repetition_penalty_matches_hf(gen, oracle, seed):
    """apply_repetition_penalty equals RepetitionPenaltyLogitsProcessor (positive logits divided, negative
    multiplied, once per distinct token), for penalties above and below 1."""
    logits = random_logits(seed, 4, 120)
    history = random_history(seed, 4, 30, 120)
    for penalty in (1.3, 2.0, 0.7):
        actual = gen.apply_repetition_penalty(logits.clone(), history, penalty)
        expected = oracle(hf_processor, "RepetitionPenaltyLogitsProcessor", dict(penalty=penalty), history, logits)
        torch.testing.assert_close(actual, expected, **VALUE_TOL, msg=lambda m: f"repetition penalty {penalty}.\n{m}")


@pytest.mark.exercise("apply_repetition_penalty")
def test_repetition_penalty_ignores_padding(gen, oracle, seed):
    """Positions where attention_mask is 0 do not count as seen: each row equals Hugging Face's processor on its real tokens."""
    logits = random_logits(seed, 3, 80)
    history = random_history(seed, 3, 20, 80)
    mask = torch.ones_like(history)
    mask[0, :7] = 0
    mask[2, :12] = 0
    actual = gen.apply_repetition_penalty(logits.clone(), history, 1.5, attention_mask=mask)
    for row in range(3):
        real = history[row][mask[row].bool()][None]
        expected = oracle(hf_processor, "RepetitionPenaltyLogitsProcessor", dict(penalty=1.5), real, logits[row : row + 1])[0]
        torch.testing.assert_close(actual[row], expected, **VALUE_TOL, msg=lambda m: f"row {row}.\n{m}")


def presence_frequency_oracle(logits, history, mask, presence, frequency):
    """OpenAI's rules, one token at a time."""
    out = logits.clone()
    for row in range(history.shape[0]):
        counts: dict[int, int] = {}
        for token, keep in zip(history[row].tolist(), mask[row].tolist()):
            if keep:
                counts[token] = counts.get(token, 0) + 1
        for token, count in counts.items():
            out[row, token] -= presence + frequency * count
    return out


@pytest.mark.exercise("apply_presence_and_frequency_penalty")
def test_presence_and_frequency_penalty_follow_openai(gen, seed):
    """presence_penalty is subtracted once per distinct token seen, frequency_penalty once per occurrence;
    padding (mask 0) does not count."""
    logits = random_logits(seed, 3, 80)
    history = random_history(seed, 3, 25, 80)
    mask = torch.ones_like(history)
    mask[1, :9] = 0
    for presence, frequency in ((0.8, 0.0), (0.0, 0.6), (0.5, 0.3), (-0.4, 0.2)):
        actual = gen.apply_presence_and_frequency_penalty(logits.clone(), history, presence, frequency, attention_mask=mask)
        expected = presence_frequency_oracle(logits, history, mask, presence, frequency)
        torch.testing.assert_close(
            actual, expected, **VALUE_TOL, msg=lambda m: f"presence={presence}, frequency={frequency}.\n{m}"
        )


@pytest.mark.exercise("apply_repetition_penalty")
@pytest.mark.exercise("apply_presence_and_frequency_penalty")
def test_penalties_reject_bad_arguments(gen):
    """A repetition penalty <= 0 and a mask of the wrong shape raise a ValueError saying what is allowed."""
    logits, history = random_logits(0, 2, 10), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="repetition_penalty"):
        gen.apply_repetition_penalty(logits, history, 0.0)
    with pytest.raises(ValueError, match="attention_mask"):
        gen.apply_presence_and_frequency_penalty(logits, history, 0.1, 0.1, attention_mask=torch.ones(2, 4))


def llama_dry(tokens: list[int], row: list[float], multiplier: float, base: float, allowed: int,
              breakers: set[int], last_n: int) -> list[float]:
    """llama.cpp's DRY penalty, transcribed from its definition (the plain quadratic search, not its Z-algorithm)."""
    context = tokens[-last_n:] if last_n > 0 else list(tokens)
    n = len(context)
    out = list(row)
    if n <= allowed:
        return out
    limit = n  # tokens after the most recent breaker
    for i in range(n):
        if context[n - 1 - i] in breakers:
            limit = i
            break
    if limit < allowed:
        return out
    longest: dict[int, int] = {}
    for j in range(n - 1):
        # how many tokens ending at j equal the tokens ending at the last position
        length = 0
        while length <= j and context[j - length] == context[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            token = context[j + 1]
            longest[token] = max(longest.get(token, 0), length)
    max_exponent = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    for token, length in longest.items():
        if token in breakers:
            continue
        exponent = length - allowed
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        out[token] -= multiplier * base**exponent
    return out


DRY_CASES = [
    # (multiplier, base, allowed_length, breakers, penalty_last_n)
    (0.8, 1.75, 2, set(), -1),
    (1.0, 2.0, 1, {5}, -1),
    (0.5, 1.5, 3, {0}, -1),
    (0.8, 1.75, 2, {4}, 9),
    (2.0, 1.0, 2, set(), -1),
]


@pytest.mark.exercise("apply_dry_penalty")
@pytest.mark.parametrize("case", DRY_CASES, ids=lambda c: f"mult={c[0]},base={c[1]},allowed={c[2]},breakers={sorted(c[3])},last_n={c[4]}")
def test_dry_penalty_follows_llama_cpp(gen, seed, case):
    """On random histories over a small vocabulary (repeats everywhere) of every length from 1 to 30, with and
    without left padding, apply_dry_penalty equals the transcription of llama.cpp's definition."""
    multiplier, base, allowed, breakers, last_n = case
    generator = torch.Generator().manual_seed(seed + 300)
    d_vocab, rows = 8, 4
    breaker_mask = torch.zeros(d_vocab, dtype=torch.bool)
    breaker_mask[list(breakers)] = True
    penalised_any = False
    for length in range(1, 31):
        history = torch.randint(0, 6, (rows, length), generator=generator)
        mask = torch.ones_like(history)
        mask[1, : length // 2] = 0
        logits = random_logits(seed + length, rows, d_vocab)
        actual = gen.apply_dry_penalty(logits.clone(), history, multiplier, base, allowed, breaker_mask, last_n, mask)
        for r in range(rows):
            real = history[r][mask[r].bool()].tolist()
            expected = torch.tensor(llama_dry(real, logits[r].tolist(), multiplier, base, allowed, breakers, last_n))
            torch.testing.assert_close(actual[r], expected, **VALUE_TOL,
                                       msg=lambda m: f"history {real} (row {r}): DRY penalties differ.\n{m}")
            penalised_any |= not torch.equal(expected, logits[r])
    assert penalised_any, "precondition: some history should be penalised"


@pytest.mark.exercise("apply_dry_penalty")
def test_dry_penalty_worked_example(gen):
    """llama.cpp's own example, 'a b c c b c y a b c', allowed_length 2, multiplier 1, base 2: 'a b c' occurs
    before, followed by c, so c would extend a repeat of 3: penalty 2^(3 - 2); 'b c' occurs followed by y: 2^0;
    'c' alone is followed by b and c, but a repeat of 1 is below the allowed length. A breaker three tokens back
    changes nothing here; a breaker one token back stops every penalty."""
    a, b, c, y = 0, 1, 2, 3
    history = torch.tensor([[a, b, c, c, b, c, y, a, b, c]])
    out = gen.apply_dry_penalty(torch.zeros(1, 5), history, 1.0, 2.0, 2, torch.zeros(5, dtype=torch.bool))
    assert out[0].tolist() == [0.0, 0.0, -2.0, -1.0, 0.0], f"penalties {out[0].tolist()}"
    breakers = torch.tensor([False, False, False, False, True])
    history = torch.tensor([[a, b, c, c, b, c, y, 4, a, b, c]])  # a breaker before 'a b c': repeats reach back 3 tokens
    out = gen.apply_dry_penalty(torch.zeros(1, 5), history, 1.0, 2.0, 2, breakers)
    assert out[0].tolist() == [0.0, 0.0, -2.0, -1.0, 0.0], f"penalties {out[0].tolist()}"
    history = torch.tensor([[a, b, c, c, b, c, y, a, 4, c]])  # only one token after the breaker: nothing
    out = gen.apply_dry_penalty(torch.zeros(1, 5), history, 1.0, 2.0, 2, breakers)
    assert out[0].tolist() == [0.0] * 5


@pytest.mark.exercise("apply_dry_penalty")
def test_dry_penalty_rejects_bad_arguments(gen):
    logits, history = random_logits(0, 1, 6), torch.zeros(1, 4, dtype=torch.long)
    for kwargs, name in [(dict(multiplier=-1.0), "dry_multiplier"), (dict(multiplier=1.0, base=0.5), "dry_base"),
                         (dict(multiplier=1.0, allowed_length=0), "dry_allowed_length"),
                         (dict(multiplier=1.0, penalty_last_n=-2), "dry_penalty_last_n")]:
        with pytest.raises(ValueError, match=name):
            gen.apply_dry_penalty(logits, history, **kwargs)


# ---------------------------------------------------------------------------------------
# Biases and bans
# ---------------------------------------------------------------------------------------


def hf_sequence_bias(bias: list[tuple[int, float]], input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's SequenceBiasLogitsProcessor with one-token sequences, ``bias`` as (token, bias) pairs."""
    from transformers import SequenceBiasLogitsProcessor

    return SequenceBiasLogitsProcessor({(t,): b for t, b in bias})(input_ids, scores.clone())


def test_logit_bias_matches_hf_sequence_bias(gen, seed, oracle):
    """apply_logit_bias equals SequenceBiasLogitsProcessor with one-token sequences; a key outside the vocabulary
    is refused."""
    logits = random_logits(seed, 3, 50)
    bias = {3: 2.5, 10: -4.0, 49: 0.75, 0: float("-inf")}
    expected = oracle(hf_sequence_bias, list(bias.items()), torch.zeros(3, 1, dtype=torch.long), logits)
    torch.testing.assert_close(gen.apply_logit_bias(logits.clone(), bias), expected, **VALUE_TOL)
    with pytest.raises(ValueError, match="logit_bias"):
        gen.apply_logit_bias(logits, {50: 1.0})


@pytest.mark.exercise("ban_bad_words")
def test_ban_bad_words_matches_hf(gen, seed, oracle):
    """On random histories over a small vocabulary, ban_bad_words bans exactly what NoBadWordsLogitsProcessor
    bans: one-token sequences everywhere, longer ones where the history ends with all but their last token."""
    generator = torch.Generator().manual_seed(seed + 400)
    bad = [[3], [1, 2], [2, 2, 4], [0, 5, 1, 6]]
    banned_multi = False
    for length in range(1, 12):
        history = torch.randint(0, 7, (6, length), generator=generator)
        logits = random_logits(seed + length, 6, 9)
        actual = gen.ban_bad_words(logits.clone(), history, bad)
        expected = oracle(hf_processor, "NoBadWordsLogitsProcessor", dict(bad_words_ids=bad, eos_token_id=8), history, logits)
        assert_same_filter(actual, expected, f"ban_bad_words on {history.tolist()}")
        banned_multi |= bool((torch.isinf(expected[:, [2, 4, 6]])).any())
    assert banned_multi, "precondition: some history should end with the start of a longer banned sequence"


@pytest.mark.exercise("ban_bad_words")
def test_ban_bad_words_ignores_padding(gen):
    """A padded row is banned as it would be alone: pads (mask 0) never complete the start of a banned sequence."""
    history = torch.tensor([[7, 7, 1], [1, 2, 2], [9, 1, 2]])
    mask = torch.tensor([[0, 0, 1], [1, 1, 1], [0, 1, 1]])
    out = gen.ban_bad_words(torch.zeros(3, 10), history, [[7, 1, 5], [2, 2, 4], [1, 2, 8]], attention_mask=mask)
    banned = [set(torch.isinf(row).nonzero().flatten().tolist()) for row in out]
    assert banned == [set(), {4}, {8}], f"banned tokens per row: {banned}"
