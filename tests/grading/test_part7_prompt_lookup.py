"""Part 7: prompt-lookup drafting, ``prompt_lookup`` against a transcription of its definition, and
the loop with it as the draft: exact in distribution, the target's greedy text at temperature 0.

How the tests judge, and the statistical tests' bounds: see ``test_part7_speculative.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from sampling_course.beside import made_beside

from doubles import IdTokenizer, RecordingTokenizer, counted
from part7_oracles import (
    ORACLE_TARGET,
    PAIR_TOKENIZER,
    REFERENCE_PAIRS,
    assert_frequencies_match,
    assert_greedy,
    exact_joint,
    id_tokenizer,
    reference_pair,
    sample_size,
    toy_pair,
)


@pytest.fixture(scope="module")
def spec(impl):
    return impl.speculative


@pytest.fixture(scope="module")
def spec_loop(impl):
    return impl.speculative_loop


# ---------------------------------------------------------------------------------------
# Prompt-lookup drafting
# ---------------------------------------------------------------------------------------


def oracle_prompt_lookup(tokens: list[int], num_tokens: int, max_ngram_size: int) -> list[int]:
    """The definition, transcribed: for n from max_ngram_size down to 1, the most recent earlier occurrence of the
    last n tokens (not the ending itself) with at least one token after it; the up to num_tokens tokens after it."""
    length = len(tokens)
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        ending = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == ending:
                return tokens[start + n : start + n + num_tokens]
    return []


LOOKUP_CASES = [
    ("a repeated phrase", [1, 2, 3, 4, 9, 1, 2], 3, 2, [3, 4, 9]),
    ("the longest n-gram wins", [5, 2, 7, 6, 2, 8, 5, 2], 2, 2, [7, 6]),
    ("the most recent occurrence", [1, 2, 3, 1, 2, 4, 1, 2], 1, 2, [4]),
    ("an occurrence overlapping the ending", [4, 4, 4, 4], 3, 2, [4]),
    ("falls back to a shorter n-gram", [1, 2, 3, 9, 3], 2, 3, [9, 3]),
    ("cut where the text ends", [1, 2, 3, 1], 5, 2, [2, 3, 1]),
    ("no match", [1, 2, 3, 4], 3, 2, []),
    ("one token", [7], 3, 2, []),
]


@pytest.mark.exercise("prompt_lookup")
@pytest.mark.parametrize("name, tokens, num_tokens, max_ngram_size, expected", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_prompt_lookup_on_hand_made_texts(spec, name, tokens, num_tokens, max_ngram_size, expected):
    """Each case's answer (written out, and checked against the transcription of the definition)."""
    assert oracle_prompt_lookup(tokens, num_tokens, max_ngram_size) == expected, "the documented answer disagrees with the definition"
    got = spec.prompt_lookup(torch.tensor(tokens), num_tokens, max_ngram_size)
    assert isinstance(got, torch.Tensor) and got.ndim == 1, f"prompt_lookup must return a 1-D tensor, got {got!r}"
    assert got.tolist() == expected, f"{name}: proposed {got.tolist()}, expected {expected}"


@pytest.mark.exercise("prompt_lookup")
def test_prompt_lookup_on_random_texts(spec, seed):
    """On random texts over 3 and 5 tokens (matches everywhere) of every length up to 25, for several sizes."""
    generator = torch.Generator().manual_seed(seed + 700)
    for vocab in (3, 5):
        for length in range(1, 26):
            tokens = torch.randint(0, vocab, (length,), generator=generator)
            for num_tokens, max_ngram_size in ((1, 1), (4, 2), (3, 3), (6, 4)):
                expected = oracle_prompt_lookup(tokens.tolist(), num_tokens, max_ngram_size)
                got = spec.prompt_lookup(tokens, num_tokens, max_ngram_size).tolist()
                assert got == expected, f"{tokens.tolist()} (num_tokens={num_tokens}, n={max_ngram_size}): {got}, expected {expected}"


def lookup_generate(spec_loop, target, prompt: str, n: int, tokenizer=None, **settings):
    tokenizer = id_tokenizer(spec_loop) if tokenizer is None else tokenizer
    text, stats = spec_loop.speculative_generate(target, None, tokenizer, prompt, n, return_stats=True, **settings)
    return IdTokenizer().encode(text), stats


