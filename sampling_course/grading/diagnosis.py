"""Name the classic mistake behind a failing check.

The course knows the classic mistakes of every exercise: the planted-mistake catalogue
(``MISTAKES`` in ``grading/parts/``). When a learner's exercise fails its tests, this module
runs the learner's code and each planted mistake of that exercise on the same small, fixed
input (the exercise's *probe*); when the learner's output is the output of one of the
mistakes, the checker can say so first, in plain words:

    This matches a classic mistake: the unbiased variance (dividing by d_model - 1 instead
    of d_model), where GPT-2's LayerNorm divides by d_model.

How a mistake finds its exercise. A ``Mistake`` rewrites text ``old`` in ``solutions/<file>``.
The function or class that holds that text (its qualified name, found with ``ast``) names the
code it breaks, e.g. ``LayerNorm.forward`` or ``TransformerSampler.sample_top_p``. It belongs
to every exercise of the same part whose module is that file and whose target is that name or
contains it (``LayerNorm`` covers ``LayerNorm.forward``; ``Attention`` covers
``Attention.apply_causal_mask`` as well as ``apply_causal_mask`` does). A mistake that maps
to no exercise is never named.

Probes. Each probe takes the modules of one implementation (``transformer``, ``sampling``,
``beams`` of some package) and returns its output on a fixed input: part 1 on a small random
``Config`` with perturbed weights (loaded with ``load_state_dict``; buffers a module creates
itself need not be in the state dict), part 2 on hand-made logits and a toy language model
whose next-token logits are a lookup table (the offline tiny tokenizer decodes them), part 3
on hand-made beams and toy models, part 4 on a small random ``DemoTransformer`` behind a
wrapper that records what the cache held at every call. Probes never load a reference model.

Planted outputs. Each mistake is planted into a private copy of ``solutions/``, imported
from memory under a unique package name (nothing is written to disk; an unchanged module
compiles once per process, and the copy's modules leave ``sys.modules`` afterwards). Its
probe output, and the solution's own, are cached for the rest of the process, since the
solutions do not change during a session.

Matching. Outputs match when they have the same structure and every leaf agrees: tensors of
the same shape within ``rtol=1e-4, atol=1e-5`` (integer and boolean tensors exactly), floats
within the same tolerance, ints and strings exactly. A learner whose output matches the
solution's is named nothing (the failure lies elsewhere), and so is one whose probe raises.

Random exercises (``sample_basic``, ``sample_top_k``, ``sample_top_p``,
``sample_next_token``) are probed on crafted logits, in one or more settings. For planted
code the probe enumerates the draw exactly (``Distribution``): ``torch.multinomial`` is
replaced by a stand-in that replays every possible choice, weighted by its probability.
For the learner's code it counts the tokens of ``N`` seeded draws (``Frequencies``), in
whatever style the learner draws. The crafted logits make every two candidates (the
solution and each mistake) differ by at least ``gap`` in some token's probability in some
setting, and a learner matches a candidate when every token's frequency is within
``gap / 2`` of its probability. ``N`` comes from Hoeffding's bound on a binomial
frequency::

    P(|f - p| >= gap / 2) <= 2 exp(-N gap^2 / 2)

With ``N = ceil(2 / gap^2 * ln(2 K / 1e-6))`` for ``K`` tokens (a few hundred draws): code
with the same distribution as a mistake matches it with probability at least 1 - 1e-6 per
setting (all K tokens within the tolerance), and code whose distribution differs from a
mistake's by at least ``gap`` in some token matches it with probability at most 1e-6 / K
(false-match probability). A correct learner is first matched to the solution, and is then
named nothing.

The learner's probe runs under a time limit (``TIME_LIMIT_S``): code that never returns is
stopped and named nothing.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.util
import io
import itertools
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from sampling_course.config import Config
from sampling_course.grading.catalogue import Exercise, Mistake
from sampling_course.grading.course import EXERCISES, get_exercise
from sampling_course.grading.mistakes import MISTAKES, REPO
from sampling_course.grading.time_limit import TookTooLong, time_limit

__all__ = [
    "PROBES", "Distribution", "Frequencies", "Raised", "coverage", "describe_match", "draws_for", "exercises_of",
    "explain", "mistake_target", "mistakes_of", "name_mistake", "planted", "same",
]

SOLUTIONS = REPO / "solutions"
RTOL, ATOL = 1e-4, 1e-5
# The probability of naming a mistake wrongly (and of missing one) per frequency setting.
FALSE_MATCH = 1e-6
# A learner's probe that runs longer than this is stopped (a loop that never ends).
TIME_LIMIT_S = 5.0


# ---------------------------------------------------------------------------------------
# Which exercise a mistake belongs to
# ---------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _spans(file: str) -> tuple[tuple[str, int, int], ...]:
    """(qualified name, first line, last line) of every function and class in ``solutions/<file>``."""
    spans: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, names: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.append((".".join(names + (child.name,)), first, child.end_lineno or child.lineno))
                visit(child, names + (child.name,))
            else:
                visit(child, names)

    visit(ast.parse(_solution_source(file)), ())
    return tuple(spans)


@lru_cache(maxsize=None)
def _solution_source(file: str) -> str:
    return (SOLUTIONS / file).read_text()


@lru_cache(maxsize=None)
def mistake_target(mistake: Mistake) -> str | None:
    """The function or class of ``solutions/<file>`` that the mistake rewrites, e.g. ``"LayerNorm.forward"``."""
    try:
        source = _solution_source(mistake.file)
    except OSError:
        return None
    if not mistake.old or source.count(mistake.old) != 1:
        return None
    start = source.index(mistake.old)
    first = source.count("\n", 0, start) + 1
    last = source.count("\n", 0, start + len(mistake.old) - 1) + 1
    # The innermost (longest name) function or class that spans every line of the text.
    holders = [name for name, a, b in _spans(mistake.file) if a <= first and last <= b]
    return max(holders, key=lambda name: name.count("."), default=None)


@lru_cache(maxsize=None)
def exercises_of(mistake: Mistake) -> tuple[Exercise, ...]:
    """The exercises of the mistake's part whose code the mistake rewrites."""
    target = mistake_target(mistake)
    if target is None:
        return ()
    module = Path(mistake.file).stem
    return tuple(
        e for e in EXERCISES
        if e.part == mistake.part and e.module == module and (target == e.target or target.startswith(e.target + "."))
    )


