"""Part 9: the Llama-style decoder against Hugging Face's LlamaForCausalLM and Qwen3ForCausalLM.

Both references are small random configurations built offline from the same weights as the
model under test (``random_llama_weights``: every parameter perturbed, RMSNorm weights
included, so a model that drops a norm cannot pass). The Llama configuration has
grouped-query attention (4 query heads over 2 key/value heads); the Qwen3 one adds q/k norms
and a head size that is not d_model / n_heads. Hugging Face's outputs (logits, each
sub-layer's input and output through forward hooks, its rotary embedding, its greedy
``generate``) come through the ``oracle`` fixture. Tolerances are part 1's
(``grading/tolerances.py``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from sampling_course.grading.tolerances import parity
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import hf_llama_state_dict, llama_state_dict, random_llama_weights
from sampling_course.weights import load_weights

TOL = parity()

CONFIGS = {
    "llama": LlamaConfig(d_model=64, d_vocab=96, n_ctx=64, d_head=16, d_mlp=160, n_heads=4, n_key_value_heads=2,
                         n_layers=2, eps=1e-6, rotary_base=10000.0),
    "qwen3": LlamaConfig(d_model=64, d_vocab=96, n_ctx=64, d_head=12, d_mlp=128, n_heads=6, n_key_value_heads=2,
                         n_layers=2, eps=1e-6, rotary_base=1000.0, qk_norm=True),
}
SEED = 33


def hf_model(cfg_fields: dict, state: dict):
    """The Hugging Face model of a configuration (Llama, or Qwen3 with q/k norms) holding ``state``."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cfg = LlamaConfig(**cfg_fields)
    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if cfg.qk_norm else (HFLlamaConfig, LlamaForCausalLM)
    model = model_class(config_class(**cfg.hf_kwargs(), attn_implementation="eager"))
    model.load_state_dict(hf_llama_state_dict(state, cfg), strict=True)
    return model.eval()


def hf_run(cfg_fields: dict, state: dict, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Oracle: Hugging Face's logits and each sub-layer's input and output (forward hooks)."""
    model = hf_model(cfg_fields, state)
    seen: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(module, args, kwargs, output):
            inputs = args[0] if args else kwargs["hidden_states"]
            seen[f"{name}.in"] = inputs.detach().clone()
            seen[f"{name}.out"] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        return hook

    for i, layer in enumerate(model.model.layers):
        for part, module in (("ln1", layer.input_layernorm), ("attn", layer.self_attn),
                             ("ln2", layer.post_attention_layernorm), ("mlp", layer.mlp)):
            module.register_forward_hook(record(f"blocks.{i}.{part}"), with_kwargs=True)
        if hasattr(layer.self_attn, "q_norm"):
            layer.self_attn.q_norm.register_forward_hook(record(f"blocks.{i}.q_norm"), with_kwargs=True)
    model.model.norm.register_forward_hook(record("ln_final"), with_kwargs=True)
    with torch.no_grad():
        seen["logits"] = model(tokens).logits
    return seen


def hf_norm(cfg_fields: dict, state: dict, x: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's first RMSNorm (layer 0's input_layernorm) on ``x``."""
    with torch.no_grad():
        return hf_model(cfg_fields, state).model.layers[0].input_layernorm(x)


def hf_rotary(cfg_fields: dict, state: dict, q: torch.Tensor, k: torch.Tensor, offset: int):
    """Oracle: Hugging Face's rotary embedding of q and k (batch, pos, heads, d_head) at positions offset, ...."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = hf_model(cfg_fields, state)
    positions = torch.arange(offset, offset + q.shape[1])[None].expand(q.shape[0], -1)
    cos, sin = model.model.rotary_emb(q, positions)
    return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)


def hf_greedy(cfg_fields: dict, state: dict, tokens: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Oracle: Hugging Face's greedy ``generate`` (with its own KV cache)."""
    model = hf_model(cfg_fields, state)
    model.generation_config.eos_token_id = None  # random weights: run all the steps, whatever token comes
    return model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=max_new_tokens,
                          do_sample=False, pad_token_id=0)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    expected = expected.to(actual.device)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, **TOL, msg=lambda m: f"{what} differs from Hugging Face's.\n{m}")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def arch(request, impl, oracle, device):
    """One configuration: its weights, the model under test holding them, and Hugging Face's run on a batch."""
    cfg = CONFIGS[request.param]
    weights = random_llama_weights(cfg, SEED)
    model = load_weights(impl.llama.LlamaTransformer(cfg), weights).to(device).eval()
    tokens = torch.randint(0, cfg.d_vocab, (2, 11), generator=torch.Generator().manual_seed(1))
    run = oracle(hf_run, cfg.to_dict(), weights, tokens)
    return dict(name=request.param, cfg=cfg, weights=weights, model=model, tokens=tokens, run=run, device=device)


# ---------------------------------------------------------------------------------------
# Configuration and weights
# ---------------------------------------------------------------------------------------


def hf_config_fields(cfg_fields: dict) -> dict:
    """Oracle: the transformers config built from ``hf_kwargs``, read back through ``LlamaConfig.from_hf``."""
    cfg = LlamaConfig(**cfg_fields)
    return LlamaConfig.from_hf(hf_model(cfg_fields, random_llama_weights(cfg, 0)).config).to_dict()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_round_trips_through_hugging_face(name, oracle):
    assert oracle(hf_config_fields, CONFIGS[name].to_dict()) == CONFIGS[name].to_dict()


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="multiple of n_key_value_heads"):
        LlamaConfig(n_heads=4, n_key_value_heads=3)
    with pytest.raises(ValueError, match="d_head must be even"):
        LlamaConfig(d_head=7)
    with pytest.raises(ValueError, match="n_layers"):
        LlamaConfig(n_layers=0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_weight_conversion_round_trips_exactly(name):
    cfg = CONFIGS[name]
    weights = random_llama_weights(cfg, SEED)
    back = llama_state_dict(hf_llama_state_dict(weights, cfg), cfg)
    assert back.keys() == weights.keys() and all(torch.equal(back[k], weights[k]) for k in weights)


def test_random_weights_perturb_every_norm():
    """No RMSNorm weight is all ones: a model that drops one would otherwise pass."""
    for cfg in CONFIGS.values():
        weights = random_llama_weights(cfg, SEED)
        norms = [k for k in weights if k.endswith(".w")]
        assert norms and all(not torch.allclose(weights[k], torch.ones_like(weights[k])) for k in norms)


# ---------------------------------------------------------------------------------------
# Components against Hugging Face's sub-layers
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("RMSNorm")
def test_rms_norm_matches_hugging_face(arch):
    model, run, dev = arch["model"], arch["run"], arch["device"]
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            for part in ("ln1", "ln2"):
                name = f"blocks.{i}.{part}"
                assert_close(getattr(block, part)(run[f"{name}.in"].to(dev)), run[f"{name}.out"], name)
            if block.attn.q_norm is not None:
                name = f"blocks.{i}.q_norm"
                assert_close(block.attn.q_norm(run[f"{name}.in"].to(dev)), run[f"{name}.out"], name)
        assert_close(model.ln_final(run["ln_final.in"].to(dev)), run["ln_final.out"], "ln_final")


@pytest.mark.exercise("RMSNorm")
def test_rms_norm_eps_inside_the_sqrt(arch, oracle):
    """On vectors whose mean square is near eps, only sqrt(mean(x^2) + eps) matches."""
    x = 1e-3 * torch.randn(2, 3, arch["cfg"].d_model, generator=torch.Generator().manual_seed(2))
    expected = oracle(hf_norm, arch["cfg"].to_dict(), arch["weights"], x)
    with torch.no_grad():
        actual = arch["model"].blocks[0].ln1(x.to(arch["device"]))
    torch.testing.assert_close(actual, expected.to(actual.device), rtol=1e-4, atol=1e-7)


@pytest.mark.exercise("Rotary")
@pytest.mark.parametrize("offset", [0, 7])
def test_rotary_matches_hugging_face(arch, oracle, offset):
    """Queries and keys rotated at positions offset, offset + 1, ... as Hugging Face rotates them."""
    cfg = arch["cfg"]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, cfg.n_heads, cfg.d_head, generator=g)
    k = torch.randn(2, 5, cfg.n_key_value_heads, cfg.d_head, generator=g)
    expected_q, expected_k = oracle(hf_rotary, cfg.to_dict(), arch["weights"], q, k, offset)
    rotary = arch["model"].blocks[0].attn.rotary
    assert_close(rotary(q.to(arch["device"]), offset), expected_q, f"rotated queries at offset {offset}")
    assert_close(rotary(k.to(arch["device"]), offset), expected_k, f"rotated keys at offset {offset}")


@pytest.mark.exercise("Rotary")
def test_rotary_gives_back_the_dtype_it_was_given(arch, oracle):
    """bfloat16 heads come back in bfloat16, rotated as Hugging Face rotates them (which casts cos and sin to
    the heads' dtype): a bfloat16 model's attention must not receive float32 queries and keys."""
    cfg = arch["cfg"]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 5, cfg.n_heads, cfg.d_head, generator=g).bfloat16()
    k = torch.randn(2, 5, cfg.n_key_value_heads, cfg.d_head, generator=g).bfloat16()
    expected_q, _ = oracle(hf_rotary, cfg.to_dict(), arch["weights"], q, k, 7)
    rotated = arch["model"].blocks[0].attn.rotary(q.to(arch["device"]), 7)
    assert rotated.dtype == torch.bfloat16, (
        f"Rotary turned bfloat16 heads into {rotated.dtype}: cos and sin are float32, so give the result back in "
        "x's dtype (.to(x.dtype)); a bfloat16 model's attention would otherwise mix float32 keys with bfloat16 weights")
    # A few bfloat16 roundings apart: Hugging Face rotates in bfloat16, a float32 rotation cast back is as right.
    torch.testing.assert_close(rotated.float(), expected_q.float().to(rotated.device), rtol=0.05, atol=0.05)


@pytest.mark.exercise("Rotary")
def test_rotary_scores_depend_on_distance_only(arch):
    """A rotated query and key give the same score at positions (m, n) as at (m + 9, n + 9)."""
    cfg, dev = arch["cfg"], arch["device"]
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 6, 1, cfg.d_head, generator=g).to(dev), torch.randn(1, 6, 1, cfg.d_head, generator=g).to(dev)
    rotary = arch["model"].blocks[0].attn.rotary
    near = torch.einsum("bqnh,bknh->qk", rotary(q, 0), rotary(k, 0))
    far = torch.einsum("bqnh,bknh->qk", rotary(q, 9), rotary(k, 9))
    torch.testing.assert_close(far, near, **TOL)


@pytest.mark.exercise("GroupedQueryAttention")
def test_attention_matches_hugging_face(arch):
    model, run, dev = arch["model"], arch["run"], arch["device"]
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            name = f"blocks.{i}.attn"
            assert_close(block.attn(run[f"{name}.in"].to(dev)), run[f"{name}.out"], name)


@pytest.mark.exercise("GroupedQueryAttention")
def test_attention_with_a_cache_matches_the_full_sequence(arch, impl):
    """Attention run in chunks (6 positions, then 1, then 4) through a cache gives Hugging Face's outputs
    of those positions in the full sequence."""
    model, run, dev, cfg = arch["model"], arch["run"], arch["device"], arch["cfg"]
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            name, cache, start = f"blocks.{i}.attn", impl.llama.LlamaCache(cfg.n_layers), 0
            x = run[f"{name}.in"].to(dev)
            for stop in (6, 7, 11):
                out = block.attn(x[:, start:stop], start, cache)
                assert_close(out, run[f"{name}.out"][:, start:stop], f"{name} on positions {start}..{stop - 1}")
                start = stop


@pytest.mark.exercise("SwiGLU")
def test_swiglu_matches_hugging_face(arch):
    model, run, dev = arch["model"], arch["run"], arch["device"]
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            name = f"blocks.{i}.mlp"
            assert_close(block.mlp(run[f"{name}.in"].to(dev)), run[f"{name}.out"], name)


# ---------------------------------------------------------------------------------------
# The whole model
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("LlamaTransformer")
def test_logits_match_hugging_face(arch):
    with torch.no_grad():
        logits = arch["model"](arch["tokens"].to(arch["device"]))
    assert_close(logits, arch["run"]["logits"], f"{arch['name']} logits")


def one_block_steps_right(model, tokens: torch.Tensor, position: int) -> bool:
    """Whether the model cut to its first block gives, through a cache, the step at ``position`` that its own
    uncached pass gives: a model right in one block and wrong in several numbers its layers differently."""
    one = copy.deepcopy(model)
    one.blocks = one.blocks[:1]
    cache = one.new_cache()
    one(tokens[:, :position], cache)
    step, _ = one(tokens[:, : position + 1], cache)
    return torch.allclose(step, one(tokens[:, : position + 1])[:, -1:], **TOL)


@pytest.mark.exercise("LlamaTransformer")
def test_cached_steps_match_the_full_forward(arch):
    """A prefill of 5 tokens and then one token per step through a cache (the model given the whole sequence so
    far, as with every cache of the course): the logits of every step are Hugging Face's logits of that position
    in the full sequence."""
    model, tokens, expected = arch["model"], arch["tokens"].to(arch["device"]), arch["run"]["logits"]
    cache = model.new_cache()
    with torch.no_grad():
        prefill, cache = model(tokens[:, :5], cache)
        assert_close(prefill, expected[:, :5], "prefill logits")
        for position in range(5, tokens.shape[1]):
            step, cache = model(tokens[:, : position + 1], cache)  # the whole sequence so far; the cache runs the new one
            wanted = expected[:, position : position + 1].to(step.device)
            if not torch.allclose(step, wanted, **TOL) and torch.allclose(model(tokens[:, : position + 1])[:, -1:], wanted, **TOL) \
                    and one_block_steps_right(model, tokens, position):
                raise AssertionError(
                    f"the cached step at position {position} differs from Hugging Face's, though the uncached pass is "
                    "right and the same model cut to its first block steps right: the later blocks see the new token "
                    "differently. Most often they number it differently: cache.seq_len grows as each layer adds its "
                    "keys, so take the positions from the cache's step (cache.prepare) once, before the loop over the "
                    "blocks, and give every block the same ones")
            assert_close(step, expected[:, position : position + 1], f"cached step at position {position}")


@pytest.mark.exercise("LlamaTransformer")
def test_greedy_tokens_match_hugging_face_generate(arch, oracle, impl):
    """Twelve cached greedy steps give the tokens Hugging Face's greedy ``generate`` gives."""
    prompt = arch["tokens"][:, :4]
    expected = oracle(hf_greedy, arch["cfg"].to_dict(), arch["weights"], prompt, 12)
    actual = impl.llama.greedy(arch["model"], prompt.to(arch["device"]), 12)
    assert actual.tolist() == expected.tolist()


def test_model_rejects_a_gpt2_config(impl):
    from sampling_course.config import Config

    with pytest.raises(TypeError, match="LlamaConfig"):
        impl.llama.LlamaTransformer(Config())
