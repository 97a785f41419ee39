"""Part 3: beam search, against Hugging Face and against toy models with a known answer.

* Toy models whose next-token distribution depends on the last token only (``BigramModel``
  in tests/doubles.py) give exact answers: beam search beating greedy, and EOS handling
  (early return, finished beams never extended).
* ``TransformerSampler.beam_search`` is checked against ``GPT2LMHeadModel.generate`` with
  ``num_beams`` (summed log-probs: ``length_penalty=0``, ``early_stopping="never"``), on
  prompts where no beam reaches EOS: there HF's algorithm and the classic one coincide.
* ``BeamHypotheses`` (length-normalised scores, Hugging Face's stopping rule) is checked on
  hand-made beams against a transcription of HF's rule, and ``beam_search`` with
  ``length_penalty``/``early_stopping`` against ``generate(num_beams=...)`` for every
  combination, on the stand-in and the story model, where beams end at different lengths.

The ``Beams`` class these build on is graded in test_part3_beams.py; the oracles both
files use are in part3_oracles.py. Nothing here is random.
"""

from __future__ import annotations

import math

import pytest

from doubles import BigramModel, counted
from part3_oracles import (
    ATOL, RTOL, EosAs, assert_same_beams, hf_beam_search, hf_is_done, hf_normalised_beams, normalised_beam_case,
    random_prompt,
)
from sampling_course.beside import made_beside
from sampling_course.implementation import load_demo


# ---------------------------------------------------------------------------------------
# Toy models with a known answer
# ---------------------------------------------------------------------------------------


def _word_ids(tokenizer, *words):
    ids = [tokenizer.encode(w) for w in words]
    assert all(len(i) == 1 for i in ids), "each toy word must be one token"
    return [i[0] for i in ids]


@pytest.mark.exercise("beam_search")
def test_beam_search_beats_greedy_on_a_toy_model(impl, tiny):
    """Greedy takes the likelier first token; beam search finds the likelier two-token sequence,
    with its exact summed log-probability."""
    tok = tiny.tokenizer
    a, b, c, d, e, x = _word_ids(tok, " the", " cat", " dog", " sat", " on", " big")
    others = [t for t in range(10, 30) if t not in (a, b, c, d, e, x)][:8]
    table = {
        a: {b: 0.6, c: 0.4},
        b: {x: 0.2, **{t: 0.1 for t in others}},
        c: {d: 0.9, e: 0.1},
    }
    # b's logits sit 5 higher: ranking by raw logits would prefer " cat big".
    model = made_beside(impl.sampling, BigramModel, tiny.cfg, table, {b: 5.0})  # where beam_search calls it
    sampler = impl.sampling.TransformerSampler(model, tok)

    prompt = tok.decode([a])
    # Greedy, independently: argmax of the table twice, on a twin of the model.
    twin = BigramModel(tiny.cfg, table, offsets={b: 5.0})
    greedy = [a]
    for _ in range(2):
        greedy.append(int(twin.logits[greedy[-1]].argmax()))
    assert greedy == [a, b, x]

    out = sampler.beam_search(prompt, num_return_sequences=2, num_beams=2, max_new_tokens=2)
    assert [text for _, text in out] == [tok.decode([a, c, d]), tok.decode([a, b, x])]
    assert out[0][0] == pytest.approx(math.log(0.4 * 0.9), abs=ATOL)
    assert out[1][0] == pytest.approx(math.log(0.6 * 0.2), abs=ATOL)
    assert out[0][0] > out[1][0], "beam search's answer should be likelier than greedy's"