def mistakes_of(exercise: Exercise | str) -> list[Mistake]:
    """The planted mistakes that belong to ``exercise``, in catalogue order."""
    exercise = get_exercise(exercise)
    return [m for m in MISTAKES if exercise in exercises_of(m)]


def explain(mistake: Mistake) -> str:
    """The mistake in plain words, as one sentence."""
    text = (mistake.why or mistake.name).strip()
    return text if text.endswith((".", "!", "?")) else text + "."


# ---------------------------------------------------------------------------------------
# Outputs and how they match
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    """The exact probability of every token that a draw of planted code returns.

    ``tolerance`` is half the smallest gap the probe's setting makes between candidates.
    """

    probs: tuple[float, ...]
    tolerance: float


@dataclass(frozen=True)
class Frequencies:
    """How often each token came out of ``draws`` seeded draws of the learner's code.

    It matches a ``Distribution`` when every token's frequency is within ``tolerance`` of
    its probability (tokens missing from either side count as 0).
    """

    counts: tuple[int, ...]
    draws: int
    tolerance: float

    def matches(self, other: Distribution) -> bool:
        size = max(len(self.counts), len(other.probs))
        counts = self.counts + (0,) * (size - len(self.counts))
        probs = other.probs + (0.0,) * (size - len(other.probs))
        return all(abs(c / self.draws - p) <= self.tolerance for c, p in zip(counts, probs))


@dataclass(frozen=True)
class Raised:
    """A probe step that raised: matches the same kind of error at the same step."""

    error: str


def draws_for(gap: float, categories: int, false_match: float = FALSE_MATCH) -> int:
    """Draws N such that 2 K exp(-N gap^2 / 2) <= false_match (see the module docstring)."""
    return math.ceil(2.0 / gap**2 * math.log(2 * categories / false_match))


def same(a: Any, b: Any) -> bool:
    """True when two probe outputs agree (see the module docstring)."""
    if isinstance(a, (Frequencies, Distribution)) or isinstance(b, (Frequencies, Distribution)):
        if isinstance(a, Distribution) and isinstance(b, Distribution):
            return len(a.probs) == len(b.probs) and all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(a.probs, b.probs))
        if isinstance(a, Distribution):
            a, b = b, a
        return isinstance(a, Frequencies) and isinstance(b, Distribution) and a.matches(b)
    if isinstance(a, Raised) or isinstance(b, Raised):
        return a == b
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if a.is_floating_point() or b.is_floating_point() or a.is_complex() or b.is_complex():
            return torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL, equal_nan=True)
        return torch.equal(a.long(), b.long())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=RTOL, abs_tol=ATOL)
        except (TypeError, ValueError):
            return False
    return type(a) is type(b) and a == b


def _plain(x: Any) -> Any:
    """A probe output leaf, detached from autograd and from tensor subclasses (KeyValueCache)."""
    if isinstance(x, torch.Tensor):
        return x.detach().as_subclass(torch.Tensor).cpu().clone()
    return x


def _as_int(token: Any) -> int:
    """A token id returned as an int or as a one-element integer tensor."""
    if isinstance(token, torch.Tensor):
        if token.numel() != 1 or token.is_floating_point():
            raise TypeError(f"expected one token id, got a tensor of shape {tuple(token.shape)}")
        return int(token.item())
    return int(token)


def _attempt(step: Callable[[], Any]) -> Any:
    """Run one step of a probe; an error (other than an unfilled stub) becomes part of the output."""
    try:
        return step()
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the learner's code may raise anything
        return Raised(type(error).__name__)


# True while planted solutions are probed: random draws are then enumerated exactly.
_EXACT = False


class _Branch(BaseException):
    """Raised by the enumerating stand-in for torch.multinomial at a draw not yet scripted."""

    def __init__(self, probs: list[float]):
        self.probs = probs


