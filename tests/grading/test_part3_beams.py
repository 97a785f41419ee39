"""Part 3: the ``Beams`` class, against Hugging Face and against hand-made histories.

* ``Beams.generate`` and ``Beams.filter`` are checked on the stand-in against log-probs
  computed here from ``hf_model``'s logits (shapes, grouping by parent, ordering, sums).
* ``Beams.get_topk_non_repeating`` is checked against Hugging Face's
  ``NoRepeatNGramLogitsProcessor`` on hand-made and random token histories.
* On real GPT-2, the classic course's published "When I was" beams.

``TransformerSampler.beam_search`` and ``BeamHypotheses`` are graded in
test_part3_beam_search.py; the oracles both files use are in part3_oracles.py.

Nothing here is random except the token histories of the n-gram tests, which are drawn
from ``SAMPLING_COURSE_TEST_SEED`` (default 0) and compared exactly with Hugging Face,
so any seed must pass.
"""

from __future__ import annotations

import pytest
import torch

from part3_oracles import ATOL, assert_close, greedy_continuation, hf_all_logprobs, hf_block_ngrams, hf_logprobs
from sampling_course.beside import made_beside
from sampling_course.masked_top_k import MaskedTopK


# ---------------------------------------------------------------------------------------
# Beams: slicing, completions, printing (given, not exercises)
# ---------------------------------------------------------------------------------------


def _hand_beams(impl, tokenizer, model=None):
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]])
    return impl.beams.Beams(model, tokenizer, torch.tensor([-1.0, -2.0, -3.0, -4.0]), tokens)


def test_beams_getitem_slices_the_batch(impl, tiny):
    """beams[i], beams[a:b], beams[index tensor] and beams[bool mask] select along the batch."""
    beams = _hand_beams(impl, tiny.tokenizer)
    assert len(beams) == 4
    for index, rows in [
        (1, [1]),
        (slice(1, 3), [1, 2]),
        (torch.tensor([3, 0]), [3, 0]),
        (torch.tensor([True, False, True, False]), [0, 2]),
    ]:
        part = beams[index]
        assert len(part) == len(rows), index
        assert torch.equal(part.tokens, beams.tokens[rows]), index
        assert torch.equal(part.logprob_sums, beams.logprob_sums[rows]), index
        assert part.tokenizer is beams.tokenizer


def test_logprobs_and_completions_types(impl, tiny):
    """logprobs_and_completions gives (python float, decoded str) for every beam, in order."""
    beams = _hand_beams(impl, tiny.tokenizer)
    pairs = beams.logprobs_and_completions
    assert [type(lp) for lp, _ in pairs] == [float] * 4
    assert [lp for lp, _ in pairs] == [-1.0, -2.0, -3.0, -4.0]
    assert [text for _, text in pairs] == [tiny.tokenizer.decode(row) for row in beams.tokens]


def test_print_renders_a_truncated_table(impl, tiny, capsys):
    """print() renders a titled table of sums and completions, cutting long ones to max_print_chars."""
    tokenizer = tiny.tokenizer
    text = "When I was a kid, John and Mary went to the church and then to the market, " * 2
    long_tokens = torch.tensor(tokenizer.encode(text))[None]
    beams = impl.beams.Beams(None, tokenizer, torch.tensor([-12.3456]), long_tokens)
    beams.print(title="My beams", max_print_chars=40)
    out = capsys.readouterr().out
    assert "My beams" in out and "-12.346" in out
    shown = repr(tokenizer.decode(long_tokens[0]))
    assert shown not in out, "a completion longer than max_print_chars is printed in full"
    assert shown[:15] in out and shown[-15:] in out, "the start and the end of a long completion are kept"


def test_print_shows_brackets_verbatim(impl, tiny, capsys):
    """A completion containing "[...]" is printed as text, not read as rich markup."""
    tokens = torch.tensor(tiny.tokenizer.encode("a [bold]x[/bold] and [/] y"))[None]
    impl.beams.Beams(None, tiny.tokenizer, torch.tensor([-1.0]), tokens).print(max_print_chars=200)
    assert "[bold]x[/bold] and [/] y" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# Beams.generate
# ---------------------------------------------------------------------------------------


def _three_histories(tiny):
    """Three different token histories of the same length from the stand-in's tokenizer."""
    prompts = ["When I was a kid, John", "The cat sat on the mat and", "Jingle bells, jingle all the"]
    ids = [tiny.tokenizer.encode(p) for p in prompts]
    length = min(len(i) for i in ids)
    return torch.tensor([i[:length] for i in ids])


