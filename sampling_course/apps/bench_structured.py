"""Race part 8's constrained decoding against outlines-core and xgrammar (``sampling-course bench-structured``).

    sampling-course bench-structured            # a GPT-2-sized vocabulary, four expressions and a JSON schema
    sampling-course bench-structured --quick    # the story model's 1,000 tokens, two expressions (timings meaningless)

Two measurements, for every expression, on one byte-level vocabulary:

* **Index build time**: what a user waits for before the first token. Ours: what
  ``regex_constraint`` runs, ``ByteAutomaton`` + ``build_index_fast`` + the ``TokenConstraint``
  mask table. outlines-core: ``Index(regex, vocabulary)``. xgrammar:
  ``GrammarCompiler.compile_regex`` (its cache off). What depends on the vocabulary alone is
  built once, untimed, for everyone: our ``TokenTrie`` (its time is printed), the peers'
  vocabulary objects. Every library gets the same regular expression (the schema's is
  ``schema_to_regex``'s). Two ratios: ours over the fastest peer, and ours over outlines-core,
  the like-for-like one (outlines-core builds the same index, every state's allowed tokens
  and where each leads; xgrammar's compiled grammar is not a full index: it checks part of
  the vocabulary at every step, which its per-token figures include). The ratio over
  outlines-core is given twice, in wall seconds and in CPU seconds (below). Where outlines-core
  is installed, the last column says whether its index and ours allow the same tokens after
  every token sequence.
* **Masking overhead per token** during decoding: one step's mask of the logits plus one
  advance of the state, replayed along the same token path for all three libraries (a
  random walk through our index, which the peers must accept too), set beside one cached
  decode step of a model with GPT-2 small's dimensions and random weights (as ``sampling-course
  bench --model random``). outlines-core writes its allowed tokens as a bitmask, which is
  unpacked and applied here with plain torch (its own torch kernel goes through
  ``torch.compile``, which takes minutes to compile on a CPU); xgrammar fills a bitmask and
  applies it to the logits with its own kernel; ours gathers a row of a boolean table and
  keeps the logits it allows (``torch.where``), and advances through the index row's dict (the
  fast index makes a row's dict the first time it is read, so the first round pays for the
  rows on the path). Each peer is timed with its own package alone, in interleaved rounds
  (every library once per round, so that a change of load hits all alike); the last two
  columns are ours over outlines-core, in wall seconds and in CPU seconds.

Wall seconds and CPU seconds. Every build and every masking run is timed twice: with
``time.perf_counter`` (wall seconds, what a user waits) and with ``time.process_time`` (CPU
seconds, the time every thread of the process spent on a core). Our index is built by Python
code, on one thread; outlines-core builds its index on about two threads (one run of this
bench measured 0.96 CPU seconds for 0.54 wall seconds of its build), so the wall ratio sets
one core of ours against about two of its own. The course measures a build's cost in CPU
seconds, and its target for the build reads the CPU-seconds ratio ours / outlines-core: a
learner's laptop is never idle, and the peer's extra threads are cores it does not have free. The wall ratio is shown beside it
because it is what a user with spare cores waits. Masking is timed both ways too.

The vocabulary: GPT-2's own 50,257 tokens when GPT-2 is in the local Hugging Face cache.
Otherwise a 50,257-token byte-level BPE built here with the ``tokenizers`` library from the
course's own text (its source, corpus and generated stories), which only supports about
10,000 merges; the rest of the vocabulary is made by merging pairs of learned tokens. The
output says which. outlines-core and xgrammar come with the ``bench`` extra
(``pip install -c constraints.txt -e '.[bench]'``); a peer that is not installed is skipped
with a line saying so.
Times are medians (``--repeats``) and depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sampling_course.apps.bench_structured_vocabulary import GPT2_VOCAB_SIZE, Vocabulary, load_vocabulary  # noqa: F401
from sampling_course.apps.options import OneLineParser, add_impl_option, add_threads_option, command, integer

if TYPE_CHECKING:  # torch loads once the arguments are known to be good
    import torch

EXPRESSIONS = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "email": r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)",
    "sentence": r" (Ivy|Max|Mia|Tom) had a (dog|cat|rabbit) named [A-Z][a-z]{1,10}\.",
    "number list": r"\[(-?[0-9]{1,6}(, -?[0-9]{1,6}){0,9})?\]",
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "pet": {"enum": ["dog", "cat", "rabbit"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
    },
}
QUICK_EXPRESSIONS = ("date", "sentence")
PASSES_PER_ROUND = 5  # passes along the token path in each round of the masking race
INSTALL_BENCH = "pip install -c constraints.txt -e '.[bench]'"


@dataclass
class Row:
    name: str
    pattern: str
    build: dict[str, float] = field(default_factory=dict)  # library -> seconds
    per_token: dict[str, float] = field(default_factory=dict)  # library -> seconds per token
    notes: list[str] = field(default_factory=list)
    build_runs: dict[str, list[float]] = field(default_factory=dict)  # library -> seconds of each round
    per_token_runs: dict[str, list[float]] = field(default_factory=dict)  # library -> seconds per token, each round
    notes_by_library: dict[str, str] = field(default_factory=dict)  # library -> why it has no figure
    agreement: str | None = None  # whether outlines-core's index allows the same tokens (None: not installed)
    # The same in CPU seconds of the whole process (time.process_time: every thread's), beside the wall seconds above.
    build_cpu: dict[str, float] = field(default_factory=dict)
    per_token_cpu: dict[str, float] = field(default_factory=dict)
    build_cpu_runs: dict[str, list[float]] = field(default_factory=dict)
    per_token_cpu_runs: dict[str, list[float]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# The libraries
# ---------------------------------------------------------------------------------------


def peers(vocabulary: Vocabulary) -> tuple[dict[str, object], list[str]]:
    """The installed peers, each a (build, start) pair of functions; and a line for each missing one."""
    found, missing = {}, []
    tokens = vocabulary.tokens
    try:
        import outlines_core

        table: dict[bytes, list[int]] = {}
        for token_id, token in enumerate(tokens):
            if token is not None:
                table.setdefault(token, []).append(token_id)
        oc_vocabulary = outlines_core.Vocabulary(vocabulary.eos_token_id, table)
        found["outlines-core"] = (lambda pattern: outlines_core.Index(pattern, oc_vocabulary), OutlinesStepper)
        # Not timed: whether outlines-core's index allows the same tokens as ours (see `agreement`).
    except Exception as exc:  # not installed, or it failed to load
        missing.append(f"outlines-core: not available ({type(exc).__name__}: {exc}); install the bench extra: {INSTALL_BENCH}")
    try:
        import xgrammar

        info = xgrammar.TokenizerInfo([t if t is not None else b"" for t in tokens], vocab_type=xgrammar.VocabType.RAW,
                                      stop_token_ids=[vocabulary.eos_token_id])
        compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        found["xgrammar"] = (compiler.compile_regex, XgrammarStepper)
    except Exception as exc:
        missing.append(f"xgrammar: not available ({type(exc).__name__}: {exc}); install the bench extra: {INSTALL_BENCH}")
    return found, missing


class OursStepper:
    def __init__(self, constraint, d_vocab: int):
        self.constraint, self.states = constraint, constraint.start(1)

    def step(self, logits: torch.Tensor, token: int) -> torch.Tensor:
        import torch

        masked = self.constraint.mask_logits(logits, self.states)
        self.states = self.constraint.advance(self.states, torch.tensor([token]))
        return masked


class OutlinesStepper:
    def __init__(self, index, d_vocab: int):
        import torch

        import outlines_core

        self.guide = outlines_core.Guide(index)
        self.bitmask = torch.zeros(1, (d_vocab + 31) // 32, dtype=torch.int32)
        self.shifts = torch.arange(32, dtype=torch.int32)
        self.d_vocab = d_vocab

    def step(self, logits: torch.Tensor, token: int) -> torch.Tensor:
        self.guide.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), self.bitmask.element_size())
        # Bit j of word i allows token 32 i + j.
        allowed = ((self.bitmask[0, :, None] >> self.shifts) & 1).reshape(-1)[: self.d_vocab].bool()
        logits.masked_fill_(~allowed, float("-inf"))
        if not self.guide.is_finished():
            self.guide.advance(token)
        return logits


class XgrammarStepper:
    def __init__(self, compiled, d_vocab: int):
        import xgrammar

        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.bitmask = xgrammar.allocate_token_bitmask(1, d_vocab)
        self.apply = xgrammar.apply_token_bitmask_inplace

    def step(self, logits: torch.Tensor, token: int) -> torch.Tensor:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self.apply(logits, self.bitmask)
        if not self.matcher.is_terminated():
            self.matcher.accept_token(token)
        return logits


# ---------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------


def timed(function, repeats: int) -> tuple[float, float, object]:
    """Median wall seconds and median CPU seconds of ``function()``, and what it returned last.

    CPU seconds are ``time.process_time``: the time every thread of this process spent on a core,
    so a library that builds on two threads is charged for both."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = function()
        cpus.append(time.process_time() - cpu_start)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), statistics.median(cpus), result


