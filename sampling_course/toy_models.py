"""Toy language models whose answer is a rule: the tests of the decoding loops work out the expected text by hand.

A loop's test needs a model whose next token it knows without running anything it grades. Each
model here is named by its rule:

* ``SuccessorModel``: the next token is the last one plus 1, with certainty.
* ``NeverEOSModel``: the next token is a fixed scramble of the last one that is never EOS.
* ``BigramModel``: the next-token distribution is a table row picked by the last token.

They live in the course's runtime so that they can be made beside the code they are handed to
(``sampling_course.beside``): a submission graded in another process calls them where it runs,
and the test works out its expected answer on a twin made with the same arguments where the test runs.

Each answers on the device of the tokens it is given, whatever torch's default device (a GPU grading
session's is the GPU): none has parameters, so a loop that moves its tokens to the model's parameters
keeps them where they are, and the model follows them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from sampling_course.config import Config

__all__ = ["BigramModel", "NeverEOSModel", "SuccessorModel"]


class SuccessorModel(nn.Module):
    """The next token is always the last token + 1 (mod d_vocab), with certainty (logit 10
    against -10 for every other token).

    A prompt ending k tokens below the EOS id reaches EOS after exactly k steps, so rows of a
    batch end at known steps. Called like a DemoTransformer, with or without a cache (of the
    ``KeyValueCache`` class it is given); ``calls`` records (positions passed, positions
    already cached) for every call.
    """

    def __init__(self, KeyValueCache: type, d_vocab: int = 64, n_ctx: int = 64):
        super().__init__()
        self.cfg = Config(d_model=4, d_head=4, n_heads=1, n_layers=1, d_mlp=4, d_vocab=d_vocab, n_ctx=n_ctx)
        self.KeyValueCache = KeyValueCache
        self.calls: list[tuple[int, int]] = []

    def forward(self, tokens: Int[Tensor, "batch pos"], kv_cache: Any = None, *, attention_mask: Any = None) -> Any:
        past = 0 if kv_cache is None else kv_cache.seq_len
        self.calls.append((tokens.shape[1], past))
        new = tokens[:, past:]
        # Made where the tokens are, whatever torch's default device (a GPU session's is the GPU).
        logits = torch.full((*new.shape, self.cfg.d_vocab), -10.0, device=tokens.device)
        logits.scatter_(-1, ((new + 1) % self.cfg.d_vocab)[..., None], 10.0)
        if kv_cache is None:
            return logits
        cache = torch.zeros(1, 2, tokens.shape[0], tokens.shape[1], 1, 4, device=tokens.device)
        return logits, self.KeyValueCache(cache)


class NeverEOSModel(nn.Module):
    """The next token is always ``successor(last)`` = (last * 7 + 3) mod (d_vocab - 1), stepped
    over the EOS id, so a text never ends before its token budget.

    Every other logit is -inf, so greedy decoding and sampling agree. It records every input
    (``inputs``), so the number of steps and the context the sampler passes are observable.
    The rule is written in tensor operations, so it runs on whatever device the tokens are.
    """

    def __init__(self, cfg: Config, eos: int):
        super().__init__()
        self.cfg, self.eos = cfg, eos
        self.inputs: list[Tensor] = []

    def successor(self, token: Any) -> Any:
        """The next token after ``token``: an int for an int, a tensor of them for a tensor."""
        nxt = (token * 7 + 3) % (self.cfg.d_vocab - 1)
        return nxt + (nxt >= self.eos)  # step over the EOS id

    def continuation(self, prompt_ids: list[int], n: int) -> list[int]:
        """The prompt followed by the ``n`` tokens the rule gives."""
        ids = list(prompt_ids)
        for _ in range(n):
            ids.append(int(self.successor(ids[-1])))
        return ids

    def forward(self, tokens: Int[Tensor, "batch pos"], *args: Any, **kwargs: Any) -> Float[Tensor, "batch pos vocab"]:
        self.inputs.append(tokens.detach().clone())
        nxt = self.successor(tokens)
        logits = torch.full((*tokens.shape, self.cfg.d_vocab), float("-inf"), device=tokens.device)
        return logits.scatter(-1, nxt[..., None], 0.0)


class BigramModel(nn.Module):
    """The next-token distribution depends on the last token only: ``table[last]`` maps next
    tokens to probabilities.

    Unlisted tokens get a negligible share and unlisted last tokens a uniform distribution.
    Each row's logits carry its own offset (``offsets[last]``), so ranking by logits instead
    of log-probabilities gives a different answer. It runs uncached and records the longest
    input it was given (``longest_input``); ``logits[last]`` is its table of logits.
    """

    def __init__(self, cfg: Config, table: dict[int, dict[int, float]], offsets: dict[int, float] | None = None):
        super().__init__()
        self.cfg = cfg
        logits = torch.zeros(cfg.d_vocab, cfg.d_vocab)
        for last, row in table.items():
            logits[last] = -40.0
            for nxt, p in row.items():
                logits[last, nxt] = math.log(p)
            logits[last] += (offsets or {}).get(last, 0.0)
        self.register_buffer("logits", logits)
        self.longest_input = 0

    def forward(self, tokens: Int[Tensor, "batch pos"], kv_cache: Any = None) -> Float[Tensor, "batch pos vocab"]:
        if kv_cache is not None:
            raise NotImplementedError("the toy model runs uncached")
        self.longest_input = max(self.longest_input, tokens.shape[1])
        return self.logits.to(tokens.device)[tokens]  # where the tokens are, like the other toy models' answers
