"""Part 5b: ``generate(num_beams=...)``, Hugging Face's beam search over a padded batch."""

from __future__ import annotations

import pytest
import torch

from sampling_course.implementation import load_demo

from part5_shared import assert_same_tokens, hf_logits_alone, left_padded, Part5, TOL


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# generate(num_beams=...): Hugging Face's beam search in the engine
# ---------------------------------------------------------------------------------------

# Story prompts of different lengths; the end-of-text token is "." for these tests, so that beams finish at
# sentence ends, after different numbers of tokens, and length_penalty and early_stopping change the answer.
BEAM_PROMPTS = ["One day, Max and Sunny went to the", "Later, it was raining. Max and Sunny stayed inside and"]
BEAM_SETTINGS = [(lp, es) for lp in (0.0, 1.0, 2.0, -1.0) for es in (True, False, "never")]


@pytest.fixture(scope="module")
def story_demo(story, impl):
    return load_demo(story, impl.transformer)


def hf_beam_generate(reference, ids: torch.Tensor, mask: torch.Tensor, new: int, length_penalty: float,
                     early_stopping: bool | str, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle: Hugging Face's beam search (3 beams, 2 returned) on a left-padded batch: (sequences, sequences_scores)."""
    out = reference.hf_model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, num_beams=3,
                                      num_return_sequences=2, length_penalty=length_penalty,
                                      early_stopping=early_stopping, eos_token_id=eos, pad_token_id=eos,
                                      output_scores=True, return_dict_in_generate=True)
    return out.sequences, out.sequences_scores


# Graded as generate's: the engine's beams run part 3's BeamHypotheses through part 5's padded batch, so a
# learner meets them once part 5 is written (part 3's own tests already grade BeamHypotheses alone).
@pytest.mark.exercise("generate")
def test_engine_beam_search_matches_hf_for_every_setting(gen, story_demo, story, oracle):
    """generate(num_beams=3, num_return_sequences=2, length_penalty=lp, early_stopping=es) on two left-padded
    story prompts equals Hugging Face generate with the same settings: the same sequences (padded at the end), the
    same sequences_scores, for lp in 0, 1, 2, -1 and early_stopping True, False, "never". Which beams win changes
    with the settings (checked), so each setting is really compared."""
    tok, new = story.tokenizer, 10
    dot = tok.encode(".")[0]
    ids, mask = left_padded([tok.encode(p) for p in BEAM_PROMPTS], dot)
    answers = set()
    for lp, es in BEAM_SETTINGS:
        out = gen.generate(story_demo, tok, BEAM_PROMPTS, new, temperature=0.0, num_beams=3, num_return_sequences=2,
                           length_penalty=lp, early_stopping=es, eos_token_id=dot, return_dict_in_generate=True)
        sequences, sequences_scores = oracle(hf_beam_generate, story, ids, mask, new, lp, es, dot)
        assert_same_tokens(out.sequences, sequences, f"beams with length_penalty={lp}, early_stopping={es!r}")
        torch.testing.assert_close(out.sequences_scores, sequences_scores, **TOL,
                                   msg=lambda m: f"sequences_scores, length_penalty={lp}, early_stopping={es!r}.\n{m}")
        answers.add(tuple(map(tuple, sequences.tolist())))
    assert len(answers) >= 4, f"precondition: the settings should give different answers, got {len(answers)}"


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("generate")
def test_engine_beam_search_scores_are_its_tokens(gen, story_demo, story, oracle):
    """With return_dict_in_generate, a beam's per-token logprobs are its tokens' log-probabilities under the model
    (NaN past its end) and sum to its score times length ** length_penalty (no processor here)."""
    tok, lp = story.tokenizer, 1.0
    dot = tok.encode(".")[0]
    out = gen.generate(story_demo, tok, BEAM_PROMPTS[:2], 12, temperature=0.0, num_beams=3, num_return_sequences=3,
                       length_penalty=lp, eos_token_id=dot, return_dict_in_generate=True)
    width = out.sequences.shape[1] - out.logprobs.shape[1]
    for r in range(out.sequences.shape[0]):
        prompt = tok.encode(BEAM_PROMPTS[r // 3])
        new = out.sequences[r, width:].tolist()
        length = new.index(dot) + 1 if dot in new else len(new)
        raw = oracle(hf_logits_alone, story, prompt + new[:length]).log_softmax(-1)
        expected = raw[len(prompt) - 1 : -1].gather(-1, torch.tensor(new[:length])[:, None])[:, 0]
        torch.testing.assert_close(out.logprobs[r, :length], expected, **TOL)
        assert torch.isnan(out.logprobs[r, length:]).all()
        # With lp = 1 the score is a mean log-prob, which does not grow with the length: an absolute bound
        # holds whatever model (yours, downstream) computed it; the log-probs above get parity()'s relative part.
        assert float(out.sequences_scores[r]) == pytest.approx(float(expected.sum()) / length**lp, abs=1e-3)


def test_engine_beam_search_rejects_sampling_settings(gen, story_demo, story):
    """num_beams > 1 takes no temperature, filter or mirostat, and at most num_beams return sequences."""
    tok = story.tokenizer
    with pytest.raises(ValueError, match="beam search"):
        gen.generate(story_demo, tok, ["Once"], 3, num_beams=2, temperature=0.7)
    with pytest.raises(ValueError, match="num_return_sequences"):
        gen.generate(story_demo, tok, ["Once"], 3, num_beams=2, num_return_sequences=3, temperature=0.0)
    with pytest.raises(ValueError, match="early_stopping"):
        gen.generate(story_demo, tok, ["Once"], 3, num_beams=2, early_stopping="sometimes", temperature=0.0)


# Not graded as the learner's (no exercise marker): what `check batched_beam_search` answers.
def test_checking_the_given_file_says_there_is_nothing_to_fill_in():
    """batched_beam_search.py is given code: asking for it as an exercise says so, not just "no exercise called"."""
    from sampling_course.grading.course import UnknownExerciseError, get_exercise

    with pytest.raises(UnknownExerciseError, match="batched_beam_search.py is given code with nothing to fill in"):
        get_exercise("batched_beam_search")
