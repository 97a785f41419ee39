"""Llama-style weights: Hugging Face's names and layout <-> the course's (part 9), and random test weights.

Hugging Face stores each projection as an ``nn.Linear`` weight, (out_features, in_features);
the course keeps TransformerLens' per-head layout, ``W_Q`` of shape (n_heads, d_model, d_head),
so that a head is an index. The conversion is a view and a transpose each way, never a
change of values, so a model converted and converted back is the same model bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sampling_course.llama_config import LlamaConfig


def llama_state_dict(hf_state: dict[str, Tensor], cfg: LlamaConfig) -> dict[str, Tensor]:
    """A ``LlamaForCausalLM``/``Qwen3ForCausalLM`` state dict in the course's names and shapes."""
    d, h, n, kv = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_key_value_heads

    def heads(weight: Tensor, count: int) -> Tensor:  # (count * d_head, d_model) -> (count, d_model, d_head)
        return weight.reshape(count, h, d).transpose(1, 2).contiguous()

    lm_head = hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"])  # tied when absent
    out = {"W_E": hf_state["model.embed_tokens.weight"].clone(), "ln_final.w": hf_state["model.norm.weight"].clone(),
           "W_U": lm_head.T.contiguous()}
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        out[ours + "ln1.w"] = hf_state[hf + "input_layernorm.weight"].clone()
        out[ours + "ln2.w"] = hf_state[hf + "post_attention_layernorm.weight"].clone()
        out[ours + "attn.W_Q"] = heads(hf_state[hf + "self_attn.q_proj.weight"], n)
        out[ours + "attn.W_K"] = heads(hf_state[hf + "self_attn.k_proj.weight"], kv)
        out[ours + "attn.W_V"] = heads(hf_state[hf + "self_attn.v_proj.weight"], kv)
        out[ours + "attn.W_O"] = hf_state[hf + "self_attn.o_proj.weight"].T.reshape(n, h, d).contiguous()
        if cfg.qk_norm:
            out[ours + "attn.q_norm.w"] = hf_state[hf + "self_attn.q_norm.weight"].clone()
            out[ours + "attn.k_norm.w"] = hf_state[hf + "self_attn.k_norm.weight"].clone()
        out[ours + "mlp.W_gate"] = hf_state[hf + "mlp.gate_proj.weight"].T.contiguous()
        out[ours + "mlp.W_in"] = hf_state[hf + "mlp.up_proj.weight"].T.contiguous()
        out[ours + "mlp.W_out"] = hf_state[hf + "mlp.down_proj.weight"].T.contiguous()
    return out


def hf_llama_state_dict(state: dict[str, Tensor], cfg: LlamaConfig) -> dict[str, Tensor]:
    """The course's Llama-style weights in Hugging Face's names and shapes (the inverse of ``llama_state_dict``)."""
    d, h, n, kv = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_key_value_heads

    def linear(weight: Tensor, count: int) -> Tensor:  # (count, d_model, d_head) -> (count * d_head, d_model)
        return weight.transpose(1, 2).reshape(count * h, d).contiguous()

    out = {"model.embed_tokens.weight": state["W_E"].clone(), "model.norm.weight": state["ln_final.w"].clone(),
           "lm_head.weight": state["W_U"].T.contiguous()}
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        out[hf + "input_layernorm.weight"] = state[ours + "ln1.w"].clone()
        out[hf + "post_attention_layernorm.weight"] = state[ours + "ln2.w"].clone()
        out[hf + "self_attn.q_proj.weight"] = linear(state[ours + "attn.W_Q"], n)
        out[hf + "self_attn.k_proj.weight"] = linear(state[ours + "attn.W_K"], kv)
        out[hf + "self_attn.v_proj.weight"] = linear(state[ours + "attn.W_V"], kv)
        out[hf + "self_attn.o_proj.weight"] = state[ours + "attn.W_O"].reshape(n * h, d).T.contiguous()
        if cfg.qk_norm:
            out[hf + "self_attn.q_norm.weight"] = state[ours + "attn.q_norm.w"].clone()
            out[hf + "self_attn.k_norm.weight"] = state[ours + "attn.k_norm.w"].clone()
        out[hf + "mlp.gate_proj.weight"] = state[ours + "mlp.W_gate"].T.contiguous()
        out[hf + "mlp.up_proj.weight"] = state[ours + "mlp.W_in"].T.contiguous()
        out[hf + "mlp.down_proj.weight"] = state[ours + "mlp.W_out"].T.contiguous()
    return out


def random_llama_weights(cfg: LlamaConfig, seed: int) -> dict[str, Tensor]:
    """Deterministic random weights in the course's names, every one perturbed.

    Hugging Face initialises RMSNorm weights to 1, so a model that drops a norm's weight
    would pass on a fresh model; here each norm weight is 1 plus noise (and q/k norm weights
    differ per dimension, so normalising after the rotation instead of before shows). The
    scales keep the logits of order 10, peaked enough for greedy decoding to be stable.
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, std: float) -> Tensor:
        return torch.randn(*shape, generator=g) * std

    def norm(size: int) -> Tensor:
        return 1 + randn(size, std=0.3)

    d, h, n, kv, m = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_key_value_heads, cfg.d_mlp
    out = {"W_E": randn(cfg.d_vocab, d, std=1.0), "ln_final.w": norm(d), "W_U": randn(d, cfg.d_vocab, std=d**-0.5 * 3)}
    for i in range(cfg.n_layers):
        ours = f"blocks.{i}."
        out[ours + "ln1.w"], out[ours + "ln2.w"] = norm(d), norm(d)
        out[ours + "attn.W_Q"] = randn(n, d, h, std=d**-0.5 * 2)
        out[ours + "attn.W_K"] = randn(kv, d, h, std=d**-0.5 * 2)
        out[ours + "attn.W_V"] = randn(kv, d, h, std=d**-0.5)
        out[ours + "attn.W_O"] = randn(n, h, d, std=(n * h) ** -0.5)
        if cfg.qk_norm:
            out[ours + "attn.q_norm.w"], out[ours + "attn.k_norm.w"] = norm(h) * 2, norm(h) * 2
        out[ours + "mlp.W_gate"] = randn(d, m, std=d**-0.5)
        out[ours + "mlp.W_in"] = randn(d, m, std=d**-0.5)
        out[ours + "mlp.W_out"] = randn(m, d, std=m**-0.5)
    return out
