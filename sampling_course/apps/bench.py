"""Time cached, uncached and batched decoding against Hugging Face ``generate`` (parts 4, 5 and 6).

    sampling-course bench                  # GPT-2 small: real weights if cached, else random
    sampling-course bench --model random   # GPT-2 small's dimensions, random weights
    sampling-course bench --quick          # a smoke run on a tiny random model (timings meaningless)

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

Every variant generates exactly the same number of tokens: the model has no end-of-text
token during the benchmark (``IdTokenizer.eos_token_id`` is -1, and the Hugging Face model's
own ``generation_config`` has no EOS, since ``generate`` falls back to it for every setting
left at None). After a short untimed warm-up (2 new tokens each), the variants run
interleaved, A B C A B C ..., so that a change in machine load hits all of them alike, and
the table reports medians. The first timed round also checks the answers: the three greedy
variants must produce the same tokens, the three beam searches the same beams and summed
log-probabilities (two beams whose scores tie within float noise may come out in either
order), and the two batched runs the same padded sequences. ``--budget`` (default 270 s, model building included) skips the rounds that would end
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
import importlib
import io
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sampling_course.apps.threads import torch_threads

# A text for the real-GPT-2 prompt (its first 32 tokens are used).
GPT2_PROMPT_TEXT = (
    "The history of the city begins with a small settlement on the river, where traders from the "
    "north and the south met every spring to exchange wool, salt and iron. Over the following "
    "centuries the market grew into a town"
)
# The quick smoke run: a GPT-2 architecture small enough to run in a second or two.
QUICK_DIMS = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=1024)
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


class IdTokenizer:
    """A stand-in tokenizer whose text is token ids: "464 3290 318" <-> tensor([[464, 3290, 318]]).

    ``eos_token_id`` is -1, an id no model produces, so generation never stops early and
    every run generates exactly the number of tokens asked for.
    """

    eos_token_id = -1

    def encode(self, text: str, return_tensors: str | None = None):
        ids = [int(token) for token in text.split()]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def decode(self, ids) -> str:
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        return " ".join(str(i) for i in ids)


@dataclass
class Variant:
    """One way of decoding: ``run(new_tokens)`` returns the sequences it generated, as lists of ids."""

    task: str  # "greedy", "beam" or "batched"
    name: str  # "uncached", "cached", "static", "engine" or "hf"
    label: str
    run: Callable[[int], list]
    times: list[float] = field(default_factory=list)


@dataclass
class Setup:
    model_name: str
    hf_model: torch.nn.Module
    demo: torch.nn.Module
    impl: str
    prompt_ids: list[int]
    new_tokens: int
    beam_new_tokens: int
    num_beams: int
    batch_prompts: list[list[int]]  # the batched task's prompts, of different lengths
    batch_new_tokens: int


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def random_gpt2(dims: dict, seed: int) -> torch.nn.Module:
    """A GPT2LMHeadModel with Hugging Face's own random initialisation (seeded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from sampling_course.reference import quiet_transformers

    quiet_transformers()
    config = GPT2Config(**dims)
    # Keep the special ids inside the vocabulary (they are never used: see IdTokenizer).
    config.bos_token_id = config.eos_token_id = config.vocab_size - 1
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


