"""Per-position negative log-likelihood of a text, one function per way of reading it past n_ctx.

The methods of the long-text experiment (``sampling_course.apps.long_text`` describes each
one and runs them all). Every function reads its texts with teacher forcing and returns, at
each position ``t``, the NLL the model gives the true token ``t + 1``, NaN where the method
did not score. None of them prints; torch loads when one first runs.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from jaxtyping import Float, Int

if TYPE_CHECKING:  # torch loads when a function first runs
    from torch import Tensor


def synchronize(*args, **kwargs):
    """``sampling_course.devices.synchronize``, imported when first used (it loads torch)."""
    from sampling_course import devices

    return devices.synchronize(*args, **kwargs)


def _inference_mode(function):
    """``torch.inference_mode()`` around ``function``, with torch imported when it first runs."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return function(*args, **kwargs)

    return run


def next_token_nll(
    logits: Float[Tensor, "text pos d_vocab"], targets: Int[Tensor, "text pos"]
) -> Float[Tensor, "text pos"]:
    """-log p(target) at every position: the cross-entropy of each prediction."""
    return -logits.float().log_softmax(dim=-1).gather(-1, targets[..., None])[..., 0]


def _empty_nll(tokens: Tensor) -> Tensor:
    # NaN marks the positions a method did not score (past n_ctx, or skipped by a stride). On the CPU
    # whatever torch's default device is (a notebook on a GPU sets it): the results live there.
    import torch

    return torch.full((tokens.shape[0], tokens.shape[1] - 1), float("nan"), device="cpu")


@_inference_mode
def full_attention_nll(model, tokens: Int[Tensor, "text pos"]) -> Float[Tensor, "text pos_minus_1"]:
    """NLL at every position ``t < n_ctx`` from one uncached forward pass over the first n_ctx tokens.

    Entry ``t`` is the NLL of token ``t + 1`` given tokens ``0 .. t``; NaN from n_ctx on.
    """
    n = min(tokens.shape[1] - 1, model.cfg.n_ctx)
    nll = _empty_nll(tokens)
    nll[:, :n] = next_token_nll(model(tokens[:, :n]), tokens[:, 1 : n + 1]).cpu()
    return nll


@_inference_mode
def cached_nll(model, tokens: Int[Tensor, "text pos"], cache, n_positions: int | None = None) -> tuple[Tensor, float]:
    """NLL at positions ``0 .. n_positions - 1``, feeding the text one token per call through ``cache``.

    One token per call is how a generator uses a cache, so the time (returned in seconds,
    model calls only) is the time of decode steps. ``cache`` is an empty
    ``StaticKeyValueCache`` or ``SinkCache`` with one row per text.
    """
    steps = tokens.shape[1] - 1 if n_positions is None else n_positions
    nll = _empty_nll(tokens)
    seconds = 0.0
    for t in range(steps):
        start = time.perf_counter()
        logits, cache = model(tokens[:, : t + 1], cache)  # only token t is new to the cache
        synchronize(tokens.device)  # on a GPU the step has only been queued until now
        seconds += time.perf_counter() - start
        nll[:, t] = next_token_nll(logits[:, -1:], tokens[:, t + 1 : t + 2])[:, 0].cpu()
    return nll, seconds


@_inference_mode
def sliding_window_nll(
    model, tokens: Int[Tensor, "text pos"], window: int, positions: list[int] | range
) -> tuple[Tensor, float]:
    """NLL at each of ``positions`` from the last ``window`` tokens, recomputed from scratch.

    The window is an ordinary uncached forward pass over tokens ``t - window + 1 .. t``, at
    positions ``0 .. window - 1`` (the whole prefix while ``t < window``). Returns the NLL
    (NaN at the positions not asked for) and the seconds spent in the model.
    """
    nll = _empty_nll(tokens)
    seconds = 0.0
    for t in positions:
        if not 0 <= t < tokens.shape[1] - 1:
            raise ValueError(f"position {t} has no next token to predict in a text of {tokens.shape[1]} tokens")
        start = time.perf_counter()
        logits = model(tokens[:, max(0, t + 1 - window) : t + 1])[:, -1:]
        synchronize(tokens.device)
        seconds += time.perf_counter() - start
        nll[:, t] = next_token_nll(logits, tokens[:, t + 1 : t + 2])[:, 0].cpu()
    return nll, seconds


def reprefill_starts(length: int, window: int) -> list[int]:
    """For each position ``t < length``: the first token of the window that reads token ``t``
    in ``reprefill_nll`` (0 until the window first fills)."""
    keep = max(1, window // 2)
    starts, start = [], 0
    for t in range(length):
        if t - start == window:  # the window holds tokens start .. t - 1: full
            start = t + 1 - keep
        starts.append(start)
    return starts


@_inference_mode
def reprefill_nll(model, tokens: Int[Tensor, "text pos"], cache, window: int) -> tuple[Tensor, float, int]:
    """NLL at every position from a window of ``window`` tokens that is re-prefilled whenever it is full.

    ``cache`` is an empty ``StaticKeyValueCache`` with at least ``window`` slots, one row per
    text. Tokens run one per call, each at its position in the window. When a token arrives
    and the window is full, the cache is emptied (``crop(0)``) and one prefill runs the last
    ``window // 2`` tokens, the new one included, at positions ``0 .. window // 2 - 1``; one
    token at a time again from there. Returns the NLL, the seconds spent in the model, and
    the number of prefills.
    """
    nll = _empty_nll(tokens)
    seconds, prefills = 0.0, 0
    starts = reprefill_starts(tokens.shape[1] - 1, window)
    for t, start in enumerate(starts):
        if start > 0 and start != starts[t - 1]:  # a new window: forget the old one
            cache.crop(0)
            prefills += 1
        begin = time.perf_counter()
        logits, cache = model(tokens[:, start : t + 1], cache)  # token t alone, or the prefill that ends with it
        synchronize(tokens.device)
        seconds += time.perf_counter() - begin
        nll[:, t] = next_token_nll(logits[:, -1:], tokens[:, t + 1 : t + 2])[:, 0].cpu()
    return nll, seconds, prefills
