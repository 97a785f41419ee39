"""Quantised decoding (part 11), measured: quality against the entropy floor, memory, speed, and the peers.

    sampling-course bench-quant                # both story models, every scheme, the peers, CPU speed
    sampling-course bench-quant --quick        # a smoke run: few stories, one speed shape, torchao only

Every number comes from one run, and every ratio is against a baseline measured in the same
process:

* **quality** (``sampling_course.apps.quant_quality``): the held-out NLL of the ``story`` and
  ``story-llama`` models at fp32, bf16 (the whole model cast: its weights *and* its computation),
  int8, int4 per group of 32/64/128 and NF4 per group of
  64 (with and without double quantisation), its gap above the grammar's entropy floor, its
  difference from fp32 and the KL of the next-token distributions to fp32, each with a 95%
  bootstrap interval over the stories (a percentile interval: approximate, and too narrow when
  the stories are few; ``quant_quality``'s docstring says why the exact sign-flip interval is not
  used); real GPT-2 small too when it is in the local cache.
  The quantised models are part 11's ``quantise_model`` on the implementation of ``--impl``;
* **stories drawn** from the story model in each configuration with part 5's ``generate`` (pure
  sampling and top-p 0.9, the same seed for all), and the share of their sentences the grammar can
  write, with a 95% bootstrap interval over the stories;
* **the peers** (``sampling_course.apps.quant_peers``): torchao's and optimum-quanto's rounding
  of the same weight matrices, scored the same way;
* **memory** (``sampling_course.apps.quant_memory``): each configuration's weight bytes by the
  formula, by the tensors the quantised model stores and by part 11's ``weight_bytes`` (all three
  must agree), the KV cache's bytes, and which configuration fits a memory budget;
* **speed** (``sampling_course.apps.quant_speed``): CPU matmuls at GPT-2 small's shapes and a
  decode step, as ratios to fp32; a GPU section when CUDA is available.

Sources: int8 per output row as in LLM.int8() (Dettmers et al., 2022) without its outlier split;
NF4 and double quantisation from QLoRA (Dettmers et al., 2023); the peers are torchao
(``Int8WeightOnlyConfig``, ``Int4WeightOnlyConfig``) and optimum-quanto (``qint8``, ``qint4``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from sampling_course.apps.options import OneLineParser, add_impl_option, add_threads_option, command, integer

MODELS = ("story", "story-llama")
TARGETS = {"int8": 0.005, "int4-g64": 0.05}  # the course's targets: nats above fp32
PEER_TOLERANCE = 0.002  # the course's rounding within this many nats of the peer's at the same scheme


def interval(value: tuple[float, float, float], digits: int = 4) -> str:
    v, low, high = value
    return f"{v:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def load_fp32(name: str, impl: str):
    """(reference, the course's fp32 model of ``name`` in the implementation ``impl``, its model module)."""
    from sampling_course.implementation import impl_module, load_demo
    from sampling_course.reference import load_reference
    from sampling_course.weights import load_weights

    reference = load_reference(name, "cpu", quiet=True)
    if name.startswith("story-llama"):
        llama = impl_module("llama", impl)
        return reference, load_weights(llama.LlamaTransformer(reference.cfg), reference.weights).eval(), llama
    transformer = impl_module("transformer", impl)
    return reference, load_demo(reference, transformer, device="cpu", dtype=None).float().eval(), transformer


def quality_table(run, title: str, weight_bytes: dict[str, int] | None = None):
    """A rich Table of one model's configurations: NLL, gap above the floor, difference from fp32, KL to fp32."""
    from rich.table import Table

    from sampling_course.apps.quant_quality import quality_rows

    out = Table("configuration", "NLL", "above floor [95%]", "minus fp32 [95%]", "KL to fp32 [95%]",
                *(["weights", "x below fp32"] if weight_bytes else []), title=title)
    for row in quality_rows(run):
        extra = []
        if weight_bytes:
            b = weight_bytes.get(row["name"])
            extra = ["-", "-"] if b is None else [f"{b / 2**20:.2f} MiB", f"{weight_bytes['fp32'] / b:.2f}x"]
        out.add_row(row["name"], f"{row['nll']:.4f}", interval(row["gap"]), interval(row["delta"]),
                    interval(row["kl"], 5), *extra)
    return out


def skipped_lines(run) -> list[str]:
    """One line per configuration that did not run, with the reason its code gave."""
    return [f"{name}: skipped ({why})" for name, why in run.skipped.items()]


def target_lines(run, matches: dict[str, str]) -> list[str]:
    """The course's quality targets on one model, each with its interval and whether it is met."""
    from sampling_course.apps.quant_quality import difference, separated

    lines = []
    for scheme, limit in TARGETS.items():
        if scheme in run.scores:
            d = difference(run, scheme, "fp32")
            met = "met" if max(abs(d[1]), abs(d[2])) <= limit else "not shown (the interval reaches past it)"
            lines.append(f"{scheme} within {limit} nats of fp32: {interval(d)}: {met}")
    for nf4, int4 in (("nf4-g64", "int4-g64"), ("nf4-g64-dq", "nf4-g64")):
        if nf4 in run.scores and int4 in run.scores:
            d = difference(run, nf4, int4)
            lines.append(f"{nf4} minus {int4}: {interval(d)}: {nf4} {separated(d[1], d[2])}")
    for peer, scheme in matches.items():
        if peer in run.scores and scheme in run.scores:
            d = difference(run, scheme, peer)
            met = "within" if -PEER_TOLERANCE <= d[1] and d[2] <= PEER_TOLERANCE else "not shown within"
            lines.append(f"course {scheme} minus {peer}: {interval(d)}: {met} {PEER_TOLERANCE} nats")
    return lines


def memory_rows(fp32, quantised: dict, weight_bytes_fn) -> list[dict]:
    """Per configuration: the formula, the stored tensors, part 11's ``weight_bytes``, and the block matrices alone."""
    from sampling_course.apps.quant_memory import formula_bytes, stored_bytes
    from sampling_course.apps.quant_peers import block_matrices

    matrices = {id(p) for _, _, p in block_matrices(fp32)}
    rest = (sum(p.numel() for p in fp32.parameters() if id(p) not in matrices)
            + sum(b.numel() for b in fp32.buffers()))  # numbers outside the block matrices: never quantised
    rows = []
    for name, model in quantised.items():
        formula = formula_bytes(fp32, name)
        stored = stored_bytes(model)
        rows.append(dict(name=name, formula=formula, stored=stored, reported=weight_bytes_fn(model),
                         matrices=stored - rest * (2 if name == "bf16" else 4)))
    return rows


def memory_table(rows: list[dict], title: str):
    from rich.table import Table

    out = Table("configuration", "formula (B)", "stored tensors (B)", "weight_bytes (B)", "all equal",
                "block matrices (B)", "matrices x below fp32", "model x below fp32", title=title)
    base = {k: rows[0][k] for k in ("matrices", "stored")}
    for r in rows:
        same = r["formula"] == r["stored"] == r["reported"]
        out.add_row(r["name"], f"{r['formula']:,}", f"{r['stored']:,}", f"{r['reported']:,}", "yes" if same else "NO",
                    f"{r['matrices']:,}", f"{base['matrices'] / r['matrices']:.2f}x", f"{base['stored'] / r['stored']:.2f}x")
    return out


def validity_table(rows: list[dict], title: str):
    """Per configuration and sampler: the share of the drawn stories' sentences the grammar can write."""
    from rich.table import Table

    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    out = Table("configuration", *[f"{s}\nvalid sentences [95%]" for s in samplers], title=title)
    for name in dict.fromkeys(r["name"] for r in rows):
        cells = {r["sampler"]: r for r in rows if r["name"] == name}
        out.add_row(name, *[f"{cells[s]['valid'][0]:.1%} [{cells[s]['valid'][1]:.1%}, {cells[s]['valid'][2]:.1%}]"
                            f" of {cells[s]['sentences']}" for s in samplers])
    return out


def kv_line(cfg) -> str:
    """The KV cache of one sequence at the model's n_ctx: weight-only quantisation leaves it as it was."""
    import torch

    from sampling_course.apps.quant_memory import kv_bytes
    from sampling_course.kv_memory import format_bytes

    return (f"KV cache of one sequence at n_ctx = {cfg.n_ctx}: {format_bytes(kv_bytes(cfg, cfg.n_ctx, torch.float32))} "
            f"in fp32, {format_bytes(kv_bytes(cfg, cfg.n_ctx, torch.bfloat16))} in bf16, whatever the weights' scheme "
            "(the quantised models compute, and cache, in fp32)")


def speed_verdict(matmuls: list[dict], step: dict[str, float]) -> str:
    """What the speed ratios of this run say, read from them."""
    ratios = [r for row in matmuls for r in row["ratios"].values()] + [v for k, v in step.items() if k != "fp32"]
    if ratios and max(ratios) < 1:
        return (f"In this run every quantised path was slower than fp32 on this CPU (ratios {min(ratios):.2f}x to "
                f"{max(ratios):.2f}x): what quantisation buys here is memory, at the cost in quality above.")
    return (f"In this run the quantised paths ran at {min(ratios):.2f}x to {max(ratios):.2f}x of fp32's speed on this "
            "CPU." if ratios else "No speed ratios were measured.")


def fits_table(rows: list[dict], budgets: dict[str, tuple[int, int]]):
    from rich.table import Table

    from sampling_course.kv_memory import format_bytes

    out = Table("scheme", *[f"{label}\n(+ KV at {seq} tokens)\nfits {format_bytes(budget)}?"
                            for label, (seq, budget) in budgets.items()],
                title="What fits: weights (block matrices as the scheme stores them, everything else in bf16) + a KV "
                      "cache (fp32 in the fp32 row, bf16 otherwise), by formula")
    for row in rows:
        out.add_row(row["scheme"], *[f"{format_bytes(row[label]['total'])}  {'yes' if row[label]['fits'] else 'no'}"
                                     for label in budgets])
    return out


def matmul_table(rows: list[dict]):
    from rich.table import Table

    methods = list(rows[0]["ratios"])
    out = Table("shape (out x in)", *[f"{m}\n/ fp32 speed" for m in methods],
                title="CPU, one token: speed relative to fp32 x @ W.T (above 1: faster)")
    for r in rows:
        out.add_row(f"{r['shape'][0]} x {r['shape'][1]}", *[f"{r['ratios'][m]:.2f}x" for m in methods])
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = OneLineParser(prog="sampling-course bench-quant", description=__doc__.splitlines()[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_impl_option(parser, "solutions", "whose quantisation to measure")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="the story models to score")
    parser.add_argument("--tokens", type=integer("--tokens", 100), default=20_000,
                        help="held-out tokens per model (default 20000, the models' training.json's held-out set)")
    parser.add_argument("--no-peers", action="store_true", help="leave out torchao and optimum-quanto")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: the story model on about 800 tokens, torchao as the only peer, one speed "
                        "shape and fewer repeats (the numbers mean little)")
    add_threads_option(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.quick:
        args.tokens = min(args.tokens, 800)
        args.models = ["story"]
    return args


@command("sampling-course bench-quant")
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    from sampling_course.apps.threads import torch_threads

    # One thread: the models are small, and the speed section times one thread's CPU time.
    with torch_threads(args.threads or 1):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from sampling_course.apps import quant_memory, quant_peers, quant_quality, quant_speed
    from sampling_course.apps.options import report_console
    from sampling_course.implementation import impl_module
    from sampling_course.reference import gpt2_local_dir

    console = report_console()
    started = time.perf_counter()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    quant = impl_module("quantised_model", args.impl)
    console.print(f"[bold]bench-quant[/]: part 11 from {args.impl}/, CPU, {torch.get_num_threads()} torch thread(s)"
                  + ("" if load is None else f"; load average {load[0]:.1f} on {os.cpu_count()} cores"))
    libraries = () if args.no_peers else ("torchao",) if args.quick else ("torchao", "optimum.quanto")
    models = list(args.models) + (["gpt2"] if gpt2_local_dir() is not None and not args.quick else [])
    if gpt2_local_dir() is None:
        console.print("real GPT-2 small is not in the local Hugging Face cache: its rows are skipped "
                      "(`sampling-course download-gpt2` once, with internet, adds them)")
    kept = {}
    for name in models:
        with console.status(f"scoring {name}"):
            reference, fp32, module = load_fp32(name, args.impl)
            heldout = quant_quality.heldout_set(name, reference.tokenizer, reference.cfg.n_ctx, args.tokens)
            peers, matches, skipped = quant_peers.peer_models(fp32, libraries)
            peers.update(quant_peers.bf16_weights(fp32))
            run, built = quant_quality.run_quality(fp32, heldout, quant.quantise_model, extra=peers)
            run.skipped.update(skipped)
        ours = {k: m for k, m in built.items() if k not in peers}
        rows = memory_rows(fp32, ours, quant.weight_bytes)
        console.print(quality_table(run, f"{name}: {len(heldout.lengths)} held-out stories, "
                                         f"{int(heldout.counts.sum()):,} tokens; entropy floor {heldout.floor:.4f} "
                                         "nats/token", {r["name"]: r["stored"] for r in rows}))
        for line in skipped_lines(run) + target_lines(run, matches):
            console.print("  " + line)
        console.print(memory_table(rows, f"{name}: weight bytes (formula = stored = weight_bytes)"))
        console.print("  " + kv_line(reference.cfg))
        if name == "story":  # part 5's generate runs GPT-2's architecture
            generate = impl_module("generate", args.impl).generate
            n_stories, new_tokens = (4, 24) if args.quick else (32, 96)
            with console.status("drawing stories"):
                drawn = quant_quality.validity_rows(ours, reference.tokenizer, generate, n_stories, new_tokens)
            console.print(validity_table(drawn, f"{name}: {n_stories} stories of up to {new_tokens} tokens per "
                                                "configuration and sampler, drawn with the same seed"))
        kept[name] = (reference, fp32, ours, module)
    # Memory of larger models, by formula, on the meta device.
    from sampling_course.config import Config
    from sampling_course.llama_config import LlamaConfig

    transformer = impl_module("transformer", args.impl)
    llama = impl_module("llama", args.impl)
    llama_1b = LlamaConfig(d_model=2048, d_vocab=128256, n_ctx=2048, d_head=64, d_mlp=8192, n_heads=32,
                           n_key_value_heads=8, n_layers=16, eps=1e-5, rotary_base=500000.0)
    budgets = {"GPT-2 small": (1024, 256 * 2**20), "1B Llama (Llama-3.2-1B's shapes, untied)": (2048, 2 * 2**30)}
    metas = {"GPT-2 small": (quant_memory.meta_model(transformer, Config()), Config(), *budgets["GPT-2 small"]),
             list(budgets)[1]: (quant_memory.meta_model(llama, llama_1b), llama_1b, *list(budgets.values())[1])}
    schemes = ["fp32", "bf16", "int8", "int4-g128", "int4-g64", "nf4-g64", "nf4-g64-dq"]
    console.print(fits_table(quant_memory.fits_rows(metas, schemes), budgets))
    # Speed on the CPU.
    quantise = impl_module("quantise", args.impl)
    shapes = quant_speed.GPT2_SMALL_SHAPES[:1] if args.quick else quant_speed.GPT2_SMALL_SHAPES
    repeats = 2 if args.quick else 7
    with console.status("timing matmuls"):
        matmuls = quant_speed.matmul_rows(quantise, shapes, repeats=repeats)
    console.print(matmul_table(matmuls))
    step: dict[str, float] = {}
    if "story" in kept:
        _, _, ours, _ = kept["story"]
        kv = impl_module("kv_cache", args.impl).KeyValueCache
        with console.status("timing decode steps"):
            step = quant_speed.decode_rows({k: m for k, m in ours.items() if k != "bf16"}, kv, repeats=repeats)
        console.print("story, one cached decode step after 64 tokens, speed relative to fp32: "
                      + ", ".join(f"{k} {v:.2f}x" for k, v in step.items()))
    console.print(speed_verdict(matmuls, step) + " Times are CPU seconds of one thread, best of interleaved repeats; "
                  + quant_speed.machine_line() + ".")
    rows, notes = quant_speed.gpu_rows()
    if rows:
        from rich.table import Table

        out = Table("weights", "ms per decode step", "x bf16", title="GPU: GPT-2 small's block matrices, one token")
        for r in rows:
            out.add_row(r["name"], f"{r['ms']:.3f}", f"{r['speedup']:.2f}x")
        console.print(out)
        for r in rows:
            if "int4" in r["name"] or "nf4" in r["name"]:
                console.print(f"  {r['name']} at least 1.3x bf16: {r['speedup']:.2f}x: "
                              f"{'met' if r['speedup'] >= 1.3 else 'not met'} in this run")
    for note in notes:
        console.print(note)
    after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    console.print(f"total time {time.perf_counter() - started:.0f} s"
                  + ("" if after is None else f"; load average {after:.1f} after"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
