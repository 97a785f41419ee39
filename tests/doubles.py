"""Test doubles for the grading suites: tokenizers and language models whose answer is known.

Each toy model is named by its rule, so a test's expected output can be worked out by hand
from the rule alone (no run of the code under test produces it):

* ``SuccessorModel``: the next token is the last one plus 1, with certainty.
* ``NeverEOSModel``: the next token is a fixed scramble of the last one that is never EOS.
* ``BigramModel``: the next-token distribution is a table row picked by the last token.
* ``TrigramModel``: the next-token logits are a table entry picked by the last two tokens;
  it keeps the token ids in its cache and checks that a cache holds the sequence's tokens.

The recorders wrap or stand in for a real object and keep what they were given:
``RecordingTokenizer`` (a shipped tokenizer that keeps the ids it last decoded), ``RecordingFile``
(each write). ``IdTokenizer`` is a tokenizer whose text is token ids.

``CountedModel`` wraps a model and keeps its record where the test runs: a test whose verdict
rests on how a loop calls its model (how often, with what) reads that record, which the code
under test cannot change, as it can change a record kept by an object made in its own process.

All but ``CountedModel`` live in the course's runtime (``sampling_course.toy_models``,
``sampling_course.trigram_model``, ``sampling_course.recording_file``, ``sampling_course.recording_tokenizer``,
``sampling_course.id_tokenizer``),
so that a test can make them beside the code it hands them to (``sampling_course.beside.made_beside``):
a submission graded in another process calls them where it runs, and the test works out its expected
answer on a twin made where the test runs. They are imported here under their names.

The suites import these with ``from doubles import ...`` (pyproject.toml puts tests/ on
the import path).
"""

from __future__ import annotations

import torch
from torch import nn

from sampling_course.id_tokenizer import IdTokenizer, IdTokenizerWithVocab
from sampling_course.recording_file import RecordingFile
from sampling_course.recording_tokenizer import RecordingTokenizer
from sampling_course.toy_models import BigramModel, NeverEOSModel, SuccessorModel
from sampling_course.trigram_model import TrigramModel

__all__ = ["BigramModel", "CountedModel", "IdTokenizer", "IdTokenizerWithVocab", "NeverEOSModel", "RecordingFile",
           "RecordingTokenizer", "SuccessorModel", "TrigramModel"]

# ---------------------------------------------------------------------------------------
# A record the code under test cannot change
# ---------------------------------------------------------------------------------------


class CountedModel(nn.Module):
    """Wraps a model and records every call in this process: ``inputs`` (the tokens, a copy) and
    ``calls`` ((positions passed, positions cached or None) for each).

    The code under test calls it as it calls any model. Graded in another process, each call comes
    here (one message) and is recorded before it goes on to the wrapped model, which may be made
    beside that code (``made_beside``): the answers are that model's, the record is this one's.
    The wrapped model is not a child module, so the code under test cannot reach past the record."""

    def __init__(self, model):
        super().__init__()
        self._wrapped = (model,)  # private, in a tuple: not a child module, not handed to the code under test
        self.cfg = model.cfg
        # An empty parameter on the wrapped model's device: a loop that takes its device from the model's
        # parameters finds the one the wrapped model's are on.
        first = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
        device = first.device if isinstance(first, torch.Tensor) else "cpu"
        self.device_anchor = nn.Parameter(torch.empty(0, device=device), requires_grad=False)
        self.inputs: list[torch.Tensor] = []
        self.calls: list[tuple[int, int | None]] = []

    def forward(self, tokens, kv_cache=None, **kwargs):
        self.inputs.append(torch.as_tensor(tokens).detach().clone())
        self.calls.append((int(tokens.shape[1]), None if kv_cache is None else int(kv_cache.seq_len)))
        model = self._wrapped[0]
        return model(tokens, **kwargs) if kv_cache is None else model(tokens, kv_cache, **kwargs)