def build(args: argparse.Namespace) -> Setup:
    from sampling_course.config import Config
    from sampling_course.reference import quiet_transformers, gpt2_local_dir
    from sampling_course.weights import demo_state_dict

    generator = torch.Generator().manual_seed(args.seed)
    local = None if args.quick or args.model == "random" else gpt2_local_dir()
    if args.model == "gpt2" and local is None:
        raise SystemExit(
            "real GPT-2 small is not in the local Hugging Face cache; run `sampling-course download-gpt2` "
            "or use --model random"
        )
    if local is not None:
        from transformers import GPT2LMHeadModel, GPT2TokenizerFast

        quiet_transformers()
        hf_model = GPT2LMHeadModel.from_pretrained(local, local_files_only=True).eval()
        tokenizer = GPT2TokenizerFast.from_pretrained(local, local_files_only=True)
        prompt_ids = tokenizer(GPT2_PROMPT_TEXT).input_ids[: args.prompt_tokens]
        text_ids = tokenizer(GPT2_PROMPT_TEXT).input_ids
        model_name = "GPT-2 small (real weights)"
    else:
        dims = QUICK_DIMS if args.quick else {}
        hf_model = random_gpt2(dims, args.seed)
        vocab = hf_model.config.vocab_size
        prompt_ids = torch.randint(0, vocab, (args.prompt_tokens,), generator=generator).tolist()
        text_ids = torch.randint(0, vocab, (4 * args.prompt_tokens,), generator=generator).tolist()
        model_name = "tiny random GPT-2 (smoke run)" if args.quick else "GPT-2 small dimensions, random weights"
    if len(prompt_ids) != args.prompt_tokens:
        raise SystemExit(f"the prompt has {len(prompt_ids)} tokens, not {args.prompt_tokens}")
    hf_model = hf_model.float()
    # generate() fills every setting left at None from the model's own config: take its EOS away there.
    hf_model.generation_config.eos_token_id = None
    transformer = importlib.import_module(f"{args.impl}.transformer")
    demo = transformer.DemoTransformer(Config.from_hf(hf_model.config))
    demo.load_state_dict(demo_state_dict(hf_model), strict=True)
    batch_prompts = batch_of_prompts(text_ids, args.batch_size, args.prompt_tokens, generator)
    total = args.prompt_tokens + max(args.new_tokens, args.beam_new_tokens, args.batch_new_tokens)
    if total > demo.cfg.n_ctx:
        raise SystemExit(f"prompt + new tokens = {total} is more than the model's n_ctx={demo.cfg.n_ctx}")
    return Setup(
        model_name, hf_model, demo.eval(), args.impl, prompt_ids, args.new_tokens, args.beam_new_tokens, args.num_beams,
        batch_prompts, args.batch_new_tokens,
    )


