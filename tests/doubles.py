"""Test doubles for the grading suites: tokenizers and language models whose answer is known.

Each toy model is named by its rule, so a test's expected output can be worked out by hand
from the rule alone (no run of the code under test produces it):

* ``SuccessorModel``: the next token is the last one plus 1, with certainty.
* ``NeverEOSModel``: the next token is a fixed scramble of the last one that is never EOS.
* ``BigramModel``: the next-token distribution is a table row picked by the last token.
* ``TrigramModel``: the next-token logits are a table entry picked by the last two tokens;
  it keeps the token ids in its cache and checks that a cache holds the sequence's tokens.

The recorders wrap or stand in for a real object and keep what they were given:
``RecordingModel`` (calls), ``RecordingTokenizer`` (the last decoded ids), ``RecordingFile``
(each write). ``IdTokenizer`` is a tokenizer whose text is token ids.

All but ``RecordingTokenizer`` live in the course's runtime (``sampling_course.toy_models``,
``sampling_course.trigram_model``, ``sampling_course.recorders``, ``sampling_course.id_tokenizer``),
so that a test can make them beside the code it hands them to (``sampling_course.beside.made_beside``):
a submission graded in another process calls them where it runs, and the test works out its expected
answer on a twin made where the test runs. They are imported here under their names.

The suites import these with ``from doubles import ...`` (pyproject.toml puts tests/ on
the import path).
"""

from __future__ import annotations

import torch

from sampling_course.id_tokenizer import IdTokenizer, IdTokenizerWithVocab
from sampling_course.recorders import RecordingFile, RecordingModel
from sampling_course.toy_models import BigramModel, NeverEOSModel, SuccessorModel
from sampling_course.trigram_model import TrigramModel

__all__ = ["BigramModel", "IdTokenizer", "IdTokenizerWithVocab", "NeverEOSModel", "RecordingFile", "RecordingModel",
           "RecordingTokenizer", "SuccessorModel", "TrigramModel"]

# ---------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------


class RecordingTokenizer:
    """Wraps a tokenizer and keeps the ids it last decoded (``decoded``): the generated
    tokens themselves, without a round trip through text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.decoded: list[int] = []

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, *args, **kwargs):
        return self.tokenizer.encode(*args, **kwargs)

    def decode(self, ids):
        self.decoded = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(ids)
