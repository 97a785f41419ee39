"""Time cached, uncached and batched decoding against Hugging Face ``generate`` (parts 4, 5 and 6).

    sampling-course bench                  # GPT-2 small: real weights if cached, else random
    sampling-course bench --model random   # GPT-2 small's dimensions, random weights
    sampling-course bench --quick          # a smoke run on a tiny random model (timings meaningless)
    sampling-course bench --device cuda    # on an NVIDIA GPU: see sampling_course/apps/bench_gpu.py

What is timed (fp32, CPU, batch 1, ``torch.inference_mode``, all in one process):

* greedy decoding of a 32-token prompt, 64 new tokens (``--new-tokens``):
  uncached ``TransformerSampler.sample(temperature=0)``, the same with
  ``kv_cache=KeyValueCache.new_empty(cfg)``, the same on part 6's fast path
  (``kv_cache=StaticKeyValueCache.new_empty(cfg, max_len=prompt + new)``), and
  ``GPT2LMHeadModel.generate(do_sample=False)`` (which uses Hugging Face's own KV cache);
* beam search with 8 beams, 40 new tokens (``--beam-new-tokens``): uncached, cached and
  static-cached ``TransformerSampler.beam_search(prompt, 8, 8, 40)`` and
  ``generate(num_beams=8, num_return_sequences=8, length_penalty=0.0, early_stopping="never")``.
  Like for like: both keep 8 beams for all 40 steps (no end-of-text token can end a beam, see
  below), score them by summed log-probabilities and return all 8.
* batched greedy decoding (part 5): 8 prompts (``--batch-size``) of 16 to 32 tokens, left-padded,
  64 new tokens each (``--batch-new-tokens``): the engine's ``generate(..., temperature=0)``
  (with its own ``KeyValueCache``, and with a ``StaticKeyValueCache``) and
  ``GPT2LMHeadModel.generate(do_sample=False)`` on the same left-padded batch and attention mask.
  Its tokens per second count every row's new tokens.

A one-token decode step reads every weight once and does two floating-point operations per
weight, so on a CPU it is bound by memory bandwidth. The bench measures the bandwidth (the
best of a few streaming reads of a buffer larger than any cache) and reports greedy decoding's
tokens per second as a fraction of the limit: bandwidth / bytes of weights read per token.

Every method generates exactly the same number of tokens: the model has no end-of-text
token during the benchmark (``IdTokenizer.eos_token_id`` is -1, and the Hugging Face model's
own ``generation_config`` has no EOS, since ``generate`` falls back to it for every setting
left at None). After a short untimed warm-up (2 new tokens each), the methods run
interleaved, A B C A B C ..., so that a change in machine load hits all of them alike, and
the table reports medians. The first timed round also checks the answers: the three greedy
methods must produce the same tokens, the three beam searches the same beams and summed
log-probabilities (two beams whose scores tie within float noise may come out in either
order), and the two batched runs the same padded sequences.

Every run is timed in wall seconds (``time.perf_counter``, what a user waits) and in CPU seconds
(``time.process_time``, the time every thread of this process spent on a core). The targets read
the ratio of the median CPU seconds: on a machine that other programs keep busy, a run's wall time
grows with the time it waits for a core, which says nothing of the code, while its CPU seconds
count only its own work. The wall ratio is shown beside it, and the per-round column gives the
lowest and highest ratio of the rounds (each round runs both methods under the same load).

``--budget`` (default 270 s, model building included) skips the rounds that would end
after it, so that the whole run stays under 5 minutes on a slow machine.

Random weights have no tokenizer, so prompts are token ids: ``IdTokenizer`` reads a prompt
written as space-separated ids ("464 3290 318") and writes ids back the same way. It is all
``TransformerSampler`` needs: ``encode(prompt, return_tensors="pt")``, ``decode(ids)`` and
``eos_token_id``. With real GPT-2 the prompt is English text, encoded once by GPT-2's
tokenizer and then passed as ids the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sampling_course.apps.weight_bytes import weight_bytes_per_token  # noqa: F401 (also imported from here)
from sampling_course.apps.options import (
    OneLineParser,
    UsageError,
    add_device_option,
    add_impl_option,
    add_threads_option,
    command,
    device_from,
    integer,
    number,
)

if TYPE_CHECKING:  # torch loads once the arguments are known to be good
    import torch

    from sampling_course.apps.bench_setup import Method, Setup

# Targets, as ratios of speeds (tokens/s): the dynamic cache (part 4), the engine (part 5), the fast path (part 6).
TARGETS = [
    ("cached greedy vs HF generate", "greedy", "cached", "hf", 1.0),
    ("cached greedy vs uncached greedy", "greedy", "cached", "uncached", 4.0),
    ("cached beam search vs HF beam search", "beam", "cached", "hf", 1.0),
    ("batched greedy (engine) vs HF generate, left-padded", "batched", "engine", "hf", 1.0),
    ("static-cache greedy vs HF generate", "greedy", "static", "hf", 1.3),
    ("static-cache beam search vs HF beam search", "beam", "static", "hf", 1.2),
]
# Summed log-probs of two correct implementations agree to ~1e-5 per step; allow for 40 steps.
SCORE_ATOL = 1e-3


# ---------------------------------------------------------------------------------------
# Checks: every method answers the same, with exactly the requested number of tokens
# ---------------------------------------------------------------------------------------


class BenchCheckError(AssertionError):
    """The methods disagree or generated the wrong number of tokens: the timings would mean nothing."""


def check_lengths(method: Method, sequences: list, setup: Setup) -> None:
    new = new_tokens_of(setup, method.task)
    count = {"greedy": 1, "beam": setup.num_beams, "batched": len(setup.batch_prompts)}[method.task]
    width = max(map(len, setup.batch_prompts)) if method.task == "batched" else len(setup.prompt_ids)
    expected = width + new
    lengths = [len(seq) for seq in sequences]
    if lengths != [expected] * count:
        raise BenchCheckError(
            f"{method.task}/{method.name} returned sequences of lengths {lengths}, "
            f"expected {count} of {expected} tokens (prompt {width} + {new} new)"
        )


def check_greedy(outputs: dict[str, list]) -> None:
    reference = outputs["hf"][0]
    for name in (name for name in outputs if name != "hf"):
        if outputs[name][0] != reference:
            first = next(i for i, (a, b) in enumerate(zip(outputs[name][0], reference)) if a != b)
            raise BenchCheckError(f"greedy {name} differs from HF generate from position {first} on")


def check_batched(outputs: dict[str, list]) -> None:
    """The engine's left-padded batch (each cache) must equal HF's, row for row and token for token."""
    for name in (name for name in outputs if name != "hf"):
        for row, (ours, theirs) in enumerate(zip(outputs[name], outputs["hf"])):
            if ours != theirs:
                first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
                raise BenchCheckError(f"batched greedy {name}: row {row} differs from HF generate from position {first} on")


def beam_scores(setup: Setup, sequences: list) -> list[float]:
    """Summed log-probs of the generated part of each sequence, from one HF forward (fp64 log-softmax)."""
    import torch

    tokens = torch.tensor(sequences)
    with torch.inference_mode():
        logprobs = setup.hf_model(tokens).logits.double().log_softmax(-1)
    start = len(setup.prompt_ids)
    picked = logprobs[:, start - 1 : -1].gather(-1, tokens[:, start:, None])[..., 0]
    return picked.sum(-1).tolist()


def check_beams(setup: Setup, outputs: dict[str, list]) -> None:
    """Same beams in the same order, or, where two beams swap, scores that tie within float noise."""
    scores = {name: beam_scores(setup, seqs) for name, seqs in outputs.items()}
    for name in (name for name in outputs if name != "hf"):
        if not all(math.isclose(a, b, abs_tol=SCORE_ATOL) for a, b in zip(scores[name], scores["hf"])):
            raise BenchCheckError(
                f"beam search {name} found beams with summed log-probs {[round(s, 3) for s in scores[name]]}, "
                f"HF generate {[round(s, 3) for s in scores['hf']]}"
            )
        for rank, (ours, theirs) in enumerate(zip(outputs[name], outputs["hf"])):
            tied = [j for j, s in enumerate(scores["hf"]) if abs(s - scores[name][rank]) <= SCORE_ATOL]
            if ours != theirs and ours not in [outputs["hf"][j] for j in tied]:
                raise BenchCheckError(f"beam search {name}: beam {rank} is not among HF's beams of the same score")


# ---------------------------------------------------------------------------------------
# Running and reporting
# ---------------------------------------------------------------------------------------


def new_tokens_of(setup: Setup, task: str) -> int:
    return {"greedy": setup.new_tokens, "beam": setup.beam_new_tokens, "batched": setup.batch_new_tokens}[task]


def quiet(progress: bool):
    """Without progress bars, beam search's own bar (it writes to stderr) is swallowed too."""
    return contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())


