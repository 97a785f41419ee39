"""The course's part 5 loop driving a Hugging Face causal LM: what ``custom_generate`` runs.

Hugging Face's ``generate`` prepares everything a decoding method needs (the prompts, left
padded, with their attention mask; the generation config, its defaults filled in; a cache) and
then calls one. ``course_decoding`` is such a method: it hands the prompts to part 5's
``generate`` (from the implementation you choose, the solutions by default), whose loop, sampler
chain and processors decide every token, and lets it run the Hugging Face model through
``HFCausalLM``, a thin front with the course's call, ``model(tokens, cache,
attention_mask=...) -> (logits, cache)``; its cache is a ``CacheHandle``, a cache of the course's
protocol around Hugging Face's, whose step gives the tokens not seen yet and Hugging Face's
positions.

    model.generate(**inputs, custom_generate=course_decoding, do_sample=True, top_p=0.9)

The generation config is translated into part 5's ``SamplerSettings`` (``sampler_settings``):
Hugging Face's defaults are kept, so its ``top_k=50`` is the course's too. A setting the course
has and Hugging Face has not (DRY, XTC, mirostat, ...) comes as ``settings=SamplerSettings(...)``,
which then replaces the config's sampler settings altogether.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from types import SimpleNamespace
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers.generation.stopping_criteria import MaxLengthCriteria

from sampling_course.implementation import impl_module
from sampling_course.sampling_settings import SamplerSettings

# Hugging Face settings part 5's chain has no step for, with the values that leave them off.
NOT_IN_THE_CHAIN = {
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0),
    "encoder_repetition_penalty": (None, 1.0), "renormalize_logits": (None, False),
    "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "exponential_decay_length_penalty": (None,),
    "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "sequence_bias": (None,),
    "guidance_scale": (None, 1.0), "watermarking_config": (None,), "min_length": (None, 0), "top_h": (None,),
    "penalty_alpha": (None,), "dola_layers": (None,), "diversity_penalty": (None, 0.0), "constraints": (None,),
    "force_words_ids": (None,), "token_healing": (None, False), "num_beams": (None, 1),
}
# Hugging Face's name -> the course's, with the value that is "off" in both.
SHARED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
          "eta_cutoff": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}


def sampler_settings(generation_config) -> SamplerSettings:
    """Part 5's settings for what ``generation_config`` asks, or a ValueError naming a setting the chain lacks."""
    unsupported = [name for name, off in NOT_IN_THE_CHAIN.items() if getattr(generation_config, name, None) not in off]
    if unsupported:
        raise ValueError(
            f"the course's sampler chain has no step for {', '.join(unsupported)}; leave "
            f"{'it' if len(unsupported) == 1 else 'them'} unset (the chain's settings: {', '.join(SamplerSettings.names())})"
        )
    values = {name: off if getattr(generation_config, name, None) is None else getattr(generation_config, name)
              for name, off in SHARED.items()}
    if not generation_config.do_sample:
        values["temperature"] = 0  # greedy: the argmax of the processed logits, the chain skipped
    bad_words = getattr(generation_config, "bad_words_ids", None)
    return SamplerSettings(**values, bad_words_ids=bad_words or None)


class HFStep(NamedTuple):
    """The first two fields of the protocol's ``CacheStep``: Hugging Face's layers mask by its own attention mask."""

    new_tokens: Int[Tensor, "batch new_pos"]
    positions: Int[Tensor, "batch new_pos"] | None


