"""Measure speculative decoding: acceptance, tokens per target forward and wall-clock speedup (part 7).

    sampling-course bench-speculative            # the story models, or a labelled stand-in pair
    sampling-course bench-speculative --quick    # a smoke run on tiny random models (timings meaningless)

The pair: ``load_reference("story")`` as the target and ``load_reference("story-draft")``
as the draft when both load. Otherwise a stand-in pair, labelled as such in every table:
the target is the offline stand-in ``"tiny"`` (random weights) and the draft is its own
first layer (the same embeddings and unembedding, one block instead of two), so that the
draft's guesses are related to the target's as a trained draft's would be.

For every gamma (1 to 8 by default), at one temperature (1.0 by default, no top-k/top-p),
on the same prompts:

* ``speculative_generate`` of the chosen implementation: the acceptance rate alpha
  (accepted / judged proposals, pooled over the runs), the tokens per target forward it
  achieved, and the theory's expectation for that alpha, (1 - alpha^(gamma+1)) / (1 - alpha);
* its wall-clock time per token against target-only cached generation
  (``TransformerSampler.sample`` with a ``KeyValueCache``), and the theory's speedup
  (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + v)) with c the draft's cost per token and
  v the cost of the target's verifying forward over gamma + 1 positions, both in units of
  the target's cost per token (measured here too);
* the same with part 6's ``StaticKeyValueCache`` for both models (``cache_class=``; it
  crops by moving a counter and runs the fast path), against target-only generation on a
  static cache (``--no-static`` skips it);
* Hugging Face assisted generation as a peer: ``hf_target.generate(...,
  assistant_model=hf_draft)`` with ``num_assistant_tokens=gamma``,
  ``num_assistant_tokens_schedule="constant"`` (set explicitly: the "heuristic" schedules
  change the number of proposals from round to round) and ``assistant_confidence_threshold=0``
  (its default, 0.4, stops drafting early when the draft is unsure), against plain
  ``hf_target.generate``;
  its tokens per target forward are counted with a forward hook;
* prompt-lookup drafting, which needs no draft model: ``speculative_generate`` with
  ``prompt_lookup_num_tokens=gamma`` (the tokens that followed the last earlier occurrence
  of the text's final 2-gram), beside Hugging Face's ``generate(prompt_lookup_num_tokens=gamma)``
  (which takes the first occurrence), with the same columns, in a second table.

Every run generates exactly the requested number of tokens, and every run is checked for
it: the end-of-text token does not stop generation here (token ids go through
``IdTokenizer``, as in ``sampling-course bench``, and both Hugging Face models run with a
generation config whose ``eos_token_id`` is None). Runs are interleaved, all methods once per
round, so that a change in machine load hits all of them alike; times are medians over the
rounds. Before timing, each gamma is checked at temperature 0: speculative greedy text must
equal the target's cached greedy text, and assisted greedy text Hugging Face's greedy text.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sampling_course.apps.options import (
    OneLineParser,
    add_device_option,
    add_impl_option,
    add_threads_option,
    command,
    device_from,
    integer,
    number,
)

if TYPE_CHECKING:  # torch loads once the arguments are known to be good
    from sampling_course.apps.speculative_pair import Pair


class BenchCheckError(AssertionError):
    """A method generated the wrong number of tokens, or its greedy text differs from plain greedy text.

    Either way the timings would mean nothing.
    """


@dataclass
class Row:
    """The measurements for one gamma."""

    gamma: int
    accepted: int = 0
    judged: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    seconds: list[float] = field(default_factory=list)
    static_seconds: list[float] = field(default_factory=list)  # the same runs on static caches
    hf_seconds: list[float] = field(default_factory=list)
    hf_new_tokens: int = 0
    hf_target_forwards: int = 0
    # Prompt-lookup drafting: ours and Hugging Face's.
    lookup_accepted: int = 0
    lookup_judged: int = 0
    lookup_new_tokens: int = 0
    lookup_target_forwards: int = 0
    lookup_seconds: list[float] = field(default_factory=list)
    hf_lookup_seconds: list[float] = field(default_factory=list)
    hf_lookup_new_tokens: int = 0
    hf_lookup_target_forwards: int = 0

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged if self.judged else float("nan")

    @property
    def lookup_alpha(self) -> float:
        return self.lookup_accepted / self.lookup_judged if self.lookup_judged else float("nan")

    @property
    def lookup_tokens_per_forward(self) -> float:
        return self.lookup_new_tokens / self.lookup_target_forwards if self.lookup_target_forwards else float("nan")

    @property
    def hf_lookup_tokens_per_forward(self) -> float:
        return self.hf_lookup_new_tokens / self.hf_lookup_target_forwards if self.hf_lookup_target_forwards else float("nan")

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards

    @property
    def hf_tokens_per_forward(self) -> float:
        return self.hf_new_tokens / self.hf_target_forwards if self.hf_target_forwards else float("nan")


@dataclass
class Results:
    pair: Pair
    temperature: float
    new_tokens: int
    rows: list[Row]
    baseline: list[float] = field(default_factory=list)  # target-only cached generation, seconds per run
    static_baseline: list[float] = field(default_factory=list)  # the same on a StaticKeyValueCache
    draft_only: list[float] = field(default_factory=list)  # draft-only cached generation, seconds per run
    hf_baseline: list[float] = field(default_factory=list)  # plain hf_target.generate, seconds per run
    verify_cost: dict[int, float] = field(default_factory=dict)  # gamma -> target forward over gamma+1 positions / over 1

    def ms_per_token(self, seconds: list[float]) -> float:
        return 1000 * statistics.median(seconds) / self.new_tokens

    @property
    def draft_cost(self) -> float:
        """c: the draft's time per token over the target's (cached generation, one token per forward)."""
        return statistics.median(self.draft_only) / statistics.median(self.baseline)


def expected_tokens_per_forward(alpha: float, gamma: int) -> float:
    """The theory's mean tokens per round when each proposal is accepted with probability alpha."""
    return gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, draft_cost: float, verify_cost: float) -> float:
    """Tokens per round over the cost of a round (gamma draft steps and one verifying target forward)."""
    return expected_tokens_per_forward(alpha, gamma) / (gamma * draft_cost + verify_cost)