def _exact_distribution(draw: Callable[[], Any], categories: int, tolerance: float) -> Distribution:
    """The exact distribution of ``draw()``, for code that draws with ``torch.multinomial(probs, 1)``.

    torch.multinomial is replaced, while ``draw`` runs, by a stand-in that returns scripted
    choices; at the first unscripted call it reports the probabilities, and every possible
    choice is then replayed (depth first), each leaf weighted by the product of its choices'
    probabilities. Code that never draws is a single leaf.
    """
    real = torch.multinomial
    leaves: Counter[int] = Counter()

    def run(script: list[int], weight: float) -> None:
        calls = 0

        def multinomial(input: torch.Tensor, num_samples: int, replacement: bool = False, **kwargs: Any) -> torch.Tensor:
            nonlocal calls
            if input.ndim != 1 or num_samples != 1 or kwargs.get("out") is not None:
                raise TypeError("the exact enumeration handles torch.multinomial(probs, 1) on a 1-D probs only")
            calls += 1
            if calls <= len(script):
                return torch.tensor([script[calls - 1]], device=input.device)
            probs = input.detach().double().cpu()
            raise _Branch((probs / probs.sum()).tolist())

        torch.multinomial = multinomial
        try:
            token = _as_int(draw())
        except _Branch as branch:
            torch.multinomial = real
            for choice, p in enumerate(branch.probs):
                if p > 0:
                    run(script + [choice], weight * p)
            return
        finally:
            torch.multinomial = real
        leaves[token] += weight

    run([], 1.0)
    if min(leaves) < 0:
        raise ValueError("a negative token id")
    size = max(categories, max(leaves) + 1)
    return Distribution(tuple(leaves.get(i, 0.0) for i in range(size)), tolerance)


def _seed(seed: int) -> None:
    """Seed torch's CPU generator (what the draws use); torch.manual_seed would also queue
    seeding for every accelerator, which costs milliseconds per call on a CPU-only machine."""
    torch.random.default_generator.manual_seed(seed)


def _frequencies(draw: Callable[[], Any], categories: int, gap: float, seed: int) -> Frequencies | Distribution:
    """The learner's side: the frequency of every token over ``draws_for(gap, categories)``
    draws after ``torch.manual_seed(seed)``. Planted solutions: the exact distribution."""
    if _EXACT:
        return _exact_distribution(draw, categories, gap / 2)
    n = draws_for(gap, categories)
    _seed(seed)
    counts = Counter(_as_int(draw()) for _ in range(n))
    if min(counts) < 0:
        raise ValueError("a negative token id")
    size = max(categories, max(counts) + 1)
    return Frequencies(tuple(counts.get(i, 0) for i in range(size)), n, gap / 2)


# ---------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------


class _Impl:
    """Attribute access to one implementation's modules: ``impl.transformer``."""

    def __init__(self, package: str):
        self.package = package

    def __getattr__(self, module: str):
        if module.startswith("_"):
            raise AttributeError(module)
        return importlib.import_module(f"{self.package}.{module}")


Probe = Callable[[_Impl], Any]
PROBES: dict[str, Probe] = {}


def _probe(name: str) -> Callable[[Probe], Probe]:
    def register(fn: Probe) -> Probe:
        get_exercise(name)  # a typo fails at import
        PROBES[name] = fn
        return fn

    return register


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cfg(**changes: Any) -> Config:
    """A small GPT-2-shaped config; d_head != d_model so the two scalings differ."""
    fields = dict(d_model=16, debug=False, layer_norm_eps=1e-5, d_vocab=40, init_range=0.02,
                  n_ctx=12, d_head=8, d_mlp=32, n_heads=2, n_layers=2)
    fields.update(changes)
    return Config(**fields)


def _randn(g: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * std


def _ln_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    # Perturbed: w = 1 and b = 0 could not tell a LayerNorm that drops them from one that does not.
    return {"w": 1 + _randn(g, cfg.d_model, std=0.3), "b": _randn(g, cfg.d_model, std=0.3)}


def _attn_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    n, d, h = cfg.n_heads, cfg.d_model, cfg.d_head
    return {
        "W_Q": _randn(g, n, d, h, std=d**-0.5), "W_K": _randn(g, n, d, h, std=d**-0.5),
        "W_V": _randn(g, n, d, h, std=d**-0.5), "W_O": _randn(g, n, h, d, std=(n * h) ** -0.5),
        "b_Q": _randn(g, n, h, std=0.5), "b_K": _randn(g, n, h, std=0.5),
        "b_V": _randn(g, n, h, std=0.5), "b_O": _randn(g, d, std=0.3),
    }


def _mlp_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "W_in": _randn(g, cfg.d_model, cfg.d_mlp, std=1.5 * cfg.d_model**-0.5), "b_in": _randn(g, cfg.d_mlp, std=0.5),
        "W_out": _randn(g, cfg.d_mlp, cfg.d_model, std=cfg.d_mlp**-0.5), "b_out": _randn(g, cfg.d_model, std=0.3),
    }


def _unembed_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"W_U": _randn(g, cfg.d_model, cfg.d_vocab, std=cfg.d_model**-0.5), "b_U": _randn(g, cfg.d_vocab, std=0.5)}


def _demo_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    params = {"embed.W_E": _randn(g, cfg.d_vocab, cfg.d_model), "pos_embed.W_pos": _randn(g, cfg.n_ctx, cfg.d_model, std=0.5)}
    for i in range(cfg.n_layers):
        for sub, make in (("ln1", _ln_params), ("attn", _attn_params), ("ln2", _ln_params), ("mlp", _mlp_params)):
            params.update({f"blocks.{i}.{sub}.{k}": v for k, v in make(cfg, g).items()})
    params.update({f"ln_final.{k}": v for k, v in _ln_params(cfg, g).items()})
    params.update({f"unembed.{k}": v for k, v in _unembed_params(cfg, g).items()})
    return params


