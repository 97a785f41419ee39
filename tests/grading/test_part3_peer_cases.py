"""Part 3 on Hugging Face's own n-gram case: test_no_repeat_ngram_dist_processor.

Hugging Face's ``tests/generation/test_logits_process.py`` checks ``NoRepeatNGramLogitsProcessor``
on two literal histories over a three-token vocabulary. ``get_topk_non_repeating`` does the
same blocking before its top-k: with k = 3 every token comes back, the blocked ones at -inf (or a large finite fill),
so the blocked set can be read off and compared with Hugging Face's literal answer.

Hugging Face's beam-scorer tests (``BeamSearchScorer``) build their inputs at random and
check shapes and bookkeeping of its batched scorer; they have no literal cases that map onto
``BeamHypotheses``, which part 3 checks against a transcription of Hugging Face's rule and
against ``generate(num_beams=...)`` itself (test_part3_beam_search.py).
"""

from __future__ import annotations

import pytest
import torch

HISTORIES = [[1, 1, 2, 1], [0, 1, 0, 1]]


@pytest.mark.exercise("Beams.get_topk_non_repeating")
@pytest.mark.parametrize(
    "n, blocked",
    [
        # 2-grams: row 1 holds (1, 1) and (1, 2) after its last token 1, row 2 holds (1, 0).
        (2, [[False, True, True], [True, False, False]]),
        # 3-grams: row 1's last two tokens (2, 1) never started a 3-gram; row 2's (0, 1) did, then 0.
        (3, [[False, False, False], [True, False, False]]),
    ],
    ids=["2-gram", "3-gram"],
)
def test_hf_no_repeat_ngram_case(impl, n, blocked):
    """The tokens blocked on Hugging Face's two histories are the ones its test expects; the input is left alone."""
    tokens = torch.tensor(HISTORIES)
    beams = impl.beams.Beams(None, None, torch.zeros(2), tokens)
    logprobs = torch.full((2, 3), 1 / 3).log()
    given = logprobs.clone()
    values, indices = beams.get_topk_non_repeating(given, n, 3)
    assert torch.equal(given, logprobs), "get_topk_non_repeating changed the log-probabilities it was given (in place)"
    assert torch.equal(tokens, torch.tensor(HISTORIES)), "get_topk_non_repeating changed the beams' tokens"
    got = torch.zeros(2, 3, dtype=torch.bool)
    for row in range(2):
        for value, token in zip(values[row].tolist(), indices[row].tolist()):
            # Blocked means far below every allowed log-prob (log 1/3): -inf, or a large finite fill such as -100.
            got[row, token] = value < logprobs.min().item() - 50
    assert got.tolist() == blocked, (
        f"no_repeat_ngram_size={n} on histories {HISTORIES}: Hugging Face blocks {blocked}, got {got.tolist()}"
    )