@pytest.mark.exercise("beam_search")
def test_beam_search_returns_finished_beams_first_and_never_extends_them(impl, tiny):
    """A beam that ends in EOS is set aside (not extended, even though EOS is followed by a
    likely token) and returned first, followed by the best live beams."""
    tok = tiny.tokenizer
    eos = tok.eos_token_id
    a, b, c, d, e, z = _word_ids(tok, " the", " cat", " dog", " sat", " on", " big")
    table = {
        a: {eos: 0.5, b: 0.3, c: 0.2},
        b: {d: 0.9, e: 0.1},
        c: {e: 0.6, d: 0.4},
        eos: {z: 0.99, d: 0.01},  # what a beam kept alive after EOS would grow into
    }
    model = made_beside(impl.sampling, BigramModel, tiny.cfg, table)
    sampler = impl.sampling.TransformerSampler(model, tok)
    out = sampler.beam_search(tok.decode([a]), num_return_sequences=3, num_beams=3, max_new_tokens=2)
    texts = [text for _, text in out]
    assert texts == [tok.decode([a, eos]), tok.decode([a, b, d]), tok.decode([a, c, e])], (
        f"expected the finished beam, then the two best live ones; got {texts}"
    )
    assert [lp for lp, _ in out] == pytest.approx([math.log(0.5), math.log(0.27), math.log(0.12)], abs=ATOL)
    for text in texts:
        assert tok.eos_token not in text or text.index(tok.eos_token) == len(text) - len(tok.eos_token), (
            f"a beam was extended past EOS: {text!r}"
        )


@pytest.mark.exercise("beam_search")
def test_beam_search_returns_early_once_enough_beams_finished(impl, tiny):
    """With num_return_sequences finished beams, beam search stops and returns them, in the
    order they finished, without running further steps."""
    tok = tiny.tokenizer
    eos = tok.eos_token_id
    a, b, d = _word_ids(tok, " the", " cat", " sat")
    table = {a: {eos: 0.5, b: 0.3, d: 0.2}, b: {eos: 0.6, d: 0.4}, d: {b: 1.0}}

    # made where beam_search calls it; its calls are recorded apart, where beam_search cannot change the record
    model = counted(made_beside(impl.sampling, BigramModel, tiny.cfg, table))
    sampler = impl.sampling.TransformerSampler(model, tok)
    out = sampler.beam_search(tok.decode([a]), num_return_sequences=1, num_beams=3, max_new_tokens=10)
    assert [text for _, text in out] == [tok.decode([a, eos])]
    assert out[0][0] == pytest.approx(math.log(0.5), abs=ATOL)
    assert max(positions for positions, _ in model.calls) == 1, "beam search kept going after enough beams had finished"

    # Two beams: " the<eos>" finishes at step 1, " the cat<eos>" at step 2 (0.3 * 0.6 beats
    # " the cat sat" at 0.12), then it must stop.
    model = counted(made_beside(impl.sampling, BigramModel, tiny.cfg, table))
    sampler = impl.sampling.TransformerSampler(model, tok)
    out = sampler.beam_search(tok.decode([a]), num_return_sequences=2, num_beams=2, max_new_tokens=10)
    assert [text for _, text in out] == [tok.decode([a, eos]), tok.decode([a, b, eos])]
    assert [lp for lp, _ in out] == pytest.approx([math.log(0.5), math.log(0.18)], abs=ATOL)
    assert max(positions for positions, _ in model.calls) == 2, "beam search kept going after enough beams had finished"


# ---------------------------------------------------------------------------------------
# beam_search against Hugging Face generate
# ---------------------------------------------------------------------------------------


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("beam_search")
@pytest.mark.parametrize("ngram", [None, 2], ids=["no-ngram-block", "ngram-2"])
@pytest.mark.parametrize("num_beams", [2, 4])
@pytest.mark.parametrize("prompt_seed", [0, 1, 2, 3])
def test_beam_search_matches_hf_generate(tiny, tiny_sampler, oracle, prompt_seed, num_beams, ngram):
    """beam_search returns HF generate(num_beams=nb, num_return_sequences=nb) beams, in HF's order,
    with HF's summed log-probs, on prompts where no beam reaches EOS."""
    prompt = random_prompt(tiny.tokenizer, prompt_seed)
    steps = 10
    expected = oracle(hf_beam_search, tiny, prompt, num_beams, steps, ngram)
    if ngram is not None:
        assert expected != oracle(hf_beam_search, tiny, prompt, num_beams, steps, None), (
            "precondition: n-gram blocking should change Hugging Face's answer on this prompt"
        )
    actual = tiny_sampler.beam_search(prompt, num_beams, num_beams, steps, no_repeat_ngram_size=ngram)
    assert_same_beams(actual, expected)


