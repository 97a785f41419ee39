# GENERATED from solutions/speculative_loop.py by `sampling-course make-exercises`.
# Given code: nothing to fill in here; it runs on the exercises of the other files.
# stub-checksum: 37ddec5af43126009740a309221af77d896c60de8d26002db4622463be37a61e
"""Part 7: the speculative generation loop, written for you.

``speculative_generate`` runs the rounds of solutions/speculative.py (propose, judge,
forget the rejected) until the text is long enough or ends, with a model as the draft or
with prompt lookup, and counts what each round did (``SpeculativeStats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor

from sampling_course.sampling_settings import check_sampling_settings

from .kv_cache import KeyValueCache
from .speculative import (
    PromptLookupDraft,
    device_and_dtype,
    filtered_probs,
    prompt_lookup,
    speculative_round,
)


def target_step(
    target, tokens: Int[Tensor, "pos"], target_cache: KeyValueCache, temperature: float, top_k: int, top_p: float,
    generator: torch.Generator | None,
) -> tuple[Int[Tensor, "1"], KeyValueCache]:
    """One plain step of the target (a round with nothing proposed): one token drawn from its filtered distribution."""
    logits, target_cache = target(tokens[None], target_cache)
    p = filtered_probs(logits[0, -1], temperature, top_k, top_p)
    new = torch.multinomial(p, num_samples=1, generator=generator)
    return new, target_cache



@dataclass
class SpeculativeStats:
    """What a run of ``speculative_generate`` did.

    ``proposed``: tokens the draft proposed. ``judged``: proposals the acceptance rule
    looked at (in each round, the accepted ones and the first rejected one, if any).
    ``accepted``: proposals kept. ``accepted_per_round``: the accepted count of each round.
    """

    gamma: int
    new_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    proposed: int = 0
    judged: int = 0
    accepted: int = 0
    accepted_per_round: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """alpha: the fraction of judged proposals that were accepted (nan before any round)."""
        return self.accepted / self.judged if self.judged else float("nan")

    @property
    def tokens_per_target_forward(self) -> float:
        """New tokens per forward pass of the target (1.0 for plain decoding; nan before any round)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else float("nan")

    def record_round(self, proposed: int, accepted: int, draft_forwards: int | None = None) -> None:
        self.target_forwards += 1
        # draft_tokens runs one forward pass per proposal (a prompt-lookup draft none)
        self.draft_forwards += proposed if draft_forwards is None else draft_forwards
        self.proposed += proposed
        self.accepted += accepted
        self.judged += accepted + (accepted < proposed)
        self.accepted_per_round.append(accepted)


