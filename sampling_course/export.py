"""The course's models saved in Hugging Face's format: folders that ``AutoModelForCausalLM.from_pretrained`` loads.

``export_gpt2`` writes a ``DemoTransformer``'s weights as a ``GPT2LMHeadModel``; ``export_llama``
writes a Llama-style model (part 9) as a ``LlamaForCausalLM``, or a ``Qwen3ForCausalLM`` when it
has q/k norms. Both convert names and layouts only, never values, and save with
``save_pretrained`` (safetensors and config.json), plus the tokenizer when one is given, so
the folder works offline like any checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import einops
import torch
from torch import Tensor

from sampling_course.config import Config
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import hf_llama_state_dict


def gpt2_hf_state_dict(state: dict[str, Tensor], cfg: Config) -> tuple[dict[str, Tensor], bool]:
    """A DemoTransformer state dict in GPT2LMHeadModel's names (the inverse of ``weights.demo_state_dict``),
    and whether the unembedding is tied to the embedding.

    GPT-2's lm_head has no bias: a non-zero ``unembed.b_U`` cannot be written, and is refused.
    """
    b_U = state["unembed.b_U"]
    if torch.count_nonzero(b_U):
        raise ValueError("GPT2LMHeadModel has no unembedding bias, and this model's unembed.b_U is not zero")
    W_E, W_U = state["embed.W_E"], state["unembed.W_U"]
    tied = bool(torch.equal(W_U.T, W_E))
    out = {"transformer.wte.weight": W_E, "transformer.wpe.weight": state["pos_embed.W_pos"],
           "transformer.ln_f.weight": state["ln_final.w"], "transformer.ln_f.bias": state["ln_final.b"],
           "lm_head.weight": W_E if tied else W_U.T}
    for i in range(cfg.n_layers):
        hf, demo = f"transformer.h.{i}.", f"blocks.{i}."

        def flat(name: str) -> Tensor:  # (n, d_model, d_head) -> (d_model, n * d_head), Conv1D's layout
            return einops.rearrange(state[demo + name], "n d_model d_head -> d_model (n d_head)")

        out[hf + "attn.c_attn.weight"] = torch.cat([flat("attn.W_Q"), flat("attn.W_K"), flat("attn.W_V")], dim=1)
        out[hf + "attn.c_attn.bias"] = torch.cat([state[demo + f"attn.b_{x}"].reshape(-1) for x in "QKV"])
        out[hf + "attn.c_proj.weight"] = einops.rearrange(state[demo + "attn.W_O"], "n d_head d -> (n d_head) d")
        out[hf + "attn.c_proj.bias"] = state[demo + "attn.b_O"]
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[hf + f"{theirs}.weight"], out[hf + f"{theirs}.bias"] = state[demo + f"{ours}.w"], state[demo + f"{ours}.b"]
        out[hf + "mlp.c_fc.weight"], out[hf + "mlp.c_fc.bias"] = state[demo + "mlp.W_in"], state[demo + "mlp.b_in"]
        out[hf + "mlp.c_proj.weight"], out[hf + "mlp.c_proj.bias"] = state[demo + "mlp.W_out"], state[demo + "mlp.b_out"]
    return {k: v.detach().cpu().contiguous().clone() for k, v in out.items()}, tied


def _save(model: Any, state: dict[str, Tensor], folder: str | Path, tokenizer: Any) -> Path:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [name for name in missing if name != "lm_head.weight"]:
        raise ValueError(f"the converted weights do not fit: missing {missing}, unexpected {unexpected}")
    folder = Path(folder)
    model.eval().save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def export_gpt2(model: torch.nn.Module, cfg: Config, folder: str | Path, tokenizer: Any = None) -> Path:
    """Save a DemoTransformer (``cfg`` its Config) as a GPT2LMHeadModel folder; returns the folder."""
    if not isinstance(cfg, Config):
        raise TypeError(f"export_gpt2 takes the model's Config, got {type(cfg).__name__}")
    from transformers import GPT2Config, GPT2LMHeadModel

    state, tied = gpt2_hf_state_dict({k: v.detach() for k, v in model.state_dict().items()}, cfg)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else (50256 if cfg.d_vocab > 50256 else None)
    hf_config = GPT2Config(vocab_size=cfg.d_vocab, n_positions=cfg.n_ctx, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                           n_head=cfg.n_heads, n_inner=cfg.d_mlp, layer_norm_epsilon=cfg.layer_norm_eps,
                           activation_function="gelu_new", tie_word_embeddings=tied,
                           # GPT2Config's default end-of-text id (50256) lies outside a smaller vocabulary.
                           bos_token_id=eos, eos_token_id=eos,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        raise ValueError(f"GPT2LMHeadModel needs d_head * n_heads == d_model, got {cfg.d_head} * {cfg.n_heads} != {cfg.d_model}")
    return _save(GPT2LMHeadModel(hf_config), state, folder, tokenizer)


def export_llama(model: torch.nn.Module, cfg: LlamaConfig, folder: str | Path, tokenizer: Any = None) -> Path:
    """Save a Llama-style model as a LlamaForCausalLM folder (Qwen3ForCausalLM with q/k norms); returns the folder."""
    if not isinstance(cfg, LlamaConfig):
        raise TypeError(f"export_llama takes the model's LlamaConfig, got {type(cfg).__name__}")
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if cfg.qk_norm else (HFLlamaConfig, LlamaForCausalLM)
    return _save(model_class(config_class(**cfg.hf_kwargs())), hf_llama_state_dict(state, cfg), folder, tokenizer)