def _loaded(module: torch.nn.Module, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``module`` with ``params`` loaded: every parameter must be there; buffers it makes itself need not."""
    missing, unexpected = module.load_state_dict(params, strict=False)
    parameters = {name for name, _ in module.named_parameters()}
    if unexpected or any(key in parameters for key in missing):
        raise LookupError(f"parameters do not match: missing {missing}, unexpected {unexpected}")
    return module.eval()


# --- part 1 ----------------------------------------------------------------------------


@_probe("LayerNorm")
def _probe_layernorm(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(1)
    ln = _loaded(impl.transformer.LayerNorm(cfg), _ln_params(cfg, g))
    # One position with a variance near eps (so where eps goes shows), one normal, one wide.
    scale = torch.tensor([3e-3, 1.0, 4.0])[None, :, None]
    x = _randn(g, 2, 3, cfg.d_model) * scale + 0.5
    return _plain(ln(x))


@_probe("apply_causal_mask")
def _probe_causal_mask(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(2)
    attn = impl.transformer.Attention(cfg)
    scores = _randn(g, 2, cfg.n_heads, 5, 5)
    masked = attn.apply_causal_mask(scores.clone())
    # Which scores were hidden: the same whatever the learner writes there (-1e5, -1e10, -inf).
    return _plain(masked) != scores


@_probe("Attention")
def _probe_attention(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(3)
    attn = _loaded(impl.transformer.Attention(cfg), _attn_params(cfg, g))
    return _plain(attn(_randn(g, 2, 5, cfg.d_model)))


@_probe("MLP")
def _probe_mlp(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(4)
    mlp = _loaded(impl.transformer.MLP(cfg), _mlp_params(cfg, g))
    return _plain(mlp(_randn(g, 2, 5, cfg.d_model)))


@_probe("Unembed")
def _probe_unembed(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(5)
    unembed = _loaded(impl.transformer.Unembed(cfg), _unembed_params(cfg, g))
    return _plain(unembed(_randn(g, 2, 5, cfg.d_model)))


@_probe("DemoTransformer")
def _probe_demo(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(6)
    model = _loaded(impl.transformer.DemoTransformer(cfg), _demo_params(cfg, g))
    tokens = torch.randint(0, cfg.d_vocab, (2, 6), generator=g)
    return _plain(model(tokens))


# --- part 2 ----------------------------------------------------------------------------


@_probe("greedy_search")
def _probe_greedy(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    return [_as_int(sampler.greedy_search(row.clone())) for row in _randn(_gen(10), 4, 12)]


@_probe("apply_temperature")
def _probe_temperature(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    logits = _randn(_gen(11), 12)
    return [_plain(sampler.apply_temperature(logits.clone(), t)) for t in (0.5, 2.0)]


@_probe("apply_frequency_penalty")
def _probe_frequency_penalty(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    input_ids = torch.tensor([1, 3, 3, 5, 5, 5, 0])
    return _plain(sampler.apply_frequency_penalty(input_ids.clone(), _randn(_gen(12), 8), 0.7))


def _logits(*probs: float) -> torch.Tensor:
    return torch.tensor(probs).log()


@_probe("sample_basic")
def _probe_sample_basic(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # Solution [.1 .6 .2 .1], argmax [0 1 0 0], uniform [.25 ...]: every pair differs by >= 0.35.
    logits = _logits(0.1, 0.6, 0.2, 0.1)
    return _frequencies(lambda: sampler.sample_basic(logits.clone()), 4, gap=0.35, seed=13)


@_probe("sample_top_k")
def _probe_sample_top_k(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # k = 2 keeps tokens 4 and 2. First 9:1 (uniform over the top k gives 1:1), then 55:45
    # (k - 1 tokens gives 1:0); a rank returned for a token lands on ids 0 and 1. Every pair
    # of the solution and the three mistakes differs by >= 0.4 in one of the two.
    settings = [_logits(0.05, 0.06, 0.08, 0.04, 0.72, 0.05), _logits(0.05, 0.03, 0.36, 0.04, 0.44, 0.08)]
    return [
        _frequencies(lambda: sampler.sample_top_k(logits.clone(), 2), 6, gap=0.4, seed=14 + i)
        for i, logits in enumerate(settings)
    ]


@_probe("sample_top_p")
def _probe_sample_top_p(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # Sorted, the tokens are 3 (.44), 5 (.30), 0 (.15), 2 (.06), 4 (.03), 1 (.02).
    # top_p = 0.6 keeps 3 and 5 (.595, .405); an exclusive cutoff keeps only 3; ascending
    # keeps them all; ranks land on ids 0 and 1. top_p = 0.1 with min_tokens_to_keep = 3
    # keeps 3, 5, 0; ignoring min_tokens_to_keep keeps 3 only; ascending keeps 1, 4, 2.
    # Every pair differs by >= 0.4 in one of the two.
    logits = _logits(0.15, 0.02, 0.06, 0.44, 0.03, 0.30)
    return [
        _frequencies(lambda: sampler.sample_top_p(logits.clone(), 0.6), 6, gap=0.4, seed=16),
        _frequencies(lambda: sampler.sample_top_p(logits.clone(), 0.1, min_tokens_to_keep=3), 6, gap=0.4, seed=17),
    ]


@_probe("sample_next_token")
def _probe_sample_next_token(impl: _Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # Temperature 4 then a penalty of 3 on token 1 gives (.88, .12); the penalty first gives
    # (.44, .56). top_k=1 and top_p=0.3 keep token 0 only; ignoring them draws from
    # (.36, .30, .22, .13). Every pair differs by >= 0.4 in one setting.
    penalised = torch.tensor([0.0, 4.0, -30.0, -30.0])
    flat = torch.tensor([1.0, 0.8, 0.5, 0.0])
    once = torch.tensor([1])

    def draw(logits: torch.Tensor, **kwargs: Any) -> Callable[[], Any]:
        return lambda: sampler.sample_next_token(once.clone(), logits.clone(), **kwargs)

    return [
        _frequencies(draw(penalised, temperature=4.0, frequency_penalty=3.0), 4, gap=0.4, seed=18),
        _frequencies(draw(flat, top_k=1), 4, gap=0.4, seed=19),
        _frequencies(draw(flat, top_p=0.3), 4, gap=0.4, seed=20),
    ]


@lru_cache(maxsize=1)
def _tokenizer():
    from sampling_course.tokenizer import load_tiny_tokenizer

    return load_tiny_tokenizer()


@lru_cache(maxsize=1)
def _words() -> tuple[int, ...]:
    """Token ids that decode to a space and a word: sequences of them decode unambiguously."""
    tok = _tokenizer()
    words = []
    for i in range(256, len(tok)):
        text = tok.decode([i])
        if text.startswith(" ") and len(text) >= 4 and text[1:].isalpha() and text.isascii():
            words.append(i)
        if len(words) == 24:
            break
    return tuple(words)


class _ToyLM(torch.nn.Module):
    """A toy language model: logits = table[row_of[last token]] + by_position[position].

    The next token depends on the token before it and on where it sits, so feeding the
    model the wrong window shows. It records the longest input it was given.
    """

    def __init__(self, cfg: Config, table: torch.Tensor, row_of: torch.Tensor, by_position: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("table", table)
        self.register_buffer("row_of", row_of)
        self.register_buffer("by_position", by_position if by_position is not None else torch.zeros(64, table.shape[1]))
        self.longest_input = 0

    def forward(self, tokens: torch.Tensor, kv_cache: Any = None) -> torch.Tensor:
        if kv_cache is not None:
            raise TypeError("the probe's toy model runs without a cache")
        self.longest_input = max(self.longest_input, tokens.shape[1])
        rows = self.row_of.index_select(0, tokens.flatten()).view_as(tokens)
        return torch.nn.functional.embedding(rows, self.table) + self.by_position[: tokens.shape[1]]


def _word_table(g: torch.Generator, std: float = 2.0,
                rows: dict[int, dict[int, float]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, row_of)`` for a ``_ToyLM``: a row for every word, one for end-of-text and one
    for any other token, each random over the words (so no ties) and -40 elsewhere; ``rows``
    gives some rows as explicit probabilities instead."""
    tok, words = _tokenizer(), _words()
    ids = list(words) + [tok.eos_token_id]
    row_of = torch.full((len(tok),), len(ids), dtype=torch.long)
    row_of[ids] = torch.arange(len(ids))
    table = torch.full((len(ids) + 1, len(tok)), -40.0)
    table[:, list(words)] = _randn(g, len(ids) + 1, len(words), std=std)
    for last, row in (rows or {}).items():
        table[row_of[last]] = -40.0
        for nxt, p in row.items():
            table[row_of[last], nxt] = math.log(p)
    return table, row_of


@_probe("sample")
def _probe_sample(impl: _Impl) -> Any:
    tok, words = _tokenizer(), _words()
    eos, vocab = tok.eos_token_id, len(tok)
    sampler = impl.sampling.TransformerSampler
    prompt = tok.decode(words[:2])
    texts = []

    # 1. top_k=1 and a frequency penalty on a peaked model: deterministic. The favourite
    # next tokens cycle w0 -> w1 -> w2 -> w0, so the penalty changes the path; a sampler that
    # drops top_k and the penalty follows the cycle (the favourite is 40 nats ahead).
    g = _gen(30)
    table, row_of = _word_table(g, std=1.0)
    for i, w in enumerate(words):
        table[row_of[w], words[(i + 1) % 3 if i < 3 else (i + 1) % len(words)]] = 40.0
    model = _ToyLM(_cfg(d_vocab=vocab, n_ctx=32), table, row_of)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=8, temperature=1.0, top_k=1,
                                            frequency_penalty=45.0, seed=0))

    # 2. Greedy, with end-of-text forced as the token after position 4: the loop must stop
    # right after it and keep it. 3. Greedy without end-of-text: exactly 3 new tokens.
    table, row_of = _word_table(g)
    forced = torch.zeros(64, vocab)
    forced[4, eos] = 100.0
    model = _ToyLM(_cfg(d_vocab=vocab, n_ctx=32), table, row_of, forced)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=8, temperature=0.0))
    model = _ToyLM(_cfg(d_vocab=vocab, n_ctx=32), table, row_of)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=3, temperature=0.0))

    # 4. Greedy past n_ctx = 5, on a model whose logits depend on the position: the window
    # the model sees (the last n_ctx tokens) decides every token.
    by_position = torch.zeros(64, vocab)
    by_position[:, list(words)] = _randn(g, 64, len(words), std=2.0)
    model = _ToyLM(_cfg(d_vocab=vocab, n_ctx=5), table, row_of, by_position)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=8, temperature=0.0))
    return texts


