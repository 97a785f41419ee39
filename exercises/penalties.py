# GENERATED from solutions/penalties.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: dc1d3f26a6d16a18e5dd35c9162ef9b07025c5e9a1aea57729340f3a8cb6a30f
"""Part 5b: the processors, which read each row's tokens so far and run before the chain.

A processor takes ``(batch, d_vocab)`` logits and the rows' tokens ``(batch, seq)`` (with
their attention mask: left padding never counts) and returns new logits; the logits it is
given are never changed. They run before the temperature, as in Hugging Face:

* ``apply_repetition_penalty``: Hugging Face's rule (Keskar et al. 2019, CTRL), over the
  prompt and the generated tokens;
* ``apply_presence_and_frequency_penalty``: OpenAI's rules, over the generated tokens only,
  as OpenAI and vLLM define them;
* ``apply_dry_penalty``: llama.cpp's DRY, over the prompt and the generated tokens;
* ``apply_logit_bias`` (OpenAI's and vLLM's ``logit_bias``) and ``ban_bad_words`` (Hugging
  Face's ``bad_words_ids``);
* ``process_logits`` runs those that are switched on, and ``min_new_tokens``.

(Part 2's sampler applies its frequency penalty after the temperature and counts the prompt
too; the order matters whenever the temperature is not 1.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.sampling_settings import SamplerSettings, check_bad_words, check_setting

from .filters import check_logits


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
    check_setting("repetition_penalty", penalty)
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
    generated columns (``generate`` does, through ``process_logits``).
    """
    check_logits(logits)
    check_setting("presence_penalty", presence_penalty)
    check_setting("frequency_penalty", frequency_penalty)
    counts = token_counts(input_ids, logits.shape[-1], attention_mask)
    # Hint: presence uses whether a token occurred (counts > 0), frequency how often (counts).
    raise NotImplementedError()


# Above this exponent base ** exponent overflows float32 (llama.cpp clamps it the same way).
FLOAT32_MAX_LOG = 88.7228391


