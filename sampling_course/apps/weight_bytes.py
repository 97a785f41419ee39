"""How many bytes of weights one decode step reads: what bandwidth limits are computed from."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unloaded until a model is measured
    import torch


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights a one-token decode step reads: every parameter, except the one row of
    the embedding and of the position embedding that the token uses."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for table in (model.embed.W_E, model.pos_embed.W_pos):
        total -= (table.shape[0] - 1) * table.shape[1] * table.element_size()
    return total