# --- part 3 ----------------------------------------------------------------------------


def _beams_state(beams: Any) -> tuple[Any, Any]:
    return _plain(beams.logprob_sums), _plain(beams.tokens)


@_probe("Beams.generate")
def _probe_generate(impl: _Impl) -> Any:
    tok, words = _tokenizer(), _words()
    g = _gen(40)
    table, row_of = _word_table(g)
    table += _randn(g, table.shape[0], 1, std=3.0)  # rows far from normalised: logits != log-probs
    model = _ToyLM(_cfg(d_vocab=len(tok), n_ctx=32), table, row_of)
    beams_cls = impl.beams.Beams
    # Each beam holds the bigram (a, its favourite next token) and ends in a: blocking bigrams
    # must take the favourite out of its top k.
    rows = []
    for i, a in enumerate(words[:3]):
        favourite = int(table[row_of[a]].argmax())
        rows.append([a, favourite, words[10 + i], a])
    tokens = torch.tensor(rows)
    sums = torch.tensor([-1.0, -2.5, -0.5])
    plain = beams_cls(model, tok, sums.clone(), tokens.clone()).generate(k=3)
    blocked = beams_cls(model, tok, sums.clone(), tokens.clone()).generate(k=2, no_repeat_ngram_size=2)
    return [_beams_state(plain), _beams_state(blocked)]


