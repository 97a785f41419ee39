"""Part 4's probes: a small random DemoTransformer behind a wrapper that records what the cache
held at every call."""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.config import Config
from sampling_course.grading.matching import plain
from sampling_course.grading.probing import (
    Impl, demo_params, generator, loaded, probe, randn, small_config, tokenizer, word_ids,
)


class _CacheRecorder(torch.nn.Module):
    """Wraps a DemoTransformer and records (input length, cached length) at every call."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.calls: list[tuple[int, int | None]] = []

    def forward(self, tokens: torch.Tensor, kv_cache: Any = None) -> Any:
        self.calls.append((tokens.shape[1], None if kv_cache is None else int(kv_cache.shape[3])))
        return self.model(tokens, kv_cache)


@probe("KeyValueCache")
def _probe_kv_cache(impl: Impl) -> Any:
    cache_cls = impl.kv_cache.KeyValueCache
    cache = cache_cls(randn(generator(70), 2, 2, 3, 5, 2, 4))
    empty = cache_cls.new_empty(small_config(n_layers=2, n_heads=2, d_head=4), batch=3)
    return [int(cache.batch), int(cache.seq_len), plain(cache.k), plain(cache.v), tuple(empty.shape)]


@probe("cached_forward")
def _probe_cached_forward(impl: Impl) -> Any:
    cfg, g = small_config(), generator(71)
    model = loaded(impl.transformer.DemoTransformer(cfg), demo_params(cfg, g))
    tokens = torch.randint(0, cfg.d_vocab, (2, 7), generator=g)
    cache = impl.kv_cache.KeyValueCache.new_empty(cfg, batch=2)
    first, cache = model(tokens[:, :3], cache)
    rest, cache = model(tokens, cache)
    return [plain(first), plain(rest)]


def _cached_sampler(impl: Impl, seed: int) -> tuple[Any, _CacheRecorder, Config]:
    tok = tokenizer()
    cfg = small_config(d_vocab=len(tok), n_ctx=24)
    model = _CacheRecorder(loaded(impl.transformer.DemoTransformer(cfg), demo_params(cfg, generator(seed))))
    return impl.sampling.TransformerSampler(model, tok), model, cfg


@probe("cached_sample")
def _probe_cached_sample(impl: Impl) -> Any:
    sampler, model, cfg = _cached_sampler(impl, 72)
    cache = impl.kv_cache.KeyValueCache.new_empty(cfg)
    text = sampler.sample(tokenizer().decode(word_ids()[:3]), max_tokens_generated=5, temperature=0.0, kv_cache=cache)
    return [text, model.calls]


@probe("cached_beam_search")
def _probe_cached_beam_search(impl: Impl) -> Any:
    sampler, model, cfg = _cached_sampler(impl, 73)
    cache = impl.kv_cache.KeyValueCache.new_empty(cfg)
    out = sampler.beam_search(tokenizer().decode(word_ids()[:3]), num_return_sequences=3, num_beams=3,
                              max_new_tokens=4, kv_cache=cache)
    return [[(float(lp), text) for lp, text in out], model.calls]
