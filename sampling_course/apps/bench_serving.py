"""Serve a stream of requests three ways: part 10's server, part 5's static batches, Hugging Face's continuous batching.

    sampling-course bench-serving                 # the story model, 32 requests, Poisson arrivals
    sampling-course bench-serving --quick         # a smoke run on a tiny random model (timings meaningless)
    sampling-course bench-serving --all-at-once   # every request arrives at t = 0 (an offline batch)
    sampling-course bench-serving --no-prefix-caching  # the course's server prefills every prompt block
    sampling-course bench-serving --max-step-tokens 32  # the course's server also with at most 32 positions a step

The stream (``sampling_course.apps.serving_stream.make_stream``, seeded): arrivals from a
Poisson process at ``--rate`` requests per second (or all at t = 0), prompt and output
lengths uniform over ``--prompt-lengths`` and ``--output-lengths``, and a share
``--shared`` of the requests with a common ``--system-length``-token system prompt in
front. Decoding is greedy and no end-of-text token stops a request, so every engine
generates the same tokens: the bench checks that, request by request, on every run.

The engines, in the same process, on the same weights (the course's model with its QKV weights fused once at
load, part 6's fast path of its one forward pass, for the course's server and the static batches alike):

* **course**: part 10's ``Engine`` (continuous batching over a paged KV cache of
  ``--blocks`` blocks of ``--block-size`` positions, at most ``--max-running`` requests;
  full prompt blocks computed before are read, not prefilled again (prefix caching, as Hugging
  Face's manager does by default; ``--no-prefix-caching`` turns it off);
  with ``--max-step-tokens``, it runs a second time in each round as **chunked**, where no step runs
  more positions than that: long prompts are prefilled in chunks);
* **static**: part 5's ``generate`` on fixed batches of up to ``--max-running`` requests
  that have arrived; a batch runs until its longest request is done;
* **HF**: Hugging Face's continuous batching (the manager behind ``generate_batch``) with
  the same page size, number of blocks and requests per batch.

Per engine: throughput (generated tokens / time until the last one), time to first token
(from the request's arrival) and time per later token, p50 and p99 over the requests, the
p99 of every wait between two consecutive tokens of a request (all requests' waits pooled),
positions run through the model (padding and finished rows included) and the prefill
share of them, the most KV memory held at once and, where the engine says, how much of
the held memory held real positions. Runs are interleaved (every engine once per round,
``--repeat`` rounds); the table gives medians and, for throughput, the spread, and a line
gives each round's throughput ratios. A second table gives the same runs in CPU seconds (of the threads
that ran each engine, Hugging Face's loop thread included; ``serving_stream.CpuClock``), and the throughput
ratios per CPU second, round by
round: on a busy machine those are the figures to compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

from sampling_course.apps.options import (
    OneLineParser,
    add_impl_option,
    add_threads_option,
    command,
    integer,
    number,
)

ENGINES = ("course", "chunked", "static", "hf")
LABELS = {"course": "course server (part 10)", "chunked": "course server, chunked prefill (--max-step-tokens)",
          "static": "static batches (part 5)", "hf": "HF continuous batching"}
SHORT = {"course": "course", "chunked": "chunked", "static": "static", "hf": "HF"}
MODELS = ("story", "tiny", "gpt2", "random")
HF_MAX_BATCH_TOKENS = 2048  # Hugging Face's limit on positions per forward pass (the course's engine has none)


class BenchCheckError(AssertionError):
    """An engine generated other tokens than the course's server for some request: the timings would mean nothing."""