@_probe("Beams.filter")
def _probe_filter(impl: _Impl) -> Any:
    tok, words = _tokenizer(), _words()
    eos = tok.eos_token_id
    tokens = torch.tensor([[words[i], words[i + 6], eos if i in (1, 4) else words[i + 12]] for i in range(6)])
    sums = torch.tensor([-3.0, -0.5, -2.0, -4.0, -1.0, -1.5])
    continuing, terminated = impl.beams.Beams(None, tok, sums, tokens).filter(k=4)
    return [_beams_state(continuing), _beams_state(terminated)]


@_probe("Beams.get_topk_non_repeating")
def _probe_ngram_blocking(impl: _Impl) -> Any:
    tok = _tokenizer()
    g = _gen(50)
    base = _randn(g, 2, 20)

    def top(history: list[list[int]], n: int | None, k: int = 4) -> Any:
        tokens = torch.tensor(history)
        # The tokens a beam already holds are the likeliest, so blocking them changes its top k.
        boost = torch.zeros(2, 20).scatter_(1, tokens, 4.0)
        logprobs = (base + boost).log_softmax(dim=-1)
        beams = impl.beams.Beams(None, tok, torch.zeros(2), tokens)
        values, indices = beams.get_topk_non_repeating(logprobs.clone(), n, k)
        return _plain(values), _plain(indices)

    scenarios = [
        ([[3, 5, 3, 7, 3], [4, 6, 9, 6, 6]], 2),  # blocks 5 and 7; 9 and 6 (the last bigram)
        ([[1, 2, 3, 1, 2], [8, 8, 8, 8, 8]], 3),  # blocks 3; 8
        ([[2, 2, 2], [4, 7, 4]], 3),  # a history exactly n long: blocks 2; nothing
        ([[3, 5, 3], [6, 6, 1]], 1),  # n = 1 blocks every token present
        ([[3, 5, 3, 7, 3], [4, 6, 9, 6, 6]], None),  # a plain top k
    ]
    return [_attempt(lambda h=history, n=n: top(h, n)) for history, n in scenarios]


@_probe("beam_search")
def _probe_beam_search(impl: _Impl) -> Any:
    tok, words = _tokenizer(), _words()
    eos, vocab = tok.eos_token_id, len(tok)
    a, b, c, d, e, x = words[:6]
    g = _gen(60)
    cfg = _cfg(d_vocab=vocab, n_ctx=32)

    def run(rows: dict[int, dict[int, float]], **kwargs: Any) -> Any:
        model = _ToyLM(cfg, *_word_table(g, std=1.0, rows=rows))
        out = impl.sampling.TransformerSampler(model, tok).beam_search(tok.decode([a]), **kwargs)
        return [(float(lp), text) for lp, text in out], model.longest_input

    others = {w: 0.1 for w in words[6:14]}
    return [
        # A beam finishes at step 1 and must come first, never extended; then the best live ones.
        run({a: {eos: 0.5, b: 0.3, c: 0.2}, b: {d: 0.9, e: 0.1}, c: {e: 0.6, d: 0.4}, eos: {x: 0.99, d: 0.01}},
            num_return_sequences=3, num_beams=3, max_new_tokens=3),
        # Enough beams finish early: return at once (the longest input stays short).
        run({a: {eos: 0.5, b: 0.3, d: 0.2}, b: {eos: 0.6, d: 0.4}, d: {b: 1.0}},
            num_return_sequences=1, num_beams=3, max_new_tokens=6),
        run({a: {eos: 0.5, b: 0.3, d: 0.2}, b: {eos: 0.6, d: 0.4}, d: {b: 1.0}},
            num_return_sequences=2, num_beams=2, max_new_tokens=6),
        # A model that likes repeating itself, under no_repeat_ngram_size=2.
        run({a: {a: 0.6, b: 0.4}, b: {a: 0.7, b: 0.3}}, num_return_sequences=2, num_beams=2, max_new_tokens=4,
            no_repeat_ngram_size=2),
        # Two beams find the likelier sequence that one beam (greedy) misses.
        run({a: {b: 0.6, c: 0.4}, b: {x: 0.2, **others}, c: {d: 0.9, e: 0.1}},
            num_return_sequences=1, num_beams=2, max_new_tokens=2),
    ]


