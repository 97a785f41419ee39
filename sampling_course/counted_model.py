"""Wrappers that record every call they get before passing it on: the record a call-count verdict reads.

``CountedModel(model)`` is called as ``model`` is and keeps ``inputs`` (the tokens of each call, a
copy) and ``calls`` ((positions passed, positions cached or None) for each). ``CountedCall(step)``
keeps only how often it was called (``calls``), for a decode step. ``ForceEOSAfter(model, eos,
length)`` counts its calls too, and makes EOS the only possible next token once the sequence has
``length`` tokens (so a loop that runs past EOS shows). A test whose verdict rests on
how a loop calls its model or its step (how often, with what, with how much cached) reads this record.

Graded in a sandbox, the record must be kept where the code under test cannot change it, and not
in the grader either (the code under test never holds an object of the grader's): it is made in a
third process, the double host (``sampling_course.grading.classroom.host``), through
``sampling_course.beside.made_apart``. There it wraps a handle to the model made beside the code
under test, and that model answers each call. The grader reads the record there; it never calls a
double there (the double would call back into the submission's process, which reads the host's
messages only while its own code is calling the host).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["CountedCall", "CountedModel", "ForceEOSAfter"]


class CountedModel(nn.Module):
    """Wraps ``model`` and records every call: ``inputs`` and ``calls``.

    The wrapped model is not a child module and has no public name, so code handed this object
    cannot reach past the record to call it unrecorded."""

    def __init__(self, model: Any):
        super().__init__()
        self._wrapped = (model,)  # private, in a tuple: not a child module
        # An empty parameter on the wrapped model's device: a loop that takes its device from the model's
        # parameters finds the one the wrapped model's are on (a handle to a model elsewhere: the CPU).
        first = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
        device = first.device if isinstance(first, torch.Tensor) else "cpu"
        self.device_anchor = nn.Parameter(torch.empty(0, device=device), requires_grad=False)
        self.inputs: list[torch.Tensor] = []
        self.calls: list[tuple[int, int | None]] = []

    @property
    def cfg(self) -> Any:
        # Read when asked, not when made: in the double host, the wrapped model answers only while the
        # code under test is calling (its process reads the host's messages only then).
        return self._wrapped[0].cfg

    def forward(self, tokens: torch.Tensor, kv_cache: Any = None, **kwargs: Any) -> Any:
        self.inputs.append(torch.as_tensor(tokens).detach().clone())
        self.calls.append((int(tokens.shape[1]), None if kv_cache is None else int(kv_cache.seq_len)))
        model = self._wrapped[0]
        return model(tokens, **kwargs) if kv_cache is None else model(tokens, kv_cache, **kwargs)


class CountedCall:
    """Wraps a callable (a decode step) and counts its calls in ``calls``; like ``CountedModel``, code
    handed it cannot reach past the count to the callable it wraps."""

    def __init__(self, function: Any):
        self._wrapped = (function,)
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._wrapped[0](*args, **kwargs)


class ForceEOSAfter(nn.Module):
    """Wraps ``model``; once the sequence has ``length`` tokens, EOS is the only possible next token.
    ``calls`` counts its calls, so that a loop running past EOS shows."""

    def __init__(self, model: Any, eos: int, length: int):
        super().__init__()
        self._wrapped = (model,)  # as CountedModel's: not a child module, no public name
        self.eos, self.length, self.calls = eos, length, 0
        first = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
        self.device_anchor = nn.Parameter(torch.empty(0, device=first.device if first is not None else "cpu"),
                                          requires_grad=False)

    @property
    def cfg(self) -> Any:
        return self._wrapped[0].cfg

    def forward(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls += 1
        logits = self._wrapped[0](tokens, *args, **kwargs).clone()
        if tokens.shape[-1] >= self.length:
            logits[:, -1, :] = float("-inf")
            logits[:, -1, self.eos] = 0.0
        return logits