@pytest.mark.exercise("Beams.generate")
@pytest.mark.parametrize("k", [1, 3])
def test_generate_shape_grouping_and_sums(impl, tiny, tiny_demo, oracle, k):
    """generate(k) gives len*k beams grouped by parent in parent order, each group best first,
    with logprob_sums = parent sum + log_softmax of the child token (log-probs, not logits)."""
    tokens = _three_histories(tiny)
    parent_sums = torch.tensor([-1.5, -0.25, -4.0])
    beams = impl.beams.Beams(tiny_demo, tiny.tokenizer, parent_sums, tokens)
    with torch.no_grad():
        children = beams.generate(k=k)

    expected_lp, expected_tok = oracle(hf_logprobs, tiny, tokens).topk(k, dim=-1)
    n, length = tokens.shape
    assert children.tokens.shape == (n * k, length + 1)
    assert children.logprob_sums.shape == (n * k,)
    for parent in range(n):
        for rank in range(k):
            child = parent * k + rank
            assert torch.equal(children.tokens[child, :length], tokens[parent]), (
                f"child {child} should extend parent {parent}: children are grouped by parent, in parent order"
            )
            assert children.tokens[child, -1] == expected_tok[parent, rank], (
                f"child {child} should add parent {parent}'s rank-{rank} token"
            )
    assert_close(
        children.logprob_sums,
        (parent_sums[:, None] + expected_lp).flatten(),
        atol=ATOL,
        rtol=0,
        msg=lambda m: f"logprob_sums should be parent sum + log_softmax(logits) of the new token.\n{m}",
    )


@pytest.mark.exercise("Beams.generate")
def test_generate_from_a_prompt_then_again(impl, tiny, tiny_demo, oracle):
    """Two generate steps from a one-beam prompt give k*k beams whose sums are two-token log-probs."""
    tokens = torch.tensor([tiny.tokenizer.encode("Once upon a time")])
    beams = impl.beams.Beams(tiny_demo, tiny.tokenizer, torch.zeros(1), tokens)
    with torch.no_grad():
        twice = beams.generate(k=2).generate(k=2)
    assert twice.tokens.shape == (4, tokens.shape[1] + 2)
    logits = oracle(hf_all_logprobs, tiny, twice.tokens)
    # Independently: the log-prob of each beam's two new tokens under Hugging Face.
    length = tokens.shape[1]
    expected = logits[:, length - 1, :].gather(1, twice.tokens[:, length, None])[:, 0] + logits[
        :, length, :
    ].gather(1, twice.tokens[:, length + 1, None])[:, 0]
    assert_close(twice.logprob_sums, expected, atol=ATOL, rtol=0)
    first = oracle(hf_logprobs, tiny, tokens).topk(2).indices[0].tolist()
    assert twice.tokens[:, length].tolist() == [first[0], first[0], first[1], first[1]]