# ---------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------


def check_length(method: str, ids: list[int], prompt: list[int], n: int) -> None:
    """Every method must generate exactly ``n`` new tokens, or the times per token compare different work."""
    if len(ids) != len(prompt) + n:
        raise BenchCheckError(
            f"{method} generated {len(ids) - len(prompt)} new tokens after a prompt of {len(prompt)}, expected {n} "
            "(did the end-of-text token stop it?)"
        )


def check_greedy(pair: Pair, gammas: list[int], n: int, caches: tuple[str, ...] = ("dynamic",),
                 lookup: bool = True) -> None:
    """At temperature 0, speculative and assisted greedy text equal plain greedy text (for every gamma and cache),
    and so does prompt-lookup drafting, ours and Hugging Face's (``lookup``)."""
    from sampling_course.apps.speculative_pair import hf_generate, ours_cached, ours_lookup, ours_speculative

    for prompt in pair.prompts[:1]:
        plain = ours_cached(pair, pair.target, prompt, n, 0.0, 0)
        check_length("target-only cached greedy generation", plain, prompt, n)
        hf_plain, _ = hf_generate(pair, prompt, n, 0.0, 0)
        check_length("plain Hugging Face greedy generate", hf_plain, prompt, n)
        for gamma in gammas:
            for cache in caches:
                ours, _ = ours_speculative(pair, prompt, n, gamma, 0.0, 0, cache)
                if ours != plain:
                    raise BenchCheckError(
                        f"gamma={gamma}: speculative greedy text ({cache} caches) differs from the target's cached greedy text"
                    )
            assisted, _ = hf_generate(pair, prompt, n, 0.0, 0, gamma=gamma)
            if assisted != hf_plain:
                raise BenchCheckError(f"gamma={gamma}: HF assisted greedy text differs from HF greedy text")
            if lookup:
                ours, _ = ours_lookup(pair, prompt, n, gamma, 0.0, 0)
                if ours != plain:
                    raise BenchCheckError(f"gamma={gamma}: prompt-lookup greedy text differs from the target's greedy text")
                looked_up, _ = hf_generate(pair, prompt, n, 0.0, 0, gamma=gamma, lookup=True)
                if looked_up != hf_plain:
                    raise BenchCheckError(f"gamma={gamma}: HF prompt-lookup greedy text differs from HF greedy text")