@pytest.mark.exercise("beam_search")
def test_beam_search_fewer_return_sequences_are_hfs_best(tiny, tiny_sampler, oracle):
    """num_return_sequences < num_beams returns the best of HF's beams, best first."""
    prompt = random_prompt(tiny.tokenizer, 4)
    expected = oracle(hf_beam_search, tiny, prompt, 4, 12, 2)
    assert_same_beams(tiny_sampler.beam_search(prompt, 2, 4, 12, no_repeat_ngram_size=2), expected[:2])


# The classic method checks its one precondition with `assert num_return_sequences <= num_beams`:
# an AssertionError there (with or without a message) is as right as a ValueError.
CLASSIC_ASSERT = (ValueError, AssertionError)


@pytest.mark.exercise("beam_search")
def test_beam_search_rejects_more_returns_than_beams(tiny_sampler):
    """The classic method's one precondition, num_return_sequences <= num_beams: a ValueError naming
    it, or the classic ``assert num_return_sequences <= num_beams``."""
    with pytest.raises(CLASSIC_ASSERT) as raised:
        tiny_sampler.beam_search("When I was", num_return_sequences=3, num_beams=2, max_new_tokens=3)
    if raised.type is not AssertionError:  # a bare assert has no message to name the argument
        raised.match("num_return_sequences")