@pytest.mark.exercise("Beams.generate")
def test_generate_applies_ngram_blocking(impl, tiny, tiny_demo, oracle, monkeypatch):
    """generate(k, no_repeat_ngram_size=2) proposes HF's top-k after its bigram blocking.

    generate's job is to pass no_repeat_ngram_size on to get_topk_non_repeating, the next
    exercise: so this runs with a stand-in for it (``MaskedTopK``, made beside the code under
    test) that blocks the tokens Hugging Face's blocking blocks for these beams, and grades
    generate alone whether or not get_topk_non_repeating is written yet (and whether it is right).
    """
    start = torch.tensor([tiny.tokenizer.encode("When I was")])
    # The stand-in's greedy continuation repeats itself, so bigram blocking has work to do.
    seq = oracle(greedy_continuation, tiny, start, 30)[0]
    length = 12
    tokens = seq.unfold(0, length, 1)  # every window of the continuation: many histories
    assert len(tokens) > 20
    logprobs = oracle(hf_logprobs, tiny, tokens)
    blocked = oracle(hf_block_ngrams, tokens, logprobs, 2)
    k = 3
    plain = logprobs.topk(k).indices
    expected_lp, expected_tok = blocked.topk(k)
    assert not torch.equal(plain, expected_tok), "precondition: blocking should change some beam's top-k"
    blocked_tokens = torch.isinf(blocked) & ~torch.isinf(logprobs)
    monkeypatch.setattr(impl.beams.Beams, "get_topk_non_repeating", made_beside(impl.beams, MaskedTopK, blocked_tokens, 2))

    beams = impl.beams.Beams(tiny_demo, tiny.tokenizer, torch.zeros(len(tokens)), tokens)
    with torch.no_grad():
        children = beams.generate(k=k, no_repeat_ngram_size=2)
    assert torch.equal(children.tokens[:, -1].view(-1, k), expected_tok)
    assert_close(children.logprob_sums.view(-1, k), expected_lp, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# Beams.filter
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("Beams.filter")
@pytest.mark.parametrize("k", [1, 3, 4, 7])
def test_filter_keeps_the_k_best_and_splits_off_eos(impl, tiny, k):
    """filter(k) takes the k best beams overall and returns (not ended in EOS, ended in EOS), each best first."""
    eos = tiny.tokenizer.eos_token_id
    tokens = torch.tensor(
        [[5, 6, 7], [5, 6, eos], [5, 8, 9], [5, eos, 10], [6, 7, eos], [6, 8, 8], [7, 7, 7]]
    )
    sums = torch.tensor([-3.0, -1.0, -0.5, -2.0, -2.5, -4.0, -0.75])
    beams = impl.beams.Beams(None, tiny.tokenizer, sums, tokens)
    best, ended = beams.filter(k)

    order = sorted(range(len(sums)), key=lambda i: -sums[i].item())[:k]
    want_best = [i for i in order if tokens[i, -1] != eos]
    want_ended = [i for i in order if tokens[i, -1] == eos]
    assert best.tokens.tolist() == tokens[want_best].tolist(), "continuing beams: wrong set or order"
    assert best.logprob_sums.tolist() == sums[want_best].tolist()
    assert ended.tokens.tolist() == tokens[want_ended].tolist(), "beams ending in EOS: wrong set or order"
    assert ended.logprob_sums.tolist() == sums[want_ended].tolist()
    assert (best.tokens[:, -1] != eos).all(), "a beam that ended in EOS was kept alive"


@pytest.mark.exercise("Beams.filter")
def test_filter_after_generate_matches_hf_ranking(impl, tiny, tiny_demo, oracle):
    """generate then filter keeps the k best of all children: HF's top-k of the flattened sums."""
    tokens = _three_histories(tiny)
    parent_sums = torch.tensor([-0.5, -1.0, -0.75])
    beams = impl.beams.Beams(tiny_demo, tiny.tokenizer, parent_sums, tokens)
    k = 4
    with torch.no_grad():
        best, ended = beams.generate(k=k).filter(k)
    lp, tok = oracle(hf_logprobs, tiny, tokens).topk(k, dim=-1)
    flat = (parent_sums[:, None] + lp).flatten()
    top = flat.topk(k).indices
    assert (tok.flatten()[top] != tiny.tokenizer.eos_token_id).all(), "precondition: no child ends in EOS"
    assert len(ended) == 0
    assert best.tokens[:, -1].tolist() == tok.flatten()[top].tolist()
    assert best.tokens[:, :-1].tolist() == tokens[top // k].tolist()
    assert_close(best.logprob_sums, flat[top], atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# Beams.get_topk_non_repeating against NoRepeatNGramLogitsProcessor
# ---------------------------------------------------------------------------------------

# (name, n, token histories, tokens HF blocks in each row: written out as documentation
# and checked against HF itself below)
NGRAM_CASES = [
    ("n=1 blocks every token seen", 1, [[3, 5, 3, 7]], [{3, 5, 7}]),
    ("n=1 one token", 1, [[4]], [{4}]),
    ("n=2 one earlier bigram", 2, [[1, 2, 3, 1]], [{2}]),
    ("n=2 repeated bigram", 2, [[1, 2, 1, 2, 1]], [{2}]),
    ("n=2 the last bigram counts", 2, [[3, 1, 1]], [{1}]),
    ("n=2 several continuations", 2, [[1, 2, 1, 3, 1, 4, 1]], [{2, 3, 4}]),
    ("n=2 constant run", 2, [[4, 4, 4]], [{4}]),
    ("n=2 no match", 2, [[1, 2, 3, 4]], [set()]),
    ("n=3 one earlier trigram", 3, [[1, 2, 3, 1, 2]], [{3}]),
    ("n=3 two continuations", 3, [[1, 2, 3, 1, 2, 5, 1, 2]], [{3, 5}]),
    ("n=3 prefix must match fully", 3, [[1, 2, 3, 4, 2]], [set()]),
    ("n=3 length exactly n", 3, [[1, 1, 1]], [{1}]),
    ("n=3 length exactly n, no match", 3, [[1, 2, 1]], [set()]),
    ("n=3 shorter than n", 3, [[1, 1]], [set()]),
    ("n=4 shorter than n", 4, [[2, 2, 2]], [set()]),
    ("n=4 long history", 4, [[1, 2, 3, 4, 1, 2, 3, 5, 6, 1, 2, 3]], [{4, 5}]),
    ("batch with different histories", 2, [[1, 2, 3, 1], [2, 1, 2, 2], [5, 6, 7, 8]], [{2}, {1, 2}, set()]),
    ("batch n=3", 3, [[1, 2, 3, 1, 2], [2, 2, 2, 2, 2], [1, 2, 1, 2, 1]], [{3}, {2}, {2}]),
]


def _blocked_by_impl(impl, tokenizer, tokens, logprobs, n, hf_blocked):
    """The tokens the implementation leaves out when asked, row by row, for as many tokens as
    Hugging Face leaves unblocked. Blocked tokens are recognised by their absence, so any way
    of blocking them (-inf, or a large negative number such as -1e10) is accepted."""
    blocked = []
    for row in range(len(tokens)):
        k = logprobs.shape[-1] - len(hf_blocked[row])
        beams = impl.beams.Beams(None, tokenizer, torch.zeros(1), tokens[row : row + 1])
        values, indices = beams.get_topk_non_repeating(logprobs[row : row + 1], n, k)
        assert values.shape == indices.shape == (1, k), f"asked for k={k}, got shapes {tuple(values.shape)}, {tuple(indices.shape)}"
        blocked.append(set(range(logprobs.shape[-1])) - set(indices[0].tolist()))
    return blocked


def _check_against_hf(impl, oracle, tokenizer, tokens, logprobs, n, k):
    expected = oracle(hf_block_ngrams, tokens, logprobs, n)
    hf_blocked = [set(torch.nonzero(row == float("-inf")).flatten().tolist()) for row in expected]
    assert _blocked_by_impl(impl, tokenizer, tokens, logprobs, n, hf_blocked) == hf_blocked, (
        f"blocked tokens differ from Hugging Face's no_repeat_ngram_size={n} on {tokens.tolist()}"
    )
    k = min(k, min(logprobs.shape[-1] - len(b) for b in hf_blocked))
    beams = impl.beams.Beams(None, tokenizer, torch.zeros(len(tokens)), tokens)
    values, indices = beams.get_topk_non_repeating(logprobs, n, k)
    want_values, want_indices = expected.topk(k, dim=-1)
    assert torch.equal(indices, want_indices), f"top-{k} differs from Hugging Face's on {tokens.tolist()}"
    assert_close(values, want_values)
    return hf_blocked


@pytest.mark.exercise("Beams.get_topk_non_repeating")
@pytest.mark.parametrize("name, n, history, blocked", NGRAM_CASES, ids=[c[0] for c in NGRAM_CASES])
def test_ngram_blocking_matches_hf_on_hand_made_histories(impl, tiny, oracle, seed, name, n, history, blocked):
    """On hand-made histories the blocked tokens and the top-k equal NoRepeatNGramLogitsProcessor's."""
    tokens = torch.tensor(history)
    generator = torch.Generator().manual_seed(seed)
    logprobs = torch.randn(len(history), 12, generator=generator).log_softmax(dim=-1)
    hf_blocked = _check_against_hf(impl, oracle, tiny.tokenizer, tokens, logprobs, n, k=4)
    assert hf_blocked == blocked, "the documented expectation disagrees with Hugging Face"


@pytest.mark.exercise("Beams.get_topk_non_repeating")
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ngram_blocking_matches_hf_on_random_histories(impl, tiny, oracle, seed, n):
    """On random histories over a small vocabulary (many repeats), blocking and top-k equal HF's."""
    generator = torch.Generator().manual_seed(seed * 1000 + n)
    # Three tokens: repeats everywhere (8 rows of up to 20 tokens see dozens of blocks for
    # n = 4, so the precondition below fails with probability < 1e-15).
    vocab, rows = 3, 8
    checked_any_block = False
    for length in range(1, 21):
        tokens = torch.randint(0, vocab, (rows, length), generator=generator)
        # Tokens never seen in the history sit above `vocab`, so that n=1 leaves some unblocked.
        logprobs = torch.randn(rows, vocab + 4, generator=generator).log_softmax(dim=-1)
        hf_blocked = _check_against_hf(impl, oracle, tiny.tokenizer, tokens, logprobs, n, k=3)
        checked_any_block |= any(hf_blocked)
    assert checked_any_block, "precondition: some random history should block a token"


@pytest.mark.exercise("Beams.get_topk_non_repeating")
def test_ngram_blocking_none_is_plain_topk(impl, tiny, seed):
    """no_repeat_ngram_size=None is plain top-k, even on a history full of repeats."""
    tokens = torch.tensor([[1, 1, 1, 1], [2, 3, 2, 3]])
    logprobs = torch.randn(2, 10, generator=torch.Generator().manual_seed(seed)).log_softmax(-1)
    beams = impl.beams.Beams(None, tiny.tokenizer, torch.zeros(2), tokens)
    values, indices = beams.get_topk_non_repeating(logprobs, None, 5)
    want_values, want_indices = logprobs.topk(5, dim=-1)
    assert torch.equal(indices, want_indices)
    assert_close(values, want_values)


# ---------------------------------------------------------------------------------------
# Real GPT-2: the classic course's published "When I was" beams
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_prompt_beam(gpt2, gpt2_demo, impl):
    """One beam holding "When I was", on the implementation under test's DemoTransformer."""
    tokens = gpt2.tokenizer.encode("When I was", return_tensors="pt")
    return impl.beams.Beams(gpt2_demo, gpt2.tokenizer, torch.zeros(1), tokens)


@torch.no_grad()
def when_i_was_top3(gpt2_prompt_beam):
    """The classic start: the three best one-token continuations of "When I was"."""
    return gpt2_prompt_beam.generate(k=3)


@pytest.mark.gpt2
@pytest.mark.exercise("Beams.generate")
def test_gpt2_when_i_was_generate(gpt2, gpt2_prompt_beam, oracle):
    """generate(3, no_repeat_ngram_size=1) after "When I was" + top 3: " a kid" -3.1, " a child" -4.8,
    " a little" -4.9 first (the classic course's values), with sums equal to HF's log-probs."""
    with torch.no_grad():
        beams = when_i_was_top3(gpt2_prompt_beam).generate(k=3, no_repeat_ngram_size=1)
    assert len(beams) == 9
    expected = [(-3.1, "When I was a kid"), (-4.8, "When I was a child"), (-4.9, "When I was a little")]
    got = beams.logprobs_and_completions[:3]
    assert [text for _, text in got] == [text for _, text in expected]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in expected], abs=0.1)
    logprobs = oracle(hf_all_logprobs, gpt2, beams.tokens)
    length = beams.tokens.shape[1]
    live = logprobs[:, length - 3].gather(1, beams.tokens[:, length - 2, None])[:, 0] + logprobs[
        :, length - 2
    ].gather(1, beams.tokens[:, length - 1, None])[:, 0]
    assert_close(beams.logprob_sums, live, atol=1e-3, rtol=0)


@pytest.mark.gpt2
@pytest.mark.exercise("Beams.filter")
def test_gpt2_when_i_was_filter(gpt2_prompt_beam):
    """filter(3) of those nine beams: " a kid" -3.1, " growing up" -3.2, " in the" -4.6, none ended."""
    with torch.no_grad():
        best, ended = when_i_was_top3(gpt2_prompt_beam).generate(k=3, no_repeat_ngram_size=1).filter(3)
    expected = [(-3.1, "When I was a kid"), (-3.2, "When I was growing up"), (-4.6, "When I was in the")]
    got = best.logprobs_and_completions
    assert [text for _, text in got] == [text for _, text in expected]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in expected], abs=0.1)
    assert len(ended) == 0


@pytest.mark.gpt2
@pytest.mark.exercise("Beams.get_topk_non_repeating")
def test_gpt2_when_i_was_ngram_blocking(gpt2_prompt_beam):
    """Five greedy steps of each beam repeat "I was"; with no_repeat_ngram_size=2 none does."""
    prompt = "When I was"
    free = blocked = when_i_was_top3(gpt2_prompt_beam)
    with torch.no_grad():
        for _ in range(5):
            free = free.generate(k=1)
            blocked = blocked.generate(k=1, no_repeat_ngram_size=2)
    assert all("I was" in text.removeprefix(prompt) for _, text in free.logprobs_and_completions)
    assert all("I was" not in text.removeprefix(prompt) for _, text in blocked.logprobs_and_completions)
