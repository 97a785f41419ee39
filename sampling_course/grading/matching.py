"""Probe outputs and how they match: exactly for deterministic code, statistically for random draws.

Outputs match when they have the same structure and every leaf agrees: tensors of the same
shape within ``rtol=1e-4, atol=1e-5`` (integer and boolean tensors exactly), floats within the
same tolerance, ints and strings exactly.

Random exercises are probed on crafted inputs, in one or more settings. For planted code the
probe enumerates the draw exactly (``Distribution``, inside ``exact_draws()``):
``torch.multinomial`` is replaced by a stand-in that replays every possible choice, weighted by
its probability. For the learner's code it counts the tokens of ``N`` seeded draws
(``Frequencies``), in whatever style the learner draws. The crafted inputs make every two
candidates (the solution and each mistake) differ by at least ``gap`` in some token's
probability in some setting, and a learner matches a candidate when every token's frequency
is within ``gap / 2`` of its probability. ``N`` comes from Hoeffding's bound on a binomial
frequency::

    P(|f - p| >= gap / 2) <= 2 exp(-N gap^2 / 2)

With ``N = ceil(2 / gap^2 * ln(2 K / 1e-6))`` for ``K`` tokens (a few hundred draws): code with
the same distribution as a mistake matches it with probability at least 1 - 1e-6 per setting
(all K tokens within the tolerance), and code whose distribution differs from a mistake's by
at least ``gap`` in some token matches it with probability at most 1e-6 / K (false-match
probability).

Batched draws (part 5's ``sample``: one ``torch.multinomial`` call on ``(rows, K)``
probabilities, one token per row, the rows independent) are compared row by row:
``frequencies(..., rows=R)`` gives one result per row, the frequencies of that row's token
over the same ``N`` calls. For planted code the stand-in enumerates every joint choice of
the rows (the product of the rows' supports, small on the probes' inputs) and sums each
row's marginal. The bound above then runs over ``R K`` frequencies instead of ``K``:
``N = ceil(2 / gap^2 * ln(2 R K / 1e-6))``, so the probability that any of them strays by
``gap / 2`` or more is again at most 1e-6 per setting (a union bound; the rows need not be
independent of each other for it). The draws may come from a ``torch.Generator`` the probe
passes in: the learner's side seeds it (and torch's global generator) before counting.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "ATOL", "FALSE_MATCH", "RTOL", "Distribution", "Frequencies", "Raised", "as_int", "attempt", "draws_for",
    "enumerating", "exact_distribution", "exact_draws", "frequencies", "plain", "same", "seed_cpu",
]

RTOL, ATOL = 1e-4, 1e-5
# The probability of naming a mistake wrongly (and of missing one) per frequency setting.
FALSE_MATCH = 1e-6


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


def plain(x: Any) -> Any:
    """A probe output leaf, detached from autograd and from tensor subclasses (KeyValueCache)."""
    if isinstance(x, torch.Tensor):
        return x.detach().as_subclass(torch.Tensor).cpu().clone()
    return x


def as_int(token: Any) -> int:
    """A token id returned as an int or as a one-element integer tensor."""
    if isinstance(token, torch.Tensor):
        if token.numel() != 1 or token.is_floating_point():
            raise TypeError(f"expected one token id, got a tensor of shape {tuple(token.shape)}")
        return int(token.item())
    return int(token)


def attempt(step: Callable[[], Any]) -> Any:
    """Run one step of a probe; an error (other than an unfilled stub) becomes part of the output."""
    try:
        return step()
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the learner's code may raise anything
        return Raised(type(error).__name__)


# True while planted solutions are probed (inside ``exact_draws()``): random draws are then
# enumerated exactly instead of counted.
_exact: contextvars.ContextVar[bool] = contextvars.ContextVar("exact_draws", default=False)


def enumerating() -> bool:
    """True inside ``exact_draws()``: the code being probed is planted, not the learner's."""
    return _exact.get()


@contextlib.contextmanager
def exact_draws() -> Iterator[None]:
    """Inside the block, ``frequencies`` enumerates the exact distribution (for planted code)."""
    token = _exact.set(True)
    try:
        yield
    finally:
        _exact.reset(token)


class _Branch(BaseException):
    """Raised by the enumerating stand-in for torch.multinomial at a draw not yet scripted."""

    def __init__(self, probs: list[float]):
        self.probs = probs


