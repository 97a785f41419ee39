"""What quantised weights do to speed (part 11's bench): on the CPU, and on a GPU when there is one.

A decode step reads every weight once per token and does two multiply-adds per weight, so a
large model's step is bound by how fast the weights arrive from memory: four times fewer bytes
could be up to four times faster, *if* a kernel multiplies straight from the compact codes.

On the CPU the bench times, at GPT-2 small's matrix shapes and one row of input (one token):

* **fp32**: ``x @ W.T``, the baseline;
* **int8 kernel**: PyTorch's ``torch._weight_int8pack_mm`` (int8 codes, one scale per row);
* **int8 dequantised**: the codes turned back into an fp32 matrix, then the fp32 matmul:
  what the course's ``quantise_model`` does in the forward pass;
* **int4 dequantised**: the same from 4-bit codes per group of 64.

Each time is the CPU time of the calling thread (``time.thread_time``, torch on one thread),
the best of several interleaved repeats, so other processes on the machine shift it less than
wall time; the table gives speeds relative to fp32 from one run. The decode-step table times one
cached step of the story model (part 4's ``KeyValueCache``) in each configuration.

On a GPU (CUDA), the section times a decode step of a stack of GPT-2 small's block matrices
(12 layers x q/k/v fused, o, MLP in, MLP out; one token) in bf16 and with torchao's weight-only
int8 and int4 (group 128) kernels, the step compiled as one graph with ``torch.compile`` (eager,
and said so, where that fails), and bitsandbytes' NF4 when installed; CUDA events, median of
repeats. Without CUDA it is skipped with one line. (This section has not run on the machines the
course is built on, which have no GPU: its first run on one is its test.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

# GPT-2 small's block matrices as (out, in): fused q/k/v, attention out, MLP in, MLP out.
GPT2_SMALL_SHAPES = ((2304, 768), (768, 768), (3072, 768), (768, 3072))


def machine_line() -> str:
    """The CPU the times were measured on, its cores and its load: ratios from one run on one machine."""
    import os
    import platform

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"measured on {model}, {os.cpu_count()} cores{load}, torch on {torch.get_num_threads()} thread(s)"


def cpu_seconds(fns: dict[str, Callable[[], object]], repeats: int = 5, inner: int = 20) -> dict[str, float]:
    """The best per-call CPU time of each function (one thread), the functions interleaved in each repeat."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()  # warm up: first calls allocate
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            for _ in range(inner):
                fn()
            best[name] = min(best[name], (time.thread_time() - start) / inner)
    return best


def matmul_rows(quantise_module, shapes=GPT2_SMALL_SHAPES, repeats: int = 5, inner: int = 20,
                group_size: int = 64, seed: int = 0) -> list[dict]:
    """Per shape: each method's speed relative to fp32 (fp32 time / its time; above 1 is faster).

    ``quantise_module`` is part 11's ``quantise`` (its ``quantise_int8``, ``dequantise_int8``,
    ``quantise_groups``, ``dequantise_groups``)."""
    q = quantise_module
    g = torch.Generator().manual_seed(seed)
    rows = []
    with torch.no_grad():
        for out, inputs in shapes:
            w = torch.randn(out, inputs, generator=g) * 0.02
            x = torch.randn(1, inputs, generator=g)
            codes, scale = q.quantise_int8(w)
            codes4, scale4, zero4 = q.quantise_groups(w, group_size)
            methods = {
                "fp32": lambda: x @ w.T,
                "int8 kernel": lambda: torch._weight_int8pack_mm(x, codes, scale.float()),
                "int8 dequantised": lambda: x @ q.dequantise_int8(codes, scale).T,
                f"int4-g{group_size} dequantised": lambda: x @ q.dequantise_groups(codes4, scale4, zero4, group_size).T,
            }
            seconds = cpu_seconds(methods, repeats, inner)
            rows.append(dict(shape=(out, inputs), fp32_us=seconds["fp32"] * 1e6,
                             ratios={name: seconds["fp32"] / s for name, s in seconds.items() if name != "fp32"}))
    return rows