def apply_dry_penalty(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    multiplier: float,
    base: float = 1.75,
    allowed_length: int = 2,
    breakers: Bool[Tensor, "d_vocab"] | None = None,
    penalty_last_n: int = -1,
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """DRY ("don't repeat yourself"), as llama.cpp's ``dry`` sampler defines it: penalise the token that would extend a repeat.

    Look at a row's tokens (the last ``penalty_last_n`` of them, or all with -1; padding
    does not count). For every earlier position j, let n_j be how many tokens ending at j
    equal the tokens ending at the last position (the length of the common suffix; it may
    overlap the end). Emitting token x = (the token after j) would make that repeat one
    longer. So every such x with n_j >= ``allowed_length`` gets its logit lowered by
    ``multiplier * base ** (n - allowed_length)``, with n the largest n_j that points at
    it: the penalty grows exponentially with the length of the repeat.

    Sequence breakers (``breakers``: a boolean per token, True for tokens such as a newline
    or a quote) stop a repeat from reaching back across them: every n_j is capped at the
    number of tokens after the most recent breaker, and a breaker token itself is never
    penalised. Nothing happens when the row has at most ``allowed_length`` tokens, or when
    fewer than ``allowed_length`` tokens follow its last breaker. The exponent is capped
    where base ** exponent would overflow float32.
    """
    check_logits(logits)
    for name, value in (("dry_multiplier", multiplier), ("dry_base", base), ("dry_allowed_length", allowed_length),
                        ("dry_penalty_last_n", penalty_last_n)):
        check_setting(name, value)
    if input_ids.ndim != 2 or input_ids.shape[0] != logits.shape[0]:
        raise ValueError(f"input_ids must have shape (batch={logits.shape[0]}, seq), got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if breakers is None:
        breakers = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    if multiplier == 0 or penalty_last_n == 0:
        return logits
    max_exponent = int(FLOAT32_MAX_LOG / math.log(base)) if base > 1.000001 else None
    logits = logits.clone()
    for row in range(logits.shape[0]):
        ids = input_ids[row][attention_mask[row].bool()]
        if penalty_last_n > 0:
            ids = ids[-penalty_last_n:]
        # Hint: reverse the row; for a shift k, the repeat length is the run of rev[i] == rev[i + k] from i = 0.
        raise NotImplementedError()
    return logits


def dry_breaker_ids(tokenizer, sequence_breakers: Sequence[str], d_vocab: int) -> Bool[Tensor, "d_vocab"]:
    """Which tokens are sequence breakers: those whose text contains one of ``sequence_breakers``.

    llama.cpp also counts a token whose text ends in the start of a longer breaker string
    when the next tokens spell the rest of it; for breakers of one character, like the
    defaults, the two rules are the same.
    """
    check_setting("dry_sequence_breakers", sequence_breakers)
    n = min(len(tokenizer), d_vocab) if hasattr(tokenizer, "__len__") else d_vocab
    texts = tokenizer.batch_decode([[i] for i in range(n)]) if hasattr(tokenizer, "batch_decode") else [
        tokenizer.decode([i]) for i in range(n)
    ]
    flags = [any(b in text for b in sequence_breakers) for text in texts] + [False] * (d_vocab - n)
    return torch.tensor(flags, dtype=torch.bool)


# ---------------------------------------------------------------------------------------
# Biases and bans
# ---------------------------------------------------------------------------------------


def apply_logit_bias(logits: Float[Tensor, "batch d_vocab"], logit_bias: dict[int, float]) -> Float[Tensor, "batch d_vocab"]:
    """Add ``logit_bias[token]`` to that token's logit in every row (OpenAI's and vLLM's ``logit_bias``).

    A large negative bias all but bans a token, -inf bans it, a positive one favours it.
    Hugging Face's ``sequence_bias`` with one-token sequences does the same.
    """
    check_logits(logits)
    check_setting("logit_bias", logit_bias)
    outside = [token for token in logit_bias if token >= logits.shape[-1]]
    if outside:
        raise ValueError(f"logit_bias keys must be token ids in [0, {logits.shape[-1]}), got {outside[0]!r}")
    bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
    for token, value in logit_bias.items():
        bias[token] = value
    return logits + bias


def ban_bad_words(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    bad_words_ids: list[list[int]],
    attention_mask: Int[Tensor, "batch seq"] | None = None,
    eos_token_id: int | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Hugging Face's ``bad_words_ids``: never complete one of these token sequences.

    A banned sequence of one token bans that token everywhere. A longer one bans its last
    token in the rows whose last tokens are the rest of it (all but its last token), so
    the sequence can never appear whole. Padding (mask 0) never counts as a token. As in
    Hugging Face, the one-token sequence ``[eos_token_id]`` is left out: banning the end
    of the text would make a row run to the length limit (``min_new_tokens`` is the
    setting that holds the end back).
    """
    check_logits(logits)
    check_bad_words(bad_words_ids, logits.shape[-1])
    bad_words_ids = [banned for banned in bad_words_ids if list(banned) != [eos_token_id]]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    # Hint: compare the last len(banned) - 1 tokens of every row with the banned sequence's start, all rows at once.
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------
# All the processors, in Hugging Face's order
# ---------------------------------------------------------------------------------------


def process_logits(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    attention_mask: Int[Tensor, "batch seq"],
    n_new: int,
    settings: SamplerSettings,
    eos_token_id: int | None = None,
    dry_breakers: Bool[Tensor, "d_vocab"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """The processors that are switched on, in Hugging Face's order, before the chain.

    ``logit_bias``, then the repetition penalty, the presence and frequency penalties,
    DRY, the banned sequences, and, while fewer than ``min_new_tokens`` tokens are new,
    the end-of-text token removed. The last ``n_new`` columns of ``input_ids`` are the
    generated tokens, the ones before them the (left-padded) prompts: the repetition
    penalty and DRY count both, as Hugging Face and llama.cpp do; the presence and
    frequency penalties count the generated tokens only, as OpenAI and vLLM do.
    ``eos_token_id`` is the end-of-text token (None: there is none), ``dry_breakers`` DRY's
    sequence breakers (``dry_breaker_ids``).
    """
    if settings.logit_bias:
        logits = apply_logit_bias(logits, settings.logit_bias)
    if settings.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, input_ids, settings.repetition_penalty, attention_mask)
    if settings.presence_penalty != 0.0 or settings.frequency_penalty != 0.0:
        n_prompt = input_ids.shape[1] - n_new
        logits = apply_presence_and_frequency_penalty(
            logits, input_ids[:, n_prompt:], settings.presence_penalty, settings.frequency_penalty,
            attention_mask[:, n_prompt:],
        )
    if settings.dry_multiplier > 0:
        logits = apply_dry_penalty(logits, input_ids, settings.dry_multiplier, settings.dry_base,
                                   settings.dry_allowed_length, dry_breakers, settings.dry_penalty_last_n,
                                   attention_mask)
    if settings.bad_words_ids:
        logits = ban_bad_words(logits, input_ids, settings.bad_words_ids, attention_mask, eos_token_id)
    if n_new < settings.min_new_tokens and eos_token_id is not None and 0 <= eos_token_id < logits.shape[-1]:
        logits = logits.clone()
        logits[:, eos_token_id] = float("-inf")
    return logits
