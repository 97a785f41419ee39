"""A tokenizer that keeps the ids it last decoded: a loop's generated tokens, without a round trip through text.

A test of a generation loop that returns text wants the tokens behind it (to compare them with
the target model's greedy tokens one by one). ``RecordingTokenizer`` is one of the course's
shipped tokenizers (``Tokenizer``, by the name of its assets) that keeps, in ``decoded``, the ids
of its last ``decode``.

It lives in the course's runtime so that it can be made beside the code it is handed to
(``sampling_course.beside``): a submission graded in another process calls it where it runs, from
the same shipped files, and the test reads what it kept as plain data.

``shipped_name(tokenizer)`` says which shipped tokenizer a ``Tokenizer`` is (the same vocabulary,
merges and special tokens, wherever its files are), so that another process can make its own
from the name (``shipped_tokenizer``) instead of being handed this one.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from sampling_course.tokenizer import STORY_TOKENIZER_DIR, TOKENIZER_DIR, Tokenizer

__all__ = ["SHIPPED_TOKENIZERS", "RecordingTokenizer", "shipped_name", "shipped_tokenizer"]

# The shipped tokenizers by name: the stand-in's ("tiny") and the story models' ("story").
SHIPPED_TOKENIZERS = {"tiny": TOKENIZER_DIR, "story": STORY_TOKENIZER_DIR}


class RecordingTokenizer:
    """The shipped tokenizer ``name`` ("tiny" or "story"); ``decoded`` holds the ids it last decoded."""

    def __init__(self, name: str):
        if name not in SHIPPED_TOKENIZERS:
            raise ValueError(f"a shipped tokenizer is one of {sorted(SHIPPED_TOKENIZERS)}, not {name!r}")
        self.tokenizer = Tokenizer(SHIPPED_TOKENIZERS[name])
        self.eos_token_id = self.tokenizer.eos_token_id
        self.decoded: list[int] = []

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.encode(*args, **kwargs)

    def decode(self, ids: Any, **kwargs: Any) -> str:
        self.decoded = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(ids, **kwargs)


_FIELDS = frozenset({"backend_tokenizer", "bos_token", "eos_token", "folder", "name_or_path", "pad_token", "unk_token"})


def _fingerprint(tokenizer: Tokenizer) -> tuple:
    return (tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token, tokenizer.bos_token, tokenizer.unk_token,
            tokenizer.pad_token)


@functools.cache
def _shipped_fingerprint(name: str) -> tuple:
    return _fingerprint(Tokenizer(SHIPPED_TOKENIZERS[name]))


def shipped_name(tokenizer: Any) -> str | None:
    """The name of the shipped tokenizer that ``tokenizer`` is (a ``Tokenizer`` with nothing of its own
    added, reading the same vocabulary, merges and special tokens), else None."""
    if type(tokenizer) is not Tokenizer or set(vars(tokenizer)) != _FIELDS:
        return None
    mark = _fingerprint(tokenizer)
    return next((name for name in SHIPPED_TOKENIZERS if _shipped_fingerprint(name) == mark), None)


def shipped_tokenizer(name: str) -> Tokenizer:
    """The shipped tokenizer ``name`` ("tiny" or "story"), read from the course's files."""
    if name not in SHIPPED_TOKENIZERS:
        raise ValueError(f"a shipped tokenizer is one of {sorted(SHIPPED_TOKENIZERS)}, not {name!r}")
    return Tokenizer(SHIPPED_TOKENIZERS[name])