class CacheHandle:
    """A Hugging Face cache behind the course's cache protocol (``prepare``, ``commit``; Hugging Face's layers
    call the cache's own ``update``): ``prepare`` says which tokens of the sequence so far are new (those past
    ``seq_len``) and at which positions Hugging Face puts them; ``commit`` counts them as seen.

    ``prompt_mask`` is the prompts' attention mask. Hugging Face attends from every new token to every
    real token, finished rows included (their outputs are thrown away), so the mask the model is given
    is the prompt's followed by ones, not part 5's mask, which also hides the pads of finished rows: the
    real rows then see exactly the numbers Hugging Face's loop computes. With no padding the model gets
    no mask at all, as in Hugging Face's loop.
    """

    def __init__(self, cache, prompt_mask: Int[Tensor, "batch pos"]):
        self.cache = cache
        self.prompt_mask = None if bool((prompt_mask == 1).all()) else prompt_mask
        self.seq_len, self.new_pos = 0, 0
        self.hf_attention_mask: Int[Tensor, "batch pos"] | None = None  # what the model is given with the step

    def prepare(self, tokens: Int[Tensor, "batch seq"], attention_mask=None) -> HFStep:
        new = tokens[:, self.seq_len :]
        self.new_pos = new.shape[1]
        if hasattr(self.cache, "make_room"):
            # A sink cache: evict before the model reads the cache's length, so that (with no
            # position_ids) the new tokens get the slots after the kept ones, as in part 9.
            self.cache.make_room(self.new_pos)
            self.hf_attention_mask = None
            return HFStep(new, None)
        self.hf_attention_mask = self.hf_mask(tokens.shape[1])
        full = self.hf_attention_mask if self.hf_attention_mask is not None else torch.ones_like(tokens)
        return HFStep(new, (full.cumsum(-1) - 1).masked_fill(full == 0, 0)[:, self.seq_len :])

    def commit(self) -> "CacheHandle":
        self.seq_len += self.new_pos
        self.new_pos = 0
        return self

    def hf_mask(self, length: int) -> Int[Tensor, "batch seq"] | None:
        if self.prompt_mask is None:
            return None
        ones = self.prompt_mask.new_ones(self.prompt_mask.shape[0], length - self.prompt_mask.shape[1])
        return torch.cat([self.prompt_mask, ones], dim=1)


class HFCausalLM(torch.nn.Module):
    """A Hugging Face causal LM called as the course's models are, ``model(tokens, cache, attention_mask=...) ->
    (logits, cache)``, for part 5's ``generate``: the cache's step gives the new tokens and their positions."""

    def __init__(self, hf_model, n_ctx: int):
        super().__init__()
        self.hf = hf_model
        config = hf_model.config.get_text_config(decoder=True)
        self.cfg = SimpleNamespace(d_vocab=config.vocab_size, n_ctx=n_ctx)
        takes = inspect.signature(hf_model.forward).parameters
        self.keep_one, self.takes_positions = "logits_to_keep" in takes, "position_ids" in takes

    def forward(
        self, tokens: Int[Tensor, "batch seq"], handle: CacheHandle, attention_mask: Int[Tensor, "batch seq"] | None = None
    ) -> tuple[Float[Tensor, "batch 1 d_vocab"], CacheHandle]:
        step = handle.prepare(tokens, attention_mask)
        extra = {"logits_to_keep": 1} if self.keep_one else {}
        if self.takes_positions:
            extra["position_ids"] = step.positions
        out = self.hf(input_ids=step.new_tokens, attention_mask=handle.hf_attention_mask, past_key_values=handle.cache,
                      use_cache=True, return_dict=True, **extra)
        # The chain runs in float32 whatever the model's dtype, as in Hugging Face's loop.
        return out.logits[:, -1:].float(), handle.commit()


class PromptRows:
    """The prompts, already tokenized, behind the tokenizer calls part 5's ``generate`` makes.

    Prompt ``"row i"`` encodes to row i's real tokens (its left padding removed; ``generate`` pads
    again). Decoding (stop strings, DRY's sequence breakers) goes to ``tokenizer`` when there is one.
    """

    def __init__(self, input_ids: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"],
                 eos_token_id: int | None, pad_token_id: int | None, tokenizer=None):
        self.rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        self.prompts = [f"row {i}" for i in range(len(self.rows))]
        self.eos_token_id, self.pad_token_id, self.tokenizer = eos_token_id, pad_token_id, tokenizer

    def encode(self, prompt: str) -> list[int]:
        return self.rows[int(prompt.removeprefix("row "))]

    def decode(self, ids, **kwargs) -> str:
        if self.tokenizer is None:
            raise ValueError("stop strings and DRY read token texts: pass text_tokenizer=<the model's tokenizer>")
        return self.tokenizer.decode(ids, **kwargs)


def first_id(value) -> int | None:
    """An id from a config field that may hold one id, a list of them, a tensor or None."""
    if isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def check_left_padded(attention_mask: Tensor) -> None:
    if bool((attention_mask[:, 1:] < attention_mask[:, :-1]).any()):
        raise ValueError("the course's loop takes left-padded prompts (zeros of the attention mask before the tokens); "
                         "load the tokenizer with padding_side='left'")