@torch.inference_mode()
def speculative_generate(
    target,
    draft,
    tokenizer,
    prompt: str,
    max_new_tokens: int,
    *,
    gamma: int = 4,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    return_stats: bool = False,
    cache_class=KeyValueCache,
    prompt_lookup_num_tokens: int | None = None,
    max_matching_ngram_size: int = 2,
):
    """Continue ``prompt`` with the ``target``'s distribution, letting ``draft`` propose ``gamma`` tokens per round.

    ``draft`` is a model, or a ``PromptLookupDraft``: then each round proposes what
    ``prompt_lookup`` finds (up to ``gamma`` tokens; a round where it finds nothing is one
    plain step of the target). ``prompt_lookup_num_tokens=k`` (Hugging Face's setting,
    with ``max_matching_ngram_size``) is the same as ``draft=PromptLookupDraft(...)`` and
    ``gamma=k``; pass ``draft=None`` with it.

    The filters (``temperature``, ``top_k``, ``top_p``) shape the target's and the draft's
    distributions alike (see ``filtered_probs``); temperature 0 gives the target's greedy
    text, token for token. ``seed`` makes the run reproducible (its own
    ``torch.Generator``; torch's global generator is left alone); without it, the global
    generator is used. Generation stops after ``max_new_tokens`` tokens or right after the
    end-of-text token.

    ``tokenizer`` is the one tokenizer both models use, or a pair
    ``(target_tokenizer, draft_tokenizer)``, which must have the same vocabulary.

    ``cache_class`` makes both models' caches, with ``cache_class.new_empty(cfg, device=...,
    dtype=...)``: part 4's ``KeyValueCache`` (the default), which ``crop_cache`` slices, or
    part 6's ``StaticKeyValueCache``, which crops itself by moving a counter and runs the
    fast path.

    Returns the decoded prompt plus continuation, like ``TransformerSampler.sample``; with
    ``return_stats=True``, a pair ``(text, SpeculativeStats)``.
    """
    tokenizer = shared_tokenizer(tokenizer)
    if prompt_lookup_num_tokens is not None:
        if draft is not None:
            raise ValueError("prompt_lookup_num_tokens drafts by prompt lookup: pass draft=None with it")
        draft, gamma = PromptLookupDraft(max_matching_ngram_size), prompt_lookup_num_tokens
    lookup = isinstance(draft, PromptLookupDraft)
    if lookup:
        draft = PromptLookupDraft(draft.max_ngram_size, getattr(target, "cfg", None) and target.cfg.d_vocab)
        if isinstance(draft.max_ngram_size, bool) or not isinstance(draft.max_ngram_size, int) or draft.max_ngram_size < 1:
            raise ValueError(f"max_matching_ngram_size must be an integer >= 1, got {draft.max_ngram_size!r}")
    check_models(target, draft, tokenizer)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (the number of tokens the draft proposes per round) must be an integer >= 1, got {gamma!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    check_sampling_settings(temperature, top_k, top_p)
    if not callable(getattr(cache_class, "new_empty", None)):
        raise TypeError(
            "cache_class must be a cache class with new_empty(cfg, device=..., dtype=...), such as KeyValueCache "
            f"or part 6's StaticKeyValueCache; got {cache_class!r}"
        )

    device, dtype = device_and_dtype(target)
    tokens = tokenizer.encode(prompt, return_tensors="pt")[0].to(device)
    n_prompt = len(tokens)
    draft_cfg = target.cfg if lookup else draft.cfg
    n_ctx = min(target.cfg.n_ctx, draft_cfg.n_ctx)
    if n_prompt + max_new_tokens > n_ctx:
        raise ValueError(
            f"the prompt ({n_prompt} tokens) plus max_new_tokens={max_new_tokens} is longer than n_ctx={n_ctx} "
            f"(target {target.cfg.n_ctx}, draft {draft_cfg.n_ctx}): both caches hold every position, and the "
            "target's look-ahead over the proposals must fit too (the last round proposes no more tokens than "
            "are still wanted, so it never reaches past prompt + max_new_tokens). Shorten one of them"
        )
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    target_cache = cache_class.new_empty(target.cfg, device=device, dtype=dtype)
    # A prompt-lookup draft has no model: its cache stays empty.
    draft_cache = cache_class.new_empty(draft_cfg, device=device, dtype=dtype if lookup else device_and_dtype(draft)[1])
    eos = getattr(tokenizer, "eos_token_id", None)
    stats = SpeculativeStats(gamma=gamma)

    while len(tokens) - n_prompt < max_new_tokens:
        wanted = max_new_tokens - (len(tokens) - n_prompt)
        # The last round proposes no more tokens than are still wanted.
        n_draft = min(gamma, wanted)
        if lookup:  # propose only what the lookup finds
            n_draft = len(prompt_lookup(tokens, n_draft, draft.max_ngram_size))
        if n_draft == 0:
            new, target_cache = target_step(target, tokens, target_cache, temperature, top_k, top_p, generator)
        else:
            new, target_cache, draft_cache = speculative_round(
                target, draft, tokens, target_cache, draft_cache, n_draft, temperature, top_k, top_p, generator
            )
        stats.record_round(n_draft, len(new) - 1, draft_forwards=0 if lookup else None)
        new = new[:wanted]
        ends = (new == eos).nonzero() if eos is not None else []
        if len(ends):
            new = new[: int(ends[0]) + 1]  # the end-of-text token is kept, as in TransformerSampler.sample
        tokens = torch.cat([tokens, new])
        stats.new_tokens += len(new)
        if len(ends):
            break
    text = tokenizer.decode(tokens)
    return (text, stats) if return_stats else text


# ---------------------------------------------------------------------------------------
# Checks: bad input fails early, saying what is wrong and what is allowed
# ---------------------------------------------------------------------------------------


def shared_tokenizer(tokenizer):
    """The tokenizer both models use; a ``(target, draft)`` pair must share one vocabulary."""
    if not isinstance(tokenizer, (tuple, list)):
        return tokenizer
    if len(tokenizer) != 2:
        raise ValueError(f"tokenizer must be one tokenizer or a pair (target_tokenizer, draft_tokenizer), got {len(tokenizer)} items")
    target_tok, draft_tok = tokenizer
    if target_tok is not draft_tok and target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError(
            "the target's and the draft's tokenizers have different vocabularies: speculative decoding "
            "compares p and q token by token, so both models must use one tokenizer (the same token ids "
            "for the same text)"
        )
    return target_tok


def check_models(target, draft, tokenizer) -> None:
    if isinstance(draft, PromptLookupDraft):  # no model to check: it shares the target's vocabulary by construction
        draft = target
    for name, model in (("target", target), ("draft", draft)):
        if not callable(model) or not hasattr(getattr(model, "cfg", None), "d_vocab"):
            raise TypeError(
                f"{name} must be a model with a cfg (a DemoTransformer), called as model(tokens, kv_cache); "
                f"got {type(model).__name__}"
            )
    if target.cfg.d_vocab != draft.cfg.d_vocab:
        raise ValueError(
            f"the target and the draft must share one vocabulary, but the target has d_vocab={target.cfg.d_vocab} "
            f"and the draft d_vocab={draft.cfg.d_vocab}: speculative decoding compares p and q token by token, "
            "so both models must use the same tokenizer"
        )
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    if size is not None and size > target.cfg.d_vocab:
        raise ValueError(
            f"the tokenizer has {size} tokens but the models only d_vocab={target.cfg.d_vocab}: "
            "use the tokenizer the models were trained with"
        )
