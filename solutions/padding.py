"""Part 5: many prompts in one batch: left padding, and the padded prefill and decode steps.

Prompts have different lengths. Padding them on the left puts every row's last real token
in the last column, so the next token's logits are ``logits[:, -1]`` for every row and the
new tokens follow directly. The attention mask (1 at tokens, 0 at pads) tells the model
which keys are real and where each row's positions start: ``DemoTransformer.forward`` with an
``attention_mask`` runs on part 4's cache, whose step (``step_after``) gives each row's positions
and hides its pads (part 5's model exercises). The prefill runs every prompt at once and fills a
KV cache; each later step runs only the newest token of every row on top of it.
"""

from __future__ import annotations

import inspect

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .transformer import DemoTransformer, KeyValueCache


def left_pad(token_lists: list[list[int]], pad_token_id: int) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Stack prompts of different lengths into ``(input_ids, attention_mask)``, padding on the left.

    Left, so that every row's last real token sits in the last column: the logits of the
    next token are then ``logits[:, -1]`` for every row, and new tokens follow directly.
    """
    ### BEGIN SOLUTION
    # Hint: pad each row at its start up to the longest prompt; the mask is 0 at pads, 1 at tokens.
    width = max(len(ids) for ids in token_lists)
    input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]
    attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]
    return torch.tensor(input_ids), torch.tensor(attention_mask)
    ### END SOLUTION


def prefill(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    cache: KeyValueCache | None = None,
) -> tuple[Float[Tensor, "batch d_vocab"], KeyValueCache]:
    """Run every prompt at once, filling ``cache`` (a fresh ``KeyValueCache`` when None); the logits of each row's next token."""
    if cache is None:
        param = next(model.parameters(), None)
        cache = KeyValueCache.new_empty(
            model.cfg, input_ids.shape[0], input_ids.device, param.dtype if param is not None else torch.float32
        )
    # Only the last position's logits are read: the course's own model skips the unembedding of the others
    # (Hugging Face's logits_to_keep); a model without the keyword computes them all.
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    logits, cache = model(input_ids, cache, attention_mask=attention_mask, **keep)
    return logits[:, -1], cache


def takes_logits_to_keep(model) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (the course's DemoTransformer does; stand-ins may not)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except Exception:  # noqa: BLE001 - a probe: a forward it cannot read (a builtin, an object that refuses) is asked for all
        return False


def decode_step(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch seq"],
    attention_mask: Int[Tensor, "batch seq"],
    cache: KeyValueCache,
) -> tuple[Float[Tensor, "batch d_vocab"], KeyValueCache]:
    """Run only the newest token of every row on top of the cache."""
    logits, cache = model(input_ids, cache, attention_mask=attention_mask)
    return logits[:, -1], cache