def measure(
    pair: Pair,
    gammas: list[int],
    new_tokens: int,
    temperature: float = 1.0,
    repeats: int = 3,
    hf: bool = True,
    check: bool = True,
    progress: bool = False,
    static: bool = False,
    lookup: bool = True,
) -> Results:
    """Warm-up and greedy checks, then ``repeats`` interleaved rounds of every method on every prompt.

    ``static``: also run ours with part 6's StaticKeyValueCache (speculative and target-only).
    """
    from tqdm.auto import tqdm

    from sampling_course.apps.speculative_pair import hf_generate, ours_cached, ours_lookup, ours_speculative, verify_cost

    longest = max(len(p) for p in pair.prompts)
    if longest + new_tokens > pair.n_ctx:
        raise ValueError(f"prompt ({longest} tokens) + new_tokens={new_tokens} is more than n_ctx={pair.n_ctx}")
    results = Results(pair, temperature, new_tokens, [Row(gamma) for gamma in gammas])
    caches = ("dynamic", "static") if static else ("dynamic",)
    if check:
        check_greedy(pair, gammas, min(24, new_tokens), caches, lookup=lookup and hf)
    prompt = pair.prompts[0]
    for gamma in gammas:  # first calls pay for lazy initialisation: keep them out of the timings
        for cache in caches:
            ours_speculative(pair, prompt, 4, gamma, temperature, 0, cache)
        if hf:
            hf_generate(pair, prompt, 4, temperature, 0, gamma=gamma)
    # Best of 20 timings each: a verifying pass takes milliseconds, and single timings scatter on a busy machine.
    results.verify_cost = verify_cost(pair, gammas, repeats=20)

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start

    runs = [(r, p) for r in range(repeats) for p in range(len(pair.prompts))]
    for r, p in tqdm(runs, desc="bench-speculative", disable=not progress, leave=False):
        prompt, seed = pair.prompts[p], 1000 * r + p
        ids, seconds = timed(lambda: ours_cached(pair, pair.target, prompt, new_tokens, temperature, seed))
        check_length("target-only cached generation", ids, prompt, new_tokens)
        results.baseline.append(seconds)
        if static:
            ids, seconds = timed(lambda: ours_cached(pair, pair.target, prompt, new_tokens, temperature, seed, "static"))
            check_length("target-only generation on a static cache", ids, prompt, new_tokens)
            results.static_baseline.append(seconds)
        ids, seconds = timed(lambda: ours_cached(pair, pair.draft, prompt, new_tokens, temperature, seed))
        check_length("draft-only cached generation", ids, prompt, new_tokens)
        results.draft_only.append(seconds)
        if hf:
            (ids, _), seconds = timed(lambda: hf_generate(pair, prompt, new_tokens, temperature, seed))
            check_length("plain Hugging Face generate", ids, prompt, new_tokens)
            results.hf_baseline.append(seconds)
        for row in results.rows:
            (ids, stats), seconds = timed(lambda: ours_speculative(pair, prompt, new_tokens, row.gamma, temperature, seed))
            check_length(f"speculative_generate (gamma={row.gamma})", ids, prompt, new_tokens)
            if stats.new_tokens != new_tokens:
                raise BenchCheckError(
                    f"speculative_generate (gamma={row.gamma}) counted {stats.new_tokens} new tokens in its stats, "
                    f"expected {new_tokens}"
                )
            row.seconds.append(seconds)
            row.accepted += stats.accepted
            row.judged += stats.judged
            row.new_tokens += stats.new_tokens
            row.target_forwards += stats.target_forwards
            if static:
                (ids, _), seconds = timed(
                    lambda: ours_speculative(pair, prompt, new_tokens, row.gamma, temperature, seed, "static")
                )
                check_length(f"speculative_generate on static caches (gamma={row.gamma})", ids, prompt, new_tokens)
                row.static_seconds.append(seconds)
            if hf:
                (ids, forwards), seconds = timed(lambda: hf_generate(pair, prompt, new_tokens, temperature, seed, row.gamma))
                check_length(f"Hugging Face assisted generation (gamma={row.gamma})", ids, prompt, new_tokens)
                row.hf_seconds.append(seconds)
                row.hf_new_tokens += new_tokens
                row.hf_target_forwards += forwards
            if not lookup:
                continue
            (ids, stats), seconds = timed(lambda: ours_lookup(pair, prompt, new_tokens, row.gamma, temperature, seed))
            check_length(f"prompt-lookup speculative_generate (gamma={row.gamma})", ids, prompt, new_tokens)
            row.lookup_seconds.append(seconds)
            row.lookup_accepted += stats.accepted
            row.lookup_judged += stats.judged
            row.lookup_new_tokens += stats.new_tokens
            row.lookup_target_forwards += stats.target_forwards
            if hf:
                (ids, forwards), seconds = timed(
                    lambda: hf_generate(pair, prompt, new_tokens, temperature, seed, row.gamma, lookup=True)
                )
                check_length(f"Hugging Face prompt lookup (gamma={row.gamma})", ids, prompt, new_tokens)
                row.hf_lookup_seconds.append(seconds)
                row.hf_lookup_new_tokens += new_tokens
                row.hf_lookup_target_forwards += forwards
    return results


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------


