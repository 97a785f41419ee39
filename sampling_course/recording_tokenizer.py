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
from the name (``shipped_tokenizer``) instead of being handed this one. GPT-2's tokenizer counts
as one when GPT-2 small is in the local Hugging Face cache: a submission's process finds its two
files in the folder ``$SAMPLING_COURSE_GPT2_TOKENIZER`` names (the grader binds them read-only into
the sandbox), any other process in the cache.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

from sampling_course.tokenizer import STORY_TOKENIZER_DIR, TOKENIZER_DIR, Tokenizer

__all__ = ["GPT2_TOKENIZER_ENV", "SHIPPED_TOKENIZERS", "RecordingTokenizer", "shipped_name", "shipped_tokenizer",
           "tokenizer_folder"]

# The shipped tokenizers by name: the stand-in's ("tiny") and the story models' ("story"); GPT-2's ("gpt2")
# where GPT-2 small is cached (its folder is looked up: ``tokenizer_folder``).
SHIPPED_TOKENIZERS = {"tiny": TOKENIZER_DIR, "story": STORY_TOKENIZER_DIR, "gpt2": None}
GPT2_TOKENIZER_ENV = "SAMPLING_COURSE_GPT2_TOKENIZER"  # the folder of GPT-2's tokenizer.json and tokenizer_config.json


def tokenizer_folder(name: str) -> Path | None:
    """The folder of the shipped tokenizer ``name``; for "gpt2", the folder ``$SAMPLING_COURSE_GPT2_TOKENIZER``
    names, else GPT-2 small's snapshot in the local Hugging Face cache, else None."""
    if name not in SHIPPED_TOKENIZERS:
        raise ValueError(f"a shipped tokenizer is one of {sorted(SHIPPED_TOKENIZERS)}, not {name!r}")
    if name != "gpt2":
        return SHIPPED_TOKENIZERS[name]
    if os.environ.get(GPT2_TOKENIZER_ENV):
        return Path(os.environ[GPT2_TOKENIZER_ENV])
    from sampling_course.reference import gpt2_local_dir

    return gpt2_local_dir()


class RecordingTokenizer:
    """The shipped tokenizer ``name`` ("tiny", "story" or "gpt2"); ``decoded`` holds the ids it last decoded."""

    def __init__(self, name: str):
        self.tokenizer = shipped_tokenizer(name)
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
def _folder_fingerprint(folder: Path) -> tuple:
    return _fingerprint(Tokenizer(folder))


def shipped_name(tokenizer: Any) -> str | None:
    """The name of the shipped tokenizer that ``tokenizer`` is (a ``Tokenizer`` with nothing of its own
    added, reading the same vocabulary, merges and special tokens), else None."""
    if type(tokenizer) is not Tokenizer or set(vars(tokenizer)) != _FIELDS:
        return None
    mark = _fingerprint(tokenizer)
    for name in SHIPPED_TOKENIZERS:
        folder = tokenizer_folder(name)
        if folder is not None and _folder_fingerprint(folder) == mark:
            return name
    return None


def shipped_tokenizer(name: str) -> Tokenizer:
    """The shipped tokenizer ``name`` ("tiny", "story" or "gpt2"), read from its folder (``tokenizer_folder``)."""
    folder = tokenizer_folder(name)
    if folder is None:
        raise ValueError("GPT-2's tokenizer is not here: GPT-2 small is not in the local Hugging Face cache "
                         f"and ${GPT2_TOKENIZER_ENV} names no folder")
    return Tokenizer(folder)
