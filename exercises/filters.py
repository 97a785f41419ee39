# GENERATED from solutions/filters.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: f9f291f487cfa8cfeb9a583c9d89e527de5a196ac43edc8eae6298bc60b556e4
"""Part 5: the three classic filters, on a whole batch of logits at once.

Each filter takes ``(batch, d_vocab)`` logits and returns new logits in which the tokens it
removes are -inf; the logits it is given are never changed (``generate`` still needs them,
for the log-probabilities it reports). Each takes Hugging Face's keyword and meaning:
``top_k`` (0 is off), ``top_p`` (1.0 is off) and ``min_p`` (0.0 is off), and top-p and min-p
take ``min_tokens_to_keep``, the fewest tokens they may leave in a row. A filter checks its
settings with the rule of ``sampling_course.sampling_settings``, so it refuses exactly what
``generate`` refuses.

Top-k keeps a fixed number of tokens; top-p (nucleus sampling, Holtzman et al. 2020, "The
Curious Case of Neural Text Degeneration") keeps the smallest set of most likely tokens
whose probability reaches ``top_p``; min-p (Nguyen et al. 2024) keeps the tokens at least
``min_p`` times as likely as the row's best. Part 5b adds the rest of the chain.
"""

from __future__ import annotations

import torch  # for the code you write in the filters
from jaxtyping import Bool, Float
from torch import Tensor

from sampling_course.sampling_settings import check_setting


def check_logits(logits: Tensor) -> None:
    """A float tensor of shape (batch, d_vocab), or a ValueError saying so."""
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a float tensor of shape (batch, d_vocab), got {shape}")


def spare_the_best(
    remove: Bool[Tensor, "batch d_vocab"], logits: Float[Tensor, "batch d_vocab"], min_tokens_to_keep: int
) -> Bool[Tensor, "batch d_vocab"]:
    """``remove``, except for each row's ``min_tokens_to_keep`` largest logits (and every logit tied with the last of them)."""
    kth_best = logits.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).values[:, -1:]
    return remove & (logits < kth_best)


def top_k_filter(logits: Float[Tensor, "batch d_vocab"], top_k: int) -> Float[Tensor, "batch d_vocab"]:
    """Keep the ``top_k`` largest logits of each row; set the others to -inf.

    Ties at the k-th largest value are all kept (as Hugging Face does), so a row can keep
    more than ``top_k`` tokens when several share that value. ``top_k`` larger than the
    vocabulary keeps everything, and 0 (off) too.
    """
    check_logits(logits)
    check_setting("top_k", top_k)
    if top_k == 0:
        return logits
    top_k = min(top_k, logits.shape[-1])
    # Hint: find each row's k-th largest value, then remove everything strictly below it (a new tensor: masked_fill, not masked_fill_).
    raise NotImplementedError()


def top_p_filter(
    logits: Float[Tensor, "batch d_vocab"], top_p: float, min_tokens_to_keep: int = 1
) -> Float[Tensor, "batch d_vocab"]:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability is >= ``top_p``.

    Inclusive: the token that takes the running total to ``top_p`` or past it is kept, and
    at least ``min_tokens_to_keep`` tokens stay. Hugging Face's rule, the same one seen
    from the other end: a token goes when the tokens no more likely than it (itself
    included) hold at most ``1 - top_p`` of the mass. On the row [0.3, 0.1, 0.1, 0.5] with
    ``top_p=0.8``, 0.5 and 0.3 stay (they hold exactly 0.8). Computed that way, from the
    least likely token up, no rounding of a running total can remove a token at
    ``top_p=1.0``. Probabilities come from the logits as they are (after the temperature,
    when ``warp_logits`` calls it).
    """
    check_logits(logits)
    check_setting("top_p", top_p)
    check_setting("min_tokens_to_keep", min_tokens_to_keep)
    # Hint: sort each row from the least likely up; a token goes while the running total (itself included) is <= 1 - top_p.
    raise NotImplementedError()


def min_p_filter(
    logits: Float[Tensor, "batch d_vocab"], min_p: float, min_tokens_to_keep: int = 1
) -> Float[Tensor, "batch d_vocab"]:
    """Keep the tokens whose probability is at least ``min_p`` times the row's top probability.

    The bar moves with the model's confidence: a peaked row keeps few tokens, a flat row
    many. The most likely token always stays, and at least ``min_tokens_to_keep`` tokens.
    """
    check_logits(logits)
    check_setting("min_p", min_p)
    check_setting("min_tokens_to_keep", min_tokens_to_keep)
    # Hint: compare each probability with min_p times the largest probability of the same row.
    raise NotImplementedError()