def length_range(name: str):
    def parse(text: str) -> tuple[int, int]:
        low, _, high = text.partition("-")
        try:
            low, high = int(low), int(high or low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must look like 8-64 (integers, 1 <= low <= high), got {text!r}")
        if not 1 <= low <= high:
            raise argparse.ArgumentTypeError(f"{name} must look like 8-64 (integers, 1 <= low <= high), got {text!r}")
        return low, high

    return parse


def load_models(name: str, impl: str, seed: int):
    """(label, the course's DemoTransformer, a Hugging Face GPT2LMHeadModel of its own) on the same weights.

    The Hugging Face model is loaded afresh, not shared: its continuous batching switches the
    model's attention implementation while it runs.
    """
    import torch
    from transformers import GPT2LMHeadModel

    from sampling_course.config import Config
    from sampling_course.implementation import impl_module, load_demo
    from sampling_course.reference import load_reference, quiet_transformers
    from sampling_course.weights import demo_state_dict

    quiet_transformers()
    transformer = impl_module("transformer", impl)
    if name == "random":
        from sampling_course.apps.bench_setup import random_gpt2

        hf_model = random_gpt2({}, seed)
        demo = transformer.DemoTransformer(Config.from_hf(hf_model.config))
        demo.load_state_dict(demo_state_dict(hf_model), strict=True)
        return "GPT-2 small dimensions, random weights" + fused_at_load(demo, impl), demo.eval(), hf_model
    reference = load_reference(name, "cpu", quiet=True)
    hf_model = GPT2LMHeadModel.from_pretrained(reference.path, local_files_only=True, dtype=torch.float32).eval()
    label = {"story": "the story model", "tiny": "tiny random GPT-2 (smoke run)", "gpt2": "GPT-2 small"}[name]
    demo = load_demo(reference, transformer, device="cpu")
    return label + fused_at_load(demo, impl), demo, hf_model


def fused_at_load(demo, impl: str) -> str:
    """Fuse the course model's QKV weights once, as it is loaded (part 6's ``fast_path.fuse_at_load``, the fast path
    of its one forward pass; Hugging Face's GPT-2 keeps its QKV weights fused as one matrix), for every course engine
    alike, the static batches included. The label's note: what was done, or why not (an unwritten part 6)."""
    from sampling_course.implementation import impl_module

    try:
        impl_module("fast_path", impl).fuse_at_load(demo)
    except NotImplementedError:
        return " (QKV not fused: part 6's fuse_at_load is not written yet)"
    return ", QKV fused at load (part 6's fuse_at_load)"


def check_same(stream, runs: dict[str, object]) -> None:
    """Every engine's tokens equal the course server's, request by request (and have the asked-for count)."""
    course = runs["course"].outputs
    for engine, served in runs.items():
        for i, (request, ours, theirs) in enumerate(zip(stream, course, served.outputs)):
            if len(theirs) != request.new_tokens:
                raise BenchCheckError(f"{LABELS[engine]}: request {i} got {len(theirs)} tokens, asked for "
                                      f"{request.new_tokens}")
            if theirs != ours:
                first = next(k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b)
                raise BenchCheckError(f"{LABELS[engine]}: request {i} differs from the course server's greedy tokens "
                                      f"from new token {first} on")


def measure(demo, hf_model, impl: str, stream, args, progress=None) -> dict[str, list]:
    """Warm every engine up, then ``args.repeat`` interleaved rounds; the summaries per engine."""
    from sampling_course.apps import serving_stream as serving
    from sampling_course.implementation import impl_module

    engine_module, generate = impl_module("engine", impl), impl_module("generate", impl).generate
    runners = {
        "course": lambda s: serving.run_course(engine_module, demo, s, args.blocks, args.block_size, args.max_running,
                                               prefix_caching=args.prefix_caching),
        "chunked": lambda s: serving.run_course(engine_module, demo, s, args.blocks, args.block_size,
                                                args.max_running, prefix_caching=args.prefix_caching,
                                                max_step_tokens=args.max_step_tokens),
        "static": lambda s: serving.run_static(generate, demo, s, args.max_running),
        "hf": lambda s: serving.run_hf(hf_model, s, args.blocks, args.block_size, args.max_running,
                                       HF_MAX_BATCH_TOKENS),
    }
    engines = [e for e in ENGINES if (e != "hf" or hf_model is not None)
               and (e != "chunked" or args.max_step_tokens is not None)]
    warm = [serving.StreamRequest(r.prompt, min(r.new_tokens, 4), 0.0, r.shared) for r in stream[:2]]
    for engine in engines:  # first calls pay for lazy initialisation: keep them out of the timings
        runners[engine](warm)
    summaries: dict[str, list] = {engine: [] for engine in engines}
    for round_ in range(args.repeat):
        runs = {}
        for engine in engines:
            if progress:
                progress(f"round {round_ + 1}/{args.repeat}: {LABELS[engine]}")
            runs[engine] = runners[engine](stream)
            summaries[engine].append(serving.summarise(runs[engine], stream))
        check_same(stream, runs)
    return summaries


def table(summaries: dict[str, list], title: str):
    """Throughput and latency as a rich Table, one row per engine (medians over the rounds)."""
    from rich.table import Table

    def median(engine, key):
        return statistics.median(getattr(s, key) for s in summaries[engine])

    out = Table("engine", "tok/s", "spread", "x static", "x HF", "TTFT p50\n(s)", "TTFT p99\n(s)", "ms/tok\np50",
                "ms/tok\np99", "gap p99\n(ms)", title=title)
    for column in out.columns[1:3]:
        column.min_width = 7  # "130-140" on one line
    for engine in summaries:
        rate = [s.tokens_per_s for s in summaries[engine]]
        ratios = [f"{median(engine, 'tokens_per_s') / median(other, 'tokens_per_s'):.2f}x" if other in summaries
                  else "-" for other in ("static", "hf")]
        out.add_row(
            SHORT[engine], f"{statistics.median(rate):.1f}", f"{min(rate):.0f}-{max(rate):.0f}", *ratios,
            f"{median(engine, 'ttft_p50'):.2f}", f"{median(engine, 'ttft_p99'):.2f}",
            f"{1000 * median(engine, 'tpot_p50'):.1f}", f"{1000 * median(engine, 'tpot_p99'):.1f}",
            "-" if any(s.gap_p99 is None for s in summaries[engine]) else f"{1000 * median(engine, 'gap_p99'):.1f}",
        )
    return out


def round_ratios(summaries: dict[str, list], key: str = "tokens_per_s") -> str:
    """Each round's throughput (``key``: per wall second, or ``tokens_per_cpu_s``) of every engine over the static
    engine's and Hugging Face's, round by round."""
    lines = []
    for other in ("static", "hf"):
        if other not in summaries:
            continue
        for engine in summaries:
            if engine not in (other, "static"):
                ratios = [getattr(ours, key) / getattr(theirs, key)
                          for ours, theirs in zip(summaries[engine], summaries[other])]
                lines.append(f"{SHORT[engine]} / {SHORT[other]}: " + " ".join(f"{r:.2f}x" for r in ratios))
    return "per round: " + "; ".join(lines)


def cpu_table(summaries: dict[str, list]):
    """The same runs in CPU seconds (``Served.cpu_seconds``: of the threads that ran the engine), one row per
    engine: the CPU seconds (median, min-max), new tokens per CPU second, and its ratio to the static engine's and
    Hugging Face's (medians of the rounds' ratios, min-max). On a machine other programs also use, the wall clock
    counts their time too; CPU seconds count the engine's own (they still grow a little when others share the
    caches and the memory bus), so these ratios are the steadier ones there."""
    from rich.table import Table

    out = Table("engine", "CPU s", "spread", "tok/CPU-s", "x static\n(CPU)", "spread", "x HF\n(CPU)", "spread",
                title="The same runs in CPU seconds (of the threads that ran each engine)")
    for engine in summaries:
        cpu = [s.served.cpu_seconds for s in summaries[engine]]
        cells = [f"{statistics.median(cpu):.2f}", f"{min(cpu):.2f}-{max(cpu):.2f}",
                 f"{statistics.median(s.tokens_per_cpu_s for s in summaries[engine]):.1f}"]
        for other in ("static", "hf"):
            if other not in summaries or other == engine:
                cells += ["-", "-"]
                continue
            ratios = [ours.tokens_per_cpu_s / theirs.tokens_per_cpu_s
                      for ours, theirs in zip(summaries[engine], summaries[other])]
            cells += [f"{statistics.median(ratios):.2f}x", f"{min(ratios):.2f}-{max(ratios):.2f}"]
        out.add_row(SHORT[engine], *cells)
    return out


def memory_table(summaries: dict[str, list], prompt_positions: int):
    """The work and the KV memory as a rich Table, one row per engine (medians over the rounds).

    "prefill saved" is the share of the stream's ``prompt_positions`` an engine did not run (prefix
    caching); static batches pad their prompts, so theirs is not given. "KV used" is the positions
    the held KV memory holds over its room, summed over the steps: for the course's server a block
    shared by several requests (prefix caching) is one block, and its positions count once
    (``serving_stream.kv_in_use``), so it never exceeds 100%."""
    from rich.table import Table

    def served(engine, key):
        values = [getattr(s.served, key) for s in summaries[engine]]
        return None if any(v is None for v in values) else statistics.median(values)

    out = Table("engine", "positions run", "prefill", "prefill saved", "KV peak MiB", "KV used", "preempted",
                title="Work and KV memory")
    for engine in summaries:
        kv, used = served(engine, "kv_peak_bytes"), served(engine, "kv_utilisation")
        saved = "-" if engine == "static" else f"{1 - served(engine, 'prefill') / prompt_positions:.0%}"
        out.add_row(
            SHORT[engine], f"{served(engine, 'positions'):.0f}", f"{served(engine, 'prefill'):.0f}", saved,
            "-" if kv is None else f"{kv / 2**20:.2f}", "-" if used is None else f"{used:.0%}",
            f"{served(engine, 'n_preemptions'):.0f}" if engine in ("course", "chunked") else "-",
        )
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = OneLineParser(prog="sampling-course bench-serving", description=__doc__.splitlines()[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, default=None,
                        help="story (the default), tiny (random weights; --quick's default), gpt2 (real GPT-2 small, "
                        "from the local cache) or random (GPT-2 small's dimensions, random weights)")
    add_impl_option(parser, "solutions", "whose code to time")
    parser.add_argument("--requests", type=integer("--requests", 1), default=32, help="requests in the stream (default 32)")
    parser.add_argument("--rate", type=number("--rate", 0, low_open=True), default=8.0,
                        help="Poisson arrivals, requests per second (default 8)")
    parser.add_argument("--all-at-once", action="store_true", help="every request arrives at t = 0 instead")
    parser.add_argument("--prompt-lengths", type=length_range("--prompt-lengths"), default=(8, 64),
                        help="each request's own prompt tokens, uniform over this range (default 8-64)")
    parser.add_argument("--output-lengths", type=length_range("--output-lengths"), default=(8, 128),
                        help="new tokens per request, uniform over this range (default 8-128)")
    parser.add_argument("--shared", type=number("--shared", 0, high=1), default=0.5,
                        help="share of requests that start with the common system prompt (default 0.5)")
    parser.add_argument("--system-length", type=integer("--system-length", 0), default=32,
                        help="tokens of the common system prompt (default 32)")
    parser.add_argument("--block-size", type=integer("--block-size", 1), default=16, help="positions per block (default 16)")
    parser.add_argument("--blocks", type=integer("--blocks", 1), default=256,
                        help="blocks in the paged caches (course and HF; default 256)")
    parser.add_argument("--max-running", type=integer("--max-running", 1), default=16,
                        help="requests decoded at once (the static batch size too; default 16)")
    parser.add_argument("--repeat", type=integer("--repeat", 1), default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seed", type=integer("--seed", 0), default=0, help="seed of the stream (default 0)")
    parser.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                        help="the course's server prefills every prompt block (by default it keeps full blocks "
                        "findable by their tokens and reuses them, as Hugging Face's manager does)")
    parser.add_argument("--max-step-tokens", type=integer("--max-step-tokens", 1), default=None,
                        help="also run the course's server with at most this many positions a step, prefilling long "
                        "prompts in chunks (the 'chunked' row; at least --max-running)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face's continuous batching")
    add_threads_option(parser)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 6 short requests on the tiny model, one round (timings meaningless)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.quick:
        args.requests, args.repeat, args.prompt_lengths, args.output_lengths = 6, 1, (4, 16), (2, 12)
        args.system_length = min(args.system_length, 8)
    args.model = args.model or ("tiny" if args.quick else "story")
    return args


@command("sampling-course bench-serving")
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    from sampling_course.apps.options import UsageError
    from sampling_course.apps.threads import course_threads, torch_threads
    from sampling_course.reference import ReferenceUnavailable, gpt2_local_dir, reference_settings

    if args.max_step_tokens is not None and args.max_step_tokens < args.max_running:
        raise UsageError(f"--max-step-tokens ({args.max_step_tokens}) must be at least --max-running "
                         f"({args.max_running}): every running request runs one position a step")
    if args.model == "gpt2" and gpt2_local_dir() is None:
        raise UsageError("real GPT-2 small is not in the local Hugging Face cache: run `sampling-course download-gpt2` "
                         "once with internet, or use --model random")
    try:
        cfg = None if args.model == "random" else reference_settings(args.model)[1]
        n_ctx, d_model = (1024, 768) if cfg is None else (cfg.n_ctx, cfg.d_model)
    except ReferenceUnavailable as exc:
        raise UsageError(str(exc)) from None
    longest = args.system_length + args.prompt_lengths[1] + args.output_lengths[1]
    if longest > n_ctx:
        raise UsageError(f"the longest request (system prompt + prompt + output = {longest} positions) is more than "
                         f"the model's n_ctx={n_ctx}")
    if -(-longest // args.block_size) > args.blocks:
        raise UsageError(f"the longest request ({longest} positions) needs {-(-longest // args.block_size)} blocks of "
                         f"{args.block_size}, more than --blocks {args.blocks}: it could never finish")
    with torch_threads(course_threads(args.threads, d_model)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch
    from sampling_course.apps.options import report_console

    from sampling_course.apps.serving_stream import make_stream

    console = report_console()
    started = time.perf_counter()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    with console.status("loading the models"):
        label, demo, hf_model = load_models(args.model, args.impl, args.seed)
    stream = make_stream(args.requests, demo.cfg.d_vocab, args.seed, None if args.all_at_once else args.rate,
                         args.prompt_lengths, args.output_lengths, args.shared, args.system_length)
    hf_note = None
    if args.no_hf:
        hf_model, hf_note = None, "Hugging Face's continuous batching skipped (--no-hf)"
    else:
        try:
            from transformers.generation import ContinuousBatchingConfig  # noqa: F401
        except ImportError as exc:
            hf_model, hf_note = None, f"Hugging Face's continuous batching is not available here ({exc}); skipped"
    arrivals = "all at t = 0" if args.all_at_once else f"Poisson, {args.rate:g} requests/s"
    load = "" if load_before is None else (f"; load average {load_before[0]:.1f} {load_before[1]:.1f} "
                                           f"{load_before[2]:.1f} on {os.cpu_count()} cores")
    console.print(
        f"[bold]{label}[/], code from {args.impl}/, CPU ({torch.get_num_threads()} threads){load}\n"
        f"{args.requests} requests, arrivals {arrivals}, prompts {args.prompt_lengths[0]}-{args.prompt_lengths[1]} "
        f"tokens (+ a {args.system_length}-token system prompt on {args.shared:.0%}), outputs "
        f"{args.output_lengths[0]}-{args.output_lengths[1]} tokens (uniform), greedy, seed {args.seed}\n"
        f"paged caches: {args.blocks} blocks of {args.block_size}; at most {args.max_running} requests at once "
        f"(static batches of up to {args.max_running}); prefix caching in the course's server "
        f"{'on' if args.prefix_caching else 'off'}"
        f"{'' if args.max_step_tokens is None else f'; chunked: the same, at most {args.max_step_tokens} positions a step'}"
        f"; {args.repeat} interleaved rounds"
    )
    if hf_note:
        console.print(f"[yellow]{hf_note}[/]")
    try:
        with console.status("") as status:
            summaries = measure(demo, hf_model, args.impl, stream, args, progress=status.update)
    except BenchCheckError as exc:
        console.print(f"[red]check failed:[/] {exc}")
        return 1
    engines = ", ".join(LABELS[e] for e in summaries)
    console.print(f"[green]checked:[/] every request got the same greedy tokens from {engines}, in every round")
    total = sum(r.new_tokens for r in stream)
    console.print(table(summaries, f"Serving {args.requests} requests ({total} new tokens), {label}"))
    console.print(round_ratios(summaries))
    console.print(cpu_table(summaries))
    console.print(round_ratios(summaries, "tokens_per_cpu_s").replace("per round:", "per round, CPU seconds:"))
    console.print(memory_table(summaries, sum(len(r.prompt) for r in stream)))
    console.print(
        "course: part 10's server; chunked: the same with --max-step-tokens; static: part 5's generate on fixed "
        "batches; HF: Hugging Face's continuous "
        "batching. tok/s: new tokens / time until the last one was ready (median over rounds; spread: min-max). TTFT: from "
        "arrival to the first token. ms/tok: (last - first token) / (new tokens - 1). gap p99: over every wait between "
        "two consecutive tokens of a request, all requests' waits together. positions run: through the "
        "model, padding and finished rows included; prefill: prompt positions (and recomputed ones after a "
        "preemption). prefill saved: the share of the prompts' positions not run (a cached prefix). KV peak: the "
        "most KV memory held at once (static: every row at the batch's width; HF: its cache's used share, as it "
        "reports it). KV used: the positions the held memory holds / its room, summed over the steps (a block "
        "shared by several requests, and its positions, count once; static: real positions / every row at the "
        "batch's width). Static batches' tokens count as ready at the step that made them, as if it streamed."
    )
    if load_before is not None:
        console.print(f"total time {time.perf_counter() - started:.0f} s; load average {load_before[0]:.1f} before, "
                      f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPU cores (timings are noisy on a busy "
                      "machine)")
    if args.quick:
        console.print("[yellow]--quick: a tiny random model and a handful of requests; the timings mean nothing, "
                      "only that everything runs[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