def exact_distribution(
    draw: Callable[[], Any], categories: int, tolerance: float, rows: int | None = None
) -> Distribution | tuple[Distribution, ...]:
    """The exact distribution of ``draw()``, for code that draws with ``torch.multinomial(probs, 1)``.

    torch.multinomial is replaced, while ``draw`` runs, by a stand-in that returns scripted
    choices; at the first unscripted call it reports the probabilities, and every possible
    choice is then replayed (depth first), each leaf weighted by the product of its choices'
    probabilities. Code that never draws is a single leaf. A call on 2-D ``(rows, K)``
    probabilities (one token per row) branches over every joint choice of the rows.

    With ``rows``, ``draw()`` returns one token per row, and the result is each row's
    distribution (its marginal over the leaves).
    """
    real = torch.multinomial
    leaves: Counter[tuple[int, ...]] = Counter()

    def run(script: list[Any], weight: float) -> None:
        calls = 0

        def multinomial(input: torch.Tensor, num_samples: int, replacement: bool = False, **kwargs: Any) -> torch.Tensor:
            nonlocal calls
            if input.ndim not in (1, 2) or num_samples != 1 or kwargs.get("out") is not None:
                raise TypeError("the exact enumeration handles torch.multinomial(probs, 1) on 1-D or 2-D probs only")
            calls += 1
            if calls <= len(script):
                return torch.tensor(script[calls - 1], device=input.device).view(*input.shape[:-1], 1)
            probs = input.detach().double().cpu()
            raise _Branch((probs / probs.sum(dim=-1, keepdim=True)).tolist())

        torch.multinomial = multinomial
        try:
            outcome = draw()
        except _Branch as branch:
            torch.multinomial = real
            if isinstance(branch.probs[0], list):  # one list per row: every joint choice
                supports = [[(c, p) for c, p in enumerate(row) if p > 0] for row in branch.probs]
                for joint in itertools.product(*supports):
                    run(script + [[c for c, _ in joint]], weight * math.prod(p for _, p in joint))
            else:
                for choice, p in enumerate(branch.probs):
                    if p > 0:
                        run(script + [choice], weight * p)
            return
        finally:
            torch.multinomial = real
        leaves[_tokens(outcome, rows)] += weight

    run([], 1.0)
    marginals = _marginals(leaves, rows)
    dists = tuple(Distribution(_padded(row, categories), tolerance) for row in marginals)
    return dists[0] if rows is None else dists


def seed_cpu(seed: int) -> None:
    """Seed torch's CPU generator (what the draws use); torch.manual_seed would also queue
    seeding for every accelerator, which costs milliseconds per call on a CPU-only machine."""
    torch.random.default_generator.manual_seed(seed)


def _tokens(outcome: Any, rows: int | None) -> tuple[int, ...]:
    """``draw()``'s outcome as a tuple of token ids: one, or one per row when ``rows`` is given."""
    if rows is None:
        tokens = (as_int(outcome),)
    else:
        if isinstance(outcome, torch.Tensor):
            if outcome.is_floating_point() or outcome.ndim != 1:
                raise TypeError(f"expected one token id per row, got a tensor of shape {tuple(outcome.shape)}")
            outcome = outcome.tolist()
        tokens = tuple(as_int(t) for t in outcome)
        if len(tokens) != rows:
            raise ValueError(f"expected {rows} tokens (one per row), got {len(tokens)}")
    if min(tokens) < 0:
        raise ValueError("a negative token id")
    return tokens


def _marginals(outcomes: Counter[tuple[int, ...]], rows: int | None) -> list[Counter[int]]:
    """Each row's total weight (or count) per token."""
    marginals: list[Counter[int]] = [Counter() for _ in range(rows or 1)]
    for tokens, weight in outcomes.items():
        for row, token in enumerate(tokens):
            marginals[row][token] += weight
    return marginals


def _padded(counts: Counter[int], categories: int) -> tuple[Any, ...]:
    size = max(categories, max(counts) + 1)
    return tuple(counts.get(i, 0) for i in range(size))


def frequencies(
    draw: Callable[[], Any],
    categories: int,
    gap: float,
    seed: int,
    rows: int | None = None,
    generator: torch.Generator | None = None,
) -> Frequencies | Distribution | tuple[Frequencies | Distribution, ...]:
    """The learner's side: the frequency of every token over ``draws_for(gap, categories)``
    draws after ``torch.manual_seed(seed)``. Planted solutions: the exact distribution.

    With ``rows``, each ``draw()`` returns one token per row and the result has one entry
    per row, over ``draws_for(gap, rows * categories)`` draws (see the module docstring).
    ``generator``, when the draws use one, is seeded with ``seed`` too.
    """
    if _exact.get():
        return exact_distribution(draw, categories, gap / 2, rows)
    n = draws_for(gap, categories * (rows or 1))
    seed_cpu(seed)
    if generator is not None:
        generator.manual_seed(seed)
    outcomes = Counter(_tokens(draw(), rows) for _ in range(n))
    counts = tuple(Frequencies(_padded(row, categories), n, gap / 2) for row in _marginals(outcomes, rows))
    return counts[0] if rows is None else counts