def token_path(constraint, seed: int, max_tokens: int = 64) -> list[int]:
    """A random walk through the index to the end-of-text token (shorter members preferred past max_tokens)."""
    rng = random.Random(seed)
    index, state, path = constraint.index, 0, []
    while state != constraint.DONE:
        moves = list(index.transitions[state].items())
        if len(path) >= max_tokens and index.is_accepting(state):
            moves = [(index.eos_token_id, constraint.DONE)]
        token, state = rng.choice(moves)
        path.append(token)
    return path


def per_token(stepper_class, built, d_vocab: int, path: list[int], repeats: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (``timed``) per token to mask one row of logits and advance,
    along ``path``."""
    import torch

    logits = torch.randn(len(path), 1, d_vocab, generator=torch.Generator().manual_seed(0))
    walls, cpus = [], []
    for _ in range(repeats):
        stepper = stepper_class(built, d_vocab)
        work = logits.clone()
        start, cpu_start = time.perf_counter(), time.process_time()
        for i, token in enumerate(path):
            masked = stepper.step(work[i], token)
            if not torch.isfinite(masked[0, token]):
                raise AssertionError(f"{stepper_class.__name__} masks token {token} that the path takes at step {i}")
        cpus.append((time.process_time() - cpu_start) / len(path))
        walls.append((time.perf_counter() - start) / len(path))
    return statistics.median(walls), statistics.median(cpus)


def decode_step_seconds(impl: str, quick: bool, repeats: int) -> tuple[float, str]:
    """Median seconds of one cached decode step (batch 1, 64 cached positions) of a random DemoTransformer."""
    import torch

    from sampling_course.config import Config

    transformer = importlib.import_module(f"{impl}.transformer")
    cfg = Config(d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=256, d_vocab=1000) if quick else Config()
    model = transformer.DemoTransformer(cfg).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.02 * torch.randn(param.shape, generator=generator))
    tokens = torch.randint(0, cfg.d_vocab, (1, 65), generator=generator)
    with torch.inference_mode():
        _, cache = model(tokens[:, :64], transformer.KeyValueCache.new_empty(cfg))
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(tokens, cache)
            times.append(time.perf_counter() - start)
    label = "tiny random model (--quick)" if quick else "GPT-2 small dimensions, random weights"
    return statistics.median(times[1:]), label


def measure(impl: str = "solutions", quick: bool = False, repeats: int = 3, seed: int = 0) -> dict:
    """Index build times, masking costs per token and one decode step's time, all on the CPU (where the peers
    mask), whatever torch's default device is: a notebook on a GPU makes that device the default."""
    import torch

    with torch.device("cpu"):
        return _measure(impl, quick, repeats, seed)