# --- part 4 ----------------------------------------------------------------------------


class _CacheRecorder(torch.nn.Module):
    """Wraps a DemoTransformer and records (input length, cached length) at every call."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.calls: list[tuple[int, int | None]] = []

    def forward(self, tokens: torch.Tensor, kv_cache: Any = None) -> Any:
        self.calls.append((tokens.shape[1], None if kv_cache is None else int(kv_cache.shape[3])))
        return self.model(tokens, kv_cache)


@_probe("KeyValueCache")
def _probe_kv_cache(impl: _Impl) -> Any:
    cache_cls = impl.transformer.KeyValueCache
    cache = cache_cls(_randn(_gen(70), 2, 2, 3, 5, 2, 4))
    empty = cache_cls.new_empty(_cfg(n_layers=2, n_heads=2, d_head=4), batch=3)
    return [int(cache.batch), int(cache.seq_len), _plain(cache.k), _plain(cache.v), tuple(empty.shape)]


@_probe("cached_forward")
def _probe_cached_forward(impl: _Impl) -> Any:
    cfg, g = _cfg(), _gen(71)
    model = _loaded(impl.transformer.DemoTransformer(cfg), _demo_params(cfg, g))
    tokens = torch.randint(0, cfg.d_vocab, (2, 7), generator=g)
    cache = impl.transformer.KeyValueCache.new_empty(cfg, batch=2)
    first, cache = model(tokens[:, :3], cache)
    rest, cache = model(tokens, cache)
    return [_plain(first), _plain(rest)]


def _cached_sampler(impl: _Impl, seed: int) -> tuple[Any, _CacheRecorder, Config]:
    tok = _tokenizer()
    cfg = _cfg(d_vocab=len(tok), n_ctx=24)
    model = _CacheRecorder(_loaded(impl.transformer.DemoTransformer(cfg), _demo_params(cfg, _gen(seed))))
    return impl.sampling.TransformerSampler(model, tok), model, cfg


@_probe("cached_sample")
def _probe_cached_sample(impl: _Impl) -> Any:
    sampler, model, cfg = _cached_sampler(impl, 72)
    cache = impl.transformer.KeyValueCache.new_empty(cfg)
    text = sampler.sample(_tokenizer().decode(_words()[:3]), max_tokens_generated=5, temperature=0.0, kv_cache=cache)
    return [text, model.calls]


@_probe("cached_beam_search")
def _probe_cached_beam_search(impl: _Impl) -> Any:
    sampler, model, cfg = _cached_sampler(impl, 73)
    cache = impl.transformer.KeyValueCache.new_empty(cfg)
    out = sampler.beam_search(_tokenizer().decode(_words()[:3]), num_return_sequences=3, num_beams=3,
                              max_new_tokens=4, kv_cache=cache)
    return [[(float(lp), text) for lp, text in out], model.calls]


# ---------------------------------------------------------------------------------------
# Running probes: planted copies of the solutions, the learner's package
# ---------------------------------------------------------------------------------------

_COUNTER = itertools.count()
_NOTHING = object()  # a planted probe that failed: matches nothing
_OUTPUTS: dict[tuple[str, Mistake | None], Any] = {}


@lru_cache(maxsize=None)
def _solution_sources() -> dict[str, str]:
    """Every module of ``solutions/`` by name (``"__init__"`` for the package itself)."""
    return {path.stem: path.read_text() for path in sorted(SOLUTIONS.glob("*.py"))}


@lru_cache(maxsize=256)
def _compiled(source: str, filename: str) -> Any:
    # Unchanged modules compile once per process, however many copies are planted.
    return compile(source, filename, "exec", dont_inherit=True)


class _PlantedPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports planted copies of the solutions from memory: package name -> {module: source}."""

    def __init__(self) -> None:
        self.packages: dict[str, dict[str, str]] = {}
        self.imported: dict[str, set[str]] = {}  # package -> the module names imported from it

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, module = fullname.partition(".")
        sources = self.packages.get(package)
        if sources is None or "." in module or (module or "__init__") not in sources:
            return None
        origin = str(SOLUTIONS / f"{module or '__init__'}.py")
        return importlib.util.spec_from_loader(fullname, self, origin=origin, is_package=not module)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        package, _, name = module.__name__.partition(".")
        filename = module.__spec__.origin
        module.__file__ = filename
        self.imported.setdefault(package, set()).add(module.__name__)
        exec(_compiled(self.packages[package][name or "__init__"], filename), module.__dict__)


_FINDER = _PlantedPackages()


