"""Test doubles for the grading suites: tokenizers and language models whose answer is known.

Each toy model is named by its rule, so a test's expected output can be worked out by hand
from the rule alone (no run of the code under test produces it):

* ``SuccessorModel``: the next token is the last one plus 1, with certainty.
* ``NeverEOSModel``: the next token is a fixed scramble of the last one that is never EOS.
* ``BigramModel``: the next-token distribution is a table row picked by the last token.
* ``TrigramModel``: the next-token logits are a table entry picked by the last two tokens;
  it keeps the token ids in its cache and checks that a cache holds the sequence's tokens.

The recorders wrap or stand in for a real object and keep what they were given:
``RecordingModel`` (calls), ``RecordingTokenizer`` (the last decoded ids), ``RecordingFile``
(each write). ``IdTokenizer`` is a tokenizer whose text is token ids.

``TrigramModel``, ``IdTokenizer`` and ``IdTokenizerWithVocab`` live in the course's runtime
(``sampling_course.trigram_model``, ``sampling_course.id_tokenizer``), so that a test can make
them beside the code it hands them to (``sampling_course.beside.made_beside``): a submission
graded in another process calls them where it runs. They are imported here under their names.

The suites import these with ``from doubles import ...`` (pyproject.toml puts tests/ on
the import path).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sampling_course.config import Config
from sampling_course.id_tokenizer import IdTokenizer, IdTokenizerWithVocab
from sampling_course.trigram_model import TrigramModel

__all__ = ["BigramModel", "IdTokenizer", "IdTokenizerWithVocab", "NeverEOSModel", "RecordingFile", "RecordingModel",
           "RecordingTokenizer", "SuccessorModel", "TrigramModel"]

# ---------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------


class RecordingTokenizer:
    """Wraps a tokenizer and keeps the ids it last decoded (``decoded``): the generated
    tokens themselves, without a round trip through text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.decoded: list[int] = []

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, *args, **kwargs):
        return self.tokenizer.encode(*args, **kwargs)

    def decode(self, ids):
        self.decoded = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(ids)


# ---------------------------------------------------------------------------------------
# Language models with a known answer
# ---------------------------------------------------------------------------------------


class SuccessorModel(nn.Module):
    """The next token is always the last token + 1 (mod d_vocab), with certainty (logit 10
    against -10 for every other token).

    A prompt ending k tokens below the EOS id reaches EOS after exactly k steps, so rows of a
    batch end at known steps. Called like a DemoTransformer, with or without a cache (of the
    ``KeyValueCache`` class it is given); ``calls`` records (positions passed, positions
    already cached) for every call.
    """

    def __init__(self, KeyValueCache, d_vocab: int = 64, n_ctx: int = 64):
        super().__init__()
        self.cfg = Config(d_model=4, d_head=4, n_heads=1, n_layers=1, d_mlp=4, d_vocab=d_vocab, n_ctx=n_ctx)
        self.KeyValueCache = KeyValueCache
        self.calls: list[tuple[int, int]] = []

    def forward(self, tokens, kv_cache=None, *, attention_mask=None):
        past = 0 if kv_cache is None else kv_cache.seq_len
        self.calls.append((tokens.shape[1], past))
        new = tokens[:, past:]
        logits = torch.full((*new.shape, self.cfg.d_vocab), -10.0)
        logits.scatter_(-1, ((new + 1) % self.cfg.d_vocab)[..., None], 10.0)
        if kv_cache is None:
            return logits
        cache = torch.zeros(1, 2, tokens.shape[0], tokens.shape[1], 1, 4)
        return logits, self.KeyValueCache(cache)


class NeverEOSModel(nn.Module):
    """The next token is always ``successor(last)`` = (last * 7 + 3) mod (d_vocab - 1), stepped
    over the EOS id, so a text never ends before its token budget.

    Every other logit is -inf, so greedy decoding and sampling agree. It records every input
    (``inputs``), so the number of steps and the context the sampler passes are observable.
    The rule is written in tensor operations, so it runs on whatever device the tokens are.
    """

    def __init__(self, cfg, eos: int):
        super().__init__()
        self.cfg, self.eos = cfg, eos
        self.inputs: list[torch.Tensor] = []

    def successor(self, token):
        """The next token after ``token``: an int for an int, a tensor of them for a tensor."""
        nxt = (token * 7 + 3) % (self.cfg.d_vocab - 1)
        return nxt + (nxt >= self.eos)  # step over the EOS id

    def continuation(self, prompt_ids: list[int], n: int) -> list[int]:
        """The prompt followed by the ``n`` tokens the rule gives."""
        ids = list(prompt_ids)
        for _ in range(n):
            ids.append(self.successor(ids[-1]))
        return ids

    def forward(self, tokens: torch.Tensor, *args, **kwargs):
        self.inputs.append(tokens.detach().clone())
        nxt = self.successor(tokens)
        return torch.full((*tokens.shape, self.cfg.d_vocab), float("-inf")).scatter(-1, nxt[..., None], 0.0)


class BigramModel(nn.Module):
    """The next-token distribution depends on the last token only: ``table[last]`` maps next
    tokens to probabilities.

    Unlisted tokens get a negligible share and unlisted last tokens a uniform distribution.
    Each row's logits carry its own offset (``offsets[last]``), so ranking by logits instead
    of log-probabilities gives a different answer. It runs uncached and records the longest
    input it was given (``longest_input``); ``logits[last]`` is its table of logits.
    """

    def __init__(self, cfg, table: dict[int, dict[int, float]], offsets: dict[int, float] | None = None):
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

    def forward(self, tokens, kv_cache=None):
        if kv_cache is not None:
            raise NotImplementedError("the toy model runs uncached")
        self.longest_input = max(self.longest_input, tokens.shape[1])
        return self.logits[tokens]


# ---------------------------------------------------------------------------------------
# Recorders
# ---------------------------------------------------------------------------------------


class RecordingModel(nn.Module):
    """Wraps a model and records, for every call, (positions passed, positions cached or None)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.calls: list[tuple[int, int | None]] = []

    def forward(self, tokens, kv_cache=None):
        self.calls.append((tokens.shape[1], None if kv_cache is None else kv_cache.seq_len))
        return self.model(tokens) if kv_cache is None else self.model(tokens, kv_cache)


class RecordingFile:
    """A text file that keeps every non-empty write separately (``chunks``)."""

    def __init__(self):
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        if text:
            self.chunks.append(text)
        return len(text)

    def flush(self) -> None:
        pass
