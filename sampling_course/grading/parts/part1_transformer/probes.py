"""Part 1's probes: each component on a small config with perturbed weights."""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.grading.matching import plain
from sampling_course.grading.probing import (
    Impl, attn_params, demo_params, generator, ln_params, loaded, mlp_params, probe, randn, small_config, unembed_params,
)


@probe("LayerNorm")
def _probe_layernorm(impl: Impl) -> Any:
    cfg, g = small_config(), generator(1)
    ln = loaded(impl.transformer.LayerNorm(cfg), ln_params(cfg, g))
    # One position with a variance near eps (so where eps goes shows), one normal, one wide.
    scale = torch.tensor([3e-3, 1.0, 4.0])[None, :, None]
    x = randn(g, 2, 3, cfg.d_model) * scale + 0.5
    return plain(ln(x))


@probe("apply_causal_mask")
def _probe_causal_mask(impl: Impl) -> Any:
    cfg, g = small_config(), generator(2)
    attn = impl.transformer.Attention(cfg)
    scores = randn(g, 2, cfg.n_heads, 5, 5)
    masked = attn.apply_causal_mask(scores.clone())
    # Two new queries after three cached keys: the mask must shift right by three.
    cached = scores[:, :, 3:]
    masked_cached = attn.apply_causal_mask(cached.clone())
    # Which scores were hidden: the same whatever the learner writes there (-1e5, -1e10, -inf).
    return plain(masked) != scores, plain(masked_cached) != cached


@probe("Attention")
def _probe_attention(impl: Impl) -> Any:
    cfg, g = small_config(), generator(3)
    attn = loaded(impl.transformer.Attention(cfg), attn_params(cfg, g))
    return plain(attn(randn(g, 2, 5, cfg.d_model)))


@probe("MLP")
def _probe_mlp(impl: Impl) -> Any:
    cfg, g = small_config(), generator(4)
    mlp = loaded(impl.transformer.MLP(cfg), mlp_params(cfg, g))
    return plain(mlp(randn(g, 2, 5, cfg.d_model)))


@probe("Unembed")
def _probe_unembed(impl: Impl) -> Any:
    cfg, g = small_config(), generator(5)
    unembed = loaded(impl.transformer.Unembed(cfg), unembed_params(cfg, g))
    return plain(unembed(randn(g, 2, 5, cfg.d_model)))


@probe("DemoTransformer")
def _probe_demo(impl: Impl) -> Any:
    cfg, g = small_config(), generator(6)
    model = loaded(impl.transformer.DemoTransformer(cfg), demo_params(cfg, g))
    tokens = torch.randint(0, cfg.d_vocab, (2, 6), generator=g)
    return plain(model(tokens))