def decode_rows(models: dict[str, torch.nn.Module], cache_cls, context: int = 64, repeats: int = 5,
                inner: int = 5, seed: int = 0) -> dict[str, float]:
    """Each model's cached decode step (one new token after ``context``) relative to the first model's:
    first model's CPU time / its time."""
    first = next(iter(models.values()))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, first.cfg.d_vocab, (1, context + 1), generator=g)
    steps = {}
    with torch.no_grad():
        for name, model in models.items():
            _, cache = model(tokens[:, :context], cache_cls.new_empty(model.cfg))
            # The model returns a new, longer cache: stepping from the same one repeats the same step.
            steps[name] = (lambda m, c: lambda: m(tokens, c))(model, cache)
        seconds = cpu_seconds(steps, repeats, inner)
    base = seconds[next(iter(models))]
    return {name: base / s for name, s in seconds.items()}


def gpu_rows(repeats: int = 50) -> tuple[list[dict], list[str]]:
    """On CUDA: a decode step of GPT-2 small's block matrices in bf16, torchao int8 / int4 weight-only and
    bitsandbytes NF4; (rows, notes). Without CUDA: ([], [why it was skipped])."""
    if not torch.cuda.is_available():
        return [], ["GPU section skipped: no CUDA device here (torchao's int8/int4 and bitsandbytes' NF4 "
                    "kernels run on NVIDIA GPUs; run the bench on one to measure them)"]
    notes: list[str] = []
    device = torch.device("cuda")
    layers = [torch.nn.Linear(inputs, out, bias=False, device=device, dtype=torch.bfloat16)
              for _ in range(12) for out, inputs in GPT2_SMALL_SHAPES]
    xs = {inputs: torch.randn(1, inputs, device=device, dtype=torch.bfloat16) for _, inputs in GPT2_SMALL_SHAPES}

    def stack(modules):
        def step():
            return [module(xs[module.in_features]) for module in modules]
        return step

    def timed(step) -> float:
        for _ in range(5):  # warm up (and compile, the first time)
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        return statistics.median(times)

    import copy

    variants: dict[str, Callable[[], list]] = {"bf16": lambda: layers}
    try:
        from sampling_course.apps.quant_peers import quiet_peer_imports

        with quiet_peer_imports():
            from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

        def torchao(config):
            def build():
                modules = [copy.deepcopy(m) for m in layers]
                for m in modules:
                    quantize_(m, config)
                return modules
            return build

        variants["torchao int8"] = torchao(Int8WeightOnlyConfig())
        variants["torchao int4-g128"] = torchao(Int4WeightOnlyConfig(group_size=128,
                                                                     int4_packing_format="tile_packed_to_4d"))
    except ImportError:
        notes.append("torchao is not installed: its rows are left out")
    try:
        import bitsandbytes as bnb

        def nf4():
            modules = []
            for m in layers:
                q = bnb.nn.Linear4bit(m.in_features, m.out_features, bias=False, compute_dtype=torch.bfloat16,
                                      quant_type="nf4")
                q.weight = bnb.nn.Params4bit(m.weight.detach().float().cpu(), requires_grad=False, quant_type="nf4")
                modules.append(q.to(device))
            return modules

        variants["bitsandbytes nf4"] = nf4
    except ImportError:
        notes.append("bitsandbytes is not installed: its NF4 row is left out")
    seconds = {}
    for name, build in variants.items():
        try:
            modules = build()
            try:  # the whole step as one compiled graph (torchao's kernels are meant to run compiled)
                seconds[name], how = timed(torch.compile(stack(modules))), "compiled"
            except Exception as exc:  # fall back to eager, and say so
                torch._dynamo.reset()
                seconds[name], how = timed(stack(modules)), f"eager ({type(exc).__name__} when compiled)"
            notes.append(f"{name}: {how}")
        except Exception as exc:
            notes.append(f"{name} did not run: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if "bf16" not in seconds:
        return [], notes
    rows = [dict(name=name, ms=s * 1000, speedup=seconds["bf16"] / s) for name, s in seconds.items()]
    return rows, notes
