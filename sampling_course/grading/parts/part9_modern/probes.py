"""Part 9's probes: each Llama-style component on a small configuration with perturbed weights.

The configuration has grouped-query attention (4 query heads over 2 key/value heads) and
Qwen3's q/k norms, so every mistake of the part changes some output; positions start past 0
and the cached probes run in two chunks, so the rotation's direction and the cache's offset show.
"""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.grading.matching import plain
from sampling_course.grading.probing import Impl, generator, loaded, probe, randn
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import random_llama_weights


def _config() -> LlamaConfig:
    return LlamaConfig(d_model=16, d_vocab=40, n_ctx=16, d_head=6, d_mlp=24, n_heads=4, n_key_value_heads=2,
                       n_layers=2, qk_norm=True)


def _weights(prefix: str) -> dict[str, torch.Tensor]:
    """The probe model's weights under ``prefix`` (``"blocks.1.attn."``), with the prefix removed."""
    weights = random_llama_weights(_config(), seed=9)
    return {name[len(prefix):]: w for name, w in weights.items() if name.startswith(prefix)}


@probe("RMSNorm")
def _probe_rms_norm(impl: Impl) -> Any:
    cfg, g = _config(), generator(1)
    norm = loaded(impl.llama.RMSNorm(cfg.d_model, 1e-2), _weights("blocks.0.ln1."))
    # One position with a mean square near eps (so where eps goes shows), one with a large mean.
    x = randn(g, 2, 3, cfg.d_model) * torch.tensor([0.05, 1.0, 2.0])[None, :, None]
    return plain(norm(x + torch.tensor([0.0, 0.0, 3.0])[None, :, None]))


@probe("Rotary")
def _probe_rotary(impl: Impl) -> Any:
    cfg, g = _config(), generator(2)
    rotary = impl.llama.Rotary(cfg)
    x = randn(g, 2, 3, cfg.n_heads, cfg.d_head)
    half = rotary(x.bfloat16(), 5)  # what a bfloat16 model hands it
    return [plain(rotary(x, 0)), plain(rotary(x, 5)), str(half.dtype)]


def _cache(impl: Impl, cfg: LlamaConfig) -> Any:
    return impl.llama.LlamaCache(cfg.n_layers)


@probe("GroupedQueryAttention")
def _probe_attention(impl: Impl) -> Any:
    cfg, g = _config(), generator(3)
    attn = loaded(impl.llama.GroupedQueryAttention(cfg, 1), _weights("blocks.1.attn."))
    x = randn(g, 2, 6, cfg.d_model)
    cache = _cache(impl, cfg)
    with torch.no_grad():
        return [plain(attn(x)), plain(attn(x[:, :4], 0, cache)), plain(attn(x[:, 4:], 4, cache))]


@probe("SwiGLU")
def _probe_swiglu(impl: Impl) -> Any:
    cfg, g = _config(), generator(4)
    mlp = loaded(impl.llama.SwiGLU(cfg), _weights("blocks.0.mlp."))
    with torch.no_grad():
        return plain(mlp(randn(g, 2, 5, cfg.d_model)))


@probe("LlamaTransformer")
def _probe_model(impl: Impl) -> Any:
    cfg = _config()
    model = loaded(impl.llama.LlamaTransformer(cfg), random_llama_weights(cfg, seed=9))
    tokens = torch.randint(0, cfg.d_vocab, (2, 7), generator=generator(5))
    cache = model.new_cache() if hasattr(model, "new_cache") else _cache(impl, cfg)
    with torch.no_grad():
        return [plain(model(tokens)), plain(model(tokens[:, :4], cache)[0]), plain(model(tokens[:, :5], cache)[0]),
                plain(model(tokens, cache)[0])]


@probe("rerotate")
def _probe_rerotate(impl: Impl) -> Any:
    cfg, g = _config(), generator(6)
    keys = randn(g, 2, 4, cfg.n_key_value_heads, cfg.d_head)
    return [plain(impl.rope_sink.rerotate(impl.llama.Rotary(cfg), keys, shift)) for shift in (1, 3)]


@probe("RotatingSinkCache.make_room")
def _probe_make_room(impl: Impl) -> Any:
    cfg, g = _config(), generator(7)
    cache = impl.rope_sink.RotatingSinkCache(cfg, n_sink=2, window=3)
    shape = (1, 5, cfg.n_key_value_heads, cfg.d_head)
    for layer in range(cfg.n_layers):
        cache.update(layer, randn(g, *shape), randn(g, *shape))
    evicted = cache.make_room(2)
    return [evicted, [plain(k) for k in cache.keys], [plain(v) for v in cache.values]]
