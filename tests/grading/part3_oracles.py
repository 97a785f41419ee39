"""Part 3's oracles, comparisons and tolerances, shared by test_part3_beams.py (the ``Beams``
class) and test_part3_beam_search.py (``beam_search`` and ``BeamHypotheses``).

Each ``hf_*`` function is an oracle: it runs Hugging Face's model or its generation code live
once, through the ``oracle`` fixture, and is read back from the store afterwards.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.reference import load_reference


def assert_close(actual, expected, **kwargs):
    """Compare values: a log-prob sum kept in float64 is as right as one in float32."""
    torch.testing.assert_close(actual, expected, check_dtype=False, **kwargs)

# Sums of a few fp32 log-probs from two correct implementations agree to ~1e-5.
ATOL = 1e-4
# ... but downstream of the learner's own model the gap grows with the value: every token's
# log-prob carries that model's float32 rounding (LayerNorm by rsqrt or by 1 / sqrt, fused or
# looped attention: up to ~1e-5 apart per token), a sum of L of them about L times that, and
# a length-normalised score scales the sum by L ** -length_penalty (x L at length_penalty = -1,
# where scores reach -90 and a correct model was measured 1.09e-4 from Hugging Face). So sums
# and scores compared with Hugging Face's are also allowed a relative 1e-5 of their size,
# still far below what any classic mistake moves them (a token more or less changes a score
# by a tenth or more).
RTOL = 1e-5


# The oracle's functions: each runs live once through the ``oracle`` fixture, then is read back.


def hf_logprobs(reference, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax of Hugging Face's logits for the token after each row of ``tokens``."""
    return reference.hf_model(tokens).logits[:, -1].log_softmax(dim=-1)


def hf_all_logprobs(reference, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax of Hugging Face's logits at every position of ``tokens``."""
    return reference.hf_model(tokens).logits.log_softmax(dim=-1)


def hf_block_ngrams(tokens: torch.Tensor, logprobs: torch.Tensor, n: int) -> torch.Tensor:
    """Hugging Face's n-gram blocking (NoRepeatNGramLogitsProcessor): the blocked tokens set to -inf."""
    from transformers import NoRepeatNGramLogitsProcessor

    return NoRepeatNGramLogitsProcessor(n)(tokens, logprobs.clone())


def greedy_continuation(reference, tokens: torch.Tensor, steps: int) -> torch.Tensor:
    """An argmax loop on Hugging Face's logits (the stand-in soon repeats itself)."""
    for _ in range(steps):
        nxt = reference.hf_model(tokens).logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=-1)
    return tokens


# ---------------------------------------------------------------------------------------
# For beam_search: Hugging Face's generate(num_beams=...) on random prompts
# ---------------------------------------------------------------------------------------


def random_prompt(tokenizer, seed: int, length: int = 6) -> str:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, tokenizer.eos_token_id, (length,), generator=generator)
    return tokenizer.decode(ids)


def hf_beam_search(reference, prompt: str, num_beams: int, max_new_tokens: int, ngram: int | None):
    """Hugging Face's beam search, scored by summed log-probs, as (score, text) pairs."""
    tok = reference.tokenizer
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = reference.hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            num_beams=num_beams,
            num_return_sequences=num_beams,
            no_repeat_ngram_size=ngram,
            max_new_tokens=max_new_tokens,
            length_penalty=0.0,
            early_stopping="never",
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tok.eos_token_id,
        )
    new = out.sequences[:, ids.shape[1] :]
    # Precondition: where no beam ends in EOS, HF's beam search is the classic algorithm.
    assert new.shape[1] == max_new_tokens and not (new == tok.eos_token_id).any(), (
        "precondition failed: a Hugging Face beam reached EOS; pick another prompt or horizon"
    )
    return [(float(score), tok.decode(seq)) for score, seq in zip(out.sequences_scores, out.sequences)]


def assert_same_beams(actual, expected):
    assert isinstance(actual, list) and all(isinstance(p, tuple) and len(p) == 2 for p in actual)
    assert [text for _, text in actual] == [text for _, text in expected], "different beams or order than HF"
    assert [lp for lp, _ in actual] == pytest.approx([lp for lp, _ in expected], rel=RTOL, abs=ATOL), (
        "summed log-probs differ from Hugging Face's sequences_scores"
    )


# ---------------------------------------------------------------------------------------
# For length-normalised beams: Hugging Face's stopping rule and its beam search
# ---------------------------------------------------------------------------------------


def hf_is_done(num_beams: int, length_penalty: float, early_stopping, max_new_tokens: int,
               finished_scores: list[float], best_running_sum: float, length: int) -> bool:
    """Hugging Face's stopping rule for one prompt, transcribed from _check_early_stop_heuristic and
    _beam_search_has_unfinished_sequences: stop when num_beams beams have finished and either early_stopping is True
    or the best running beam's best possible score is not above the worst finished score."""
    if len(finished_scores) < num_beams:
        return False
    if early_stopping is True:
        return True
    best_length = max_new_tokens if early_stopping == "never" and length_penalty > 0.0 else length
    return not best_running_sum / best_length**length_penalty > min(finished_scores)


class EosAs:
    """A tokenizer whose end-of-text token is another token (one the model emits), so that beams finish."""

    def __init__(self, tokenizer, eos_token_id: int):
        self.tokenizer, self.eos_token_id = tokenizer, eos_token_id

    def encode(self, *args, **kwargs):
        return self.tokenizer.encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)


def hf_normalised_beams(reference, prompt: str, num_beams: int, new: int, length_penalty, early_stopping, eos: int):
    """Oracle: Hugging Face's beam search: (sequences_score, text) pairs, each text cut after its first end-of-text token."""
    tok = reference.tokenizer
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = reference.hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=num_beams,
            num_return_sequences=num_beams, max_new_tokens=new, length_penalty=length_penalty,
            early_stopping=early_stopping, eos_token_id=eos, pad_token_id=eos, output_scores=True,
            return_dict_in_generate=True,
        )
    pairs = []
    for score, sequence in zip(out.sequences_scores, out.sequences):
        generated = sequence[ids.shape[1] :].tolist()
        if eos in generated:
            generated = generated[: generated.index(eos) + 1]
        pairs.append((float(score), tok.decode(ids[0].tolist() + generated)))
    return pairs


def hf_second_likeliest(reference, prompt: str) -> int:
    """Oracle: the second likeliest token after ``prompt`` under Hugging Face's logits."""
    tok = reference.tokenizer
    return int(reference.hf_model(tok(prompt, return_tensors="pt").input_ids).logits[0, -1].topk(2).indices[1])


def normalised_beam_case(reference_name: str, oracle):
    """(reference, prompt, end-of-text token, max_new_tokens): beams that finish after different numbers of tokens.
    The stand-in never emits its own end-of-text token: its second likeliest token after the prompt stands in.
    The story model ends sentences with "."."""
    reference = load_reference(reference_name)
    tok = reference.tokenizer
    if reference_name == "story":
        return reference, "Later, it was raining. Max and Sunny stayed inside and", tok.encode(".")[0], 12
    prompt = random_prompt(tok, 3)
    return reference, prompt, oracle(hf_second_likeliest, reference, prompt), 12