def agreement(index, oc_index, eos_token_id: int) -> str:
    """"yes" when outlines-core's index allows the same tokens as ours after every token sequence, else where not.

    outlines-core minimises its automaton, so one of its states may stand for several of ours: the walk
    follows pairs of states reached by the same tokens."""
    transitions = oc_index.get_transitions()
    start = (0, oc_index.get_initial_state())
    seen, todo = {start}, [start]
    while todo:
        ours, theirs = todo.pop()
        row, their_row = index.transitions[ours], transitions.get(theirs, {})
        if set(row) != set(their_row):
            return f"no: state {ours} ({len(set(row) ^ set(their_row))} tokens differ)"
        for token, target in row.items():
            pair = (target, their_row[token])
            if token != eos_token_id and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return "yes"


def _measure(impl: str, quick: bool, repeats: int, seed: int) -> dict:
    automaton, token_index, fast_index, constraints, json_schema = (
        importlib.import_module(f"{impl}.{name}") for name in ("byte_automaton", "token_index", "fast_index", "token_constraint", "json_schema")
    )
    vocabulary = load_vocabulary(token_index, quick)
    found, missing = peers(vocabulary)
    d_vocab, eos = len(vocabulary.tokens), vocabulary.eos_token_id
    trie_seconds, trie_cpu_seconds, trie = timed(lambda: fast_index.TokenTrie(vocabulary.tokens), 1)
    expressions = {name: EXPRESSIONS[name] for name in (QUICK_EXPRESSIONS if quick else EXPRESSIONS)}
    if not quick:
        expressions["JSON schema"] = json_schema.schema_to_regex(SCHEMA)
    rows = []
    for name, pattern in expressions.items():
        row = Row(name, pattern)

        def build_ours():
            index = fast_index.build_index_fast(automaton.ByteAutomaton(pattern), trie, eos)
            return constraints.TokenConstraint(index, vocabulary.tokens, d_vocab)

        builders = {"ours": build_ours}
        builders.update({peer: (lambda build=build: build(pattern)) for peer, (build, _) in found.items()})
        # Interleaved rounds: each round builds every library's index once, so a change of load hits all alike.
        built = {}
        for _ in range(repeats):
            for library, build in builders.items():
                if library in row.notes_by_library:
                    continue
                try:
                    seconds, cpu_seconds, built[library] = timed(build, 1)
                except Exception as exc:  # an expression a peer does not support
                    row.notes_by_library[library] = f"{type(exc).__name__}: {str(exc)[:120]}"
                    continue
                row.build_runs.setdefault(library, []).append(seconds)
                row.build_cpu_runs.setdefault(library, []).append(cpu_seconds)
        row.build = {library: statistics.median(runs) for library, runs in row.build_runs.items()}
        row.build_cpu = {library: statistics.median(runs) for library, runs in row.build_cpu_runs.items()}
        constraint = built["ours"]
        path = token_path(constraint, seed)
        steppers = {"ours": (OursStepper, constraint)}
        steppers.update({peer: (stepper_class, built[peer]) for peer, (_, stepper_class) in found.items() if peer in built})
        # Interleaved as the builds are: each round masks along the path once with every library.
        for _ in range(repeats):
            for library, (stepper_class, index) in steppers.items():
                if library in row.notes_by_library:
                    continue
                try:
                    # A path is a few tokens: the median of several passes, so that one preemption is not a round's figure.
                    wall, cpu = per_token(stepper_class, index, d_vocab, path, PASSES_PER_ROUND)
                    row.per_token_runs.setdefault(library, []).append(wall)
                    row.per_token_cpu_runs.setdefault(library, []).append(cpu)
                except Exception as exc:  # a path the peer refuses
                    if library == "ours":
                        raise
                    row.notes_by_library[library] = f"{type(exc).__name__}: {str(exc)[:120]}"
        row.per_token = {library: statistics.median(runs) for library, runs in row.per_token_runs.items()
                         if library not in row.notes_by_library}
        row.per_token_cpu = {library: statistics.median(runs) for library, runs in row.per_token_cpu_runs.items()
                             if library not in row.notes_by_library}
        if "outlines-core" in built:
            row.agreement = agreement(constraint.index, built["outlines-core"], eos)
        row.notes = [f"{library}: {note}" for library, note in row.notes_by_library.items()]
        rows.append(row)
    step, step_label = decode_step_seconds(impl, quick, max(5, repeats * 3))
    return {"vocabulary": vocabulary.label, "rows": rows, "missing": missing, "step": step, "step_label": step_label,
            "peers": list(found), "trie_seconds": trie_seconds, "repeats": repeats,
            "trie_cpu_seconds": trie_cpu_seconds}