def run(setup: Setup, repeats: int, progress: bool = True, budget_s: float | None = None) -> list[Method]:
    """A short warm-up, then ``repeats`` timed rounds with the methods interleaved.

    The first timed round's answers are checked (BenchCheckError when they disagree). With
    ``budget_s``, no round starts that would probably end after ``budget_s`` seconds; at
    least one round always runs.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    from sampling_course.apps.bench_setup import methods

    all_methods = methods(setup)
    bar = tqdm(total=len(all_methods) * (1 + repeats), desc="bench", disable=not progress, leave=False)
    for method in all_methods:  # first calls pay for lazy initialisation: keep them out of the timings
        bar.set_postfix_str(f"warm-up: {method.task} {method.name}")
        with quiet(progress):
            method.run(2)
        bar.update()
    for round_ in range(1, repeats + 1):
        elapsed = time.perf_counter() - started
        if budget_s is not None and round_ > 1 and elapsed * round_ / (round_ - 1) > budget_s:
            break  # one more round (as long as the average so far) would overrun the budget
        outputs: dict[str, dict[str, list]] = {"greedy": {}, "beam": {}, "batched": {}}
        for method in all_methods:
            bar.set_postfix_str(f"round {round_}: {method.task} {method.name}")
            with quiet(progress):
                start, cpu_start = time.perf_counter(), time.process_time()
                sequences = method.run(new_tokens_of(setup, method.task))
                method.times.append(time.perf_counter() - start)
                method.cpu_times.append(time.process_time() - cpu_start)
            check_lengths(method, sequences, setup)
            outputs[method.task][method.name] = sequences
            bar.update()
        if round_ == 1:
            check_greedy(outputs["greedy"])
            check_beams(setup, outputs["beam"])
            check_batched(outputs["batched"])
    bar.close()
    return all_methods


# ---------------------------------------------------------------------------------------
# Memory bandwidth: the limit of a one-token decode step
# ---------------------------------------------------------------------------------------


def measure_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second that this machine streams from memory: the best of ``repeats`` sums over a big buffer.

    A sum reads each float once and does one addition with it, so it runs at the speed
    memory delivers data, with torch's threads as the decode steps use them. The buffer is
    larger than any CPU cache, so that it really comes from memory.
    """
    import torch

    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()  # touch every page once before timing
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * data.element_size() / best


