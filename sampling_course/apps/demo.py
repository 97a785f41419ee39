"""`sampling-course demo`: the course's decoders at work on one prompt, next to the reference.

It runs the solutions where they can be imported (the course's checkout) and the learner's own
code in `exercises/` otherwise (the student release) or when asked (`--impl exercises`).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING
from unittest import mock

from rich.console import Console
from rich.table import Table

from sampling_course.apps.options import (
    OneLineParser,
    UsageError,
    add_device_option,
    add_impl_option,
    add_threads_option,
    command,
    device_from,
    integer,
    nonempty,
    parse,
)

if TYPE_CHECKING:  # torch loads once the arguments are known to be good
    import torch

    from sampling_course.config import Config
    from sampling_course.reference import Reference
    from sampling_course.tokenizer import Tokenizer

DEFAULT_PROMPT = "When I was a kid, John and Mary went to the"
# The story models know only their children's stories, each of which starts after <|endoftext|>.
STORY_PROMPT = ("<|endoftext|>Once upon a time, there was a little girl named Lily. She lived in a small house "
                "near the woods. Lily had a dog named Spot.")

# (label, sample() keyword arguments): one row of the decoding table each.
DECODING_SETTINGS: list[tuple[str, dict]] = [
    ("greedy", dict(temperature=0.0)),
    ("temperature 0.5", dict(temperature=0.5)),
    ("temperature 1.0", dict(temperature=1.0)),
    ("temperature 1.5", dict(temperature=1.5)),
    ("frequency penalty 2.0", dict(temperature=1.0, frequency_penalty=2.0)),
    ("top-k 5", dict(temperature=1.0, top_k=5)),
    ("top-p 0.9", dict(temperature=1.0, top_p=0.9)),
]


def next_token_table(reference: Reference, model: torch.nn.Module, prompt: str, top: int = 10) -> Table:
    """Part 1: the top next tokens from DemoTransformer and from the reference, side by side."""
    import torch

    tokens = reference.tokenizer(prompt, return_tensors="pt").input_ids.to(reference.device)
    with torch.inference_mode():
        demo_logits = model(tokens)[0, -1]
        ref_logits = reference.hf_model(tokens).logits[0, -1]
    demo_probs, ref_probs = demo_logits.softmax(-1), ref_logits.softmax(-1)
    demo_top = demo_probs.topk(top).indices.tolist()
    ref_top = ref_probs.topk(top).indices.tolist()
    max_diff = (demo_logits - ref_logits).abs().max().item()
    table = Table(
        "rank", "DemoTransformer", "p", "reference", "p", "same",
        title=f"Part 1 · next token after {prompt!r}",
        caption=f"top-{top} agreement {sum(a == b for a, b in zip(demo_top, ref_top))}/{top}; "
        f"largest logit difference {max_diff:.2e}",
    )
    for rank, (d, r) in enumerate(zip(demo_top, ref_top), start=1):
        table.add_row(
            str(rank),
            repr(reference.tokenizer.decode(d)), f"{demo_probs[d]:.4f}",
            repr(reference.tokenizer.decode(r)), f"{ref_probs[r]:.4f}",
            "[green]✓[/]" if d == r else "[red]✗[/]",
        )
    return table


def decoding_table(sampler, prompt: str, max_tokens: int, seed: int, measure: bool = False) -> Table:
    """Part 2: one continuation per decoding setting, all from the same seed.

    The same seed means the same random numbers for every row, so two rows differ only where
    their settings move the probabilities enough for those numbers to pick another token.
    On a confident model neighbouring settings (temperature 0.5 and 1.0, say) can give the
    same text; the caption says so, and other seeds show other draws.

    ``measure=True`` (for the story models) adds the share of the continuation's sentences
    that the story grammar can write, from ``sampling_course.report.decoding_report``.
    """
    columns = ["setting", "continuation"] + (["valid sentences"] if measure else [])
    table = Table(
        *columns, title=f"Part 2 · decoding settings (seed {seed})",
        caption="Every row draws with the same seed, so every row reads the same random numbers: a row differs "
        "from another only where its setting changes which token those numbers pick. Where the model is sure, "
        "neighbouring settings pick the same tokens (identical rows are not a bug); --seed N shows other draws.",
    )
    for label, kwargs in DECODING_SETTINGS:
        text = sampler.sample(prompt, max_tokens_generated=max_tokens, seed=seed, **kwargs)
        row = [label, repr(text[len(prompt):])]
        if measure:
            from sampling_course.report import decoding_report
            from sampling_course.stories import EOS_TOKEN

            valid = decoding_report([text[len(prompt):]], prompt=prompt.removeprefix(EOS_TOKEN)).valid
            row.append("-" if valid != valid else f"{valid:.0%}")  # nan: no complete sentence
        table.add_row(*row)
    return table


def beam_table(sampler, prompt: str, max_tokens: int) -> Table:
    """Part 3: beam search with and without n-gram blocking."""
    table = Table("setting", "logprob sum", "continuation", title="Part 3 · beam search (4 beams)")
    for label, ngram in [("no blocking", None), ("no_repeat_ngram_size=2", 2)]:
        results = sampler.beam_search(prompt, num_return_sequences=2, num_beams=4,
                                      max_new_tokens=max_tokens, no_repeat_ngram_size=ngram)
        for logprob, text in results:
            table.add_row(label, f"{logprob:.2f}", repr(text[len(prompt):]))
    return table


def cache_table(sampler, model, prompt: str, max_tokens: int, KeyValueCache) -> Table:
    """Part 4: the same greedy continuation with and without ``KeyValueCache`` (part 4's), timed once each."""
    table = Table("variant", "seconds", "same text", title=f"Part 4 · KV cache ({max_tokens} greedy tokens)")
    timings = {}
    for label, cache in [("uncached", None), ("cached", KeyValueCache.new_empty(model.cfg))]:
        start = time.perf_counter()
        timings[label] = (sampler.sample(prompt, max_tokens, temperature=0.0, kv_cache=cache), time.perf_counter() - start)
    same = timings["uncached"][0] == timings["cached"][0]
    for label, (_, seconds) in timings.items():
        table.add_row(label, f"{seconds:.3f}", "[green]✓[/]" if same else "[red]✗[/]")
    return table


@contextmanager
def progress_bars_on_a_terminal_only(sampling: ModuleType) -> Iterator[None]:
    """Inside the block, progress bars (beam search's, a GPT-2 download's) show only when stderr is a
    terminal: redrawn with carriage returns, they are debris in a file or a pipe."""
    if sys.stderr.isatty():
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_bars_were_off = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        if hasattr(sampling, "tqdm"):
            with mock.patch.object(sampling, "tqdm", functools.partial(sampling.tqdm, disable=True)):
                yield
        else:
            yield
    finally:
        if not hub_bars_were_off:
            enable_progress_bars()


REFERENCES = ["auto", "gpt2", "story", "story-draft", "tiny"]


def parse_args(argv: Sequence[str] | None):
    parser = OneLineParser(prog="sampling-course demo", description=__doc__)
    parser.add_argument("--reference", choices=REFERENCES, default="auto",
                        help="auto: real GPT-2 when available, else the offline story model")
    parser.add_argument("--prompt", type=nonempty("--prompt"), default=None,
                        help="default: the start of a story for the story models, an everyday sentence otherwise")
    parser.add_argument("--max-tokens", type=integer("--max-tokens", 1), default=24,
                        help="new tokens per continuation (default 24)")
    parser.add_argument("--seed", type=integer("--seed", 0), default=0, help="seed of the sampled rows (default 0)")
    add_impl_option(parser, "solutions", "whose code runs (parts 1 to 4)")
    add_device_option(parser)
    add_threads_option(parser)
    return parser, parse(parser, argv)


def checked_settings(name: str, flag: str = "--reference") -> "tuple[str, Config, Tokenizer]":
    """The checkpoint ``name`` stands for, its Config and tokenizer, without torch (``reference_settings``); an
    unavailable GPT-2 is a usage error that says which flag works offline."""
    from sampling_course.reference import ReferenceUnavailable, reference_settings

    try:
        return reference_settings(name)
    except ReferenceUnavailable as exc:
        raise UsageError(f"{exc} ({flag} story works offline)") from None


@command("sampling-course demo")
def main(argv: Sequence[str] | None = None) -> int:
    parser, args = parse_args(argv)
    if isinstance(args, int):
        return args
    # The checkpoint's settings and tokenizer load in a moment, without torch: check the prompt
    # against n_ctx before torch and the weights load.
    name, cfg, tokenizer = checked_settings(args.reference)
    story = name.startswith("story")
    prompt = args.prompt if args.prompt is not None else STORY_PROMPT if story else DEFAULT_PROMPT
    n_prompt = len(tokenizer.encode(prompt))
    if n_prompt + args.max_tokens > cfg.n_ctx:
        raise UsageError(f"the prompt ({n_prompt} token{'s' * (n_prompt != 1)}) and --max-tokens {args.max_tokens} do not fit in "
                         f"{name}'s context of {cfg.n_ctx} tokens")
    device = device_from(parser, args)
    from sampling_course.apps.threads import course_threads, torch_threads
    from sampling_course.reference import load_reference

    with torch_threads(course_threads(args.threads, cfg.d_model)):
        try:
            return _run(load_reference(args.reference, device), prompt, args.max_tokens, args.seed, story, args.impl)
        except NotImplementedError:
            print(f"not implemented yet: the demo runs {args.impl}/ (parts 1 to 4: the transformer, sampling, beam "
                  "search and the KV cache); `sampling-course progress` shows what is left", file=sys.stderr)
            return 1


def _run(reference: "Reference", prompt: str, max_tokens: int, seed: int, story: bool, impl: str = "solutions") -> int:
    from sampling_course.implementation import impl_module, load_demo

    sampling = impl_module("sampling", impl)
    kv_cache = impl_module("kv_cache", impl)
    console = Console()
    with progress_bars_on_a_terminal_only(sampling):
        console.print(f"Reference: [bold]{reference.name}[/] ({reference.cfg.n_layers} layers, "
                      f"d_model {reference.cfg.d_model}, vocabulary {reference.cfg.d_vocab}), on {reference.device}")
        model = load_demo(reference, impl_module("transformer", impl))
        sampler = sampling.TransformerSampler(model, reference.tokenizer)
        console.print(next_token_table(reference, model, prompt))
        console.print(decoding_table(sampler, prompt, max_tokens, seed, measure=story))
        console.print(beam_table(sampler, prompt, max_tokens))
        console.print(cache_table(sampler, model, prompt, max_tokens, kv_cache.KeyValueCache))
    return 0
