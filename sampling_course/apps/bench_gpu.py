"""``sampling-course bench --device cuda``: greedy decoding of GPT-2 small's dimensions on a GPU.

    sampling-course bench --device cuda            # real GPT-2 small if cached, else its dimensions, random weights
    sampling-course bench --device cuda --quick    # a smoke run: a tiny model, few tokens (timings meaningless)

For batch 1 and batch 8 (``--batch-sizes``), prompts of 32 tokens and 128 new tokens
(``--prompt-tokens``, ``--new-tokens``), in float32 and bfloat16 (``--dtypes``), all in one
run and on the same weights:

* **static cache, eager**: part 5's ``generate`` on part 6's ``StaticKeyValueCache``
  (its fast path), temperature 0: a Python loop that launches every kernel of every step;
* **captured step**: part 6b's ``CapturedDecoder``: the prefill eagerly, then one CUDA
  graph replay per token, finished rows looked at every 16 steps;
* **HF eager**: ``GPT2LMHeadModel.generate(do_sample=False)`` with its dynamic cache;
* **HF static, compiled**: the same with ``cache_implementation="static"`` and its forward
  compiled by ``torch.compile(mode="reduce-overhead")`` (Hugging Face's ``CompileConfig``),
  which also captures CUDA graphs.

float32 runs with TF32 off (full float32 matmuls). The prompts are the same length (no
padding) and no token ends a row, so every method generates exactly the same number of
tokens; after a warm-up (which pays for compiling and capturing) each case's methods run
interleaved (A B C D A B C D ...), and the table reports medians. Every method's tokens are
compared with HF eager's in the same dtype: in float32 they should be identical; in
bfloat16 two correct implementations may part at a near tie (another order of additions
rounds differently), so the table says from which step on they differ, if they do.
``--strict`` exits with status 1 when float32 tokens differ or a target is missed. ``--budget``
(seconds for the whole run) is shared equally by the cases (dtype and batch): in each, no timed round
starts that would probably end after its share; the warm-ups always run, and so does one timed round.

A decode step reads every weight once, so the GPU's memory bandwidth limits it: the bench
measures that bandwidth (the best of a few sums over a 1 GiB buffer, timed with CUDA
events) and prints each method's steps per second times the bytes of weights a step reads,
as a fraction of it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sampling_course.devices import full_fp32_precision, synchronize

# Targets, as ratios of tokens/s, batch 1: the captured step against each of Hugging Face's.
TARGETS = [
    ("captured step vs HF eager, batch 1", "captured", "hf", 5.0),
    ("captured step vs HF static cache compiled, batch 1", "captured", "hf_compiled", 1.0),
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
QUICK_DIMS = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=1024)


@dataclass
class Method:
    """One way of decoding: ``run()`` returns the (batch, prompt + new) token ids, on the CPU."""

    name: str  # "static", "captured", "hf" or "hf_compiled"
    label: str
    run: Callable[[], torch.Tensor]
    times: list[float] = field(default_factory=list)
    tokens: torch.Tensor | None = None


@dataclass
class Case:
    """The methods of one dtype and batch size, on one copy of the weights."""

    dtype: str
    batch: int
    methods: list[Method]
    weight_bytes: int  # bytes of weights a decode step reads
    agreement: dict[str, int | None] = field(default_factory=dict)  # method -> first differing step (None: identical)


def gpu_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of ``fn()``, from an idle device to a finished one (GPU work is queued, not run, by the call)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def measure_gpu_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Bytes per second the GPU reads from its memory: the best of ``repeats`` sums over a buffer, timed with CUDA events.

    A sum reads each element once and does one addition with it: bound by the memory,
    like a decode step's reads of the weights.
    """
    data = torch.ones(megabytes * 2**20 // 4, device=device)
    data.sum()
    best = math.inf
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        data.sum()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return data.numel() * data.element_size() / best


def first_difference(a: torch.Tensor, b: torch.Tensor, prompt: int) -> int | None:
    """The first new-token step (from 0) at which any row of ``a`` and ``b`` differ; None if identical."""
    differ = (a != b).any(dim=0).nonzero()
    return None if len(differ) == 0 else int(differ[0]) - prompt


# ---------------------------------------------------------------------------------------
# The methods
# ---------------------------------------------------------------------------------------


def hf_model_for(dims: dict | None, seed: int) -> tuple[torch.nn.Module, str]:
    """Real GPT-2 small when cached (and ``dims`` is None), else a GPT-2 of ``dims`` (GPT-2 small's when {}) with random weights."""
    from sampling_course.apps.bench_setup import random_gpt2
    from sampling_course.reference import gpt2_local_dir, quiet_transformers

    local = gpt2_local_dir() if dims is None else None
    if local is not None:
        from transformers import GPT2LMHeadModel

        quiet_transformers()
        return GPT2LMHeadModel.from_pretrained(local, local_files_only=True, dtype=torch.float32).eval(), "GPT-2 small"
    label = "tiny random GPT-2 (smoke run)" if dims else "GPT-2 small dimensions, random weights"
    return random_gpt2(dims or {}, seed), label


def methods(
    hf_model: torch.nn.Module,
    demo: torch.nn.Module,
    impl: str,
    prompts: torch.Tensor,
    new_tokens: int,
    capture: bool = True,
    compile: bool = True,
) -> list[Method]:
    """The four methods on these weights and prompts (already on their device, in their dtype).

    ``capture`` and ``compile`` (True on a GPU) turn the CUDA graph and ``torch.compile`` off
    for a run of the same code on the CPU (the tests do that); the labels say so.
    """
    from transformers import CompileConfig, GenerationConfig

    from sampling_course.apps.bench_setup import IdTokenizer

    engine = importlib.import_module(f"{impl}.generate")
    caches = importlib.import_module(f"{impl}.caches")
    gpu_decoding = importlib.import_module(f"{impl}.gpu_decoding")
    cfg, (batch, prompt) = demo.cfg, prompts.shape
    device, dtype = prompts.device, demo.embed.W_E.dtype
    tokenizer = IdTokenizer()
    texts = [tokenizer.decode(row) for row in prompts.tolist()]
    max_len = prompt + new_tokens
    decoder = gpu_decoding.CapturedDecoder(demo, batch, max_len, capture=capture)
    mask = torch.ones_like(prompts)

    def static() -> torch.Tensor:
        cache = caches.StaticKeyValueCache.new_empty(cfg, batch=batch, max_len=max_len, device=device, dtype=dtype)
        return engine.generate(demo, tokenizer, texts, new_tokens, temperature=0.0, kv_cache=cache).cpu()

    def hf(**settings) -> torch.Tensor:
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0, **settings)
        with torch.inference_mode():
            return hf_model.generate(prompts, attention_mask=mask, generation_config=config).cpu()

    compiled = dict(cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead"))
    if not compile:
        compiled = dict(cache_implementation="static", disable_compile=True)
    return [
        Method("static", "static cache, eager", static),
        Method("captured", "captured step" if capture else "fixed-shape step, eager (no capture)",
               lambda: decoder.generate(prompts, new_tokens, check_every=16).cpu()),
        Method("hf", "HF eager", lambda: hf(disable_compile=True)),
        Method("hf_compiled", "HF static cache, compiled" if compile else "HF static cache (not compiled)",
               lambda: hf(**compiled)),
    ]


def build_cases(args: argparse.Namespace, device: torch.device, capture: bool = True, compile: bool = True) -> tuple[list[Case], str]:
    """The weights in each dtype on ``device``, DemoTransformers holding them, the prompts, the methods."""
    from sampling_course.apps.weight_bytes import weight_bytes_per_token
    from sampling_course.config import Config
    from sampling_course.weights import demo_state_dict

    base, label = hf_model_for(QUICK_DIMS if args.quick else ({} if args.model == "random" else None), args.seed)
    base.generation_config.eos_token_id = None  # no token ends a row: every method makes every token
    transformer = importlib.import_module(f"{args.impl}.transformer")
    generator = torch.Generator().manual_seed(args.seed)
    cases = []
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        hf_model = copy.deepcopy(base).to(device, dtype).eval()
        demo = transformer.DemoTransformer(Config.from_hf(base.config))
        demo.load_state_dict(demo_state_dict(base), strict=True)
        demo = demo.to(device, dtype).eval()
        for batch in args.batch_sizes:
            prompts = torch.randint(0, base.config.vocab_size, (batch, args.prompt_tokens), generator=generator, device="cpu").to(device)
            cases.append(Case(dtype_name, batch, methods(hf_model, demo, args.impl, prompts, args.new_tokens, capture, compile),
                              weight_bytes_per_token(demo)))
    return cases, label


def run_cases(cases: list[Case], device: torch.device, repeats: int, prompt: int, progress: bool = False,
              budget_s: float | None = None) -> int:
    """Case by case: warm up every method (twice: compiling and capturing happen here), then up to ``repeats``
    interleaved rounds. With ``budget_s`` (seconds from this call), each of the n cases has until its share
    (the k-th case until k/n of the budget): no round starts that would probably end later (one as long as
    the case's longest so far); at least one round runs. Returns the fewest rounds a case ran."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    bar = tqdm(total=sum(len(c.methods) for c in cases) * (2 + repeats), desc="bench", disable=not progress, leave=False)
    fewest = repeats
    for k, case in enumerate(cases, start=1):
        deadline = None if budget_s is None else started + budget_s * k / len(cases)
        with full_fp32_precision() if case.dtype == "float32" else contextlib.nullcontext():
            for method in case.methods:
                bar.set_postfix_str(f"warm-up: {case.dtype} batch {case.batch} {method.name}")
                for _ in range(2):
                    method.tokens = method.run()
                    bar.update()
            reference = next(m for m in case.methods if m.name == "hf").tokens
            case.agreement = {m.name: first_difference(m.tokens, reference, prompt) for m in case.methods if m.name != "hf"}
            rounds, longest = 0, 0.0
            while rounds < repeats and (deadline is None or not rounds or time.perf_counter() + longest <= deadline):
                round_start = time.perf_counter()
                for method in case.methods:
                    method.times.append(gpu_seconds(method.run, device))
                    bar.update()
                longest = max(longest, time.perf_counter() - round_start)
                rounds += 1
        fewest = min(fewest, rounds)
    bar.close()
    return fewest


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------


def report(cases: list[Case], new_tokens: int, bandwidth: float | None, console, title: str) -> list[tuple[str, float, float, bool]]:
    from rich.table import Table

    table = Table("dtype", "batch", "method", "median s", "tokens/s", "vs HF eager", "vs HF compiled",
                  "of bandwidth", "tokens", title=title)
    speeds: dict[tuple[str, int, str], float] = {}
    for case in cases:
        median = {m.name: statistics.median(m.times) for m in case.methods}
        for method in case.methods:
            seconds = median[method.name]
            speeds[case.dtype, case.batch, method.name] = case.batch * new_tokens / seconds
            fraction = new_tokens / seconds * case.weight_bytes / bandwidth if bandwidth else None
            step = case.agreement.get(method.name)
            same = "reference" if method.name == "hf" else ("same as HF eager" if step is None else f"differ from step {step}")
            table.add_row(
                case.dtype, str(case.batch), method.label, f"{seconds:.3f}", f"{case.batch * new_tokens / seconds:,.0f}",
                f"{median['hf'] / seconds:.2f}x", f"{median['hf_compiled'] / seconds:.2f}x",
                "-" if fraction is None else f"{fraction:.0%}", same,
            )
    console.print(table)
    targets = Table("target", "dtype", "measured", "wanted", "result", title="Targets (ratios of tokens/s)")
    outcomes = []
    for label, fast, slow, wanted in TARGETS:
        for case in (c for c in cases if c.batch == 1):
            ratio = speeds[case.dtype, 1, fast] / speeds[case.dtype, 1, slow]
            ok = ratio >= wanted and case.agreement.get(fast) is None
            outcomes.append((f"{label} ({case.dtype})", ratio, wanted, ok))
            targets.add_row(label, case.dtype, f"{ratio:.2f}x", f">= {wanted:.1f}x, same tokens",
                            "[green]PASS[/]" if ok else "[red]MISS[/]")
    console.print(targets)
    return outcomes


def float32_agrees(cases: list[Case]) -> list[str]:
    """The float32 methods whose tokens differ from HF eager's (there, all must be identical)."""
    return [f"float32 batch {c.batch}: {name} differs from step {step}" for c in cases if c.dtype == "float32"
            for name, step in c.agreement.items() if step is not None]


def main(args: argparse.Namespace, device: torch.device) -> int:
    """Run the GPU bench (``bench.main`` calls it for ``--device cuda``)."""
    from sampling_course.apps.options import report_console

    console = report_console()
    started = time.perf_counter()
    with console.status("building the models"):
        cases, label = build_cases(args, device)
    name = torch.cuda.get_device_name(device)
    console.print(f"[bold]{label}[/] on {name}, code from {args.impl}/; prompts of {args.prompt_tokens} tokens, "
                  f"{args.new_tokens} new tokens, greedy; up to {args.repeats} timed rounds after 2 warm-ups, interleaved")
    rounds = run_cases(cases, device, args.repeats, args.prompt_tokens, progress=not args.no_progress,
                       budget_s=args.budget - (time.perf_counter() - started))
    if rounds < args.repeats:
        console.print(f"as few as {rounds} of {args.repeats} timed rounds: --budget {args.budget:g} s is shared "
                      f"equally by the runs of each dtype and batch ({len(cases)})")
    bandwidth = measure_gpu_bandwidth(device, 64 if args.quick else 1024)
    console.print(f"memory bandwidth, measured: {bandwidth / 1e9:,.0f} GB/s")
    outcomes = report(cases, args.new_tokens, bandwidth, console,
                      f"{label}, {name}: greedy decoding, medians of {rounds if rounds == args.repeats else f'{rounds} to {args.repeats}'} runs")
    wrong = float32_agrees(cases)
    for line in wrong:
        # Random weights give nearly flat logits, where a tie can fall either way; real GPT-2's rarely do.
        console.print(f"[red]tokens differ: {line} (in float32 every method should give HF eager's tokens)[/]")
    console.print(f"total time {time.perf_counter() - started:.0f} s")
    if args.quick:
        console.print("(--quick: a smoke run on a tiny model; the timings and targets mean nothing here)")
        return 0
    missed = [label for label, _, _, ok in outcomes if not ok]
    return 1 if (wrong or missed) and args.strict else 0


# ---------------------------------------------------------------------------------------
# What notebook 06b measures
# ---------------------------------------------------------------------------------------


def gpt2_sized_demo(transformer_module, device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A DemoTransformer of GPT-2 small's size on ``device``: its real weights when cached, else random ones
    (what a step costs does not depend on the weights' values)."""
    from sampling_course.config import Config
    from sampling_course.weights import demo_state_dict

    hf_model, label = hf_model_for(None, seed)
    demo = transformer_module.DemoTransformer(Config.from_hf(hf_model.config))
    demo.load_state_dict(demo_state_dict(hf_model), strict=True)
    return demo.to(device, dtype).eval(), label


@dataclass
class StepCost:
    batch: int
    ms: float  # one eager decode step on the static cache
    kernels: int | None  # GPU kernels it launches (None off a CUDA GPU)
    weight_bytes: int


def kernels_launched(fn: Callable[[], object], device: torch.device) -> int | None:
    """How many GPU kernels ``fn()`` launches (torch.profiler's CUDA kernel events); None off a CUDA GPU."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


@torch.inference_mode()
def eager_step_costs(model, caches, batches=(1, 8), context: int = 64, repeats: int = 20, seed: int = 0) -> list[StepCost]:
    """For each batch size: the best time of one eager decode step (part 6's static cache and fast path) with
    ``context`` tokens cached, and the kernels it launches."""
    from sampling_course.apps.weight_bytes import weight_bytes_per_token

    device = model.embed.W_E.device
    generator = torch.Generator().manual_seed(seed)
    out = []
    for batch in batches:
        tokens = torch.randint(0, model.cfg.d_vocab, (batch, context + 1), generator=generator, device="cpu").to(device)
        cache = caches.StaticKeyValueCache.new_empty(model.cfg, batch=batch, max_len=context + 1)
        model(tokens[:, :context], cache)

        def step():
            cache.crop(context)  # forget the previous run of this step
            model(tokens, cache)

        step()
        best = min(gpu_seconds(step, device) for _ in range(repeats))
        out.append(StepCost(batch, 1000 * best, kernels_launched(step, device), weight_bytes_per_token(model)))
    return out


def step_cost_table(costs: list[StepCost], bandwidth: float | None, title: str = "One eager decode step"):
    """The costs as a table: ms, kernels, and the time reading the weights would take at the measured bandwidth."""
    from rich.table import Table

    table = Table("batch", "ms per step", "kernels launched", "µs per kernel", "reading the weights takes",
                  "tokens/s", title=title)
    for cost in costs:
        floor = f"{1000 * cost.weight_bytes / bandwidth:.3f} ms" if bandwidth else "-"
        per_kernel = f"{1000 * cost.ms / cost.kernels:.1f}" if cost.kernels else "-"
        table.add_row(str(cost.batch), f"{cost.ms:.3f}", str(cost.kernels or "-"), per_kernel, floor,
                      f"{1000 * cost.batch / cost.ms:,.0f}")
    return table


@torch.inference_mode()
def ms_per_token(decoder, prompts: torch.Tensor, new_tokens: int, repeats: int = 5) -> float:
    """The best time per generated step of ``decoder.generate`` (prefill included), in milliseconds."""
    decoder.generate(prompts, new_tokens)  # warm-up (and the capture, for a captured decoder)
    best = min(gpu_seconds(lambda: decoder.generate(prompts, new_tokens), prompts.device) for _ in range(repeats))
    return 1000 * best / new_tokens
