"""Attention sinks: how much attention each head puts on the first tokens of a text (part 6).

The sink cache of the long-text experiment (``sampling_course.apps.long_text``) keeps the
first few tokens forever, because trained models put a large share of their attention
there. This module measures that share by another route than the experiment's own
caches: Hugging Face's eager attention, which returns every layer's attention pattern.
``attention_mass_on_first`` gives the share per layer and head, ``uniform_mass_on_first``
what a head that spread its attention evenly would put there, and ``attention_table``
shows both.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def eager_hf_model(reference):
    """A fresh copy of the reference's Hugging Face model whose attention can return its patterns."""
    from transformers import GPT2LMHeadModel

    from sampling_course.reference import quiet_transformers

    quiet_transformers()
    # A copy: the reference's own model is shared, and it runs a fused attention that keeps no pattern.
    model = GPT2LMHeadModel.from_pretrained(reference.path, attn_implementation="eager", dtype=reference.dtype)
    return model.to(reference.device).eval()


def n_positions(hf_model) -> int:
    """The model's context: GPT-2's ``n_positions``, a Llama-style model's ``max_position_embeddings``."""
    config = hf_model.config
    return getattr(config, "n_positions", None) or config.max_position_embeddings


@torch.inference_mode()
def attention_patterns(hf_model, tokens: Int[Tensor, "text pos"]) -> list[Float[Tensor, "text n_heads query_pos key_pos"]]:
    """Every layer's attention pattern on ``tokens`` (at most n_ctx of them): softmax over keys, per query."""
    if tokens.shape[1] > n_positions(hf_model):
        raise ValueError(f"{tokens.shape[1]} tokens do not fit the model's n_ctx={n_positions(hf_model)}")
    return list(hf_model(tokens, output_attentions=True).attentions)


def attention_mass(
    hf_model, tokens: Int[Tensor, "text pos"], keys: Bool[Tensor, "text pos"] | Bool[Tensor, "text pos pos"],
    from_position: int = 64,
) -> Float[Tensor, "n_layers n_heads"]:
    """The share of attention each head puts on the key positions marked in ``keys``, averaged over
    texts and over the queries from ``from_position`` to n_ctx - 1 (one text at a time, to bound memory).

    ``keys`` marks the same keys for every query (text, key), or its own keys for each query
    (text, query, key), as :func:`latest_marks` does."""
    n = min(tokens.shape[1], n_positions(hf_model))
    if not 0 <= from_position < n:
        raise ValueError(f"from_position must be in [0, {n - 1}], got {from_position}")
    if keys.shape not in (tokens.shape, (*tokens.shape, tokens.shape[1])):
        raise ValueError(f"keys must mark positions of tokens, shape {tuple(tokens.shape)} or "
                         f"{(*tokens.shape, tokens.shape[1])} (one row per query), got {tuple(keys.shape)}")
    keys = keys[:, :n, :n] if keys.dim() == 3 else keys[:, :n]
    total = 0.0
    device = next(hf_model.parameters()).device  # the texts go where the model is; the shares come back to the CPU
    for row, marked in zip(tokens[:, :n].to(device), keys.to(device)):
        patterns = torch.stack(attention_patterns(hf_model, row[None]))[:, 0].float()  # (layer, head, query, key)
        marked = marked[from_position:] if marked.dim() == 2 else marked
        total = total + (patterns[:, :, from_position:] * marked).sum(dim=-1).mean(dim=-1)
    return (total / len(tokens)).cpu()


def latest_marks(tokens: Int[Tensor, "text pos"], token_id: int) -> Bool[Tensor, "text pos pos"]:
    """For each query, the key of the most recent ``token_id`` at or before it (none where there is none yet).

    With ``<|endoftext|>`` before every story, that is the start of the story the query is in."""
    n = tokens.shape[1]
    positions = torch.arange(n, device=tokens.device)
    last = torch.where(tokens == token_id, positions, -1).cummax(dim=-1).values  # (text, query); -1: none yet
    return positions[None, None, :] == last[:, :, None]


def uniform_mass(keys: Bool[Tensor, "text pos pos"], from_position: int) -> float:
    """What a head spreading its attention evenly over the keys it may see (0 ... q) puts on ``keys``."""
    n = keys.shape[1]
    if not 0 <= from_position < n:
        raise ValueError(f"from_position must be in [0, {n - 1}], got {from_position}")
    seen = keys.tril().sum(dim=-1).float() / torch.arange(1, n + 1)  # (text, query)
    return seen[:, from_position:].mean().item()


def attention_mass_on_first(
    hf_model, tokens: Int[Tensor, "text pos"], k: int = 4, from_position: int = 64
) -> Float[Tensor, "n_layers n_heads"]:
    """The share of attention each head puts on the first ``k`` tokens of the text (see ``attention_mass``)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    first = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
    first[:, :k] = True
    return attention_mass(hf_model, tokens, first, from_position)


def uniform_mass_on_first(k: int, from_position: int, n_positions: int) -> float:
    """The same share for a head that spread its attention evenly over every key it may see."""
    return sum(min(k, q + 1) / (q + 1) for q in range(from_position, n_positions)) / (n_positions - from_position)


def attention_table(mass: Tensor, k: int, from_position: int, n_positions: int, model_name: str = ""):
    """Per layer: the mean share of attention on the first ``k`` tokens, its largest head, and uniform's."""
    from rich.table import Table

    uniform = uniform_mass_on_first(k, from_position, n_positions)
    out = Table(
        "layer", "mean over heads", "largest head", "uniform attention",
        title=f"Share of attention on the first {k} tokens{' of ' + model_name if model_name else ''} "
        f"(queries {from_position}-{n_positions - 1})",
    )
    for layer, heads in enumerate(mass):
        out.add_row(str(layer), f"{heads.mean():.3f}", f"{heads.max():.3f}", f"{uniform:.3f}")
    return out