def bandwidth_report(setup: Setup, results: list[Method], bandwidth: float, console) -> None:
    """Greedy tokens per second beside the bandwidth limit: bandwidth / bytes read per token."""
    per_token = weight_bytes_per_token(setup.demo)
    limit = bandwidth / per_token
    console.print(
        f"memory bandwidth, measured: {bandwidth / 1e9:.1f} GB/s; a decode step reads {per_token / 1e6:.0f} MB "
        f"of weights, so greedy decoding is limited to {limit:.1f} tokens/s"
    )
    for method in results:
        if method.task == "greedy" and method.name != "uncached":
            tokens_per_s = setup.new_tokens / statistics.median(method.times)
            console.print(f"  greedy, {method.label}: {tokens_per_s:.1f} tokens/s = {tokens_per_s / limit:.0%} of the limit")


def round_ratios(slow: Method, fast: Method, cpu: bool = False) -> list[float]:
    """slow / fast for each timed round (the two ran in the same round, so under the same load)."""
    pairs = zip(slow.cpu_times, fast.cpu_times) if cpu else zip(slow.times, fast.times)
    return [a / b for a, b in pairs]


def report(setup: Setup, results: list[Method], console) -> list[tuple[str, float, float, bool]]:
    """The table of timings and the targets; returns ``(target, CPU-seconds ratio, wanted, met)`` for each."""
    import torch
    from rich.table import Table

    by_key = {(v.task, v.name): v for v in results}
    median = {key: statistics.median(v.times) for key, v in by_key.items()}
    cpu = {key: statistics.median(v.cpu_times) for key, v in by_key.items()}
    batch = len(setup.batch_prompts)
    # New tokens per run, all rows counted.
    new = {"greedy": setup.new_tokens, "beam": setup.beam_new_tokens, "batched": batch * setup.batch_new_tokens}
    labels = {"greedy": "greedy", "beam": f"beam x{setup.num_beams}", "batched": f"batched greedy x{batch}"}

    table = Table(
        "task", "method", "median s", "new tokens/s", "speed vs HF", "speed vs uncached", "median CPU s", "CPU vs HF",
        title=f"{setup.model_name}: fp32, CPU ({torch.get_num_threads()} threads), batch 1 (batched: {batch}, "
        f"left-padded prompts of {min(map(len, setup.batch_prompts))}-{max(map(len, setup.batch_prompts))} tokens), "
        f"prompt {len(setup.prompt_ids)} tokens; medians of {len(results[0].times)} runs",
    )
    for (task, name), method in by_key.items():
        seconds = median[task, name]
        uncached = median.get((task, "uncached"))
        table.add_row(
            labels[task],
            method.label,
            f"{seconds:.3f}",
            f"{new[task] / seconds:.1f}",
            f"{median[task, 'hf'] / seconds:.2f}x",
            f"{uncached / seconds:.2f}x" if uncached is not None else "-",
            f"{cpu[task, name]:.3f}",
            f"{cpu[task, 'hf'] / cpu[task, name]:.2f}x",
        )
    console.print(table)

    targets = Table("target", "wall ratio", "CPU-seconds ratio", "per round (CPU)", "wanted", "result",
                    title="Targets (ratios of speeds; the result reads CPU seconds)")
    outcomes = []
    for label, task, fast, slow, wanted in TARGETS:
        wall_ratio = median[task, slow] / median[task, fast]
        ratio = cpu[task, slow] / cpu[task, fast]
        rounds = round_ratios(by_key[task, slow], by_key[task, fast], cpu=True)
        ok = ratio >= wanted
        outcomes.append((label, ratio, wanted, ok))
        targets.add_row(label, f"{wall_ratio:.2f}x", f"{ratio:.2f}x", f"{min(rounds):.2f}-{max(rounds):.2f}",
                        f">= {wanted:.1f}x", "[green]PASS[/]" if ok else "[red]MISS[/]")
    console.print(targets)
    return outcomes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = OneLineParser(
        prog="sampling-course bench", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=["auto", "random", "gpt2"], default="auto",
                        help="real GPT-2 small (gpt2), its dimensions with random weights (random), or "
                        "gpt2 when it is in the local cache and random otherwise (auto, the default)")
    add_impl_option(parser, "solutions", "whose code to time")
    parser.add_argument("--prompt-tokens", type=integer("--prompt-tokens", 1), default=32,
                        help="tokens of the prompt (default 32)")
    parser.add_argument("--new-tokens", type=integer("--new-tokens", 1), default=None,
                        help="new tokens of greedy decoding (default 64; 128 on a GPU)")
    parser.add_argument("--beam-new-tokens", type=integer("--beam-new-tokens", 1), default=40,
                        help="new tokens of beam search (default 40)")
    parser.add_argument("--num-beams", type=integer("--num-beams", 1), default=8, help="beams (default 8)")
    parser.add_argument("--batch-size", type=integer("--batch-size", 1), default=8,
                        help="prompts in the batched task (default 8)")
    parser.add_argument("--batch-new-tokens", type=integer("--batch-new-tokens", 1), default=64,
                        help="new tokens per row, batched task (default 64)")
    parser.add_argument("--repeats", type=integer("--repeats", 1), default=3,
                        help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--budget", type=number("--budget", 0, low_open=True), default=270.0,
                        help="seconds for the whole run: rounds that would end later are skipped (default 270; the GPU bench "
                             "shares it equally by dtype and batch, and always runs the warm-ups and one round of each)")
    parser.add_argument("--seed", type=integer("--seed", 0), default=0, help="seed of the random weights and prompt")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a tiny random model, few tokens, one timed round (timings meaningless)")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_option(parser, help="cpu (the CPU bench), cuda (or cuda:N: the GPU bench, see bench_gpu.py), or "
                      "auto (the default: cuda when torch finds an NVIDIA GPU, else cpu)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="GPU bench: the dtypes, from float32 and bfloat16 (default both)")
    parser.add_argument("--batch-sizes", default="1,8", help="GPU bench: the batch sizes (default 1,8)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    try:
        args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        parser.error(f"--batch-sizes must be integers separated by commas, got {args.batch_sizes!r}")
    if not args.dtypes or any(d not in ("float32", "bfloat16") for d in args.dtypes):
        parser.error(f"--dtypes must name float32 and/or bfloat16, got {args.dtypes!r}")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--batch-sizes must be integers >= 1")
    if args.quick:
        args.prompt_tokens, args.new_tokens, args.beam_new_tokens = 8, 8, 6
        args.num_beams, args.repeats, args.batch_new_tokens = 4, 1, 8
    longest = args.prompt_tokens + max(args.new_tokens or 128, args.beam_new_tokens, args.batch_new_tokens)
    if longest > 1024:  # GPT-2 small's context, the largest model the bench times
        parser.error(f"--prompt-tokens and the new tokens must fit in 1024 positions, got {longest}")
    # Last, since torch loads for it: the device (a GPU decides the default number of new tokens).
    args.device = _bench_device(parser, args.device)
    if args.new_tokens is None:
        args.new_tokens = 128 if args.device.type == "cuda" else 64
    return args


def _bench_device(parser: argparse.ArgumentParser, name: str) -> "torch.device":
    """The bench's device: cpu, or a CUDA GPU (CUDA graphs and torch.compile's are what it measures there);
    auto is cuda when there is one. Anything else ends the command with one line."""
    import torch

    from sampling_course.devices import cuda_available, pick_device

    if name.strip().lower() == "auto":
        return pick_device("cuda") if cuda_available() else torch.device("cpu")
    device = device_from(parser, argparse.Namespace(device=name))
    if device.type == "mps":
        parser.exit(2, f"{parser.prog}: error: --device mps: the GPU bench measures CUDA graphs, which only NVIDIA "
                       "GPUs have; run it with --device cuda on one, or --device cpu here\n")
    return device


@command("sampling-course bench")
def main(argv: Sequence[str] | None = None) -> int:
    from sampling_course.reference import gpt2_local_dir

    args = parse_args(argv)
    if isinstance(args, int):
        return args
    if args.model == "gpt2" and not args.quick and gpt2_local_dir() is None:
        raise UsageError("real GPT-2 small is not in the local Hugging Face cache: run `sampling-course download-gpt2` "
                         "once with internet, or use --model random")
    from sampling_course.apps.threads import course_threads, torch_threads

    # The bench's models are GPT-2 small's size (768 wide), or a tiny one with --quick.
    with torch_threads(course_threads(args.threads, 64 if args.quick else 768)):
        if args.device.type == "cuda":
            from sampling_course.apps import bench_gpu

            return bench_gpu.main(args, args.device)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from sampling_course.apps.options import report_console

    import torch

    console = report_console()
    started = time.perf_counter()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    from sampling_course.apps.bench_setup import build

    with console.status("building the models"):
        setup = build(args)
    console.print(
        f"[bold]{setup.model_name}[/], code from {setup.impl}/; greedy: {setup.new_tokens} new tokens; "
        f"beam search: {setup.num_beams} beams, {setup.beam_new_tokens} new tokens; "
        f"batched greedy: {len(setup.batch_prompts)} prompts, {setup.batch_new_tokens} new tokens each; "
        f"up to {args.repeats} timed rounds, interleaved"
    )
    try:
        budget = args.budget - (time.perf_counter() - started)
        results = run(setup, args.repeats, progress=not args.no_progress, budget_s=budget)
    except BenchCheckError as exc:
        console.print(f"[red]check failed:[/] {exc}")
        return 1
    console.print("[green]checked:[/] every method generated the same tokens (greedy, batched) and beams (beam search)")
    outcomes = report(setup, results, console)
    bandwidth_report(setup, results, measure_bandwidth(64 if args.quick else 512), console)
    console.print(f"total time {time.perf_counter() - started:.0f} s")
    if load_before is not None:
        load_after, cores = os.getloadavg()[0], os.cpu_count() or 1
        console.print(f"load average {load_before:.1f} before, {load_after:.1f} after, on {cores} CPU cores")
        # The 1-minute load average lags, and the bench itself adds about one per thread.
        if load_before > 1.0 or load_after > torch.get_num_threads() + 1.0:
            console.print(
                "[yellow]other processes were running: with every core busy, torch's threads wait on "
                "each other and timings (and ratios) can be off by far more than the run-to-run noise[/]"
            )
    if args.quick:
        console.print("(--quick: a smoke run on a tiny model; the timings and targets mean nothing here)")
        return 0
    missed = [label for label, _, _, ok in outcomes if not ok]
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
