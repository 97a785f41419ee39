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

The computing functions are importable (the part 6 notebook uses them) and print nothing:
``story_texts`` and ``run_experiment`` here, one NLL function per method in
``sampling_course.apps.long_text_nll``, and the results in
``sampling_course.apps.long_text_results``, whose ``table`` (and
``attention_sinks.attention_table``) turn them into rich tables.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import time
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from jaxtyping import Int

from sampling_course.apps.long_text_nll import cached_nll, full_attention_nll, reprefill_nll, sliding_window_nll
from sampling_course.apps.long_text_results import (
    FULL,
    POSITION_RULES,
    REPREFILL,
    SLIDING,
    LongTextResults,
    MethodResult,
    cache_method,
    table,
)
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


def model_device(*args, **kwargs):
    """``sampling_course.devices.model_device``, imported when first used (it loads torch)."""
    from sampling_course import devices

    return devices.model_device(*args, **kwargs)


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
# The experiment
# ---------------------------------------------------------------------------------------


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

    ``caches`` is the part 6 module of the static cache (``solutions.caches`` or
    ``exercises.caches``); the sink cache comes from ``sink_cache`` of the same package.
    ``model`` is a DemoTransformer of the same implementation. ``progress(message)``, if
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

    sink_cache = importlib.import_module(f"{caches.__package__}.sink_cache")

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
            cache = sink_cache.SinkCache.new_empty(
                cfg, batch=batch, window_length=window, num_sink_tokens=sinks, position_rule=rule
            )
            nll, seconds = cached_nll(model, tokens, cache)
            how = f"{sinks} sinks + {window - sinks} recent" if sinks else f"{window} recent"
            results.methods[name] = MethodResult(name, nll, seconds, cache_bytes(cache), how)
    return results


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
    from sampling_course.apps.options import report_console

    from sampling_course.apps.attention_sinks import attention_mass_on_first, attention_table, eager_hf_model
    from sampling_course.implementation import impl_module, load_demo

    console = report_console()
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