def ratio_text(row: Row, peers: list[str], masking: bool = False, cpu: bool = False) -> str:
    """Ours over the fastest of ``peers`` (in index build time, or with ``masking`` in masking time per token;
    in wall seconds, or with ``cpu`` in CPU seconds): the ratio of the medians, and the spread of the per-round
    ratios."""
    if masking:
        medians, runs = (row.per_token_cpu, row.per_token_cpu_runs) if cpu else (row.per_token, row.per_token_runs)
    else:
        medians, runs = (row.build_cpu, row.build_cpu_runs) if cpu else (row.build, row.build_runs)
    present = [p for p in peers if p in medians]
    if not present or "ours" not in medians:
        return "n/a"
    fastest = min(present, key=medians.__getitem__)
    per_round = sorted(o / f for o, f in zip(runs.get("ours", []), runs.get(fastest, [])))
    text = f"{medians['ours'] / medians[fastest]:.2f}x"
    return text if len(per_round) < 2 else f"{text} ({per_round[0]:.2f}-{per_round[-1]:.2f})"


def report(results: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(escape(f"vocabulary: {results['vocabulary']}"))
    trie_cpu = f" ({results['trie_cpu_seconds']:.3f} CPU s)" if "trie_cpu_seconds" in results else ""
    console.print(f"our token trie of the vocabulary: {results['trie_seconds']:.3f} s{trie_cpu}, built once and not timed below "
                  "(as the peers' vocabulary objects)")
    for line in results["missing"]:
        console.print(escape(f"skipped {line}"))
    libraries = ["ours", *results["peers"]]
    outlines = (["ours / outlines-core (wall)", "ours / outlines-core (CPU s)", "same as outlines-core"]
                if "outlines-core" in results["peers"] else [])
    build = Table("expression", *[f"{lib} build (s)" for lib in libraries], "ours / fastest peer", *outlines,
                  title=f"Index build time, wall seconds (medians of {results['repeats']} interleaved rounds; per-round ratios "
                  "in brackets; CPU s: every thread's, the course's measure of the build)")
    for row in results["rows"]:
        build.add_row(row.name, *[f"{row.build[lib]:.4f}" if lib in row.build else "n/a" for lib in libraries],
                      ratio_text(row, results["peers"]),
                      *([ratio_text(row, ["outlines-core"]), ratio_text(row, ["outlines-core"], cpu=True),
                         row.agreement or "n/a"] if outlines else []))
    console.print(build)
    step = results["step"]
    masking_ratios = (["ours / outlines-core (wall)", "ours / outlines-core (CPU s)"]
                      if "outlines-core" in results["peers"] else [])
    masking = Table("expression", *[f"{lib} (µs/token)" for lib in libraries], *[f"{lib} / step" for lib in libraries],
                    *masking_ratios,
                    title=f"Masking overhead per token vs one decode step ({results['step_label']}: {step * 1e3:.1f} ms; "
                    f"medians of {results['repeats']} interleaved rounds, per-round ratios in brackets)")
    for row in results["rows"]:
        masking.add_row(
            row.name,
            *[f"{row.per_token[lib] * 1e6:.0f}" if lib in row.per_token else "n/a" for lib in libraries],
            *[f"{row.per_token[lib] / step:.2%}" if lib in row.per_token else "n/a" for lib in libraries],
            *([ratio_text(row, ["outlines-core"], masking=True), ratio_text(row, ["outlines-core"], masking=True, cpu=True)]
              if masking_ratios else []),
        )
    console.print(masking)
    for row in results["rows"]:
        for note in row.notes:
            console.print(escape(f"{row.name}: {note}"))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = OneLineParser(prog="sampling-course bench-structured", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run on the story model's vocabulary (timings meaningless)")
    add_impl_option(parser, "solutions", "whose part-8 files to race")
    parser.add_argument("--repeats", type=integer("--repeats", 1), default=3,
                        help="interleaved rounds of every library's build and of every library's masking run (median)")
    add_threads_option(parser)
    parser.add_argument("--seed", type=integer("--seed", 0), default=0, help="seed of the token paths")
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)


@command("sampling-course bench-structured")
def main(argv: Sequence[str] | None = None) -> int:
    from sampling_course.apps.options import report_console

    args = parse_args(argv)
    if isinstance(args, int):
        return args
    from sampling_course.apps.threads import course_threads, torch_threads

    # The race masks logits over the story model's vocabulary: small operations, one thread (apps.threads).
    with torch_threads(course_threads(args.threads, 192)):
        results = measure(args.impl, args.quick, args.repeats, args.seed)
    report(results, report_console())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