def table(results: Results):
    """The results as a rich Table, one row per gamma."""
    import torch
    from rich.table import Table

    hf, static = bool(results.hf_baseline), bool(results.static_baseline)
    base = results.ms_per_token(results.baseline)
    columns = ["gamma", "alpha", "tok/fwd", "theory", "ms/tok", "speedup", "theory"]
    if static:
        columns += ["static\nms/tok", "static\nspeedup"]
    if hf:
        columns += ["HF tok/fwd", "HF ms/tok", "HF speedup"]
    out = Table(
        *columns,
        title=f"Speculative decoding, {results.pair.label}\ntemperature {results.temperature}, "
        f"{results.new_tokens} new tokens x {len(results.baseline)} runs, CPU ({torch.get_num_threads()} threads)",
    )
    c = results.draft_cost
    for row in results.rows:
        ms = results.ms_per_token(row.seconds)
        cells = [
            str(row.gamma),
            f"{row.alpha:.3f}",
            f"{row.tokens_per_forward:.2f}",
            f"{expected_tokens_per_forward(row.alpha, row.gamma):.2f}",
            f"{ms:.2f}",
            f"{base / ms:.2f}x",
            f"{expected_speedup(row.alpha, row.gamma, c, results.verify_cost[row.gamma]):.2f}x",
        ]
        if static:
            static_ms = results.ms_per_token(row.static_seconds)
            cells += [f"{static_ms:.2f}", f"{results.ms_per_token(results.static_baseline) / static_ms:.2f}x"]
        if hf:
            hf_ms = results.ms_per_token(row.hf_seconds)
            cells += [f"{row.hf_tokens_per_forward:.2f}", f"{hf_ms:.2f}", f"{results.ms_per_token(results.hf_baseline) / hf_ms:.2f}x"]
        out.add_row(*cells)
    return out


def lookup_table(results: Results):
    """Prompt-lookup drafting as a rich Table, one row per gamma (None when it was not measured)."""
    from rich.table import Table

    if not any(row.lookup_seconds for row in results.rows):
        return None
    hf = any(row.hf_lookup_seconds for row in results.rows)
    base = results.ms_per_token(results.baseline)
    columns = ["gamma", "alpha", "tok/fwd", "theory", "ms/tok", "speedup"]
    if hf:
        columns += ["HF tok/fwd", "HF ms/tok", "HF speedup"]
    out = Table(*columns, title=f"Prompt-lookup drafting (no draft model), {results.pair.label}")
    for row in results.rows:
        ms = results.ms_per_token(row.lookup_seconds)
        cells = [
            str(row.gamma), f"{row.lookup_alpha:.3f}", f"{row.lookup_tokens_per_forward:.2f}",
            f"{expected_tokens_per_forward(row.lookup_alpha, row.gamma):.2f}", f"{ms:.2f}", f"{base / ms:.2f}x",
        ]
        if hf:
            hf_ms = results.ms_per_token(row.hf_lookup_seconds)
            cells += [f"{row.hf_lookup_tokens_per_forward:.2f}", f"{hf_ms:.2f}",
                      f"{results.ms_per_token(results.hf_baseline) / hf_ms:.2f}x"]
        out.add_row(*cells)
    return out


def baselines_text(results: Results) -> str:
    lines = [
        f"target-only cached generation (TransformerSampler.sample): {results.ms_per_token(results.baseline):.2f} ms/token",
        f"draft-only cached generation: {results.ms_per_token(results.draft_only):.2f} ms/token, "
        f"so c = draft cost / target cost = {results.draft_cost:.2f}",
        "target forward over gamma + 1 new positions / over 1: "
        + ", ".join(f"gamma {g}: {v:.2f}" for g, v in results.verify_cost.items()),
    ]
    if results.static_baseline:
        lines.insert(1, f"target-only generation on part 6's StaticKeyValueCache: "
                        f"{results.ms_per_token(results.static_baseline):.2f} ms/token")
    if results.hf_baseline:
        lines.insert(1, f"plain Hugging Face generate: {results.ms_per_token(results.hf_baseline):.2f} ms/token")
    return "\n".join(lines)