LOOKUP_PROMPT = "1 2 0 1 2 3 1 2"  # the ending "1 2" occurs twice before: proposals from the first round on
LOOKUP_SETTINGS = [
    pytest.param(dict(prompt_lookup_num_tokens=3, temperature=1.0), 2, id="k3-T1"),
    pytest.param(dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, temperature=0.7, top_k=3), 3, id="k2-n1-T0.7-topk3"),
]


@pytest.mark.exercise("prompt_lookup")
@pytest.mark.parametrize("settings, length", LOOKUP_SETTINGS)
def test_prompt_lookup_output_follows_the_target_distribution_exactly(spec_loop, settings, length, seed):
    """With prompt-lookup drafting, the joint distribution of the first ``length`` tokens equals the target's,
    computed by enumeration (chi-square; false-failure probability <= 1e-6), and proposals were judged."""
    target, _ = toy_pair(spec_loop)
    tokenizer = id_tokenizer(spec_loop)
    filters = {k: v for k, v in settings.items() if k in ("temperature", "top_k", "top_p")}
    expected = exact_joint(ORACLE_TARGET, IdTokenizer().encode(LOOKUP_PROMPT), length, filters)
    n = sample_size(sum(prob > 0 for prob in expected.values()) - 1)
    torch.manual_seed(seed)
    n_prompt = len(LOOKUP_PROMPT.split())
    observed: Counter = Counter()
    judged = 0
    for _ in range(n):
        ids, stats = lookup_generate(spec_loop, target, LOOKUP_PROMPT, length, tokenizer, **settings)
        observed[tuple(ids[n_prompt:])] += 1
        judged += stats.judged
    assert judged > 0, "no proposal was judged: the prompt lookup never proposed"
    assert_frequencies_match(observed, expected, n, f"prompt-lookup speculative_generate({settings})")


@pytest.mark.exercise("prompt_lookup")
def test_prompt_lookup_is_the_targets_greedy_text_and_counts_no_draft_forwards(spec, impl, spec_loop):
    """Temperature 0: the target's greedy text, token for token, on toy models and the reference pairs' targets;
    the stats count target forwards only."""
    model, _ = toy_pair(spec_loop)
    for prompt in ("2 0", "1 2 0 1 2", "3 3 1"):
        target = counted(model)  # its calls are recorded apart, where the loop cannot change them
        ids, stats = lookup_generate(spec_loop, target, prompt, 30, prompt_lookup_num_tokens=4, temperature=0)
        assert stats.draft_forwards == 0 and stats.target_forwards == len(target.calls) > 0
        assert_greedy(ORACLE_TARGET, IdTokenizer().encode(prompt), ids, 30, None, f"prompt lookup, prompt {prompt!r}")
    for pair in REFERENCE_PAIRS:
        model, _, tokenizer = reference_pair(pair, impl.transformer)
        recording = made_beside(spec_loop, RecordingTokenizer, PAIR_TOKENIZER[pair])
        text, stats = spec_loop.speculative_generate(model, None, recording, "Once upon a time", 60, temperature=0,
                                                prompt_lookup_num_tokens=5, return_stats=True)
        assert text == tokenizer.decode(recording.decoded)
        assert_greedy(model, tokenizer.encode("Once upon a time"), recording.decoded, 60, tokenizer.eos_token_id, pair)
        assert stats.draft_forwards == 0 and stats.proposed > 0


@pytest.mark.exercise("prompt_lookup")
def test_prompt_lookup_settings_are_checked(spec, spec_loop):
    target, draft = toy_pair(spec_loop)
    tok = id_tokenizer(spec_loop)
    with pytest.raises(ValueError, match="draft=None"):
        spec_loop.speculative_generate(target, draft, tok, "1 2", 4, prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="max_matching_ngram_size"):
        spec_loop.speculative_generate(target, None, tok, "1 2", 4, prompt_lookup_num_tokens=3, max_matching_ngram_size=0)
    with pytest.raises(ValueError, match="num_tokens"):
        spec.prompt_lookup(torch.tensor([1, 2]), 0)
