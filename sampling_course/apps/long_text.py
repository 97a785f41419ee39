"""The long-text experiment (part 6): what each way of reading past n_ctx costs in quality, memory and time.

    sampling-course long-text                  # the story model, or GPT-2 when cached (--model auto)
    sampling-course long-text --quick          # a smoke run in a few seconds (small texts and window)

The texts: stories from the course's grammar (``sampling_course.stories``), each after an
``<|endoftext|>`` token, concatenated into texts of ``length`` tokens (3 x n_ctx by
default). They are held-out stories (``HELDOUT_SEED``), never seen in training.

Each text is read with teacher forcing: the true text goes in, and at every position ``t``
we read the negative log-likelihood (NLL) that the model gives the true token ``t + 1``.
Averaged over positions and exponentiated, that is the perplexity. The methods differ in
what the model sees when it predicts token ``t + 1``:

* **full attention**: the whole prefix, while it fits (``t < n_ctx``). The quality ceiling.
  Run one token at a time through a ``StaticKeyValueCache`` (that gives its time per
  token), and checked against one uncached forward pass.
* **sliding window, recomputed**: the last ``W`` tokens, run from scratch at positions
  ``0 .. W - 1``, as if the text started there. The quality reference for a budget of
  ``W`` tokens, but O(W) work per token, so only every ``stride``-th position is scored
  (and the table compares every method on those positions).
* **window re-prefilled**: a ``StaticKeyValueCache`` of ``W`` slots, one token per step at
  its position in the window; when the window is full it starts afresh with one prefill of
  the last ``W / 2`` tokens at positions ``0 .. W/2 - 1``. Every token then sees between
  ``W / 2`` and ``W`` tokens at true positions counted from the window's start, for one
  prefill of ``W / 2`` tokens per ``W / 2`` or so tokens read.
* **window cache**: a ``SinkCache`` without sinks (``num_sink_tokens=0``): each token is
  computed once and its key stays at the position it was computed at; the oldest is evicted.
* **sink cache**: the same with the first ``num_sink_tokens`` tokens kept forever.

Both caches run with each position rule (``"cache"``: positions stop at ``W - 1``;
``"absolute"``: at ``n_ctx - 1``). Until the window fills (``t < W``) every method sees the
whole prefix at its true positions, so every method must give full attention's NLL there:
the experiment checks that and prints the largest difference.

``sampling_course.apps.attention_sinks.attention_mass_on_first`` measures, by another
route (Hugging Face's eager attention), how much attention each layer and head puts on the
first few tokens of a text: the "attention sinks" that the sink cache keeps. The command
prints that table too.

The computing functions are importable (the part 6 notebook uses them) and print nothing;
``table`` (and ``attention_sinks.attention_table``) turn their results into rich tables.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from jaxtyping import Float, Int

from sampling_course.apps.options import (
    OneLineParser,
    UsageError,
    add_device_option,
    add_impl_option,
    add_threads_option,
    command,
    integer,
)
from sampling_course.stories import HELDOUT_SEED, sample_stories

if TYPE_CHECKING:  # torch loads once the arguments are known to be good
    from torch import Tensor

POSITION_RULES = ("cache", "absolute")
FULL = "full attention"
SLIDING = "sliding window, recomputed"
REPREFILL = "window, re-prefilled when full"


def synchronize(*args, **kwargs):
    """``sampling_course.devices.synchronize``, imported when first used (it loads torch)."""
    from sampling_course import devices

    return devices.synchronize(*args, **kwargs)


def model_device(*args, **kwargs):
    """``sampling_course.devices.model_device``, imported when first used (it loads torch)."""
    from sampling_course import devices

    return devices.model_device(*args, **kwargs)


def _inference_mode(function):
    """``torch.inference_mode()`` around ``function``, with torch imported when it first runs."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return function(*args, **kwargs)

    return run


def cache_method(num_sink_tokens: int, position_rule: str) -> str:
    """The name of a SinkCache method in the results: 'window cache' without sinks, 'sink cache' with."""
    kind = "sink cache" if num_sink_tokens else "window cache"
    return f"{kind}, {position_rule} positions"


# ---------------------------------------------------------------------------------------
# The texts
# ---------------------------------------------------------------------------------------


def story_texts(tokenizer, n_texts: int, length: int, seed: int = HELDOUT_SEED) -> Int[Tensor, "text pos"]:
    """``n_texts`` texts of exactly ``length`` tokens: stories, each after ``<|endoftext|>``.

    Every text starts with ``<|endoftext|>``, as the model's training windows did, and the
    last story is cut wherever the length runs out. The same seed gives the same texts.
    """
    if n_texts < 1 or length < 2:
        raise ValueError(f"need n_texts >= 1 and length >= 2, got n_texts={n_texts}, length={length}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no end-of-text token to separate the stories with")
    rng = random.Random(seed)
    texts = []
    for _ in range(n_texts):
        ids: list[int] = []
        while len(ids) < length:
            for story in sample_stories(8, rng.getrandbits(32)):
                ids += [eos] + tokenizer(story.text).input_ids
        texts.append(ids[:length])
    import torch

    return torch.tensor(texts)