def batch_of_prompts(text_ids: list[int], batch: int, longest: int, generator: torch.Generator) -> list[list[int]]:
    """``batch`` windows of ``text_ids`` with lengths from ``longest // 2`` to ``longest``: the longest
    first, so the batch is always exactly ``longest`` wide, the others at random lengths."""
    lengths = [longest] + torch.randint(max(1, longest // 2), longest + 1, (batch - 1,), generator=generator).tolist()
    starts = torch.randint(0, len(text_ids) - longest + 1, (batch,), generator=generator).tolist()
    return [text_ids[start : start + n] for start, n in zip(starts, lengths)]


def left_pad_ids(prompts: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Hugging Face's input for a batch: ids left-padded with ``pad``, and the attention mask."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


# ---------------------------------------------------------------------------------------
# The variants
# ---------------------------------------------------------------------------------------


def variants(setup: Setup) -> list[Variant]:
    """The variants; each ``run(new_tokens)`` returns its sequences (prompt included) as id lists."""
    from transformers import GenerationConfig

    sampling = importlib.import_module(f"{setup.impl}.sampling")
    engine = importlib.import_module(f"{setup.impl}.generate")
    KeyValueCache = importlib.import_module(f"{setup.impl}.transformer").KeyValueCache
    StaticKeyValueCache = importlib.import_module(f"{setup.impl}.caches").StaticKeyValueCache
    cfg = setup.demo.cfg
    tokenizer = IdTokenizer()
    sampler = sampling.TransformerSampler(setup.demo, tokenizer)
    prompt = tokenizer.decode(setup.prompt_ids)
    input_ids = torch.tensor([setup.prompt_ids])
    beams = setup.num_beams

    def hf_generate(new_tokens: int, ids: Tensor = input_ids, mask: Tensor | None = None, **beam_settings) -> list:
        # eos_token_id=None: no token ends a sequence, as with IdTokenizer.
        config = GenerationConfig(
            max_new_tokens=new_tokens, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0,
            **beam_settings,
        )
        mask = torch.ones_like(ids) if mask is None else mask
        with torch.inference_mode():
            out = setup.hf_model.generate(ids, attention_mask=mask, generation_config=config)
        return out.tolist()

    # The batched task: the engine left-pads with id 0 (IdTokenizer has no pad and no valid EOS), as HF is told to.
    batch_texts = [tokenizer.decode(p) for p in setup.batch_prompts]
    batch_ids, batch_mask = left_pad_ids(setup.batch_prompts, pad=0)

    def engine_generate(new_tokens: int, kv_cache=None) -> list:
        return engine.generate(setup.demo, tokenizer, batch_texts, new_tokens, temperature=0.0, kv_cache=kv_cache).tolist()

    def static(new_tokens: int, batch: int = 1, prompt_len: int = len(setup.prompt_ids)):
        """A static cache sized for exactly this run, as a generator that knows its lengths would allocate it."""
        return StaticKeyValueCache.new_empty(cfg, batch=batch, max_len=prompt_len + new_tokens)

    def greedy(new_tokens: int, kv_cache=None) -> list:
        return [tokenizer.encode(sampler.sample(prompt, new_tokens, temperature=0, kv_cache=kv_cache))]

    def beam_search(new_tokens: int, kv_cache=None) -> list:
        found = sampler.beam_search(prompt, beams, beams, new_tokens, kv_cache=kv_cache)
        return [tokenizer.encode(text) for _, text in found]

    # Summed log-probs for all beams, as in beam_search: no length penalty, and no early stop.
    hf_beams = dict(num_beams=beams, num_return_sequences=beams, length_penalty=0.0, early_stopping="never")
    return [
        Variant("greedy", "uncached", "uncached", lambda n: greedy(n)),
        Variant("greedy", "cached", "KV cache", lambda n: greedy(n, KeyValueCache.new_empty(cfg))),
        Variant("greedy", "static", "static cache", lambda n: greedy(n, static(n))),
        Variant("greedy", "hf", "HF generate", lambda n: hf_generate(n)),
        Variant("beam", "uncached", "uncached", lambda n: beam_search(n)),
        Variant("beam", "cached", "KV cache", lambda n: beam_search(n, KeyValueCache.new_empty(cfg))),
        Variant("beam", "static", "static cache", lambda n: beam_search(n, static(n, batch=beams))),
        Variant("beam", "hf", "HF generate", lambda n: hf_generate(n, **hf_beams)),
        Variant("batched", "engine", "engine generate", engine_generate),
        Variant("batched", "static", "engine, static cache",
                lambda n: engine_generate(n, static(n, len(batch_texts), batch_ids.shape[1]))),
        Variant("batched", "hf", "HF generate", lambda n: hf_generate(n, batch_ids, batch_mask)),
    ]


# ---------------------------------------------------------------------------------------
# Checks: every variant answers the same, with exactly the requested number of tokens
# ---------------------------------------------------------------------------------------


class BenchCheckError(AssertionError):
    """The variants disagree or generated the wrong number of tokens: the timings would mean nothing."""


def check_lengths(variant: Variant, sequences: list, setup: Setup) -> None:
    new = new_tokens_of(setup, variant.task)
    count = {"greedy": 1, "beam": setup.num_beams, "batched": len(setup.batch_prompts)}[variant.task]
    width = max(map(len, setup.batch_prompts)) if variant.task == "batched" else len(setup.prompt_ids)
    expected = width + new
    lengths = [len(seq) for seq in sequences]
    if lengths != [expected] * count:
        raise BenchCheckError(
            f"{variant.task}/{variant.name} returned sequences of lengths {lengths}, "
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


def run(setup: Setup, repeats: int, progress: bool = True, budget_s: float | None = None) -> list[Variant]:
    """A short warm-up, then ``repeats`` timed rounds with the variants interleaved.

    The first timed round's answers are checked (BenchCheckError when they disagree). With
    ``budget_s``, no round starts that would probably end after ``budget_s`` seconds; at
    least one round always runs.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    all_variants = variants(setup)
    bar = tqdm(total=len(all_variants) * (1 + repeats), desc="bench", disable=not progress, leave=False)
    for variant in all_variants:  # first calls pay for lazy initialisation: keep them out of the timings
        bar.set_postfix_str(f"warm-up: {variant.task} {variant.name}")
        with quiet(progress):
            variant.run(2)
        bar.update()
    for round_ in range(1, repeats + 1):
        elapsed = time.perf_counter() - started
        if budget_s is not None and round_ > 1 and elapsed * round_ / (round_ - 1) > budget_s:
            break  # one more round (as long as the average so far) would overrun the budget
        outputs: dict[str, dict[str, list]] = {"greedy": {}, "beam": {}, "batched": {}}
        for variant in all_variants:
            bar.set_postfix_str(f"round {round_}: {variant.task} {variant.name}")
            with quiet(progress):
                start = time.perf_counter()
                sequences = variant.run(new_tokens_of(setup, variant.task))
                variant.times.append(time.perf_counter() - start)
            check_lengths(variant, sequences, setup)
            outputs[variant.task][variant.name] = sequences
            bar.update()
        if round_ == 1:
            check_greedy(outputs["greedy"])
            check_beams(setup, outputs["beam"])
            check_batched(outputs["batched"])
    bar.close()
    return all_variants


# ---------------------------------------------------------------------------------------
# Memory bandwidth: the limit of a one-token decode step
# ---------------------------------------------------------------------------------------


def measure_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second that this machine streams from memory: the best of ``repeats`` sums over a big buffer.

    A sum reads each float once and does one addition with it, so it runs at the speed
    memory delivers data, with torch's threads as the decode steps use them. The buffer is
    larger than any CPU cache, so that it really comes from memory.
    """
    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()  # touch every page once before timing
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * data.element_size() / best


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights a one-token decode step reads: every parameter, except the one row of
    the embedding and of the position embedding that the token uses."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for table in (model.embed.W_E, model.pos_embed.W_pos):
        total -= (table.shape[0] - 1) * table.shape[1] * table.element_size()
    return total


def bandwidth_report(setup: Setup, results: list[Variant], bandwidth: float, console) -> None:
    """Greedy tokens per second beside the bandwidth limit: bandwidth / bytes read per token."""
    per_token = weight_bytes_per_token(setup.demo)
    limit = bandwidth / per_token
    console.print(
        f"memory bandwidth, measured: {bandwidth / 1e9:.1f} GB/s; a decode step reads {per_token / 1e6:.0f} MB "
        f"of weights, so greedy decoding is limited to {limit:.1f} tokens/s"
    )
    for variant in results:
        if variant.task == "greedy" and variant.name != "uncached":
            tokens_per_s = setup.new_tokens / statistics.median(variant.times)
            console.print(f"  greedy, {variant.label}: {tokens_per_s:.1f} tokens/s = {tokens_per_s / limit:.0%} of the limit")


def report(setup: Setup, results: list[Variant], console) -> list[tuple[str, float, float, bool]]:
    from rich.table import Table

    by_key = {(v.task, v.name): v for v in results}
    median = {key: statistics.median(v.times) for key, v in by_key.items()}
    batch = len(setup.batch_prompts)
    # New tokens per run, all rows counted.
    new = {"greedy": setup.new_tokens, "beam": setup.beam_new_tokens, "batched": batch * setup.batch_new_tokens}
    labels = {"greedy": "greedy", "beam": f"beam x{setup.num_beams}", "batched": f"batched greedy x{batch}"}

    table = Table(
        "task", "variant", "median s", "new tokens/s", "speed vs HF", "speed vs uncached",
        title=f"{setup.model_name}: fp32, CPU ({torch.get_num_threads()} threads), batch 1 (batched: {batch}, "
        f"left-padded prompts of {min(map(len, setup.batch_prompts))}-{max(map(len, setup.batch_prompts))} tokens), "
        f"prompt {len(setup.prompt_ids)} tokens; medians of {len(results[0].times)} runs",
    )
    for (task, name), variant in by_key.items():
        seconds = median[task, name]
        uncached = median.get((task, "uncached"))
        table.add_row(
            labels[task],
            variant.label,
            f"{seconds:.3f}",
            f"{new[task] / seconds:.1f}",
            f"{median[task, 'hf'] / seconds:.2f}x",
            f"{uncached / seconds:.2f}x" if uncached is not None else "-",
        )
    console.print(table)

    targets = Table("target", "measured", "wanted", "result", title="Targets (ratios of tokens/s)")
    outcomes = []
    for label, task, fast, slow, wanted in TARGETS:
        ratio = median[task, slow] / median[task, fast]
        ok = ratio >= wanted
        outcomes.append((label, ratio, wanted, ok))
        targets.add_row(label, f"{ratio:.2f}x", f">= {wanted:.1f}x", "[green]PASS[/]" if ok else "[red]MISS[/]")
    console.print(targets)
    return outcomes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sampling-course bench", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=["auto", "random", "gpt2"], default="auto",
                        help="real GPT-2 small (gpt2), its dimensions with random weights (random), or "
                        "gpt2 when it is in the local cache and random otherwise (auto, the default)")
    parser.add_argument("--impl", choices=["solutions", "exercises"], default="solutions",
                        help="whose code to time (default: solutions)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64, help="new tokens of greedy decoding (default 64)")
    parser.add_argument("--beam-new-tokens", type=int, default=40, help="new tokens of beam search (default 40)")
    parser.add_argument("--num-beams", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts in the batched task (default 8)")
    parser.add_argument("--batch-new-tokens", type=int, default=64, help="new tokens per row, batched task (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--budget", type=float, default=270.0,
                        help="seconds for the whole run: rounds that would end later are skipped (default 270)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompt")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a tiny random model, few tokens, one timed round (timings meaningless)")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompt_tokens, args.new_tokens, args.beam_new_tokens = 8, 8, 6
        args.num_beams, args.repeats, args.batch_new_tokens = 4, 1, 8
    for name in ("prompt_tokens", "new_tokens", "beam_new_tokens", "num_beams", "repeats", "batch_size", "batch_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with torch_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    started = time.perf_counter()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
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
    console.print("[green]checked:[/] every variant generated the same tokens (greedy, batched) and beams (beam search)")
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
