# GENERATED from solutions/token_constraint.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 6c22960bd26311e0962be9c45cbf796a983f82009880f6185c6b0503fcc710c5
"""Part 8: a constraint for part 5's ``generate``: each row of a batch in one state of a token index.

Before sampling, ``mask_logits`` sets the logit of every token a row's state forbids to
-inf; after sampling, ``advance`` moves each row along the token it got. ``regex_constraint``
builds one from a regular expression and a tokenizer, with the fast index of ``fast_index.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .byte_automaton import ByteAutomaton
from .fast_index import IndexRows, build_index_fast, vocabulary_trie
from .token_index import DONE, TokenIndex, token_bytes


class TokenConstraint:
    """Each row of a batch in one state of a ``TokenIndex``; masks the logits and follows the tokens.

    Part 5's ``generate(..., constraint=...)`` uses it like this, once per step::

        states = constraint.start(batch)                  # before the loop: every row at state 0
        logits = constraint.mask_logits(logits, states)   # before temperature and filters
        tokens = sample(logits, ...)
        states = constraint.advance(states, tokens)
        finished |= constraint.finished(states)           # a row that read EOS is done

    ``allowed`` is a boolean table with one row per index state and a last row for
    ``DONE`` (so ``allowed[states]`` works for every state, DONE = -1 included): True
    where a token may follow. In DONE only the end-of-text token may follow, so a finished
    row still has something to sample (part 5 replaces it with a pad anyway).
    """

    DONE = DONE

    def __init__(self, index: TokenIndex, vocabulary: Sequence[bytes | None], d_vocab: int | None = None):
        d_vocab = len(vocabulary) if d_vocab is None else d_vocab
        if d_vocab < len(vocabulary):
            raise ValueError(f"d_vocab={d_vocab} is smaller than the vocabulary ({len(vocabulary)} tokens)")
        self.index = index
        self.vocabulary = list(vocabulary)
        self.d_vocab = d_vocab
        allowed = torch.zeros(index.n_states + 1, d_vocab, dtype=torch.bool)
        # One write for the whole table: a write per state costs more than the table itself.
        rows = index.transitions
        if isinstance(rows, IndexRows):  # the fast index keeps its rows as arrays: no dict is read
            sizes, tokens = np.diff(rows.offsets), rows.tokens
        else:
            sizes = np.array([len(row) for row in rows], dtype=np.int64)
            tokens = np.array([token for row in rows for token in row], dtype=np.int64)
        # The row of each entry by np.repeat: torch.repeat_interleave costs milliseconds even for a few states.
        allowed[torch.from_numpy(np.repeat(np.arange(index.n_states), sizes)), torch.from_numpy(tokens)] = True
        allowed[DONE, index.eos_token_id] = True
        self.allowed = allowed

    @property
    def eos_token_id(self) -> int:
        return self.index.eos_token_id

    def start(self, batch: int, device: torch.device | str | None = None) -> Int[Tensor, "batch"]:
        """Every row at the start state (0)."""
        return torch.zeros(batch, dtype=torch.long, device=device)

    def mask_logits(self, logits: Float[Tensor, "batch d_vocab"], states: Int[Tensor, "batch"]) -> Float[Tensor, "batch d_vocab"]:
        """``logits`` with every token that may not follow its row's state set to -inf; the rest unchanged."""
        check_rows(logits, states, self.d_vocab)
        allowed = self.allowed.to(logits.device)
        # Hint: allowed[states] is one row of the table per row of the batch.
        raise NotImplementedError()

    def advance(self, states: Int[Tensor, "batch"], tokens: Int[Tensor, "batch"]) -> Int[Tensor, "batch"]:
        """Each row's state after reading its token.

        A row follows ``index.transitions``; reading the end-of-text token takes it to
        DONE. A row already in DONE stays there, whatever it reads (a finished row reads
        pads). A token that may not follow its row's state raises a ValueError.
        """
        if states.shape != tokens.shape or states.ndim != 1:
            raise ValueError(f"states and tokens must both have shape (batch,), got {tuple(states.shape)} and {tuple(tokens.shape)}")
        # Hint: a Python loop over the rows is fine: the index is a list of dicts.
        raise NotImplementedError()

    def finished(self, states: Int[Tensor, "batch"]) -> Bool[Tensor, "batch"]:
        """The rows that have read the end-of-text token."""
        return states == DONE

    def text(self, token_ids: Sequence[int]) -> str:
        """The text of token ids (the end-of-text token and anything after it left out)."""
        token_ids = list(token_ids)
        if self.eos_token_id in token_ids:
            token_ids = token_ids[: token_ids.index(self.eos_token_id)]
        return b"".join(self.vocabulary[t] or b"" for t in token_ids).decode("utf-8", errors="replace")


def regex_constraint(pattern: str, tokenizer, d_vocab: int | None = None) -> TokenConstraint:
    r"""A ``TokenConstraint`` for the regular expression ``pattern`` over ``tokenizer``'s vocabulary.

    Every text ``generate(..., constraint=...)`` completes (ends with the end-of-text
    token) matches ``pattern`` as a whole: ``re.fullmatch(pattern, text, re.ASCII)``, so ``\d``
    is ``[0-9]`` (see ``byte_automaton.py``). The index is ``build_index_fast``'s, equal to
    ``build_index``'s. ``d_vocab``: the model's vocabulary size when it is larger than the
    tokenizer's.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        raise ValueError("the tokenizer has no eos_token_id: a constraint needs an end-of-text token to finish a text")
    vocabulary = token_bytes(tokenizer)
    index = build_index_fast(ByteAutomaton(pattern), vocabulary_trie(vocabulary), eos)
    return TokenConstraint(index, vocabulary, d_vocab)


# ---------------------------------------------------------------------------------------
# Checks that fail loudly, saying what is allowed
# ---------------------------------------------------------------------------------------


def check_rows(logits: Tensor, states: Tensor, d_vocab: int) -> None:
    if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[-1] != d_vocab:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must have shape (batch, d_vocab={d_vocab}), got {shape}")
    if not isinstance(states, Tensor) or states.shape != logits.shape[:1] or states.is_floating_point():
        raise ValueError(f"states must be an integer tensor of shape (batch={logits.shape[0]},), got {states!r:.80}")