@contextlib.contextmanager
def planted(change: Mistake | None = None) -> Iterator[str]:
    """The solutions with ``change`` planted, importable under a unique package name inside the block.

    Nothing is copied to disk: the package is served from memory while the block runs,
    and its modules leave ``sys.modules`` when it ends.
    """
    sources = dict(_solution_sources())
    if change is not None:
        module = Path(change.file).stem
        if sources.get(module, "").count(change.old) != 1:
            raise ValueError(f"{change.name!r}: expected its text once in solutions/{change.file}")
        sources[module] = sources[module].replace(change.old, change.new)
    name = f"_planted_solutions_{os.getpid()}_{next(_COUNTER)}"
    _FINDER.packages[name] = sources
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    try:
        yield name
    finally:
        del _FINDER.packages[name]
        for key in _FINDER.imported.pop(name, ()):
            sys.modules.pop(key, None)
        if not _FINDER.packages and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Seeded, gradient-free, silent (progress bars, prints), and the caller's RNG state kept."""
    try:
        from sampling_course.grading.runner import _terminal_like
    except ImportError:  # pragma: no cover - the runner is being reworked; progress bars only
        _terminal_like = contextlib.nullcontext
    sink = io.StringIO()
    # One thread: the probes' tensors are tiny, and on a busy machine waking a thread pool
    # for every small op costs more than the op.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), _terminal_like(), \
                contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            _seed(0)
            yield
    finally:
        torch.set_num_threads(threads)


def _planted_output(exercise: Exercise, change: Mistake | None) -> Any:
    """The probe output of the solutions with ``change`` planted (None: the solutions), cached."""
    global _EXACT
    key = (exercise.name, change)
    if key not in _OUTPUTS:
        # A mistake can belong to several exercises (Attention and apply_causal_mask): probe them all at once.
        wanted = [exercise] if change is None else [e for e in exercises_of(change) if e.name in PROBES]
        try:
            with _quiet(), planted(change) as package:
                _EXACT = True
                for e in wanted:
                    try:
                        _OUTPUTS[(e.name, change)] = PROBES[e.name](_Impl(package))
                    except Exception:  # noqa: BLE001 - a mistake whose probe raises is never named
                        _OUTPUTS[(e.name, change)] = _NOTHING
        except Exception:  # noqa: BLE001
            for e in wanted:
                _OUTPUTS[(e.name, change)] = _NOTHING
        finally:
            _EXACT = False
    return _OUTPUTS[key]


def _learner_output(exercise: Exercise, package: str, obj: Any) -> Any:
    """The probe output of ``package`` (imported afresh), with ``obj`` in place of the exercise's object."""
    from sampling_course.grading.runner import isolated_package, substituted

    probe = PROBES[exercise.name]
    with _quiet(), isolated_package(package):
        with substituted(package, exercise, obj) if obj is not None else contextlib.nullcontext():
            with time_limit(TIME_LIMIT_S):
                return probe(_Impl(package))


def name_mistake(exercise: Exercise | str, package: str, obj: Any = None) -> Mistake | None:
    """The planted mistake of ``exercise`` whose output ``package``'s code reproduces, or None.

    ``package`` is an implementation (``"exercises"``, ``"solutions"`` or any importable
    copy); with ``obj``, that object replaces the exercise's own, as in ``check(name, obj=...)``.
    None when the exercise has no probe or no mistakes, when the learner's probe raises or
    runs too long, when its output is the solution's, or when no mistake matches.
    """
    exercise = get_exercise(exercise)
    candidates = mistakes_of(exercise)
    if exercise.name not in PROBES or not candidates:
        return None
    try:
        learner = _learner_output(exercise, package, obj)
    except (Exception, TookTooLong):  # noqa: BLE001 - a learner's error is the tests' to report
        return None
    if isinstance(learner, (list, tuple)) and learner and all(isinstance(step, Raised) for step in learner):
        return None
    solution = _planted_output(exercise, None)
    if solution is _NOTHING or same(learner, solution):
        return None
    for mistake in candidates:
        output = _planted_output(exercise, mistake)
        if output is not _NOTHING and same(learner, output):
            return mistake
    return None


def describe_match(exercise: Exercise | str, package: str, obj: Any = None) -> str | None:
    """The sentence a failing check shows first, or None when no classic mistake matches.

    Never raises: a diagnosis that goes wrong must not hide the test's own message.
    """
    try:
        mistake = name_mistake(exercise, package, obj)
    except Exception:  # noqa: BLE001
        return None
    return None if mistake is None else f"This matches a classic mistake: {explain(mistake)}"


def coverage(parts: tuple[int, ...] = (1, 2, 3)) -> tuple[list[tuple[Mistake, Exercise]], list[tuple[Mistake, str]]]:
    """``(probed, unnamed)``: every (mistake, exercise) pair with a probe, and each mistake of
    ``parts`` that cannot be named, with the reason."""
    probed: list[tuple[Mistake, Exercise]] = []
    unnamed: list[tuple[Mistake, str]] = []
    for mistake in MISTAKES:
        if mistake.part not in parts:
            continue
        exercises = exercises_of(mistake)
        with_probe = [e for e in exercises if e.name in PROBES]
        probed += [(mistake, e) for e in with_probe]
        if not exercises:
            unnamed.append((mistake, f"its code ({mistake_target(mistake)}) belongs to no part-{mistake.part} exercise"))
        elif not with_probe:
            unnamed.append((mistake, f"no probe for {', '.join(e.name for e in exercises)}"))
    return probed, unnamed