# Not graded as the learner's (no exercise marker): these checks are given code, above the
# learner's region, and a learner who writes beam_search whole (as the classic course's
# notebook has it) need not repeat them. They check the course's own beam_search.
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_return_sequences=0, num_beams=2), "num_return_sequences"),
        (dict(num_return_sequences=1, num_beams=0), "num_beams"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(prompt=""), "prompt"),
        (dict(no_repeat_ngram_size=0), "no_repeat_ngram_size"),
        (dict(no_repeat_ngram_size=-2), "no_repeat_ngram_size"),
        (dict(max_new_tokens=200), "n_ctx"),
    ],
    ids=["zero-returns", "zero-beams", "negative-steps", "empty-prompt", "ngram-0", "ngram-negative", "past-n_ctx"],
)
def test_beam_search_rejects_bad_arguments(tiny_sampler, kwargs, match):
    """Bad arguments raise a ValueError naming the argument."""
    args = dict(prompt="When I was", num_return_sequences=1, num_beams=2, max_new_tokens=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tiny_sampler.beam_search(**args)


# ---------------------------------------------------------------------------------------
# Length-normalised beams: BeamHypotheses and Hugging Face's beam search
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("BeamHypotheses")
@pytest.mark.parametrize("length_penalty", [0.0, 0.5, 1.0, 2.0, -1.0])
def test_beam_hypotheses_score_and_keep_the_best(impl, length_penalty):
    """score = sum / length ** length_penalty; add keeps the num_beams best by score, best first, as
    (score, sum, beam)."""
    hyps = impl.beams.BeamHypotheses(3, length_penalty, False, 20)
    beams = [(-6.0, 3, "a"), (-9.0, 9, "b"), (-2.5, 1, "c"), (-7.5, 5, "d"), (-12.0, 12, "e"), (-4.0, 2, "f")]
    for logprob_sum, length, beam in beams:
        assert hyps.score(logprob_sum, length) == pytest.approx(logprob_sum / length**length_penalty)
        hyps.add(logprob_sum, length, beam)
    ranked = sorted(((s / n**length_penalty, s, b) for s, n, b in beams), reverse=True)[:3]
    assert len(hyps) == 3
    assert [b for _, _, b in hyps.hypotheses] == [b for _, _, b in ranked], (
        f"kept {[b for _, _, b in hyps.hypotheses]}, the three best by score are {[b for _, _, b in ranked]}"
    )
    assert [s for s, _, _ in hyps.hypotheses] == pytest.approx([s for s, _, _ in ranked])
    assert [s for _, s, _ in hyps.hypotheses] == pytest.approx([s for _, s, _ in ranked])


@pytest.mark.exercise("BeamHypotheses")
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -1.0])
def test_beam_hypotheses_is_done_follows_hf(impl, early_stopping, length_penalty):
    """is_done agrees with the transcription of Hugging Face's rule above, for finished sets of every size and best
    running beams above, near and below the worst finished score, at several lengths."""
    finished = [(-3.0, 3), (-5.0, 6), (-4.2, 2), (-6.5, 8)]
    for n_finished in range(len(finished) + 1):
        hyps = impl.beams.BeamHypotheses(3, length_penalty, early_stopping, 12)
        for i, (logprob_sum, length) in enumerate(finished[:n_finished]):
            hyps.add(logprob_sum, length, i)
        kept = [s for s, _, _ in hyps.hypotheses]
        for best_running_sum in (-0.5, -2.0, -4.0, -6.0, -9.0, -20.0):
            for length in (1, 4, 9):
                expected = hf_is_done(3, length_penalty, early_stopping, 12, kept, best_running_sum, length)
                assert hyps.is_done(best_running_sum, length) == expected, (
                    f"{n_finished} finished (scores {kept}), best running sum {best_running_sum} over {length} "
                    f"tokens, early_stopping={early_stopping!r}: Hugging Face says done={expected}"
                )


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("BeamHypotheses")
@pytest.mark.parametrize("reference_name", ["tiny", "story"])
def test_length_normalised_beam_search_matches_hf(impl, reference_name, oracle):
    """beam_search(..., length_penalty=lp, early_stopping=es) returns Hugging Face generate(num_beams=3)'s beams in
    its order with its sequences_scores, for lp in 0, 1, 2, -1 and early_stopping True, False, "never", with beams
    ending (in the end-of-text token) at different lengths. Which beams win changes with the settings (checked), so
    every setting is really compared. Setting only one of the two uses Hugging Face's default for the other."""
    reference, prompt, eos, new = normalised_beam_case(reference_name, oracle)
    sampler = impl.sampling.TransformerSampler(load_demo(reference, impl.transformer), EosAs(reference.tokenizer, eos))
    answers = set()
    for length_penalty in (0.0, 1.0, 2.0, -1.0):
        for early_stopping in (True, False, "never"):
            expected = oracle(hf_normalised_beams, reference, prompt, 3, new, length_penalty, early_stopping, eos)
            actual = sampler.beam_search(prompt, 3, 3, new, length_penalty=length_penalty, early_stopping=early_stopping)
            assert [text for _, text in actual] == [text for _, text in expected], (
                f"length_penalty={length_penalty}, early_stopping={early_stopping!r}: different beams or order than "
                f"Hugging Face.\nyours: {[t for _, t in actual]}\nHF:    {[t for _, t in expected]}"
            )
            assert [s for s, _ in actual] == pytest.approx([s for s, _ in expected], rel=RTOL, abs=ATOL), (
                f"length_penalty={length_penalty}, early_stopping={early_stopping!r}: scores differ from sequences_scores"
            )
            answers.add(tuple(text for _, text in expected))
    assert len(answers) >= 3, f"precondition: the settings should change the answer, got {len(answers)} answers"
    only_penalty = sampler.beam_search(prompt, 3, 3, new, length_penalty=2.0)
    assert only_penalty == sampler.beam_search(prompt, 3, 3, new, length_penalty=2.0, early_stopping=False)


# ---------------------------------------------------------------------------------------
# Real GPT-2
# ---------------------------------------------------------------------------------------


@pytest.mark.gpt2
@pytest.mark.exercise("beam_search")
@pytest.mark.parametrize("ngram", [None, 2], ids=["no-ngram-block", "ngram-2"])
@pytest.mark.parametrize("num_beams", [2, 4])
def test_gpt2_beam_search_matches_hf_generate(gpt2, gpt2_demo, impl, oracle, num_beams, ngram):
    """On real GPT-2, beam_search equals HF generate's beams and summed log-probs."""
    sampler = impl.sampling.TransformerSampler(gpt2_demo, gpt2.tokenizer)
    for prompt in ["When I was", "The ships hung in the sky in much the same way that"]:
        expected = oracle(hf_beam_search, gpt2, prompt, num_beams, 10, ngram)
        actual = sampler.beam_search(prompt, num_beams, num_beams, 10, no_repeat_ngram_size=ngram)
        assert [text for _, text in actual] == [text for _, text in expected]
        assert [lp for lp, _ in actual] == pytest.approx([lp for lp, _ in expected], abs=1e-3)
