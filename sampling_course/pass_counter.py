"""The positions of every forward pass a serving engine asks of its model, kept where the engine cannot write.

A test that bounds how many positions one forward pass runs (chunked prefill's cap) hands the
engine ``PassCounter(model)`` in place of ``model``: called as the model is, it records the
number of token ids of each call in ``passes`` ((batch, positions) for a batch of decoding rows,
(1, positions) for an engine's packed row) and passes the call on. ``cfg`` and ``embed`` are the
model's, so the engine reads its configuration, device and dtype as from the model itself.

Graded in a sandbox, the counter is made in the double host (``sampling_course.beside.made_apart``,
``sampling_course.grading.classroom.host``), around a handle to the model made beside the code under
test: the engine's calls reach the host, are counted there and go on to the model in the engine's
process. Nothing in that process can change the count (a hook or a counter of its own could be
patched, from ``exercises/__init__.py`` say), and a forward pass that skips part of the model
(its token embedding) is still counted whole. What the count does not see is a pass run on another
object than the one the engine was handed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["PassCounter"]


class PassCounter(nn.Module):
    """Wraps ``model``; ``passes`` holds the number of token ids of each call, in order.

    The wrapped model is not a child module and has no public name (as ``CountedModel``'s), so code
    handed this object cannot reach past the count to call it uncounted."""

    def __init__(self, model: Any):
        super().__init__()
        self._wrapped = (model,)
        self.passes: list[int] = []

    @property
    def cfg(self) -> Any:
        # Read when asked, not when made: in the double host, the wrapped model answers only while the
        # code under test is calling (its process reads the host's messages only then).
        return self._wrapped[0].cfg

    @property
    def embed(self) -> Any:
        """The model's token embedding (an engine reads its weight's device and dtype)."""
        return self._wrapped[0].embed

    def forward(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.passes.append(int(torch.as_tensor(tokens).numel()))
        return self._wrapped[0](tokens, *args, **kwargs)
