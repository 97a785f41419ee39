"""A tokenizer whose text is token ids: "2 0 1" <-> [2, 0, 1].

A generation loop needs a tokenizer to turn its prompt into ids and its ids back into text; a
test on a toy model with a handful of tokens needs one whose answer it can read at a glance.
``IdTokenizer`` writes each id as a number; ``IdTokenizerWithVocab`` also reports a vocabulary,
as Hugging Face tokenizers do with ``get_vocab()``.

They live in the course's runtime so that they can be made beside the code they are handed to
(``sampling_course.beside``): a submission graded in another process calls them where it runs.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["IdTokenizer", "IdTokenizerWithVocab"]


class IdTokenizer:
    """Text is token ids separated by spaces: "2 0 1" <-> [2, 0, 1].

    ``encode(text, return_tensors="pt")`` gives ``tensor([[2, 0, 1]])``; ``decode`` takes a
    list, a tensor or one id. There is no pad token, and ``eos_token_id`` is what the test
    says (None: no token ends a text). All the generation loops need from a tokenizer.
    """

    pad_token_id = None

    def __init__(self, eos_token_id: int | None = None):
        self.eos_token_id = eos_token_id

    def encode(self, text: str, return_tensors: str | None = None) -> Any:
        ids = [int(token) for token in text.split()]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def decode(self, ids: Any, **kwargs: Any) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return " ".join(str(i) for i in ([ids] if isinstance(ids, int) else ids))


class IdTokenizerWithVocab(IdTokenizer):
    """An ``IdTokenizer`` that reports a vocabulary, as Hugging Face tokenizers do with
    ``get_vocab()``: two tokenizers with different vocabularies do not share token ids."""

    def __init__(self, vocab: dict[str, int], eos_token_id: int | None = None):
        super().__init__(eos_token_id)
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab
