"""Part 9: the attention-sink cache that re-rotates kept keys, against a brute-force recomputation.

The brute force is built from Hugging Face's own Llama/Qwen3 layers (no code of the course):
for every token, each layer stores the token's *unrotated* key and its value; at every step it
picks the positions a sink cache keeps (the first ``n_sink`` and the last ``window``), rotates
their stored keys afresh at slots 0, 1, ..., L - 1 and the new query at slot L - 1, and
attends. The re-rotating cache must give the same logits at every step: rotating at the old
slot and then back by the shift has to equal rotating at the new slot. Configurations and
weights are part 9's (``test_part9_llama``'s, perturbed, grouped-query, Qwen3's q/k norms).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.grading.tolerances import parity
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import hf_llama_state_dict, random_llama_weights
from sampling_course.weights import load_weights

TOL = parity()
CONFIGS = {
    "llama": LlamaConfig(d_model=64, d_vocab=96, n_ctx=64, d_head=16, d_mlp=160, n_heads=4, n_key_value_heads=2),
    "qwen3": LlamaConfig(d_model=64, d_vocab=96, n_ctx=64, d_head=12, d_mlp=128, n_heads=6, n_key_value_heads=2,
                         rotary_base=1000.0, qk_norm=True),
}
N_SINK, WINDOW, LENGTH = 2, 5, 16


def brute_force_stream(cfg_fields: dict, state: dict, tokens: torch.Tensor, n_sink: int, window: int) -> torch.Tensor:
    """Oracle: the logits of each position of ``tokens``, one token per step, attending to the first
    ``n_sink`` and last ``window`` positions with keys rotated afresh at their slots (Hugging Face's layers)."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    cfg = LlamaConfig(**cfg_fields)
    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if cfg.qk_norm else (HFLlamaConfig, LlamaForCausalLM)
    model = model_class(config_class(**cfg.hf_kwargs())).eval()
    model.load_state_dict(hf_llama_state_dict(state, cfg), strict=True)
    batch, h = tokens.shape[0], cfg.d_head
    raw_keys: list[list[torch.Tensor]] = [[] for _ in range(cfg.n_layers)]
    values: list[list[torch.Tensor]] = [[] for _ in range(cfg.n_layers)]
    logits = []
    with torch.no_grad():
        for t in range(tokens.shape[1]):
            kept = list(range(t + 1)) if t + 1 <= n_sink + window else [*range(n_sink), *range(t + 1 - window, t + 1)]
            slots = torch.arange(len(kept))[None].expand(batch, -1)
            x = model.model.embed_tokens(tokens[:, t : t + 1])
            for i, layer in enumerate(model.model.layers):
                attn, normed = layer.self_attn, layer.input_layernorm(x)
                q = attn.q_proj(normed).view(batch, 1, -1, h)
                k = attn.k_proj(normed).view(batch, 1, -1, h)
                if hasattr(attn, "q_norm"):
                    q, k = attn.q_norm(q), attn.k_norm(k)
                raw_keys[i].append(k)
                values[i].append(attn.v_proj(normed).view(batch, 1, -1, h))
                keys = torch.cat([raw_keys[i][j] for j in kept], dim=1).transpose(1, 2)
                vals = torch.cat([values[i][j] for j in kept], dim=1).transpose(1, 2)
                cos, sin = model.model.rotary_emb(x, slots)
                query, _ = apply_rotary_pos_emb(q.transpose(1, 2), keys[:, :, -1:], cos[:, -1:], sin[:, -1:])
                _, keys = apply_rotary_pos_emb(keys, keys, cos, sin)
                keys, vals = repeat_kv(keys, attn.num_key_value_groups), repeat_kv(vals, attn.num_key_value_groups)
                pattern = (query @ keys.transpose(-1, -2) / h**0.5).softmax(dim=-1)
                z = (pattern @ vals).transpose(1, 2).reshape(batch, 1, -1)
                x = x + attn.o_proj(z)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            logits.append(model.lm_head(model.model.norm(x)))
    return torch.cat(logits, dim=1)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request, impl, device):
    cfg = CONFIGS[request.param]
    weights = random_llama_weights(cfg, 7)
    model = load_weights(impl.llama.LlamaTransformer(cfg), weights).to(device).eval()
    tokens = torch.randint(0, cfg.d_vocab, (2, LENGTH), generator=torch.Generator().manual_seed(8))
    return cfg, weights, model, tokens


def assert_rerotate_is_right(impl) -> None:
    """make_room turns the kept keys with the learner's own ``rerotate``: when that is wrong, say so, so that
    make_room's failure is not read as make_room's mistake."""
    cfg = CONFIGS["qwen3"]
    rotary = impl.llama.Rotary(cfg)
    keys = torch.randn(1, 3, cfg.n_key_value_heads, cfg.d_head, generator=torch.Generator().manual_seed(10))
    for p, s in [(9, 2), (5, 5)]:
        turned = impl.rope_sink.rerotate(rotary, rotary(keys, p), s)
        if not (isinstance(turned, torch.Tensor) and turned.shape == keys.shape
                and torch.allclose(turned, rotary(keys, p - s), **TOL)):
            raise AssertionError(
                f"make_room re-rotates the kept keys with your rerotate, and rerotate is wrong: a key rotated at {p} and "
                f"re-rotated by {s} is not the key rotated at {p - s}. Fix rerotate first: check('rerotate')")


# Graded as make_room's (the exercise after rerotate): the cache needs both; a wrong rerotate is named as the cause.
@pytest.mark.exercise("RotatingSinkCache.make_room")
@pytest.mark.parametrize("n_sink", [N_SINK, 0])
@pytest.mark.parametrize("prefill", [1, 4])
def test_sink_cache_matches_brute_force(setup, impl, oracle, device, n_sink, prefill):
    """Every step's logits, past the capacity, equal the brute force's (with sinks, and as a plain window)."""
    cfg, weights, model, tokens = setup
    assert_rerotate_is_right(impl)
    expected = oracle(brute_force_stream, cfg.to_dict(), weights, tokens, n_sink, WINDOW)
    cache = impl.rope_sink.RotatingSinkCache(cfg, n_sink=n_sink, window=WINDOW)
    actual = impl.rope_sink.stream_logits(model, tokens.to(device), cache, prefill=prefill)
    torch.testing.assert_close(actual, expected.to(actual.device), **TOL,
                               msg=lambda m: f"sink cache (n_sink={n_sink}, prefill={prefill}) differs from the brute force.\n{m}")
    assert cache.seq_len == n_sink + WINDOW


@pytest.mark.exercise("rerotate")
def test_rerotating_equals_rotating_at_the_new_position(impl):
    """A key rotated at p and re-rotated by s equals the key rotated at p - s, for positive and negative s."""
    cfg = CONFIGS["qwen3"]
    rotary = impl.llama.Rotary(cfg)
    keys = torch.randn(2, 6, cfg.n_key_value_heads, cfg.d_head, generator=torch.Generator().manual_seed(9))
    for p, s in [(10, 3), (4, 4), (2, -5)]:
        torch.testing.assert_close(impl.rope_sink.rerotate(rotary, rotary(keys, p), s), rotary(keys, p - s), **TOL)


@pytest.mark.exercise("RotatingSinkCache.make_room")
def test_make_room_keeps_the_sinks_and_the_newest(impl):
    """Evicting 3 of 8 slots (2 sinks): the sinks' values stay, the newest 3 window values move down."""
    cfg = CONFIGS["llama"]
    cache = impl.rope_sink.RotatingSinkCache(cfg, n_sink=2, window=6)
    values = torch.arange(8.0)[None, :, None, None].expand(1, 8, cfg.n_key_value_heads, cfg.d_head)
    for layer in range(cfg.n_layers):
        cache.update(layer, torch.zeros_like(values), values)
    assert cache.make_room(3) == 3
    assert cache.values[1][0, :, 0, 0].tolist() == [0.0, 1.0, 5.0, 6.0, 7.0] and cache.seq_len == 5
    assert cache.make_room(3) == 0


def test_cache_rejects_nonsense(impl):
    with pytest.raises(ValueError, match="window"):
        impl.rope_sink.RotatingSinkCache(CONFIGS["llama"], n_sink=2, window=0)
    cache = impl.rope_sink.RotatingSinkCache(CONFIGS["llama"], n_sink=2, window=4)
    with pytest.raises(ValueError, match="n_new"):
        cache.make_room(5)
