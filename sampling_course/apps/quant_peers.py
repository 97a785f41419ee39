"""The peers of part 11 on the same weights: torchao and optimum-quanto, matrix by matrix.

Neither library can run the course's models directly: torchao's ``quantize_`` and quanto's
``quantize`` replace ``nn.Linear`` modules, and the course's models keep their weights as
parameters read by einsum and matmul (``W_Q`` of shape ``[n_heads, d_model, d_head]``, ``W_in``
of shape ``[d_model, d_mlp]``). So the bench hands each library every weight matrix the course
quantises, as an ``(out, in)`` matrix (``block_matrices``), lets the library quantise it with its
own API, reads back the library's dequantised weights, and writes them into a copy of the fp32
model (``with_dequantised_weights``). The copy then scores exactly what the library's rounding
gives, through the same forward pass as every other configuration:

* **torchao int8** (``Int8WeightOnlyConfig``: symmetric, one scale per output row): the matrix
  as the weight of an ``nn.Linear``, ``quantize_`` applied, ``weight.dequantize()`` read back.
* **torchao int4-gN** (``Int4WeightOnlyConfig(group_size=N)``): its CPU kernels are not in
  torchao 0.18's CPU build (its tensors need CUDA or the ``mslk`` library), so the bench calls
  the primitives that config uses to round (``_choose_qparams_affine_tinygemm``,
  ``_quantize_affine_tinygemm``, ``_dequantize_affine_tinygemm``: asymmetric 4-bit per group of
  N inputs, with a floating-point zero point), on fp32 matrices.
* **quanto qint8 / qint4-gN** (optimum-quanto's ``quantize_weight`` with its ``AbsmaxOptimizer``
  for qint8 per output row and its ``MaxOptimizer`` for qint4 per group, the optimisers its
  ``quantize`` uses by default), ``dequantize()`` read back.

bitsandbytes' NF4 has no CPU path here; it runs in the GPU section (``quant_speed``) only.
A library that is not installed gives a row that says so.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

# The block weights the course quantises, by name, for GPT-2 (part 1) and the Llama-style model (part 9).
MATRIX_NAMES = ("W_Q", "W_K", "W_V", "W_O", "W_gate", "W_in", "W_out")


def to_matrix(name: str, weight: Tensor) -> Tensor:
    """The ``(out, in)`` matrix of a block weight: the layout ``nn.Linear`` and the quantisers use
    (one row per output, groups along the inputs)."""
    if name in ("W_Q", "W_K", "W_V"):  # [heads, d_model, d_head]: each head's outputs are rows
        return weight.permute(0, 2, 1).reshape(-1, weight.shape[1])
    if name == "W_O":  # [heads, d_head, d_model]: the inputs are every head's d_head values
        return weight.reshape(-1, weight.shape[-1]).T
    return weight.T  # [in, out] for W_in, W_gate and W_out


def from_matrix(name: str, matrix: Tensor, shape: torch.Size) -> Tensor:
    """The inverse of ``to_matrix``: back to the parameter's own shape."""
    if name in ("W_Q", "W_K", "W_V"):
        return matrix.reshape(shape[0], shape[2], shape[1]).permute(0, 2, 1)
    if name == "W_O":
        return matrix.T.reshape(shape)
    return matrix.T


def block_matrices(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, str, Tensor]]:
    """Every weight matrix inside the model's blocks, as (module, parameter name, the parameter)."""
    for block in model.blocks:
        for module in block.modules():
            for name in MATRIX_NAMES:
                param = module._parameters.get(name)
                if param is not None:
                    yield module, name, param


def with_dequantised_weights(fp32: torch.nn.Module, roundtrip: Callable[[Tensor], Tensor]) -> torch.nn.Module:
    """A copy of ``fp32`` in which every block matrix ``W`` is ``roundtrip(W)`` (in the ``(out, in)`` layout)."""
    model = copy.deepcopy(fp32)
    with torch.no_grad():
        for _, name, param in block_matrices(model):
            matrix = to_matrix(name, param.detach().float())
            param.copy_(from_matrix(name, roundtrip(matrix).to(param.dtype), param.shape))
    return model.eval()


BF16_WEIGHTS = "bf16 matrices, fp32 compute"