def _gammas(text: str) -> list[int]:
    """``1-8`` or ``1,2,4``: gammas >= 1."""
    try:
        first, _, last = text.partition("-")
        gammas = list(range(int(first), int(last) + 1)) if last else [int(g) for g in text.split(",")]
    except ValueError:
        gammas = []
    if not gammas or min(gammas) < 1:
        raise argparse.ArgumentTypeError(f"--gammas must look like 1-8 or 1,2,4 (gammas >= 1), got {text!r}")
    return gammas


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = OneLineParser(
        prog="sampling-course bench-speculative", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_impl_option(parser, "solutions", "whose code to time")
    parser.add_argument("--gammas", type=_gammas, default=_gammas("1-8"),
                        help="gammas to measure: 1-8 (default), or a list such as 1,2,4")
    parser.add_argument("--new-tokens", type=integer("--new-tokens", 1), default=96,
                        help="new tokens per run (default 96)")
    parser.add_argument("--temperature", type=number("--temperature", 0), default=1.0,
                        help="sampling temperature (default 1.0; 0 is greedy)")
    parser.add_argument("--repeats", type=integer("--repeats", 1), default=3, help="rounds over the prompts (default 3)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face assisted generation and prompt lookup")
    parser.add_argument("--no-static", action="store_true", help="skip the runs on part 6's StaticKeyValueCache")
    parser.add_argument("--no-lookup", action="store_true", help="skip prompt-lookup drafting")
    add_threads_option(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny random models, gammas 1 and 3, few tokens")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_option(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.quick:
        args.gammas, args.new_tokens, args.repeats = [1, 3], 8, 1
    args.device = device_from(parser, args)  # last: torch loads for it
    return args


@command("sampling-course bench-speculative")
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    from sampling_course.apps.threads import course_threads, torch_threads

    # The pair is the story models or tiny random ones: one thread each (see apps.threads).
    with torch_threads(course_threads(args.threads, 128)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from sampling_course.apps.options import report_console

    console = report_console()
    started = time.perf_counter()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    from sampling_course.apps.speculative_pair import load_pair

    with console.status("loading the models"):
        pair = load_pair(args.impl, quick=args.quick, device=args.device)
    new_tokens = min(args.new_tokens, pair.n_ctx - max(len(p) for p in pair.prompts))
    try:
        results = measure(
            pair, args.gammas, new_tokens, args.temperature, args.repeats, hf=not args.no_hf,
            progress=not args.no_progress, static=not args.no_static, lookup=not args.no_lookup,
        )
    except BenchCheckError as exc:
        console.print(f"[red]check failed:[/] {exc}")
        return 1
    ours = "ours on both caches" if not args.no_static else "ours"
    lookup = "" if args.no_lookup else "; draft model and prompt lookup"
    console.print(f"[green]checked:[/] at temperature 0 every gamma gives the plain greedy text ({ours} and "
                  f"Hugging Face's{lookup})")
    console.print(table(results))
    lookup = lookup_table(results)
    if lookup is not None:
        console.print(lookup)
        console.print("prompt lookup: alpha counts only rounds where the lookup proposed; a round that finds no "
                      "match is one plain target step. tok/fwd and speedup count every round.")
    console.print(baselines_text(results))
    console.print(
        "alpha: accepted / judged proposals. tok/fwd: new tokens per target forward; theory: (1 - alpha^(gamma+1)) / "
        "(1 - alpha). speedup: over target-only cached generation; theory: tok/fwd theory / (gamma c + v), with c and "
        "v above. static: both models on StaticKeyValueCaches, speedup over target-only generation on one. HF: "
        "assisted generation (num_assistant_tokens=gamma, constant schedule, assistant_confidence_threshold=0), "
        "speedup over plain HF generate"
    )
    if load_before is not None:
        console.print(
            f"total time {time.perf_counter() - started:.0f} s; load average {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPU cores (timings are noisy on a busy machine)"
        )
    if args.quick:
        console.print("[yellow]--quick: tiny random models; the timings mean nothing, only that everything runs[/]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
