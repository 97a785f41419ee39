# GENERATED from solutions/generate.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: b0914dcb729d97aa2a35f771e2b64ff0e8db83d108bb0e99419d26c7b276a3ee
"""Part 5: the generation engine, many prompts at once.

Parts 2-4 continue one prompt with a loop written for teaching. This module is the engine
you meet in Hugging Face's ``generate`` and in the samplers of training repositories:

    prompts -> left padding -> prefill (one pass over every prompt, filling a KV cache)
            -> per step: penalties -> temperature -> top-k -> top-p -> min-p -> draw
            -> append the token (a pad for rows already finished) -> stopping criteria

Everything works on a whole batch, ``(batch, d_vocab)`` logits at a time:

* ``sample`` is the primitive: temperature 0 is argmax, otherwise ``warp_logits`` applies
  the temperature and the filters in Hugging Face's order and one ``torch.multinomial``
  draw is made per row. Each filter is its own function that sets removed logits to -inf.
  The settings mean what they mean in Hugging Face: ``top_k=0``, ``top_p=1.0`` and
  ``min_p=0.0`` are off, temperature 0 is greedy (``sampling_course.sampling_settings``
  checks them, for part 7 too). Part 2's classic sampler used ``top_p=0.0`` for off.
* Penalties see each row's tokens so far: ``apply_repetition_penalty`` (Hugging Face's
  rule, over the prompt and the generated tokens) and ``apply_presence_and_frequency_penalty``
  (OpenAI's rules, over the generated tokens only, as OpenAI and vLLM define them). They run
  before the temperature, as in Hugging Face. (Part 2's sampler applies its frequency
  penalty after the temperature and counts the prompt too; the order matters whenever the
  temperature is not 1.)
* ``generate`` runs the loop with per-row stopping; ``StoppingCriteria`` and the
  streamer protocol have Hugging Face's shapes, so your own criteria and streamers plug in.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Protocol, TextIO, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.devices import check_generator
from sampling_course.sampling_settings import check_sampling_settings

from .transformer import DemoTransformer, KeyValueCache

# ---------------------------------------------------------------------------------------
# Filters: each takes (batch, d_vocab) logits and sets the logits it removes to -inf
# ---------------------------------------------------------------------------------------


def top_k_filter(logits: Float[Tensor, "batch d_vocab"], top_k: int) -> Float[Tensor, "batch d_vocab"]:
    """Keep the ``top_k`` largest logits of each row; set the others to -inf.

    Ties at the k-th largest value are all kept (as Hugging Face does), so a row can keep
    more than ``top_k`` tokens when several share that value. ``top_k`` larger than the
    vocabulary keeps everything.
    """
    check_logits(logits)
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1 here (0 means no top-k: do not call the filter), got {top_k!r}")
    top_k = min(top_k, logits.shape[-1])
    # Hint: find each row's k-th largest value, then remove everything strictly below it.
    raise NotImplementedError()


def top_p_filter(logits: Float[Tensor, "batch d_vocab"], top_p: float) -> Float[Tensor, "batch d_vocab"]:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability is >= ``top_p``.

    Inclusive: the token that takes the running total to ``top_p`` or past it is kept, and
    the most likely token is always kept. Probabilities come from the logits as they are
    (after the temperature, when ``warp_logits`` calls it).
    """
    check_logits(logits)
    if not isinstance(top_p, (int, float)) or not 0.0 <= top_p <= 1.0:
        raise ValueError(f"top_p must be in [0, 1] (1 keeps everything), got {top_p!r}")
    # Hint: sort each row, and keep a token while the probability of the tokens ranked above it is < top_p.
    raise NotImplementedError()


def min_p_filter(logits: Float[Tensor, "batch d_vocab"], min_p: float) -> Float[Tensor, "batch d_vocab"]:
    """Keep the tokens whose probability is at least ``min_p`` times the row's top probability.

    The bar moves with the model's confidence: a peaked row keeps few tokens, a flat row
    many. The most likely token always stays.
    """
    check_logits(logits)
    if not isinstance(min_p, (int, float)) or not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1] (0 keeps everything), got {min_p!r}")
    # Hint: compare each probability with min_p times the largest probability of the same row.
    raise NotImplementedError()


