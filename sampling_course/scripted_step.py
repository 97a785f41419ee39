"""A decode step whose rows end at known calls: what a loop around a captured step is tested on.

A decode loop that looks at its finished rows only every few steps must give the tokens of a
loop that looks after every step, and stop at the first look after the last row ended. A step
whose rows end at calls fixed in advance makes both answers known. ``ScriptedStep`` is that
step; like a step replayed as a CUDA graph, it writes into the same tensors at every call and
marks the rows that ended in ``finished``, in place.

It lives in the course's runtime so that it can be made beside the code it is handed to
(``sampling_course.beside``): a submission graded in another process calls it where it runs,
and the test reads how often it was called (``calls``) as plain data.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

__all__ = ["ScriptedStep"]


class ScriptedStep:
    """A decode step whose rows end at known calls: at call i (from 0), row r returns ``eos`` if
    ``ends[r] == i``, ``pad`` once it has ended, and 100 (r + 1) + i otherwise (None in ``ends``:
    the row never ends). Like a captured step it writes into the same tensor (``out``) at every
    call and marks ended rows in ``finished``, in place. ``calls`` counts the calls."""

    def __init__(self, ends: list[int | None], eos: int = 99, pad: int = 0):
        if not isinstance(ends, list) or not all(end is None or type(end) is int for end in ends):
            raise TypeError(f"ends must be a list of call numbers or None, got {ends!r}")
        self.ends, self.eos, self.pad = ends, eos, pad
        self.out = torch.zeros(len(ends), dtype=torch.long)
        self.finished = torch.zeros(len(ends), dtype=torch.bool)
        self.done = [False] * len(ends)  # the host's own copy, so the step itself never reads the device
        self.calls = 0

    def __call__(self) -> Int[Tensor, "batch"]:
        i, self.calls = self.calls, self.calls + 1
        values = []
        for r, end in enumerate(self.ends):
            if self.done[r]:
                values.append(self.pad)
            elif end == i:
                values.append(self.eos)
                self.done[r] = True
            else:
                values.append(100 * (r + 1) + i)
        self.out.copy_(torch.tensor(values))
        self.finished.copy_(torch.tensor(self.done))
        return self.out
