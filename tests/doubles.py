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

``counted(model)`` wraps a model in a ``CountedModel`` (``sampling_course.counted_model``) kept
where the code under test cannot change it: a test whose verdict rests on how a loop calls its
model (how often, with what) reads that record. For a submission graded in a sandbox it is made
in a third process, the double host, neither the grader's nor the submission's (``made_apart``).

They all live in the course's runtime (``sampling_course.toy_models``,
``sampling_course.trigram_model``, ``sampling_course.recording_file``, ``sampling_course.recording_tokenizer``,
``sampling_course.id_tokenizer``, ``sampling_course.counted_model``),
so that a test can make them beside the code it hands them to (``sampling_course.beside.made_beside``):
a submission graded in another process calls them where it runs, and the test works out its expected
answer on a twin made where the test runs. They are imported here under their names.

The suites import these with ``from doubles import ...`` (pyproject.toml puts tests/ on
the import path).
"""

from __future__ import annotations

from sampling_course.beside import made_apart
from sampling_course.counted_model import CountedCall, CountedModel
from sampling_course.id_tokenizer import IdTokenizer, IdTokenizerWithVocab
from sampling_course.recording_file import RecordingFile
from sampling_course.recording_tokenizer import RecordingTokenizer
from sampling_course.toy_models import BigramModel, NeverEOSModel, SuccessorModel
from sampling_course.trigram_model import TrigramModel

__all__ = ["BigramModel", "CountedCall", "CountedModel", "IdTokenizer", "IdTokenizerWithVocab", "NeverEOSModel", "RecordingFile",
           "RecordingTokenizer", "SuccessorModel", "TrigramModel", "counted",
           "counted_calls"]

# ---------------------------------------------------------------------------------------
# A record the code under test cannot change
# ---------------------------------------------------------------------------------------


def counted(model):
    """``model`` wrapped in a ``CountedModel`` whose record (``inputs``, ``calls``) the code under test cannot
    change: here, when ``model`` is of this process; in the double host, when it lives in a submission's
    process (``made_apart``), where the submission's code calls it and this test reads the record as data."""
    return made_apart(model, CountedModel)


def counted_calls(step):
    """``step`` wrapped in a ``CountedCall`` whose count (``calls``) the code under test cannot change (as ``counted``)."""
    return made_apart(step, CountedCall)
