"""An exact interval for a paired difference over a few units (texts, seeds): the sign-flip test and its inversion.

Two methods are run on the same ``n`` units; unit ``i`` gives a total difference ``s_i`` over ``c_i``
scored positions (``c_i = 1`` for one number per unit). The estimate is ``sum(s) / sum(c)``, the
difference of the two methods' means over every scored position.

**The assumption.** The units are independent, and each ``s_i - theta * c_i`` is symmetric about 0, where
``theta`` is the true difference: a unit is as likely to fall ``d`` above the truth as ``d`` below it. Nothing
else (no normal distribution, no large ``n``). Under it, flipping the signs of the ``s_i - theta * c_i`` gives
``2 ** n`` equally likely versions of the data, so the rank of the observed sum among their sums is uniform:
the test's p-value is exact, not an approximation that holds for large ``n``.

**The interval by inversion.** The one-sided test of ``theta = delta`` counts the sign patterns whose sum is at
least the observed one. Flipping a set ``F`` of units lowers the sum by ``2 * sum_F (s_i - delta * c_i)``, so
that count is one (nothing flipped) plus the number of non-empty sets ``F`` whose own ratio
``r_F = sum_F s / sum_F c`` is at most ``delta``. The values of ``delta`` the test does not reject at level
``alpha`` are therefore the ones between the ``k``-th smallest and the ``k``-th largest of the ``2 ** n - 1``
subset ratios, with ``k = floor(alpha * 2 ** (n - 1))`` (Hartigan 1969, *Using subsample values as typical
values*, JASA 64). Each tail then misses with probability exactly ``k / 2 ** n``: at ``n = 8`` and 95%,
``k = 6`` and the interval covers with probability ``1 - 12 / 256 = 0.953``. Below ``n = 6`` no ``k`` is
left (the smallest two-sided p-value, ``2 / 2 ** n``, is above 0.05), and the interval is the whole line.

A percentile bootstrap over so few units is too narrow: it resamples an 8-point distribution as if it were the
population, and at ``n = 8`` its 95% interval covers markedly less often (``tests/apps/test_sign_flip.py``
measures both).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, Sequence

from jaxtyping import Float

if TYPE_CHECKING:
    from torch import Tensor

MAX_UNITS = 16  # 2 ** 16 subsets: every one is enumerated (about 8 MiB of float64 at 16 units)


class SignFlip(NamedTuple):
    """A paired difference over ``n`` units with its exact interval and p-value."""

    estimate: float  # sum(s) / sum(c)
    low: float  # the interval; -inf and inf when n is too small for any bound at this level
    high: float
    p_value: float  # two-sided, of "the true difference is 0"
    confidence: float  # the interval's exact coverage under the assumption (0.953 at n = 8 for 95%)
    below: int  # units whose own difference s_i is below 0
    above: int  # and above 0

    def separated(self) -> str:
        """``"lower"`` or ``"higher"`` where the interval leaves out 0 (the first method's mean is lower or higher),
        ``"not separated"`` otherwise."""
        return "lower" if self.high < 0 else "higher" if self.low > 0 else "not separated"


def subset_ratios(sums: Float[Tensor, "unit"], counts: Float[Tensor, "unit"]) -> Float[Tensor, "subset"]:
    """``sum_F s / sum_F c`` for every non-empty set ``F`` of units, sorted (float64)."""
    import torch

    n = len(sums)
    masks = ((torch.arange(1, 2**n)[:, None] >> torch.arange(n)) & 1).double()
    return torch.sort((masks @ sums) / (masks @ counts)).values


def sign_flip(sums: Sequence[float] | Float[Tensor, "unit"], counts: Sequence[float] | Float[Tensor, "unit"] | None = None,
              confidence: float = 0.95) -> SignFlip:
    """The difference ``sum(sums) / sum(counts)`` with its sign-flip interval and two-sided p-value.

    ``sums``: each unit's total difference; ``counts``: each unit's number of scored positions (all 1 if
    omitted, so the estimate is the plain mean of ``sums``). The interval covers the true difference with
    probability ``confidence`` or a little more (exactly ``.confidence``) under the module's assumption."""
    import torch

    sums = torch.as_tensor(sums, dtype=torch.float64).flatten()
    counts = torch.ones_like(sums) if counts is None else torch.as_tensor(counts, dtype=torch.float64).flatten()
    n = len(sums)
    if not 1 <= n <= MAX_UNITS:
        raise ValueError(f"need between 1 and {MAX_UNITS} units (every one of the 2 ** n sign patterns is enumerated), "
                         f"got {n}")
    if counts.shape != sums.shape:
        raise ValueError(f"sums and counts must have one value per unit, got {n} sums and {len(counts)} counts")
    if not torch.isfinite(sums).all() or not (torch.isfinite(counts) & (counts > 0)).all():
        raise ValueError("sums must be finite and counts finite and above 0")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    ratios = subset_ratios(sums, counts)
    patterns = 2**n
    # k: how many subset ratios each tail leaves out. The tiny margin keeps 0.05 * 128 = 6.4000000000000057
    # from rounding the wrong way when alpha * 2 ** (n - 1) is a whole number.
    k = math.floor((1.0 - confidence) * 2 ** (n - 1) + 1e-9)
    low, high = (ratios[k - 1].item(), ratios[-k].item()) if k else (-math.inf, math.inf)
    upper_tail = (1 + (ratios <= 0).sum().item()) / patterns  # sign patterns with a sum >= the observed one
    lower_tail = (1 + (ratios >= 0).sum().item()) / patterns
    return SignFlip(estimate=(sums.sum() / counts.sum()).item(), low=low, high=high,
                    p_value=min(1.0, 2 * min(upper_tail, lower_tail)), confidence=1 - 2 * k / patterns,
                    below=int((sums < 0).sum()), above=int((sums > 0).sum()))