def bf16_weights(fp32: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The block matrices rounded to bf16 and computed with in fp32, like the quantised schemes: the weight
    format alone, where the "bf16" configuration also computes in bf16."""
    return {BF16_WEIGHTS: with_dequantised_weights(fp32, lambda matrix: matrix.to(torch.bfloat16).float())}


@contextlib.contextmanager
def quiet_peer_imports():
    """Importing torchao logs a warning for each optional native library this build lacks (its CUDA
    kernels on a CPU machine) and torch one for each enum it registers: noise in a bench's output."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def torchao_roundtrip(scheme: str) -> Callable[[Tensor], Tensor]:
    """torchao's rounding of one ``(out, in)`` matrix at ``scheme`` ("int8" or "int4-gN"), dequantised."""
    with quiet_peer_imports():
        import torchao.quantization  # noqa: F401
    if scheme == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        def int8(matrix: Tensor) -> Tensor:
            linear = torch.nn.Linear(matrix.shape[1], matrix.shape[0], bias=False)
            with torch.no_grad():
                linear.weight.copy_(matrix)
            quantize_(linear, Int8WeightOnlyConfig())
            return linear.weight.dequantize().float()

        return int8
    group = _group_size(scheme, "int4")
    from torchao.quantization.quant_primitives import (
        MappingType,
        _choose_qparams_affine_tinygemm,
        _dequantize_affine_tinygemm,
        _quantize_affine_tinygemm,
    )

    def int4(matrix: Tensor) -> Tensor:
        block = (1, group)
        scale, zero = _choose_qparams_affine_tinygemm(matrix, MappingType.ASYMMETRIC, block, torch.int32, 0, 15,
                                                      scale_dtype=matrix.dtype, zero_point_dtype=matrix.dtype)
        codes = _quantize_affine_tinygemm(matrix, block, scale, zero, torch.int32, 0, 15)
        return _dequantize_affine_tinygemm(codes, block, scale, zero, torch.int32, 0, 15, output_dtype=matrix.dtype)

    return int4


def quanto_roundtrip(scheme: str) -> Callable[[Tensor], Tensor]:
    """optimum-quanto's rounding of one ``(out, in)`` matrix at ``scheme`` ("int8" or "int4-gN"), dequantised."""
    with quiet_peer_imports():
        from optimum.quanto import AbsmaxOptimizer, MaxOptimizer, qint4, qint8, quantize_weight

    if scheme == "int8":
        def int8(matrix: Tensor) -> Tensor:
            scale = AbsmaxOptimizer()(matrix, qtype=qint8, axis=0)
            # optimized=False: the plain PyTorch path, no C++ extension compiled on first use.
            return quantize_weight(matrix, qint8, axis=0, scale=scale, optimized=False).dequantize().float()

        return int8
    group = _group_size(scheme, "int4")

    def int4(matrix: Tensor) -> Tensor:
        scale, shift = MaxOptimizer()(matrix, qtype=qint4, axis=0, group_size=group)
        q = quantize_weight(matrix, qint4, axis=0, scale=scale, shift=shift, group_size=group, optimized=False)
        return q.dequantize().float()

    return int4


def _group_size(scheme: str, kind: str) -> int:
    prefix = f"{kind}-g"
    if not scheme.startswith(prefix) or not scheme[len(prefix):].isdigit():
        raise ValueError(f"a peer scheme is int8 or {kind}-gN (N a group size), got {scheme!r}")
    return int(scheme[len(prefix):])


# (row label, the library's package, the course scheme it matches, its round trip)
PEERS: tuple[tuple[str, str, str, Callable[[str], Callable[[Tensor], Tensor]]], ...] = (
    ("torchao int8", "torchao", "int8", torchao_roundtrip),
    ("torchao int4-g64", "torchao", "int4-g64", torchao_roundtrip),
    ("torchao int4-g128", "torchao", "int4-g128", torchao_roundtrip),
    ("quanto int8", "optimum.quanto", "int8", quanto_roundtrip),
    ("quanto int4-g64", "optimum.quanto", "int4-g64", quanto_roundtrip),
)


def peer_models(fp32: torch.nn.Module, libraries: tuple[str, ...] = ("torchao", "optimum.quanto")
                ) -> tuple[dict[str, torch.nn.Module], dict[str, str], dict[str, str]]:
    """(label -> the fp32 model with the peer's dequantised weights, label -> the course scheme it matches,
    label -> why it did not run) for every peer of ``libraries``."""
    models, matches, skipped = {}, {}, {}
    for label, package, scheme, roundtrip in PEERS:
        if package not in libraries:
            continue
        if not installed(package.split(".")[0]) or not installed(package):
            skipped[label] = f"{package} is not installed (pip install the course's bench extra)"
            continue
        try:
            models[label] = with_dequantised_weights(fp32, roundtrip(scheme))
            matches[label] = scheme
        except Exception as exc:  # a peer's own failure is reported in its row, never hidden
            skipped[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return models, matches, skipped