def warp_logits(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Float[Tensor, "batch d_vocab"]:
    """The logits ``sample`` draws from: temperature, then top-k, then top-p, then min-p.

    This is Hugging Face's order. ``top_k=0``, ``top_p=1.0`` and ``min_p=0.0`` switch a
    filter off. The temperature must be > 0 here (``sample`` handles 0 as argmax).
    """
    check_sampling_settings(temperature, top_k, top_p, min_p)
    if temperature == 0:
        raise ValueError("warp_logits needs temperature > 0; temperature 0 is greedy decoding (see sample)")
    # Hint: call a filter only when its setting is on, each on the output of the one before.
    raise NotImplementedError()


def sample(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch"]:
    """One token per row: argmax at temperature 0, otherwise a draw from ``warp_logits``.

    At temperature 0 no filter runs. Otherwise each row is drawn independently from
    softmax of its warped logits, with randomness from ``generator`` (torch's global
    generator when None), so the same seeded generator gives the same tokens.
    """
    check_logits(logits)
    check_sampling_settings(temperature, top_k, top_p, min_p)
    check_generator(generator, logits.device)  # a generator draws on its own device only
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------
# Penalties: from each row's tokens so far, before the temperature
# ---------------------------------------------------------------------------------------


def token_counts(
    input_ids: Int[Tensor, "batch seq"], d_vocab: int, attention_mask: Int[Tensor, "batch seq"] | None = None
) -> Int[Tensor, "batch d_vocab"]:
    """How many times each token occurs in each row, counting only positions where the mask is 1."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (batch, seq), got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
        )
    counts = torch.zeros(input_ids.shape[0], d_vocab, dtype=torch.long, device=input_ids.device)
    return counts.scatter_add_(1, input_ids, attention_mask.long())


def apply_repetition_penalty(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    penalty: float,
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Hugging Face's repetition penalty: make every token already in the row less likely.

    A seen token's logit is divided by ``penalty`` when positive and multiplied by it when
    negative (dividing a negative logit would raise it). Once per distinct token, however
    often it occurs. Positions where ``attention_mask`` is 0 (padding) do not count, so a
    padded row is penalised as it would be alone. (Hugging Face's generate counts left
    padding as seen, which also penalises the pad token of padded rows.)
    ``penalty`` 1.0 changes nothing; above 1 discourages repeats.
    """
    check_logits(logits)
    if not isinstance(penalty, (int, float)) or not penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 is off), got {penalty!r}")
    seen = token_counts(input_ids, logits.shape[-1], attention_mask) > 0
    # Hint: both cases must move the logit down: shrink a positive one, stretch a negative one.
    raise NotImplementedError()


def apply_presence_and_frequency_penalty(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    presence_penalty: float,
    frequency_penalty: float,
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """OpenAI's penalties: subtract ``presence_penalty`` once from every token that occurs in
    ``input_ids``, and ``frequency_penalty`` once per occurrence. Padding (mask 0) does not count.

    OpenAI and vLLM count the tokens generated so far, not the prompt's: pass only the
    generated columns (``generate`` does, through ``apply_penalties``).
    """
    check_logits(logits)
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{name} must be a number (0 is off), got {value!r}")
    counts = token_counts(input_ids, logits.shape[-1], attention_mask)
    # Hint: presence uses whether a token occurred (counts > 0), frequency how often (counts).
    raise NotImplementedError()


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
        # Hint: decode the last few tokens together (a stop string can span several), and compare with the text without the newest.
        raise NotImplementedError()


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
        # Hint: decode everything so far; print only up to the last space or newline, and only what is new.
        raise NotImplementedError()

    def end(self) -> None:
        """Print whatever is held back and start afresh."""
        raise NotImplementedError()
        self.token_ids, self.printed, self.waiting_for_prompt = [], 0, True


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------


@dataclass
class GenerateOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns.

    ``sequences``: the left-padded prompts and the new tokens, ``(batch, prompt + new)``.
    ``scores``: each chosen token's log-probability under the distribution it was drawn
    from (after penalties, temperature and filters; at temperature 0, after the penalties).
    ``logprobs``: its log-probability under the raw model (temperature 1, nothing filtered).
    Both are ``(batch, new)``; a row's steps after it finished hold NaN (its pad tokens
    were not chosen by anyone), so sum a row's values with ``torch.nansum``.
    """

    sequences: Int[Tensor, "batch seq"]
    scores: Float[Tensor, "batch new"]
    logprobs: Float[Tensor, "batch new"]


def left_pad(token_lists: list[list[int]], pad_token_id: int) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Stack prompts of different lengths into ``(input_ids, attention_mask)``, padding on the left.

    Left, so that every row's last real token sits in the last column: the logits of the
    next token are then ``logits[:, -1]`` for every row, and new tokens follow directly.
    """
    # Hint: pad each row at its start up to the longest prompt; the mask is 0 at pads, 1 at tokens.
    raise NotImplementedError()


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
    logits, cache = model(input_ids, cache, attention_mask=attention_mask)
    return logits[:, -1], cache


def decode_step(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch seq"],
    attention_mask: Int[Tensor, "batch seq"],
    cache: KeyValueCache,
) -> tuple[Float[Tensor, "batch d_vocab"], KeyValueCache]:
    """Run only the newest token of every row on top of the cache."""
    logits, cache = model(input_ids, cache, attention_mask=attention_mask)
    return logits[:, -1], cache


def apply_penalties(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    attention_mask: Int[Tensor, "batch seq"],
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    n_prompt: int = 0,
) -> Float[Tensor, "batch d_vocab"]:
    """The repetition penalty, then the presence and frequency penalties (those switched on).

    The first ``n_prompt`` columns of ``input_ids`` are the (left-padded) prompts. The
    repetition penalty counts them, as Hugging Face's does; the presence and frequency
    penalties count only the columns after them, the generated tokens, as OpenAI and vLLM do.
    """
    if repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, input_ids, repetition_penalty, attention_mask)
    if presence_penalty != 0.0 or frequency_penalty != 0.0:
        logits = apply_presence_and_frequency_penalty(
            logits, input_ids[:, n_prompt:], presence_penalty, frequency_penalty, attention_mask[:, n_prompt:]
        )
    return logits


