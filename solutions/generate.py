"""Part 5: the generation engine, many prompts at once.

Parts 2-4 continue one prompt with a loop written for teaching. ``generate`` is the loop you
meet in Hugging Face's ``generate``, in vLLM and in llama.cpp:

    prompts -> left padding -> prefill (one pass over every prompt, filling a KV cache)
            -> per step: processors (logit bias, penalties, DRY, banned words, a minimum length)
                      -> the chain (temperature, top-k, top-p, min-p, typical, epsilon, eta,
                         top-n-sigma, XTC; in an order you can choose)
                      -> draw (one multinomial draw per row, or mirostat)
            -> append the token (a pad for rows already finished) -> stopping criteria

The pieces live in their own modules, read in this order: ``padding`` (left padding, the
prefill and decode steps), ``filters`` and ``batched_sampling`` (the classic filters, the
chain and the draw), this module (the loop), ``outputs`` (scores, log-probabilities,
stopping criteria, stop strings, streaming); then part 5b's ``modern_filters``,
``penalties`` and ``batched_beam_search``. Every sampler setting is declared once, in
``sampling_course.sampling_settings.SamplerSettings``, with Hugging Face's keyword names
where Hugging Face has the setting (``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``,
``min_new_tokens``, ``min_tokens_to_keep``, ``bad_words_ids``) and vLLM's or llama.cpp's
otherwise (``logit_bias``, ``top_n_sigma``, ``xtc_probability``, ``mirostat``,
``dry_multiplier``, ``samplers``).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.sampling_settings import SamplerSettings, check_bad_words

from .batched_beam_search import beam_generate
from .batched_sampling import choose_tokens
from .outputs import EosTokenCriteria, GenerateOutput, Record, StopStringCriteria, Streamer
from .padding import decode_step, left_pad, prefill
from .penalties import dry_breaker_ids, process_logits
from .transformer import DemoTransformer


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
    settings: SamplerSettings | None = None,
    num_return_sequences: int = 1,
    logprobs: int | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id: int | None = None,
    stopping_criteria: list | None = None,
    stop_strings: str | list[str] | None = None,
    streamer: Streamer | None = None,
    seed: int | None = None,
    return_dict_in_generate: bool = False,
    kv_cache=None,
    constraint=None,
    **keywords,
) -> Int[Tensor, "batch seq"] | GenerateOutput:
    """Continue every prompt at once, each row stopping on its own.

    The prompts are left-padded into one batch with one KV cache: a prefill runs them all,
    then each step runs one new token per row. Each step runs the processors
    (``process_logits``: ``logit_bias``, the penalties, DRY, ``bad_words_ids``,
    ``min_new_tokens``) and then the draw (``choose_tokens``: the chain of ``warp_logits``
    and ``sample``, or mirostat) for the whole batch, once, finished rows included, so a
    seed gives the same tokens however the rows end. ``num_return_sequences`` continues
    every prompt that many times (rows grouped by prompt, as Hugging Face orders them).

    A row that emits ``eos_token_id`` (the tokenizer's by default; an id outside the
    vocabulary turns it off), or that a criterion of ``stopping_criteria`` or
    ``stop_strings`` stops, is finished: from the next step on it receives the pad token
    (the tokenizer's, else the EOS id) and never changes again. Those pads are masked out
    (attention mask 0) like the left padding. The loop ends when every row is finished or
    after ``max_new_tokens`` steps.

    ``num_beams > 1`` runs Hugging Face's beam search instead (``beam_generate``), ranked by
    ``length_penalty`` and stopped by ``early_stopping``; the chain and the draw do not
    apply there (leave them at their defaults), the processors do.

    The sampler's settings (``temperature``, ``top_k``, ``top_p``, ``min_p``, the rest of the
    chain, mirostat, the processors' settings: every field of ``SamplerSettings``) come as
    keywords, or as one ``settings`` object, checked once.

    Returns the sequences ``(batch, prompt + new)``, left padding included, or with
    ``return_dict_in_generate=True`` (or ``logprobs=k``) a ``GenerateOutput``.
    ``streamer`` (one sequence only) gets the prompt's ids, then every new token, then ``end()``.
    ``seed`` seeds a private ``torch.Generator``, which draws exactly what torch's global
    generator would after ``torch.manual_seed(seed)``. ``kv_cache`` is an empty cache to
    fill, one row per sequence (part 6's ``StaticKeyValueCache`` takes the fast path); None
    starts a ``KeyValueCache``.

    ``constraint`` (part 8's ``TokenConstraint``) keeps each row inside a language: every
    row starts at ``constraint.start``; each step, after the penalties and before the
    temperature and filters, ``constraint.mask_logits`` sets the tokens its state forbids
    to -inf, and ``constraint.advance`` moves each row's state along the token it got. A
    row whose state reads the end-of-text token (``constraint.finished``) is finished, even
    when ``eos_token_id`` is switched off; a row finished otherwise is done for the
    constraint too (its state becomes ``constraint.DONE``). Part 8 checks this branch as
    ``check("constrained_generate")``; the rest of the loop is ``check("generate")``.
    """
    check_generate_args(prompts, max_new_tokens, streamer, stopping_criteria)
    check_counts(num_return_sequences, logprobs, num_beams, length_penalty, early_stopping)
    if kv_cache is not None and kv_cache.seq_len != 0:
        raise ValueError(f"kv_cache must be empty (seq_len 0): generate fills it from the prompts, got seq_len={kv_cache.seq_len}")
    cfg = model.cfg
    device = next(model.parameters(), torch.empty(0)).device
    if eos_token_id is None:
        eos_token_id = tokenizer.eos_token_id
    pad_token_id = choose_pad_token_id(tokenizer, eos_token_id, cfg.d_vocab)
    settings = SamplerSettings.of(settings, **keywords)  # every sampler setting checked once, here
    if not (eos_token_id is not None and 0 <= eos_token_id < cfg.d_vocab):
        eos_token_id = None  # an id outside the vocabulary switches the end-of-text token off
    dry_breakers = None
    if settings.dry_multiplier > 0:
        dry_breakers = dry_breaker_ids(tokenizer, settings.dry_sequence_breakers, cfg.d_vocab).to(device)
    if settings.bad_words_ids:
        check_bad_words(settings.bad_words_ids, cfg.d_vocab)

    prompt_ids = [list(tokenizer.encode(prompt)) for prompt in prompts]
    if not all(prompt_ids):
        raise ValueError("every prompt must encode to at least one token; got an empty prompt")
    if num_beams == 1:
        # Every prompt num_return_sequences times, its copies next to each other.
        prompt_ids = [ids for ids in prompt_ids for _ in range(num_return_sequences)]
    input_ids, attention_mask = left_pad(prompt_ids, pad_token_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if input_ids.shape[1] + max_new_tokens > cfg.n_ctx:
        raise ValueError(
            f"the longest prompt ({input_ids.shape[1]} tokens) plus max_new_tokens={max_new_tokens} is more than "
            f"the model's n_ctx={cfg.n_ctx}; shorten the prompt or ask for fewer new tokens"
        )
    if num_beams > 1:
        if settings.is_sampling:
            raise ValueError(
                "num_beams > 1 is beam search: it ranks beams by their log-probabilities and draws nothing, so "
                "temperature, the filters and mirostat do not apply; leave them at their defaults (or use num_beams=1)"
            )
        if stopping_criteria or stop_strings or streamer is not None or kv_cache is not None or constraint is not None:
            raise ValueError("beam search here takes no stopping_criteria, stop_strings, streamer, kv_cache or constraint")
        return beam_generate(model, input_ids, attention_mask, max_new_tokens, settings, eos_token_id, num_beams,
                             num_return_sequences, length_penalty, early_stopping, pad_token_id,
                             return_dict_in_generate or logprobs is not None)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streaming prints one text: ask for one sequence with a streamer, got {input_ids.shape[0]}")
    criteria = list(stopping_criteria or [])
    if eos_token_id is not None:
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

    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)
    record = Record(logprobs) if return_dict_in_generate or logprobs is not None else None
    # Mirostat's state: each row starts at twice the target surprise, as llama.cpp does.
    mu = torch.full((input_ids.shape[0],), 2.0 * settings.mirostat_tau, device=device) if settings.mirostat else None
    cache = None
    ### BEGIN SOLUTION
    # Hint: the first step is the prefill (every prompt at once); every later one runs only the newest tokens.
    # Hint: (part 8) with a constraint, mask the processed logits before choose_tokens, then advance every row's state along its token.
    for step in range(max_new_tokens):
        if cache is None:
            logits, cache = prefill(model, input_ids, attention_mask, kv_cache)
        else:
            logits, cache = decode_step(model, input_ids, attention_mask, cache)
        processed = process_logits(logits, input_ids, attention_mask, step, settings, eos_token_id, dry_breakers)
        if constraint is not None:
            # Before the temperature and the filters, so that they choose among allowed tokens only.
            processed = constraint.mask_logits(processed, states)
        next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)
        # A finished row gets a pad, masked out like the left padding: it never changes again.
        next_tokens = next_tokens.masked_fill(finished, pad_token_id)
        if constraint is not None:
            states = constraint.advance(states, next_tokens)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=1)
        if record is not None:
            record.step(logits, drawn_from, next_tokens, finished)
        if streamer is not None:
            streamer.put(next_tokens.cpu())
        # Each criterion stops only the rows it names; the batch ends when every row is done.
        finished |= stopped_rows(criteria, input_ids, processed)
        if constraint is not None:
            finished |= constraint.finished(states)
            states = states.masked_fill(finished, constraint.DONE)
        if finished.all():
            break
    ### END SOLUTION
    if streamer is not None:
        streamer.end()
    return input_ids if record is None else record.output(input_ids)


# ---------------------------------------------------------------------------------------
# Checks that fail loudly, saying what is allowed
# ---------------------------------------------------------------------------------------


def check_counts(num_return_sequences, logprobs, num_beams, length_penalty, early_stopping) -> None:
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1 (1 samples instead of beam search), got {num_beams!r}")
    limit = num_beams if num_beams > 1 else None
    if isinstance(num_return_sequences, bool) or not isinstance(num_return_sequences, int) or num_return_sequences < 1 or (
        limit is not None and num_return_sequences > limit
    ):
        allowed = f"between 1 and num_beams={num_beams}" if limit else "an integer >= 1"
        raise ValueError(f"num_return_sequences must be {allowed}, got {num_return_sequences!r}")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 1):
        raise ValueError(f"logprobs (how many top log-probabilities to return per step) must be None or an integer >= 1, got {logprobs!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or math.isnan(length_penalty):
        raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never") or not isinstance(early_stopping, (bool, str)):
        raise ValueError(f"early_stopping must be True, False or \"never\", got {early_stopping!r}")


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
