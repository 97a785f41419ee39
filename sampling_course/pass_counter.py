"""The positions of every forward pass through a module, written down where the module runs.

A serving engine may run its model piece by piece rather than through the model's ``forward``,
so a test that bounds how many positions one forward pass runs (chunked prefill's cap) watches
a module every pass goes through once per position: the first block's first LayerNorm.
``PassCounter(module)`` puts a forward pre-hook on it and keeps, in ``passes``, the positions of
each call (batch times positions for a 3-D input, the first dimension for a 2-D one).

It lives in the course's runtime so that it can be made beside the code under test
(``sampling_course.beside.made_beside``): graded in another process, the module runs there, and
a hook registered on the grader's copy of it would never run.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["PassCounter"]


class PassCounter:
    """A forward pre-hook on ``module``: ``passes`` holds the positions of each call; ``remove()`` takes it off."""

    def __init__(self, module: nn.Module):
        if not isinstance(module, nn.Module):
            raise TypeError(f"PassCounter watches a torch.nn.Module, not a {type(module).__name__}")
        self.passes: list[int] = []
        self._handle = module.register_forward_pre_hook(self._seen)

    def _seen(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        shape = args[0].shape
        self.passes.append(int(shape[0] * shape[1]) if len(shape) == 3 else int(shape[0]))

    def remove(self) -> None:
        self._handle.remove()