def chosen_logprobs(logits: Float[Tensor, "batch d_vocab"], tokens: Int[Tensor, "batch"]) -> Float[Tensor, "batch"]:
    """log softmax(logits) at each row's chosen token."""
    return logits.log_softmax(dim=-1).gather(-1, tokens[:, None])[:, 0]


def stopped_rows(criteria: list, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
    """The rows that any of ``criteria`` stops after this step."""
    stop = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for criterion in criteria:
        stop |= criterion(input_ids, scores).to(device=stop.device, dtype=torch.bool)
    return stop


@torch.inference_mode()
def generate(
    model: DemoTransformer,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    eos_token_id: int | None = None,
    stopping_criteria: list | None = None,
    stop_strings: str | list[str] | None = None,
    streamer: Streamer | None = None,
    seed: int | None = None,
    return_dict_in_generate: bool = False,
    kv_cache=None,
    constraint=None,
) -> Int[Tensor, "batch seq"] | GenerateOutput:
    """Continue every prompt at once, each row stopping on its own.

    The prompts are left-padded into one batch with one KV cache: a prefill runs them all,
    then each step runs one new token per row. Each step applies the penalties to the
    logits (``apply_penalties``: the repetition penalty counts the prompt and the new
    tokens, the presence and frequency penalties the new tokens only), then ``sample``
    (temperature, top-k, top-p, min-p, draw) for the whole batch, once, finished rows
    included, so a seed gives the same tokens however the rows end.

    A row that emits ``eos_token_id`` (the tokenizer's by default; an id outside the
    vocabulary turns it off), or that a criterion of ``stopping_criteria`` or
    ``stop_strings`` stops, is finished: from the next step on it receives the pad token
    (the tokenizer's, else the EOS id) and never changes again. Those pads are masked out
    (attention mask 0) like the left padding. The loop ends when every row is finished or
    after ``max_new_tokens`` steps.

    Returns the sequences ``(batch, prompt + new)``, left padding included, or with
    ``return_dict_in_generate=True`` a ``GenerateOutput`` with scores and log-probs.
    ``streamer`` (batch size 1 only) gets the prompt's ids, then every new token, then ``end()``.
    ``seed`` seeds a private ``torch.Generator``, which draws exactly what torch's global
    generator would after ``torch.manual_seed(seed)``. ``kv_cache`` is an empty cache to
    fill, one row per prompt (part 6's ``StaticKeyValueCache`` takes the fast path); None
    starts a ``KeyValueCache``.

    ``constraint`` (part 8's ``TokenConstraint``) keeps each row inside a language: every
    row starts at ``constraint.start``; each step, after the penalties and before the
    temperature and filters, ``constraint.mask_logits`` sets the tokens its state forbids
    to -inf, and ``constraint.advance`` moves each row's state along the token it got. A
    row whose state reads the end-of-text token (``constraint.finished``) is finished, even
    when ``eos_token_id`` is switched off; a row finished otherwise is done for the
    constraint too (its state becomes ``constraint.DONE``).
    """
    check_generate_args(prompts, max_new_tokens, streamer, stopping_criteria)
    if kv_cache is not None and kv_cache.seq_len != 0:
        raise ValueError(f"kv_cache must be empty (seq_len 0): generate fills it from the prompts, got seq_len={kv_cache.seq_len}")
    check_sampling_settings(temperature, top_k, top_p, min_p)
    cfg = model.cfg
    device = next(model.parameters(), torch.empty(0)).device
    if eos_token_id is None:
        eos_token_id = tokenizer.eos_token_id
    pad_token_id = choose_pad_token_id(tokenizer, eos_token_id, cfg.d_vocab)

    prompt_ids = [list(tokenizer.encode(prompt)) for prompt in prompts]
    if not all(prompt_ids):
        raise ValueError("every prompt must encode to at least one token; got an empty prompt")
    input_ids, attention_mask = left_pad(prompt_ids, pad_token_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if input_ids.shape[1] + max_new_tokens > cfg.n_ctx:
        raise ValueError(
            f"the longest prompt ({input_ids.shape[1]} tokens) plus max_new_tokens={max_new_tokens} is more than "
            f"the model's n_ctx={cfg.n_ctx}; shorten the prompt or ask for fewer new tokens"
        )
    criteria = list(stopping_criteria or [])
    if eos_token_id is not None and 0 <= eos_token_id < cfg.d_vocab:
        criteria.append(EosTokenCriteria(eos_token_id))
    if stop_strings:
        criteria.append(StopStringCriteria(tokenizer, stop_strings))
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    if streamer is not None:
        streamer.put(input_ids[0].cpu())
    check_constraint(constraint)
    states = constraint.start(input_ids.shape[0], device) if constraint is not None else None

    # The presence and frequency penalties count the columns from n_prompt on: the generated tokens.
    n_prompt = input_ids.shape[1]
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)
    scores: list[Tensor] = []
    logprobs: list[Tensor] = []
    cache = None
    # Hint: the first step is the prefill (every prompt at once); every later one runs only the newest tokens.
    # Hint: (part 8) with a constraint, mask the logits before sample, then advance every row's state along its token.
    raise NotImplementedError()
    if streamer is not None:
        streamer.end()
    if not return_dict_in_generate:
        return input_ids
    empty = torch.empty(input_ids.shape[0], 0, device=device)
    return GenerateOutput(
        sequences=input_ids,
        scores=torch.stack(scores, dim=1) if scores else empty,
        logprobs=torch.stack(logprobs, dim=1) if logprobs else empty,
    )


# ---------------------------------------------------------------------------------------
# Checks that fail loudly, saying what is allowed
# ---------------------------------------------------------------------------------------


def check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a float tensor of shape (batch, d_vocab), got {shape}")


def check_generate_args(prompts, max_new_tokens, streamer, stopping_criteria) -> None:
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of strings (one per row), got {type(prompts).__name__}")
    if not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("every prompt must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if streamer is not None and len(prompts) != 1:
        raise ValueError(f"streaming prints one text: pass one prompt with a streamer, got {len(prompts)}")
    for criterion in stopping_criteria or []:
        if not callable(criterion):
            raise TypeError(
                f"each stopping criterion must be callable as criterion(input_ids, scores), got {type(criterion).__name__}"
            )


def check_constraint(constraint) -> None:
    if constraint is None:
        return
    missing = [name for name in ("start", "mask_logits", "advance", "finished", "DONE") if not hasattr(constraint, name)]
    if missing:
        raise TypeError(
            f"constraint must be a TokenConstraint (part 8: regex_constraint or json_schema_constraint), "
            f"got {type(constraint).__name__}, which lacks {', '.join(missing)}"
        )


def choose_pad_token_id(tokenizer, eos_token_id: int | None, d_vocab: int) -> int:
    """The tokenizer's pad token, else the EOS token (GPT-2 has no pad), else 0.

    Pads are never attended, so any id in the vocabulary works; it only has to be one.
    """
    for candidate in (getattr(tokenizer, "pad_token_id", None), eos_token_id):
        if isinstance(candidate, int) and 0 <= candidate < d_vocab:
            return candidate
    return 0
