"""Part 5: what ``generate`` returns and when a row stops: scores and log-probabilities, stopping criteria, stop strings, streaming.

* ``GenerateOutput`` (``return_dict_in_generate=True``): the sequences, each chosen token's
  log-probability under the distribution it was drawn from (``scores``) and under the raw
  model (``logprobs``), and with ``logprobs=k`` the raw model's k best tokens at each step.
* Stopping criteria have Hugging Face's shape (all tokens so far and the step's scores in,
  one verdict per row out), so your own criteria plug in; ``StopStringCriteria`` stops a
  row whose text ends with a stop string, even one spread over several tokens.
* Streamers have Hugging Face's shape too (``put(token_ids)`` then ``end()``);
  ``TextStreamer`` prints the text a word at a time as it is generated.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol, TextIO, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def chosen_logprobs(logits: Float[Tensor, "batch d_vocab"], tokens: Int[Tensor, "batch"]) -> Float[Tensor, "batch"]:
    """log softmax(logits) at each row's chosen token."""
    return logits.log_softmax(dim=-1).gather(-1, tokens[:, None])[:, 0]


@dataclass
class GenerateOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns.

    ``sequences``: the left-padded prompts and the new tokens, ``(batch, prompt + new)``.
    ``scores``: each chosen token's log-probability under the distribution it was drawn
    from (after the processors and the chain; at temperature 0, after the processors).
    ``logprobs``: its log-probability under the raw model (temperature 1, nothing filtered).
    Both are ``(batch, new)``; a row's steps after it finished hold NaN (its pad tokens
    were not chosen by anyone), so sum a row's values with ``torch.nansum``.
    ``top_tokens`` and ``top_logprobs`` (with ``logprobs=k``, vLLM's setting): at every
    step the raw model's k most likely tokens and their log-probabilities,
    ``(batch, new, k)``, best first (-1 and NaN after a row finished).
    ``sequences_scores`` (beam search only): each returned sequence's score, its summed
    log-probability divided by its new tokens ** ``length_penalty``.
    """

    sequences: Int[Tensor, "batch seq"]
    scores: Float[Tensor, "batch new"]
    logprobs: Float[Tensor, "batch new"]
    top_tokens: Int[Tensor, "batch new k"] | None = None
    top_logprobs: Float[Tensor, "batch new k"] | None = None
    sequences_scores: Float[Tensor, "batch"] | None = None


class Record:
    """What ``return_dict_in_generate`` collects, one step at a time."""

    def __init__(self, top: int | None = None):
        self.top = top
        self.scores: list[Tensor] = []
        self.logprobs: list[Tensor] = []
        self.top_tokens: list[Tensor] = []
        self.top_logprobs: list[Tensor] = []

    def step(self, logits: Tensor, drawn_from: Tensor, tokens: Tensor, finished: Tensor) -> None:
        """Record one step: the raw logits, the logits the tokens were drawn from, the tokens, the finished rows."""
        raw = logits.log_softmax(dim=-1)
        self.scores.append(chosen_logprobs(drawn_from, tokens).masked_fill(finished, float("nan")))
        self.logprobs.append(raw.gather(-1, tokens[:, None])[:, 0].masked_fill(finished, float("nan")))
        if self.top:
            values, ids = raw.topk(self.top, dim=-1)
            self.top_logprobs.append(values.masked_fill(finished[:, None], float("nan")))
            self.top_tokens.append(ids.masked_fill(finished[:, None], -1))

    def output(self, sequences: Tensor) -> GenerateOutput:
        empty = torch.empty(sequences.shape[0], 0, device=sequences.device)

        def stack(steps: list[Tensor], fallback: Tensor) -> Tensor:
            return torch.stack(steps, dim=1) if steps else fallback

        top_empty = torch.empty(sequences.shape[0], 0, self.top or 0, device=sequences.device)
        return GenerateOutput(
            sequences=sequences,
            scores=stack(self.scores, empty),
            logprobs=stack(self.logprobs, empty),
            top_tokens=stack(self.top_tokens, top_empty.long()) if self.top else None,
            top_logprobs=stack(self.top_logprobs, top_empty) if self.top else None,
        )


# ---------------------------------------------------------------------------------------
# Stopping criteria: Hugging Face's shape, one verdict per row
# ---------------------------------------------------------------------------------------


@runtime_checkable
class StoppingCriteria(Protocol):
    """Called after every step with all tokens so far (``(batch, seq)``, left padding
    included) and that step's processed logits; returns True for each row that should stop.

    A row that a criterion stops is finished for good: ``generate`` pads it from then on.
    """

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]: ...


class MaxLengthCriteria:
    """Stop every row once the sequences (padding included) have ``max_length`` tokens."""

    def __init__(self, max_length: int):
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        self.max_length = max_length

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.max_length, device=input_ids.device)


class EosTokenCriteria:
    """Stop each row whose newest token is the end-of-text token."""

    def __init__(self, eos_token_id: int):
        if not isinstance(eos_token_id, int):
            raise TypeError(f"eos_token_id must be an int, got {type(eos_token_id).__name__}")
        self.eos_token_id = eos_token_id

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
        return input_ids[:, -1] == self.eos_token_id


class StopStringCriteria:
    """Stop a row when its text ends with one of ``stop_strings``, even one spread over several tokens.

    As with Hugging Face's criterion of the same name, the stop string must reach into the
    newest token: text that completed a stop string earlier is not looked at again, and
    the newest token may run past the stop string's end ("stop" matches tokens "st" +
    "opped"). The tokens that completed it stay in the output. The last few tokens are
    decoded together, so a stop string that ends in a character whose bytes are split over
    tokens matches too (Hugging Face's criterion compares each token's own text, and misses it).
    """

    def __init__(self, tokenizer, stop_strings: str | list[str]):
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if not stop_strings or not all(isinstance(s, str) and s for s in stop_strings):
            raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
        self.tokenizer = tokenizer
        self.stop_strings = list(stop_strings)
        # Every token decodes to at least one byte, so a stop string of n bytes ends within
        # the last n tokens; one more token keeps the character before it intact.
        self.tail_tokens = max(len(s.encode("utf-8")) for s in self.stop_strings) + 1

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
        return torch.tensor([self.row_stops(row) for row in input_ids.tolist()], device=input_ids.device)

    def row_stops(self, ids: list[int]) -> bool:
        """Whether a stop string ends inside the text that the last of ``ids`` added."""
        ### BEGIN SOLUTION
        # Hint: decode the last few tokens together (a stop string can span several), and compare with the text without the newest.
        tail = ids[-self.tail_tokens :]
        before, text = self.decode(tail[:-1]), self.decode(tail)
        # Where the newest token's text starts: past the text both share. (A character split
        # across tokens shows as "\ufffd" in `before` and as itself in `text`.)
        start = 0
        while start < min(len(before), len(text)) and before[start] == text[start]:
            start += 1
        # A stop string that ends at or after `start` reaches into the newest token.
        return any(s in text[max(0, start - len(s) + 1) :] for s in self.stop_strings)
        ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Streaming: Hugging Face's streamer shape, put(token_ids) then end()
# ---------------------------------------------------------------------------------------


@runtime_checkable
class Streamer(Protocol):
    """Receives the prompt's token ids, then each new token as it is chosen, then ``end()``."""

    def put(self, token_ids: Int[Tensor, "..."]) -> None: ...

    def end(self) -> None: ...


