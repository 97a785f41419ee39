"""The long-text experiment's results: the methods' names, what each one measured, and the table.

``run_experiment`` (``sampling_course.apps.long_text``) fills a ``LongTextResults``: per method,
the NLL at every position of every text, the time spent in the model and the keys and values
held. ``table`` shows them as a rich Table, ``smoothed_nll`` turns one method's NLL into a curve
to plot, and ``LongTextResults.checks`` says how far the methods are from full attention where
they must agree with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jaxtyping import Float, Int

if TYPE_CHECKING:  # torch loads when the results are first used
    from torch import Tensor

# The methods' names: the keys of ``LongTextResults.methods`` and the table's rows.
POSITION_RULES = ("cache", "absolute")
FULL = "full attention"
SLIDING = "sliding window, recomputed"
REPREFILL = "window, re-prefilled when full"


def cache_method(num_sink_tokens: int, position_rule: str) -> str:
    """The name of a SinkCache method in the results: 'window cache' without sinks, 'sink cache' with."""
    kind = "sink cache" if num_sink_tokens else "window cache"
    return f"{kind}, {position_rule} positions"


@dataclass
class MethodResult:
    """One method's per-position NLL, model time and memory."""

    name: str
    nll: Float[Tensor, "text pos_minus_1"]  # NaN where the method did not score
    seconds: float  # time spent in the model
    cache_bytes: int  # the keys and values it holds for one text (0: it holds none)
    how: str  # how it ran, for the table

    @property
    def scored(self) -> int:
        """Token predictions scored, over all texts."""
        return int((~self.nll.isnan()).sum())

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / self.scored


@dataclass
class LongTextResults:
    """Every method's results on the same texts, with the settings they ran under."""

    model_name: str
    n_ctx: int
    window: int
    num_sink_tokens: int
    stride: int
    tokens: Int[Tensor, "text pos"]
    methods: dict[str, MethodResult] = field(default_factory=dict)
    uncached_full_nll: Tensor | None = None  # full attention from one uncached pass, for the checks
    # Where the table may average, when no method limits it: the recomputed window's positions, kept
    # when that method is left out so that tables with and without it compare the same positions.
    scored_positions: Tensor | None = None  # (pos_minus_1,) bool
    device: str = "cpu"  # where the model ran

    def ranges(self) -> list[tuple[str, int, int]]:
        """(label, start, end) of the position ranges the table averages over."""
        end = self.tokens.shape[1] - 1
        w, n = min(self.window, end), min(self.n_ctx, end)
        return [(f"t < {w}", 0, w), (f"{w} ≤ t < {n}", w, n), (f"t ≥ {n}", n, end)]

    def common_positions(self, start: int, end: int) -> Tensor:
        """Where, in positions ``start .. end - 1``, every method that scores any of them has scored.

        The recomputed sliding window scores only every ``stride``-th position: comparing
        every method on the same positions keeps the comparison fair (position 0, say, is
        hard to predict for everyone).
        """
        import torch

        common = torch.ones_like(self.tokens[:, start:end], dtype=torch.bool)
        if self.scored_positions is not None:
            common &= self.scored_positions[start:end]
        for result in self.methods.values():
            scored = ~result.nll[:, start:end].isnan()
            if scored.any():
                common &= scored
        return common

    def mean_nll(self, name: str, start: int, end: int, common: bool = True) -> float:
        """Mean NLL of a method over positions ``start .. end - 1`` (NaN if it scored none of them).

        ``common``: only over the positions every method scored (``common_positions``);
        otherwise over every position this method scored.
        """
        values = self.methods[name].nll[:, start:end]
        keep = ~values.isnan() & (self.common_positions(start, end) if common else True)
        return values[keep].mean().item() if keep.any() else float("nan")

    def checks(self) -> dict[str, float]:
        """Largest |NLL difference| where methods must agree: the window covers the whole prefix."""
        full = self.methods[FULL].nll
        w = min(self.window, full.shape[1])
        out = {}
        if self.uncached_full_nll is not None:
            out["full attention: static cache vs one uncached pass"] = _max_diff(full, self.uncached_full_nll)
        for name, result in self.methods.items():
            if name != FULL:
                out[f"{name} vs full attention, t < {w}"] = _max_diff(result.nll[:, :w], full[:, :w])
        return out


def _max_diff(a: Tensor, b: Tensor) -> float:
    both = ~(a.isnan() | b.isnan())
    return (a[both] - b[both]).abs().max().item() if both.any() else float("nan")


def smoothed_nll(nll: Float[Tensor, "text pos"], width: int = 32) -> Float[Tensor, "pos"]:
    """For plotting: the mean NLL over texts at each position, averaged over the ``width`` positions
    ending there. Positions a method did not score (NaN) are skipped; NaN comes out where none was,
    and after the last position it scored (full attention stops at n_ctx)."""
    import torch

    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    scored = ~nll.isnan()
    # Running sums make every window's total a difference of two entries.
    zero = torch.zeros(1, device=nll.device)
    sums = torch.cat([zero, torch.where(scored, nll, 0.0).sum(0).cumsum(0)])
    counts = torch.cat([zero, scored.sum(0).cumsum(0).float()])
    end = torch.arange(1, nll.shape[1] + 1, device=nll.device)
    start = (end - width).clamp(min=0)
    count = counts[end] - counts[start]
    curve = torch.where(count > 0, (sums[end] - sums[start]) / count.clamp(min=1), float("nan"))
    if scored.any():
        curve[int(scored.any(0).nonzero().max()) + 1 :] = float("nan")
    return curve


def _nll_cell(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f} ({math.exp(value):.3g})"


def _size(n_bytes: int) -> str:
    return "none" if n_bytes == 0 else f"{n_bytes / 2**20:.2f} MiB"


def table(results: LongTextResults):
    """The results as a rich Table: NLL (perplexity) per position range, memory and time per method."""
    import torch
    from rich.table import Column, Table

    n_texts, length = results.tokens.shape
    where = f"CPU, {torch.get_num_threads()} torch thread(s)" if results.device == "cpu" else results.device
    ranges = results.ranges()
    limited = SLIDING in results.methods or results.scored_positions is not None
    every = f" (every {results.stride}th)" if results.stride > 1 and limited else ""
    out = Table(
        "method", "cache\nper text", "ms per\ntoken",
        *[Column(f"NLL (ppl)\n{label}", no_wrap=True) for label, _, _ in ranges],
        title=(
            f"Long texts on {results.model_name} (n_ctx {results.n_ctx}): {n_texts} texts x {length} tokens, "
            f"window W = {results.window}, {results.num_sink_tokens} sink tokens"
        ),
        caption=(
            "NLL: mean negative log-likelihood of the true next token in nats, ppl = exp(NLL), over the positions "
            f"t every method scored{every}; t: position of the last token read. cache: keys and values held for "
            f"one text. ms per token: time in the model per token scored; every method but the recomputed sliding "
            f"window runs 1 token per step (the re-prefilled window adds its prefills); {n_texts} texts per step, "
            f"{where}."
        ),
    )
    for name, result in results.methods.items():
        cells = [_nll_cell(results.mean_nll(name, start, end)) for _, start, end in ranges]
        out.add_row(f"{name}\n[dim]{result.how}[/]", _size(result.cache_bytes), f"{result.ms_per_token:.2f}", *cells)
    return out
