"""Part 11's independent references, shared by its test files: torchao's quantisation primitives
(``torchao.quantization.quant_primitives``), the matrices the tests quantise, and the tie rule.

torchao's answers come through the ``oracle`` store (``grading/oracle.py``): importing torchao costs
about 1.5 s of CPU, and its outputs for the same weights never change, so each is computed live
once and read back after. torchao's version is an argument of every oracle function, so that
another version recomputes them.

The tie rule. ``round(w / scale)`` is the nearest integer; where the quotient lies within
``TIE`` of a half, two codes are as near as float32 can tell (torchao multiplies by ``1 / scale``,
the course divides; torch.round rounds halves to even, ``floor(x + 0.5)`` up), and either is right.
Everywhere else the code is unique, and every correct implementation finds it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import warnings

import torch

# Two quotients computed two correct ways (w / scale, w * (1 / scale)) differ by a few float32
# ulps, at most about 1e-5 for the codes' range (|w / scale| <= 255); a tie is judged 100 times wider.
TIE = 1e-3

PUBLISHED_NF4 = (
    # QLoRA's NF4 levels as bitsandbytes publishes them (bitsandbytes/functional.py, get_4bit_type("nf4");
    # the same values appear in QLoRA's appendix E): Dettmers, Pagnoni, Holtzman and Zettlemoyer, 2023.
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)


def tensors(*values):
    """``values``, each a plain tensor (or a tuple of them as one): what a quantiser returns must be data. In class
    grading a tensor subclass crosses as a handle, whose ``dtype``, ``double()`` and indexing its own class answers
    (one saying int8 over unrounded float codes passed torchao's comparison): it fails here."""
    for value in values:
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise AssertionError(f"expected a plain torch.Tensor, got {type(value).__name__}")
    return values if len(values) != 1 else values[0]


def torchao_version() -> str:
    """The installed torchao's version, read without importing it (an oracle key)."""
    return importlib.metadata.version("torchao")


def _primitives():
    """torchao's quant_primitives, imported without its notices (a CUDA extension it cannot load on a CPU build)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        from torchao.quantization import quant_primitives
    return quant_primitives


def torchao_int8(weight: torch.Tensor, version: str) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's symmetric int8 per row on [-127, 127]: (codes, scale)."""
    qp = _primitives()
    block = (1, weight.shape[1])
    scale, zero_point = qp.choose_qparams_affine(weight, qp.MappingType.SYMMETRIC, block, torch.int8, -127, 127,
                                                 scale_dtype=torch.float32)
    q = qp.quantize_affine(weight, block, scale, zero_point, torch.int8, -127, 127)
    return q, scale.reshape(weight.shape[0])


def torchao_groups(weight: torch.Tensor, group_size: int, bits: int, version: str) -> tuple[torch.Tensor, ...]:
    """torchao's asymmetric quantisation per group of ``group_size`` inputs on [0, 2**bits - 1]:
    (codes, scale, zero_point, dequantised), scale and zero point (out, groups)."""
    qp = _primitives()
    block, top = (1, group_size), 2**bits - 1
    scale, zero_point = qp.choose_qparams_affine(weight, qp.MappingType.ASYMMETRIC, block, torch.uint8, 0, top,
                                                 scale_dtype=torch.float32, zero_point_dtype=torch.int32)
    q = qp.quantize_affine(weight, block, scale, zero_point, torch.uint8, 0, top)
    deq = qp.dequantize_affine(q, block, scale, zero_point, torch.uint8, 0, top, output_dtype=torch.float32)
    groups = (weight.shape[0], weight.shape[1] // group_size)
    return q, scale.reshape(groups), zero_point.reshape(groups).float(), deq


def allowed_codes(quotient: torch.Tensor, low: int, high: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes a correct quantiser may give for the exact quotients ``w / scale`` (+ zero point), in float64:
    the nearest integer, or either neighbour within ``TIE`` of a half; then clamped to [low, high]."""
    below = (quotient + TIE).floor()
    above = (quotient - TIE).ceil()
    nearest = quotient.round()
    near_tie = (quotient - quotient.floor() - 0.5).abs() < TIE
    first = torch.where(near_tie, below, nearest).clamp(low, high)
    second = torch.where(near_tie, above, nearest).clamp(low, high)
    return first, second


def assert_codes_allowed(codes: torch.Tensor, quotient: torch.Tensor, low: int, high: int, what: str) -> None:
    first, second = allowed_codes(quotient, low, high)
    got = codes.double()
    wrong = ~((got == first) | (got == second))
    if wrong.any():
        i = tuple(int(x) for x in wrong.nonzero()[0])
        raise AssertionError(f"{what}: {int(wrong.sum())} codes are not the nearest integer; first at {i}: got "
                             f"{got[i].item():g}, the quotient is {quotient[i].item():.6f} (allowed "
                             f"{first[i].item():g} or {second[i].item():g})")


def weight_matrices(reference) -> dict[str, torch.Tensor]:
    """A reference's layer-0 weight matrices as (out, in), from its Hugging Face checkpoint: GPT-2's Conv1D
    stores (in, out), so each is transposed (the fused c_attn holds W_Q, W_K and W_V side by side)."""
    w = reference.weights
    names = {"c_attn": "attn.c_attn", "attn_proj": "attn.c_proj", "c_fc": "mlp.c_fc", "mlp_proj": "mlp.c_proj"}
    # On the CPU whatever device the session grades on: these tests are about numbers, not kernels.
    return {key: w[f"transformer.h.0.{name}.weight"].T.float().cpu().contiguous() for key, name in names.items()}


def random_matrix(seed: int, rows: int, cols: int) -> torch.Tensor:
    """Normal weights with a few outliers per row (as trained weights have), and one all-positive region."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=g) * 0.05
    outliers = torch.randint(0, cols, (rows, 2), generator=g)
    weight.scatter_(1, outliers, torch.randn(rows, 2, generator=g) * 0.5)
    weight[0, : cols // 2] = weight[0, : cols // 2].abs()
    return weight
