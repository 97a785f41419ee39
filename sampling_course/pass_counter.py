"""The positions of every forward pass through a model, written down where the model runs.

A serving engine may run its model piece by piece rather than through the model's ``forward``,
so a test that bounds how many positions one forward pass runs (chunked prefill's cap) watches
the one module every pass must still call once on all its positions: the token embedding
(``model.embed``), which turns the pass's token ids into the residual stream.
``PassCounter(module)`` puts a forward pre-hook on it and keeps, in ``passes``, the positions of
each call: the number of token ids it was given, whatever their shape ((batch, positions) for
the model's own forward, (1, positions) for an engine's packed row).

It lives in the course's runtime so that it can be made beside the code under test
(``sampling_course.beside.made_beside``): graded in another process, the module runs there, and
a hook registered on the grader's copy of it would never run.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["PassCounter"]


class PassCounter:
    """A forward pre-hook on a token embedding ``module``: ``passes`` holds the number of token ids of each call;
    ``remove()`` takes it off."""

    def __init__(self, module: nn.Module):
        if not isinstance(module, nn.Module):
            raise TypeError(f"PassCounter watches a torch.nn.Module, not a {type(module).__name__}")
        self.passes: list[int] = []
        self._handle = module.register_forward_pre_hook(self._seen)

    def _seen(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.passes.append(int(args[0].numel()))

    def remove(self) -> None:
        self._handle.remove()