@torch.no_grad()
def course_decoding(
    model,
    input_ids: Int[Tensor, "batch pos"],
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    impl: str | None = None,
    settings: SamplerSettings | None = None,
    seed: int | None = None,
    logprobs: int | None = None,
    text_tokenizer=None,
    stop_strings: str | list[str] | None = None,
    constraint=None,
    **model_kwargs,
):
    """Part 5's ``generate`` as Hugging Face's decoding method (pass it as ``custom_generate=``).

    Hugging Face has expanded the prompts for ``num_return_sequences`` and made the cache
    (``past_key_values=`` replaces it: ``SinkCache`` for a Llama or Qwen3 model, ``StaticKeyValueCache``
    for any). ``impl`` picks
    whose part 5 runs (``"solutions"``, the default where they exist, or ``"exercises"``); ``settings`` replaces
    the config's sampler settings; ``seed`` seeds part 5's private generator (without it the
    draws come from torch's global one, as Hugging Face's do); ``logprobs=k`` adds each step's k
    best raw log-probabilities; ``stop_strings`` are part 5's (a row stops when its text ends
    with one), read with ``text_tokenizer``, which DRY reads token texts with too (Hugging Face
    does not hand a callable its ``tokenizer=``; the folder passes it on); ``constraint`` is part 8's. ``logits_processor`` is Hugging Face's own chain and is not run.
    Stopping criteria run (the maximum length is counted by the loop).

    Returns the sequences, or with ``return_dict_in_generate=True`` (or ``logprobs``) part 5's
    ``GenerateOutput``: ``sequences``; ``scores``, each chosen token's log-probability after the
    processors and the chain; ``logprobs``, under the raw model (``(batch, new)``, NaN after a
    row finished).
    """
    generate = impl_module("generate", impl, default="solutions").generate
    if generation_config.num_beams not in (None, 1):
        raise ValueError(f"the course's custom_generate samples or decodes greedily; num_beams must be 1, got {generation_config.num_beams}")
    if settings is None:
        settings = sampler_settings(generation_config)
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    check_left_padded(attention_mask)
    cache = model_kwargs.get("past_key_values")
    if cache is None or cache.get_seq_length() != 0:
        raise ValueError("the course's loop fills the cache from the prompts: it needs an empty past_key_values")
    if hasattr(cache, "check_room"):  # a static cache: refused now rather than after some steps
        cache.check_room(input_ids.shape[0], generation_config.max_length - 1)
    sink = hasattr(cache, "make_room")
    if sink and bool((attention_mask == 0).any()):
        raise ValueError("the sink cache keeps the first columns as every row's sinks, so its prompts take no "
                         "padding: give rows of one length")
    if sink and input_ids.shape[1] > cache.window:
        raise ValueError(f"the sink cache takes a prompt of at most window={cache.window} tokens, got {input_ids.shape[1]}")
    eos = first_id(getattr(generation_config, "_eos_token_tensor", None))
    if eos is None:
        eos = first_id(generation_config.eos_token_id)
    pad = first_id(getattr(generation_config, "_pad_token_tensor", None))
    prompts = PromptRows(input_ids, attention_mask, eos, pad if pad is not None else eos, text_tokenizer)
    # A sink cache has no length limit (that is its point); otherwise the model's positions do.
    config = model.config.get_text_config(decoder=True)
    n_ctx = sys.maxsize if sink else getattr(config, "max_position_embeddings", sys.maxsize)
    front = HFCausalLM(model, n_ctx)
    # The maximum length is the loop's own count; every other criterion (more end-of-text ids,
    # stop strings, a time limit, your own) stops the rows it names.
    criteria = [c for c in (stopping_criteria or []) if not isinstance(c, MaxLengthCriteria)]
    max_new_tokens = generation_config.max_length - input_ids.shape[1]
    wants_dict = bool(generation_config.return_dict_in_generate) or logprobs is not None
    out = generate(front, prompts, prompts.prompts, max_new_tokens, settings=settings, logprobs=logprobs,
                   eos_token_id=eos, stopping_criteria=criteria, stop_strings=stop_strings, seed=seed,
                   return_dict_in_generate=wants_dict, kv_cache=CacheHandle(cache, attention_mask), constraint=constraint)
    sequences = out.sequences if wants_dict else out
    # Part 5 re-pads the prompts with its own pad id; the prompts come back as they were given.
    sequences = torch.cat([input_ids, sequences[:, input_ids.shape[1] :]], dim=1)
    return dataclasses.replace(out, sequences=sequences) if wants_dict else sequences
