# GENERATED from solutions/beams.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 61494d56850cea9160cf8eec16807cc9bb04e6e19bb4d8b74ad85fe6b7b8ca82
"""Part 3: beam search.

Greedy decoding commits to the best token at every step and can walk past a sequence
that is more likely overall. Beam search keeps the ``num_beams`` most likely partial
sequences instead, ranked by their summed log-probabilities:

    generate: every beam proposes its k best next tokens   (len(beams) -> len(beams) * k)
    filter:   keep the k best of all proposals; set aside those that ended in EOS
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from rich.console import Console
from rich.table import Table
from rich.text import Text
from torch import Tensor

from .kv_cache import KeyValueCache
from .transformer import DemoTransformer


@dataclass
class Beams:
    """A batch of partial sequences ("beams") and their summed log-probabilities."""

    model: DemoTransformer
    tokenizer: object
    logprob_sums: Float[Tensor, "batch"]
    tokens: Int[Tensor, "batch seq"]
    # Part 4: keys and values for tokens[:, :-1] of every beam, or None to run uncached.
    kv_cache: KeyValueCache | None = None
    # Part 4: beam i's keys and values are row cache_rows[i] of kv_cache (row i when None).
    # After generate, the k children of a beam share their parent's row: copying the whole
    # cache k times over, only for filter to keep k of the len(self) * k children, would
    # take longer than running the model.
    cache_rows: Int[Tensor, "batch"] | None = None

    def new_beams(self, logprob_sums, tokens, kv_cache=None, cache_rows=None) -> "Beams":
        """Beams with the same model and tokenizer but new contents."""
        return Beams(self.model, self.tokenizer, logprob_sums, tokens, kv_cache, cache_rows)

    def __getitem__(self, batch_idx) -> "Beams":
        """The beams selected by ``batch_idx`` (an int slice, index tensor or boolean mask).

        The result has a cache row of its own for every beam: only the selected rows are copied.
        """
        if isinstance(batch_idx, int):
            batch_idx = slice(batch_idx, batch_idx + 1)
        rows = batch_idx if self.cache_rows is None else self.cache_rows[batch_idx]
        if hasattr(self.kv_cache, "reorder"):
            # Part 6's static cache reorders itself in place; that waits until these beams run
            # (beam_cache), because filter also selects the finished beams from the same cache.
            rows = torch.arange(self.kv_cache.batch, device=self.tokens.device)[rows]
            return self.new_beams(self.logprob_sums[batch_idx], self.tokens[batch_idx], self.kv_cache, rows)
        cache = None if self.kv_cache is None else self.kv_cache[:, :, rows]
        return self.new_beams(self.logprob_sums[batch_idx], self.tokens[batch_idx], cache)

    @property
    def beam_cache(self) -> KeyValueCache | None:
        """The cache with one row per beam, in beam order (what the model needs)."""
        if self.kv_cache is None or self.cache_rows is None:
            return self.kv_cache
        if hasattr(self.kv_cache, "reorder"):  # part 6: permute the rows in place, once
            # Layer by layer as the model reaches each one, where the cache offers it (StaticKeyValueCache.reorder_later).
            getattr(self.kv_cache, "reorder_later", self.kv_cache.reorder)(self.cache_rows)
            self.cache_rows = None
            return self.kv_cache
        return self.kv_cache[:, :, self.cache_rows]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def logprobs_and_completions(self) -> list[tuple[float, str]]:
        """(summed log-probability, decoded text) for every beam, in order."""
        return [
            (logprob.item(), self.tokenizer.decode(tokens))
            for logprob, tokens in zip(self.logprob_sums, self.tokens)
        ]

    def generate(self, k: int, no_repeat_ngram_size: int | None = None) -> "Beams":
        """Extend every beam by each of its ``k`` most likely next tokens.

        Returns ``len(self) * k`` beams grouped by parent, in parent order: the children of
        beam 0 first (best first), then those of beam 1, and so on.
        """
        raise NotImplementedError()

    def filter(self, k: int) -> tuple["Beams", "Beams"]:
        """Among the ``k`` best beams, split those still going from those that ended in EOS.

        Returns ``(best_continuing, best_terminated)``, each ordered best first.
        """
        raise NotImplementedError()

    def get_topk_non_repeating(
        self,
        logprobs: Float[Tensor, "batch d_vocab"],
        no_repeat_ngram_size: int | None,
        k: int,
    ) -> tuple[Float[Tensor, "batch k"], Int[Tensor, "batch k"]]:
        """The top ``k`` next tokens of each beam, never completing an n-gram it already holds.

        A token is blocked when the last ``n - 1`` tokens followed by it form an n-gram that
        already occurs in the beam (the prompt included), as Hugging Face's
        ``no_repeat_ngram_size`` does. With n = 1 every token already present is blocked;
        a beam shorter than n blocks nothing.
        """
        # Given: without n-gram blocking it is plain top-k (Beams.generate, the exercise before
        # this one, runs through here from the start).
        if no_repeat_ngram_size is None:
            return logprobs.topk(k, dim=-1)
        raise NotImplementedError()

    def print(self, title: str = "Best completions", max_print_chars: int = 80) -> None:
        """Show the beams as a table; long completions keep their start and end."""
        table = Table("logprob sum", "completion", title=title)
        for logprob, text in self.logprobs_and_completions:
            text = repr(text)
            if len(text) > max_print_chars:
                half = (max_print_chars - 5) // 2
                text = text[:half] + " ... " + text[-half:]
            # Text, not a markup string: a completion containing "[...]" must print as it is.
            table.add_row(f"{logprob:>8.3f}", Text(text))
        Console().print(table)


class BeamHypotheses:
    """The finished beams of one beam search, ranked by length-normalised score: Hugging Face's rule.

    A beam that finishes (it ended in EOS, or reached ``max_new_tokens``) with summed
    log-probability ``logprob_sum`` over its ``length`` new tokens scores

        logprob_sum / length ** length_penalty

    With ``length_penalty = 0`` the score is the plain sum, which favours short beams (every
    token adds a negative log-probability); 1 ranks by the mean log-probability per token;
    above 1 favours long beams more, below 0 favours short ones more. Only the
    ``num_beams`` best finished beams are kept (``hypotheses``, best first, as
    ``(score, logprob_sum, beam)`` with ``beam`` whatever the caller stores: tokens, text).

    ``early_stopping`` says when the search may stop (``is_done``):

    * True: as soon as ``num_beams`` beams have finished;
    * False: once ``num_beams`` have finished and the best running beam, scored at its
      current length, cannot beat the worst kept one (a heuristic: with a positive
      ``length_penalty`` a running beam could still overtake it by growing longer);
    * "never": only when no running beam can beat the worst kept one at any length up to
      ``max_new_tokens`` (an exact bound: sums only fall as a beam grows, so with a
      positive ``length_penalty`` the best a beam can reach is its sum now over the
      longest length).
    """

    def __init__(self, num_beams: int, length_penalty: float = 1.0, early_stopping: bool | str = False,
                 max_new_tokens: int | None = None):
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
            raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or length_penalty != length_penalty:
            raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
        if not isinstance(early_stopping, (bool, str)) or early_stopping not in (True, False, "never"):
            raise ValueError(f'early_stopping must be True, False or "never", got {early_stopping!r}')
        if early_stopping == "never" and length_penalty > 0 and max_new_tokens is None:
            raise ValueError('early_stopping="never" with a positive length_penalty needs max_new_tokens (the longest length)')
        self.num_beams = num_beams
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.max_new_tokens = max_new_tokens
        self.hypotheses: list[tuple[float, float, object]] = []

    def __len__(self) -> int:
        return len(self.hypotheses)

    def score(self, logprob_sum: float, length: int) -> float:
        """The length-normalised score of a beam with this summed log-probability over ``length`` new tokens."""
        raise NotImplementedError()

    def add(self, logprob_sum: float, length: int, beam: object) -> None:
        """Keep a finished beam if it is among the ``num_beams`` best by score (``hypotheses`` stays best first)."""
        # Hint: append (score, sum, beam), sort by score, best first, and drop what is past num_beams.
        raise NotImplementedError()

    def is_done(self, best_running_sum: float, length: int) -> bool:
        """Whether the search may stop, given the best running beam's summed log-probability over ``length`` new tokens."""
        # Hint: never before num_beams beams have finished; then compare the best a running beam can still score with the worst kept score.
        raise NotImplementedError()
