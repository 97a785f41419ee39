"""A toy language model whose answer is a table: the next-token logits depend on the last two tokens.

Speculative decoding's tests need a target and a draft whose exact distribution over a few
generated tokens can be written down by enumeration, and that catch a cache holding a token the
sequence does not have. ``TrigramModel`` is both: its logits are ``table[previous, current]``, and
its "keys and values" are the token ids themselves, so every cache it is given can be checked
against the tokens.

It lives in the course's runtime so that it can be made beside the code it is handed to
(``sampling_course.beside``): a submission graded in another process calls it where it runs, and
the test reads what it recorded (``calls``) as plain data.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from sampling_course.config import Config

__all__ = ["TrigramModel"]


class TrigramModel(nn.Module):
    """The logits for the next token are ``table[previous, current]``: they depend on the last
    two tokens. ``table`` has shape ``(V + 1, V, V)`` for a vocabulary of V tokens; its row V
    stands for "no previous token" (the first position).

    Called like a DemoTransformer: ``model(tokens)`` gives logits at every position and
    ``model(tokens, kv_cache)`` runs only the positions the cache lacks and returns
    ``(their logits, the extended cache)``. Its "keys and values" are the token ids
    themselves, so the previous token of the first new position is read from the cache,
    as a transformer reads its past. Every cache it is given is checked against the
    tokens: a cache holding a token the sequence does not have (a rejected proposal that
    was not cropped) raises an AssertionError saying so. ``calls`` records
    (positions passed, positions cached, or None uncached) for every call; ``clear_calls()``
    empties it. The table is the model's one (frozen) parameter, so the model is on the device
    its table is on, as a transformer is on the device of its weights.
    """

    def __init__(self, table: Float[Tensor, "vocab_plus_1 vocab vocab"], name: str, n_ctx: int = 64):
        super().__init__()
        vocab = table.shape[-1] if isinstance(table, torch.Tensor) and table.ndim == 3 else 0
        if not vocab or tuple(table.shape) != (vocab + 1, vocab, vocab):
            raise ValueError(f"a trigram table has shape (V + 1, V, V), got {getattr(table, 'shape', type(table))}")
        self.table = nn.Parameter(table.float(), requires_grad=False)
        self.start = vocab  # the table's row for "no previous token"
        self.name = name
        self.cfg = Config(d_model=1, d_vocab=vocab, n_ctx=n_ctx, d_head=1, d_mlp=1, n_heads=1, n_layers=1)
        self.calls: list[tuple[int, int | None]] = []

    def clear_calls(self) -> None:
        """Forget the calls recorded so far."""
        self.calls.clear()

    def forward(self, tokens: Int[Tensor, "1 pos"], kv_cache: Tensor | None = None):
        if tokens.ndim != 2 or tokens.shape[0] != 1:
            raise AssertionError(f"{self.name}: expected tokens of shape (1, pos), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"{self.name}: {tokens.shape[1]} positions, past n_ctx={self.cfg.n_ctx}")
        ids = tokens[0]
        if kv_cache is None:
            self.calls.append((len(ids), None))
            previous = torch.cat([ids.new_tensor([self.start]), ids[:-1]])
            return self.table[previous, ids][None]
        past = kv_cache.shape[3]
        self.calls.append((len(ids), past))
        if len(ids) <= past:
            raise ValueError(f"{self.name}: {len(ids)} tokens but the cache already holds {past} positions")
        cached = kv_cache.as_subclass(torch.Tensor)[0, 0, 0, :, 0, 0].round().long()
        if not torch.equal(cached, ids[:past]):
            raise AssertionError(
                f"{self.name}'s cache holds the tokens {cached.tolist()}, but the sequence begins with "
                f"{ids[:past].tolist()}: a cache must be cropped back to the tokens that were kept"
            )
        new = ids[past:]
        previous = torch.cat([cached[-1:] if past else ids.new_tensor([self.start]), new[:-1]])
        entries = new.to(kv_cache.dtype).reshape(1, 1, 1, -1, 1, 1).expand(1, 2, 1, -1, 1, 1)
        extended = torch.cat([kv_cache.as_subclass(torch.Tensor), entries], dim=3)
        return self.table[previous, new][None], type(kv_cache)(extended)