# ---------------------------------------------------------------------------------------
# Per-position NLL, one function per way of reading the text
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------


@dataclass
class MethodResult:
    """One method's per-position NLL, model time and memory."""

    name: str
    nll: Float[Tensor, "text pos_minus_1"]  # NaN where the method did not score
    seconds: float  # time spent in the model
    cache_bytes: int  # the keys and values it holds for one text (0: it holds none)
    how: str  # how it ran, for the table

    @property
    def scored(self) -> int:
        """Token predictions scored, over all texts."""
        return int((~self.nll.isnan()).sum())

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / self.scored


@dataclass
class LongTextResults:
    model_name: str
    n_ctx: int
    window: int
    num_sink_tokens: int
    stride: int
    tokens: Int[Tensor, "text pos"]
    methods: dict[str, MethodResult] = field(default_factory=dict)
    uncached_full_nll: Tensor | None = None  # full attention from one uncached pass, for the checks
    device: str = "cpu"  # where the model ran

    def ranges(self) -> list[tuple[str, int, int]]:
        """(label, start, end) of the position ranges the table averages over."""
        end = self.tokens.shape[1] - 1
        w, n = min(self.window, end), min(self.n_ctx, end)
        return [(f"t < {w}", 0, w), (f"{w} ≤ t < {n}", w, n), (f"t ≥ {n}", n, end)]

    def common_positions(self, start: int, end: int) -> Tensor:
        """Where, in positions ``start .. end - 1``, every method that scores any of them has scored.

        The recomputed sliding window scores only every ``stride``-th position: comparing
        every method on the same positions keeps the comparison fair (position 0, say, is
        hard to predict for everyone).
        """
        import torch

        common = torch.ones_like(self.tokens[:, start:end], dtype=torch.bool)
        for result in self.methods.values():
            scored = ~result.nll[:, start:end].isnan()
            if scored.any():
                common &= scored
        return common

    def mean_nll(self, name: str, start: int, end: int, common: bool = True) -> float:
        """Mean NLL of a method over positions ``start .. end - 1`` (NaN if it scored none of them).

        ``common``: only over the positions every method scored (``common_positions``);
        otherwise over every position this method scored.
        """
        values = self.methods[name].nll[:, start:end]
        keep = ~values.isnan() & (self.common_positions(start, end) if common else True)
        return values[keep].mean().item() if keep.any() else float("nan")

    def checks(self) -> dict[str, float]:
        """Largest |NLL difference| where methods must agree: the window covers the whole prefix."""
        full = self.methods[FULL].nll
        w = min(self.window, full.shape[1])
        out = {}
        if self.uncached_full_nll is not None:
            out["full attention: static cache vs one uncached pass"] = _max_diff(full, self.uncached_full_nll)
        for name, result in self.methods.items():
            if name != FULL:
                out[f"{name} vs full attention, t < {w}"] = _max_diff(result.nll[:, :w], full[:, :w])
        return out


def _max_diff(a: Tensor, b: Tensor) -> float:
    both = ~(a.isnan() | b.isnan())
    return (a[both] - b[both]).abs().max().item() if both.any() else float("nan")


def cache_bytes(cache) -> int:
    """Bytes of keys and values a cache holds for one text (its buffer over its rows)."""
    return cache.buffer.numel() * cache.buffer.element_size() // cache.buffer.shape[2]


