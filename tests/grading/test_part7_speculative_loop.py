"""Part 7: the speculative loop, ``speculative_round`` and ``speculative_generate``: exact in
distribution on toy models, the target's greedy text at temperature 0, honest statistics.

How the tests judge, and the statistical tests' bounds: see ``test_part7_speculative.py``.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from sampling_course.beside import made_beside

from doubles import IdTokenizer, IdTokenizerWithVocab, RecordingTokenizer, TrigramModel, counted
from part7_oracles import (
    ORACLE_TARGET,
    PAIR_TOKENIZER,
    REFERENCE_PAIRS,
    TOY_PROMPT,
    assert_cache_holds,
    assert_frequencies_match,
    assert_greedy,
    exact_joint,
    first_layers,
    id_tokenizer,
    random_demo,
    random_table,
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
# speculative_round and the loop around it
# ---------------------------------------------------------------------------------------


def generate(spec_loop, target, draft, prompt: str, n: int, tokenizer=None, **settings):
    tokenizer = id_tokenizer(spec_loop) if tokenizer is None else tokenizer
    text, stats = spec_loop.speculative_generate(target, draft, tokenizer, prompt, n, return_stats=True, **settings)
    return IdTokenizer().encode(text), stats


@pytest.mark.exercise("speculative_round")
def test_speculative_round_keeps_only_accepted_positions(spec, impl, seed, device):
    """One round: 1 to gamma + 1 new tokens; one target forward over the last token and every proposal;
    afterwards each cache holds only the tokens kept (checked here, on the caches' data).
    40 rounds from the same start, which include rejections except with probability < 1e-11."""
    KVC = impl.kv_cache.KeyValueCache
    target, draft = toy_pair(spec)
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.tensor([2, 0, 1])
    target_cache, draft_cache = KVC.new_empty(target.cfg), KVC.new_empty(draft.cfg)
    _, target_cache = target(tokens[None, :2], target_cache)
    lengths = Counter()
    for _ in range(40):
        spy = counted(target)  # its calls are recorded apart, where speculative_round cannot change them
        new, t_cache, d_cache = spec.speculative_round(
            spy, draft, tokens, target_cache, draft_cache, 3, 1.0, 0, 1.0, generator
        )
        lengths[len(new)] += 1
        assert 1 <= len(new) <= 4, f"a round with gamma=3 added {len(new)} tokens"
        calls = spy.calls
        assert calls == [(len(tokens) + 3, 2)], f"expected one target forward over 4 new positions, got {calls}"
        kept = torch.cat([tokens, new])
        assert t_cache.shape[3] == len(kept) - 1, f"the target's cache holds {t_cache.shape[3]} positions, expected {len(kept) - 1}"
        assert d_cache.shape[3] <= len(kept) - 1
        assert_cache_holds(t_cache, kept[: len(kept) - 1], "the target's cache")
        assert_cache_holds(d_cache, kept[: d_cache.shape[3]], "the draft's cache")
    # From this context a round adds 1 token with probability .12 and all 4 with at most .51, so 40 rounds
    # without a rejection, or without an accepted proposal, happen with probability below 1e-11.
    assert min(lengths) < 4 and max(lengths) >= 2, f"40 rounds should see rejections and acceptances, got lengths {dict(lengths)}"


TOY_SETTINGS = [
    pytest.param(dict(gamma=1, temperature=1.0), 2, id="gamma1-T1"),
    pytest.param(dict(gamma=2, temperature=0.6, top_k=2), 3, id="gamma2-T0.6-topk2"),
    pytest.param(dict(gamma=4, temperature=1.4, top_p=0.7), 3, id="gamma4-T1.4-topp0.7"),
]


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("settings, length", TOY_SETTINGS)
def test_output_follows_the_target_distribution_exactly(spec_loop, settings, length, seed):
    """The joint distribution of the first ``length`` generated tokens equals the target's, computed by
    enumerating every continuation with uncached forwards. Chi-square: false-failure probability <= 1e-6."""
    target, draft = toy_pair(spec_loop)
    tokenizer = id_tokenizer(spec_loop)
    filters = {k: v for k, v in settings.items() if k != "gamma"}
    expected = exact_joint(ORACLE_TARGET, IdTokenizer().encode(TOY_PROMPT), length, filters)
    n = sample_size(sum(prob > 0 for prob in expected.values()) - 1)
    torch.manual_seed(seed)  # the runs draw from torch's global generator (seed=None)
    n_prompt = len(TOY_PROMPT.split())
    observed: Counter = Counter()
    for _ in range(n):
        ids, _ = generate(spec_loop, target, draft, TOY_PROMPT, length, tokenizer, **settings)
        observed[tuple(ids[n_prompt:])] += 1
    assert_frequencies_match(observed, expected, n, f"speculative_generate({settings})")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_temperature_zero_is_the_targets_greedy_text_on_toy_models(spec_loop, gamma):
    """Temperature 0: token for token the target's greedy choice, whatever the draft proposes."""
    target, draft = toy_pair(spec_loop)
    for prompt in ("2 0", "1", "3 3 1"):
        ids, stats = generate(spec_loop, target, draft, prompt, 30, gamma=gamma, temperature=0)
        assert_greedy(ORACLE_TARGET, IdTokenizer().encode(prompt), ids, 30, None, f"gamma={gamma}, prompt {prompt!r}")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("gamma", [1, 4])
def test_temperature_zero_is_the_targets_greedy_text_on_random_transformers(spec_loop, impl, gamma, seed):
    """Random small DemoTransformers: an unrelated draft, the target's first layer, and the target itself."""
    target = random_demo(impl.transformer, seed)
    drafts = {
        "unrelated draft": random_demo(impl.transformer, seed + 1, n_layers=1, d_model=16, d_head=4),
        "the target's first layer": first_layers(impl.transformer, target, 1),
        "the target itself": target,
    }
    prompt_ids = torch.randint(0, 16, (5,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompt = IdTokenizer().decode(prompt_ids)
    for name, draft in drafts.items():
        ids, stats = generate(spec_loop, target, draft, prompt, 24, gamma=gamma, temperature=0)
        assert_greedy(target, prompt_ids, ids, 24, None, f"{name}, gamma={gamma}")


@pytest.mark.exercise("speculative_round")
@pytest.mark.downstream  # the learner's own model: greedy within TIE_TOLERANCE of its own argmax
@pytest.mark.parametrize("pair", REFERENCE_PAIRS)
def test_temperature_zero_is_the_targets_greedy_text_on_reference_pairs(spec_loop, impl, pair):
    """The reference models with their tokenizer: greedy speculative text equals the target's greedy text."""
    target, draft, tokenizer = reference_pair(pair, impl.transformer)
    recording = made_beside(spec_loop, RecordingTokenizer, PAIR_TOKENIZER[pair])
    for prompt, gamma in (("Once upon a time", 3), ("The cat sat on the", 5)):
        text = spec_loop.speculative_generate(target, draft, recording, prompt, 40, gamma=gamma, temperature=0)
        assert text == tokenizer.decode(recording.decoded)
        prompt_ids = tokenizer.encode(prompt)
        assert_greedy(target, prompt_ids, recording.decoded, 40, tokenizer.eos_token_id, f"{pair}, {prompt!r}")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("pair", REFERENCE_PAIRS)
def test_speculative_generate_runs_on_part_6_static_caches(spec_loop, impl, pair):
    """cache_class=StaticKeyValueCache: both models keep their keys in part 6's preallocated buffers, which crop
    themselves (crop_cache calls their crop); greedy speculative text is still the target's greedy text."""
    target, draft, tokenizer = reference_pair(pair, impl.transformer)
    recording = made_beside(spec_loop, RecordingTokenizer, PAIR_TOKENIZER[pair])
    for prompt, gamma in (("Once upon a time", 3), ("The cat sat on the", 5)):
        text = spec_loop.speculative_generate(
            target, draft, recording, prompt, 40, gamma=gamma, temperature=0, cache_class=impl.caches.StaticKeyValueCache
        )
        assert text == tokenizer.decode(recording.decoded)
        assert_greedy(target, tokenizer.encode(prompt), recording.decoded, 40, tokenizer.eos_token_id,
                      f"{pair}, {prompt!r}, static caches")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("gamma, n", [(1, 10), (3, 17), (4, 20)])
def test_an_identical_draft_has_every_proposal_accepted(spec_loop, gamma, n):
    """Draft == target: every proposal is accepted and each round adds gamma + 1 tokens (the bonus
    included), so the target runs ceil(n / (gamma + 1)) times. At temperatures other than 1 this also
    catches a temperature applied twice to one side."""
    table = random_table(7, scale=1.5)
    for settings in (dict(temperature=1.0), dict(temperature=0.5, top_k=3), dict(temperature=2.0, top_p=0.8)):
        target, draft = made_beside(spec_loop, TrigramModel, table, "target"), made_beside(spec_loop, TrigramModel, table, "draft")
        target = counted(target)  # its calls are recorded apart, where the loop cannot change them
        ids, stats = generate(spec_loop, target, draft, "1 2", n, gamma=gamma, seed=gamma, **settings)
        rounds = math.ceil(n / (gamma + 1))
        assert len(ids) == 2 + n
        assert stats.acceptance_rate == 1.0, f"{settings}: acceptance rate {stats.acceptance_rate} with the target as its own draft"
        calls = target.calls
        assert stats.target_forwards == rounds == len(calls), (
            f"{settings}: {n} tokens with gamma={gamma} and nothing rejected take {rounds} target forwards; "
            f"stats say {stats.target_forwards}, the target was called {len(calls)} times"
        )
        assert stats.tokens_per_target_forward == pytest.approx(n / rounds)


@pytest.mark.exercise("speculative_round")
def test_stats_count_the_real_forward_passes(spec_loop, seed):
    """Stats agree with spies: target and draft forwards, proposals, and a rate alpha = accepted / judged;
    after the first, every target forward runs at most gamma + 1 new positions. Alpha is strictly between
    0 and 1 except with probability < 1e-10 (no context of the toy pair accepts 3 proposals in a row with
    probability above .3, or rejects the first with probability above .72)."""
    target, draft = (counted(model) for model in toy_pair(spec_loop, n_ctx=128))  # records kept apart
    gamma, n = 3, 80
    ids, stats = generate(spec_loop, target, draft, TOY_PROMPT, n, gamma=gamma, seed=seed)
    target_calls, draft_calls = target.calls, draft.calls
    assert len(ids) == 2 + n and stats.new_tokens == n
    assert stats.target_forwards == len(target_calls) and stats.draft_forwards == len(draft_calls)
    assert all(c is not None for _, c in target_calls + draft_calls), "every forward pass must use a cache"
    assert all(positions - cached <= gamma + 1 for positions, cached in target_calls[1:]), target_calls
    assert sum(stats.accepted_per_round) == stats.accepted <= stats.judged <= stats.proposed
    assert 0 < stats.acceptance_rate < 1 and stats.acceptance_rate == stats.accepted / stats.judged
    assert stats.tokens_per_target_forward == n / stats.target_forwards


@pytest.mark.exercise("speculative_round")
def test_same_seed_same_text_and_eos_ends_it(spec_loop):
    """A seed makes the run reproducible; generation stops right after the end-of-text token."""
    target, draft = toy_pair(spec_loop)
    first = generate(spec_loop, target, draft, TOY_PROMPT, 30, gamma=3, seed=11)[0]
    assert generate(spec_loop, target, draft, TOY_PROMPT, 30, gamma=3, seed=11)[0] == first
    eos = 3
    ending = id_tokenizer(spec_loop, eos)
    for s in range(10):
        ids, stats = generate(spec_loop, target, draft, TOY_PROMPT, 30, gamma=3, seed=s, tokenizer=ending)
        new = ids[2:]
        assert eos not in new[:-1], f"tokens were generated after the end-of-text token: {new}"
        assert new[-1] == eos or len(new) == 30
        assert stats.new_tokens == len(new)


@pytest.mark.exercise("speculative_round")
def test_bad_input_raises_clear_errors(spec, impl, spec_loop):
    """Different vocabularies or tokenizers, gamma < 1, the n_ctx limit, bad settings: ValueError saying what is allowed
    (a cache class without new_empty: TypeError)."""
    target, draft = toy_pair(spec_loop)
    other_vocab = random_demo(impl.transformer, 0, d_vocab=5)
    tok = id_tokenizer(spec_loop)

    def run(*args, **kwargs):
        return spec_loop.speculative_generate(*args, **kwargs)

    with pytest.raises(ValueError, match="vocabular"):
        run(target, other_vocab, tok, "1 2", 5)

    with pytest.raises(ValueError, match="tokenizer"):
        run(target, draft, (made_beside(spec_loop, IdTokenizerWithVocab, {"a": 0}),
                            made_beside(spec_loop, IdTokenizerWithVocab, {"b": 0})), "1 2", 5)
    for gamma in (0, -2, 1.5):
        with pytest.raises(ValueError, match="gamma"):
            run(target, draft, tok, "1 2", 5, gamma=gamma)
    with pytest.raises(ValueError, match="n_ctx"):
        run(target, draft, tok, "1 2", 63)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(target, draft, tok, "1 2", -1)
    with pytest.raises(ValueError, match="temperature"):
        run(target, draft, tok, "1 2", 5, temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        run(target, draft, tok, "1 2", 5, top_p=0.0)
    with pytest.raises(ValueError, match="prompt"):
        run(target, draft, tok, "", 5)
    with pytest.raises(ValueError, match="seed"):
        run(target, draft, tok, "1 2", 5, seed="7")
    with pytest.raises(TypeError, match="draft"):
        run(target, "not a model", tok, "1 2", 5)
    with pytest.raises(TypeError, match="cache_class"):
        run(target, draft, tok, "1 2", 5, cache_class=dict)
    # The limit is the prompt plus max_new_tokens: 2 + 62 positions fit in n_ctx=64.
    shared = made_beside(spec_loop, IdTokenizerWithVocab, {"a": 0})
    ids, stats = generate(spec_loop, target, draft, "1 2", 62, gamma=8, tokenizer=(shared, shared), seed=0)
    assert len(ids) == 64
