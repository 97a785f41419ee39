"""What quantised weights take in memory: a formula, the stored tensors, and what then fits (part 11's bench).

Only the weight matrices inside the blocks are quantised (attention's q/k/v/o, the MLP's);
the embeddings, the unembedding, the norms and the biases keep their dtype. For one
``(out, in)`` matrix the stored bytes are its codes, its scales and its zero points:

* ``int8``: ``out x in`` one-byte codes + ``out`` scales (one per row, ``S`` bytes each);
* ``int4-gG``: ``out x in / 2`` bytes (two 4-bit codes a byte) + ``out x in / G`` groups
  x (a scale of ``S`` bytes + a zero point of ``Z`` bytes);
* ``nf4-gG``: ``out x in / 2`` bytes + ``out x in / G`` absmax scales of ``S`` bytes;
* ``nf4-gG-dq`` (double quantisation, QLoRA's section 3): the absmax scales themselves as
  one-byte codes in blocks of ``DQ_BLOCK`` (the last block padded to full size), one ``S``-byte
  scale per block and one ``S``-byte offset per matrix (their mean, subtracted before they are
  quantised): ``ceil(g / DQ_BLOCK) x (DQ_BLOCK + S) + S`` bytes for ``g = out x in / G`` absmaxes.

``S`` and ``Z`` are the bytes of the scale and zero-point dtypes (``SCALE_BYTES``,
``ZERO_BYTES``: fp32 scales, and zero points as one byte each, since they are whole numbers
from 0 to 15). The model's bytes are the matrices' by this formula plus every other
parameter's and buffer's ``numel x element_size``. The bench checks the formula against the bytes of the
tensors the quantised model actually stores (``stored_bytes``, every distinct storage among
its parameters, buffers and tensor attributes) and against part 11's own ``weight_bytes``.

The KV cache is not quantised here: its bytes are ``sampling_course.kv_memory``'s formula at
the dtype the model computes in.
"""

from __future__ import annotations

import math

import torch

from sampling_course.apps.quant_peers import block_matrices, to_matrix
from sampling_course.kv_memory import kv_cache_bytes, storage_bytes

SCALE_BYTES = 4  # fp32 scales and absmax values
ZERO_BYTES = 1  # zero points are whole numbers from 0 to 15: one byte each
DQ_BLOCK = 256  # absmax values per second-level scale (QLoRA's choice)


def parse_scheme(scheme: str) -> tuple[str, int | None, bool]:
    """``"int4-g64"`` -> ("int4", 64, False); ``"nf4-g64-dq"`` -> ("nf4", 64, True); ``"int8"`` -> ("int8", None, False)."""
    kind, *rest = scheme.split("-")
    double = rest[-1:] == ["dq"]
    rest = rest[:-1] if double else rest
    group = int(rest[0][1:]) if rest and rest[0].startswith("g") and rest[0][1:].isdigit() else None
    if kind == "int8" and not rest and not double:
        return kind, None, False
    if kind in ("int4", "nf4") and group and len(rest) == 1 and (kind == "nf4" or not double):
        return kind, group, double
    raise ValueError(f"a scheme is int8, int4-gG or nf4-gG[-dq] (G a group size), got {scheme!r}")


def matrix_bytes(scheme: str, out: int, inputs: int) -> int:
    """The formula: the stored bytes of one ``(out, inputs)`` matrix at ``scheme`` (the module's docstring)."""
    kind, group, double = parse_scheme(scheme)
    if kind == "int8":
        return out * inputs + out * SCALE_BYTES
    groups = out * math.ceil(inputs / group)
    codes = math.ceil(out * inputs / 2)
    if kind == "int4":
        return codes + groups * (SCALE_BYTES + ZERO_BYTES)
    if not double:
        return codes + groups * SCALE_BYTES
    return codes + math.ceil(groups / DQ_BLOCK) * (DQ_BLOCK + SCALE_BYTES) + SCALE_BYTES


def formula_bytes(model: torch.nn.Module, scheme: str) -> int:
    """The model's weight bytes by the formula: ``scheme`` "fp32" or "bf16" for the whole model at that
    dtype, else the block matrices by ``matrix_bytes`` and every other parameter at its own dtype.
    ``model`` may live on the meta device (shapes only)."""
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    if scheme in ("fp32", "bf16"):  # the whole model cast: its (floating-point) buffers too
        numbers = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
        return numbers * (4 if scheme == "fp32" else 2)
    matrices = {id(p): to_matrix(name, p).shape for _, name, p in block_matrices(model)}
    total = sum(matrix_bytes(scheme, out, inputs) for out, inputs in matrices.values())
    return total + sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in matrices) + buffers


def stored_bytes(model: torch.nn.Module) -> int:
    """The bytes of every distinct storage the model holds: parameters, buffers and tensors kept as plain
    attributes of its modules (where a quantised layer may keep its codes)."""
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        tensors += [value for value in vars(module).values() if isinstance(value, torch.Tensor)]
    return storage_bytes(t for t in tensors if t is not None)


def kv_bytes(cfg, seq_len: int, dtype: torch.dtype, batch: int = 1) -> int:
    """The KV cache of ``batch`` sequences of ``seq_len`` tokens for a GPT-2 ``Config`` or a ``LlamaConfig``."""
    kv_heads = getattr(cfg, "n_key_value_heads", cfg.n_heads)
    return kv_cache_bytes(n_layers=cfg.n_layers, batch=batch, seq_len=seq_len, n_kv_heads=kv_heads,
                          d_head=cfg.d_head, dtype=dtype)


def deployment_bytes(model: torch.nn.Module, scheme: str) -> int:
    """The formula with every parameter outside the block matrices in bf16 (how a model is deployed
    when its block weights are quantised; the course's ``quantise_model`` keeps them as they were)."""
    if scheme in ("fp32", "bf16"):
        return formula_bytes(model, scheme)
    matrices = {id(p): to_matrix(name, p).shape for _, name, p in block_matrices(model)}
    rest = sum(p.numel() for p in model.parameters() if id(p) not in matrices)
    return sum(matrix_bytes(scheme, out, inputs) for out, inputs in matrices.values()) + 2 * rest


def fits_rows(models: dict[str, tuple[torch.nn.Module, object, int, int]], schemes: list[str]) -> list[dict]:
    """Per scheme and model: weights (``deployment_bytes``) + a KV cache of ``seq_len`` tokens in bf16, and
    whether the sum fits the model's budget. ``models``: label -> (meta model, its config, seq_len, budget)."""
    rows = []
    for scheme in schemes:
        row: dict = dict(scheme=scheme)
        for label, (model, cfg, seq_len, budget) in models.items():
            weights = deployment_bytes(model, scheme)
            kv = kv_bytes(cfg, seq_len, torch.float32 if scheme == "fp32" else torch.bfloat16)
            row[label] = dict(weights=weights, kv=kv, total=weights + kv, fits=weights + kv <= budget)
        rows.append(row)
    return rows


def meta_model(module, cfg) -> torch.nn.Module:
    """The course's model of configuration ``cfg`` (``module.DemoTransformer`` or ``module.LlamaTransformer``) on
    the meta device: its parameters' shapes without their memory."""
    with torch.device("meta"):
        cls = module.LlamaTransformer if hasattr(module, "LlamaTransformer") else module.DemoTransformer
        return cls(cfg)
