"""A top-k whose blocked tokens are known in advance: a stand-in for beam search's n-gram blocking.

``Beams.generate`` hands its log-probabilities to ``get_topk_non_repeating`` with the n-gram
size it was given. To grade ``generate`` alone (whether or not the blocking is written yet, and
whether it is right), a test puts ``MaskedTopK(blocked, n)`` in its place: ``blocked`` marks,
for each beam, the tokens that would complete an n-gram the beam already holds (worked out from
the beams' tokens by a reference), so the stand-in answers as a correct blocking would for those
beams, and plain top-k when no n-gram size is given.

It lives in the course's runtime so that it can be made beside the code it is handed to
(``sampling_course.beside``): a submission graded in another process calls it where it runs.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["MaskedTopK"]


class MaskedTopK:
    """``get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)`` for one batch of beams: with
    ``no_repeat_ngram_size == n``, the top ``k`` of ``logprobs`` with the ``blocked`` tokens set to
    -inf; with None, the plain top ``k``. ``calls`` records the (n-gram size, k) of every call."""

    def __init__(self, blocked: Bool[Tensor, "batch d_vocab"], n: int):
        if not isinstance(blocked, torch.Tensor) or blocked.dtype != torch.bool or blocked.ndim != 2:
            raise TypeError("blocked must be a boolean tensor of shape (batch, d_vocab)")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an n-gram size, 1 or more, got {n!r}")
        self.blocked, self.n = blocked, n
        self.calls: list[tuple[int | None, int]] = []

    def __call__(self, logprobs: Float[Tensor, "batch d_vocab"], no_repeat_ngram_size: int | None,
                 k: int) -> tuple[Float[Tensor, "batch k"], Int[Tensor, "batch k"]]:
        self.calls.append((no_repeat_ngram_size, k))
        if no_repeat_ngram_size is None:
            return logprobs.topk(k, dim=-1)
        if no_repeat_ngram_size != self.n or logprobs.shape != self.blocked.shape:
            raise ValueError(f"this stand-in knows the blocked tokens of {tuple(self.blocked.shape)} log-probabilities "
                             f"for no_repeat_ngram_size={self.n}, not {tuple(logprobs.shape)} for {no_repeat_ngram_size!r}")
        return logprobs.masked_fill(self.blocked.to(logprobs.device), float("-inf")).topk(k, dim=-1)