class TextStreamer:
    """Print text as it is generated, a word at a time.

    The text after the last space or newline is held back, because the next token may
    still extend that word, and because a character whose bytes are split over several
    tokens decodes as "\ufffd" until its last byte arrives. ``end()`` prints the rest.
    What it prints, put together, is exactly the decode of every token it was given.
    ``skip_prompt`` leaves out the first ``put`` (``generate`` sends the prompt first).
    Other keyword arguments go to ``tokenizer.decode`` (e.g. ``skip_special_tokens=True``).
    """

    def __init__(self, tokenizer, skip_prompt: bool = False, file: TextIO | None = None, **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.file = file
        self.decode_kwargs = {"clean_up_tokenization_spaces": False, **decode_kwargs}
        self.token_ids: list[int] = []
        self.printed = 0  # characters of the decoded text already printed
        self.waiting_for_prompt = True

    def decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, **self.decode_kwargs)

    def emit(self, text: str) -> None:
        """Write ``text`` out at once (a subclass may send it elsewhere)."""
        if text:
            print(text, end="", flush=True, file=self.file if self.file is not None else sys.stdout)

    def put(self, token_ids: Int[Tensor, "..."]) -> None:
        if isinstance(token_ids, Tensor):
            if token_ids.ndim > 1 and token_ids.shape[0] > 1:
                raise ValueError(f"TextStreamer streams one sequence (batch size 1), got shape {tuple(token_ids.shape)}")
            token_ids = token_ids.reshape(-1).tolist()
        is_prompt, self.waiting_for_prompt = self.waiting_for_prompt, False
        if is_prompt and self.skip_prompt:
            return
        ### BEGIN SOLUTION
        # Hint: decode everything so far; print only up to the last space or newline, and only what is new.
        self.token_ids.extend(int(t) for t in token_ids)
        text = self.decode()
        safe_end = max(text.rfind(" "), text.rfind("\n")) + 1
        if safe_end > self.printed:
            self.emit(text[self.printed : safe_end])
            self.printed = safe_end
        ### END SOLUTION

    def end(self) -> None:
        """Print whatever is held back and start afresh."""
        ### BEGIN SOLUTION
        self.emit(self.decode()[self.printed :])
        ### END SOLUTION
        self.token_ids, self.printed, self.waiting_for_prompt = [], 0, True