def check_settings(n_ctx: int, window: int, num_sink_tokens: int, stride: int, length: int) -> None:
    """Raise a ValueError saying what is allowed when a setting of the experiment is out of range."""
    if isinstance(window, bool) or not isinstance(window, int) or not 2 <= window <= n_ctx:
        raise ValueError(
            f"window must be an integer in [2, n_ctx={n_ctx}]: the window's tokens sit at positions "
            f"0 .. window - 1, which the model must have learned; got {window!r}"
        )
    if not 0 <= num_sink_tokens < window:
        raise ValueError(f"num_sink_tokens must be in [0, window - 1 = {window - 1}], got {num_sink_tokens}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if length < 2:
        raise ValueError(f"the texts need at least 2 tokens, got {length}")


def run_experiment(
    model,
    caches: ModuleType,
    tokens: Int[Tensor, "text pos"],
    window: int,
    num_sink_tokens: int = 4,
    stride: int = 4,
    model_name: str = "",
    progress=None,
) -> LongTextResults:
    """Every method on ``tokens`` (one row per text, all texts as one batch).

    ``caches`` is the part 6 module (``solutions.caches`` or ``exercises.caches``) and
    ``model`` a DemoTransformer of the same implementation. ``progress(message)``, if
    given, is called before each method. The texts run on the model's device; the results
    (NLLs, texts) are on the CPU.
    """
    cfg = model.cfg
    batch, length = tokens.shape
    check_settings(cfg.n_ctx, window, num_sink_tokens, stride, length)
    say = progress or (lambda message: None)
    results = LongTextResults(model_name, cfg.n_ctx, window, num_sink_tokens, stride, tokens.cpu())
    results.device = str(model_device(model))
    tokens = tokens.to(results.device)

    say(FULL)
    results.uncached_full_nll = full_attention_nll(model, tokens)
    static = caches.StaticKeyValueCache.new_empty(cfg, batch=batch, max_len=cfg.n_ctx)
    nll, seconds = cached_nll(model, tokens, static, n_positions=min(length - 1, cfg.n_ctx))
    results.methods[FULL] = MethodResult(FULL, nll, seconds, cache_bytes(static), "a static cache of n_ctx slots")

    say(SLIDING)
    positions = range(0, length - 1, stride)
    nll, seconds = sliding_window_nll(model, tokens, window, positions)
    every = "" if stride == 1 else f"; scored every {stride}th t"
    results.methods[SLIDING] = MethodResult(SLIDING, nll, seconds, 0, f"W tokens rerun per token{every}")

    say(REPREFILL)
    static = caches.StaticKeyValueCache.new_empty(cfg, batch=batch, max_len=window)
    nll, seconds, prefills = reprefill_nll(model, tokens, static, window)
    results.methods[REPREFILL] = MethodResult(
        REPREFILL, nll, seconds, cache_bytes(static), f"last {max(1, window // 2)} rerun when full ({prefills} prefills)"
    )

    for sinks in sorted({0, num_sink_tokens}):
        for rule in POSITION_RULES:
            name = cache_method(sinks, rule)
            say(name)
            cache = caches.SinkCache.new_empty(
                cfg, batch=batch, window_length=window, num_sink_tokens=sinks, position_rule=rule
            )
            nll, seconds = cached_nll(model, tokens, cache)
            how = f"{sinks} sinks + {window - sinks} recent" if sinks else f"{window} recent"
            results.methods[name] = MethodResult(name, nll, seconds, cache_bytes(cache), how)
    return results


def smoothed_nll(nll: Float[Tensor, "text pos"], width: int = 32) -> Float[Tensor, "pos"]:
    """For plotting: the mean NLL over texts at each position, averaged over the ``width`` positions
    ending there. Positions a method did not score (NaN) are skipped; NaN comes out where none was,
    and after the last position it scored (full attention stops at n_ctx)."""
    import torch

    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    scored = ~nll.isnan()
    # Running sums make every window's total a difference of two entries.
    zero = torch.zeros(1, device=nll.device)
    sums = torch.cat([zero, torch.where(scored, nll, 0.0).sum(0).cumsum(0)])
    counts = torch.cat([zero, scored.sum(0).cumsum(0).float()])
    end = torch.arange(1, nll.shape[1] + 1, device=nll.device)
    start = (end - width).clamp(min=0)
    count = counts[end] - counts[start]
    curve = torch.where(count > 0, (sums[end] - sums[start]) / count.clamp(min=1), float("nan"))
    if scored.any():
        curve[int(scored.any(0).nonzero().max()) + 1 :] = float("nan")
    return curve


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------


def _nll_cell(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f} ({math.exp(value):.3g})"


def _size(n_bytes: int) -> str:
    return "none" if n_bytes == 0 else f"{n_bytes / 2**20:.2f} MiB"


def table(results: LongTextResults):
    """The results as a rich Table: NLL (perplexity) per position range, memory and time per method."""
    import torch
    from rich.table import Column, Table

    n_texts, length = results.tokens.shape
    where = f"CPU, {torch.get_num_threads()} torch thread(s)" if results.device == "cpu" else results.device
    ranges = results.ranges()
    every = f" (every {results.stride}th)" if results.stride > 1 and SLIDING in results.methods else ""
    out = Table(
        "method", "cache\nper text", "ms per\ntoken",
        *[Column(f"NLL (ppl)\n{label}", no_wrap=True) for label, _, _ in ranges],
        title=(
            f"Long texts on {results.model_name} (n_ctx {results.n_ctx}): {n_texts} texts x {length} tokens, "
            f"window W = {results.window}, {results.num_sink_tokens} sink tokens"
        ),
        caption=(
            "NLL: mean negative log-likelihood of the true next token in nats, ppl = exp(NLL), over the positions "
            f"t every method scored{every}; t: position of the last token read. cache: keys and values held for "
            f"one text. ms per token: time in the model per token scored; every method but the recomputed sliding "
            f"window runs 1 token per step (the re-prefilled window adds its prefills); {n_texts} texts per step, "
            f"{where}."
        ),
    )
    for name, result in results.methods.items():
        cells = [_nll_cell(results.mean_nll(name, start, end)) for _, start, end in ranges]
        out.add_row(f"{name}\n[dim]{result.how}[/]", _size(result.cache_bytes), f"{result.ms_per_token:.2f}", *cells)
    return out


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = OneLineParser(
        prog="sampling-course long-text", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=["auto", "story", "gpt2", "tiny"], default=None,
                        help="the model: auto (GPT-2 when cached, else story; the default), story, gpt2, or tiny "
                        "(random weights, for smoke runs); --quick defaults to story")
    add_impl_option(parser, "solutions")
    parser.add_argument("--texts", type=integer("--texts", 1), default=4, help="number of texts (default 4)")
    parser.add_argument("--length", type=integer("--length", 2), default=None, help="tokens per text (default 3 x n_ctx)")
    parser.add_argument("--window", type=integer("--window", 2), default=None,
                        help="window length W (default n_ctx / 2: 256 on story)")
    parser.add_argument("--sinks", type=integer("--sinks", 0), default=4, help="sink tokens of the sink cache (default 4)")
    parser.add_argument("--stride", type=integer("--stride", 1), default=4,
                        help="score the recomputed sliding window at every stride-th position (default 4)")
    parser.add_argument("--seed", type=integer("--seed", 0), default=HELDOUT_SEED,
                        help="seed of the stories (default: the held-out seed)")
    add_threads_option(parser)
    parser.add_argument("--no-attention", action="store_true", help="skip the attention-on-the-first-tokens table")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 texts of n_ctx + 32 tokens, window 32, stride 8 (a few seconds)")
    add_device_option(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.model is None:
        args.model = "story" if args.quick else "auto"
    if args.quick:
        args.texts, args.stride = 2, 8
    return args


@command("sampling-course long-text")
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    from sampling_course.apps.demo import checked_settings

    # The model's settings load in a moment, without torch: check the window against its context first.
    _, cfg, _ = checked_settings(args.model, "--model")
    args.length = args.length if args.length is not None else (cfg.n_ctx + 32 if args.quick else 3 * cfg.n_ctx)
    args.window = args.window if args.window is not None else (min(32, cfg.n_ctx // 2) if args.quick else cfg.n_ctx // 2)
    try:
        check_settings(cfg.n_ctx, args.window, args.sinks, args.stride, args.length)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from sampling_course.apps.threads import course_threads, torch_threads

    # One thread unless told otherwise, as before: the experiment runs many small steps.
    from sampling_course.devices import pick_device
    from sampling_course.reference import load_reference

    try:  # a device this machine lacks: one line, before the model loads
        args.device = pick_device(args.device)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--device {args.device}: {exc}") from None
    with torch_threads(course_threads(args.threads, cfg.d_model)):
        return _run(args, load_reference(args.model, args.device))


def _run(args: argparse.Namespace, reference) -> int:
    from rich.console import Console

    from sampling_course.apps.attention_sinks import attention_mass_on_first, attention_table, eager_hf_model
    from sampling_course.implementation import impl_module, load_demo

    console = Console()
    started = time.perf_counter()
    cfg, length, window = reference.cfg, args.length, args.window
    model = load_demo(reference, impl_module("transformer", args.impl))
    caches = impl_module("caches", args.impl)
    tokens = story_texts(reference.tokenizer, args.texts, length, args.seed)
    with console.status("") as status:
        results = run_experiment(
            model, caches, tokens, window, args.sinks, args.stride, model_name=reference.name,
            progress=lambda name: status.update(f"running: {name}"),
        )
    console.print(table(results))
    bad = {name: diff for name, diff in results.checks().items() if not diff <= 1e-3}
    worst = max(results.checks().values())
    if bad:
        console.print(f"[red]check failed: methods disagree where the window covers the whole prefix: {bad}[/]")
    else:
        console.print(f"checked: before the window fills, every method gives full attention's NLL "
                      f"(largest difference {worst:.1e} nats)")
    if not args.no_attention:
        from_position = min(64, window // 2)
        n = min(length, cfg.n_ctx)
        mass = attention_mass_on_first(eager_hf_model(reference), tokens, args.sinks or 1, from_position)
        console.print(attention_table(mass, args.sinks or 1, from_position, n, reference.name))
    load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores" if hasattr(os, "getloadavg") else ""
    console.print(f"total time {time.perf_counter() - started:.0f} s{load}")
    if args.quick:
        console.print("[yellow]--quick: short texts and a small window; only a smoke run[/]")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
