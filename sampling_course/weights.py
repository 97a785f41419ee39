"""Convert a Hugging Face GPT-2 checkpoint into the course's DemoTransformer names."""

from __future__ import annotations

from collections.abc import Mapping

import einops
import torch
from torch import Tensor

from sampling_course.config import Config


def demo_state_dict(source: torch.nn.Module | Mapping[str, Tensor], cfg: Config | None = None) -> dict[str, Tensor]:
    """Return a state dict for ``DemoTransformer(cfg)`` from a Hugging Face GPT-2 checkpoint.

    ``source`` is a ``GPT2LMHeadModel`` (or ``GPT2Model``), whose config gives ``cfg``, or
    the checkpoint's tensors under Hugging Face's names (``reference.weights``) with ``cfg``.

    Hugging Face's GPT-2 stores its linear layers as ``Conv1D`` with weights laid out
    (in_features, out_features), and packs Q, K and V into one ``c_attn`` matrix. The
    course keeps one matrix per head instead, in TransformerLens' layout:
    W_Q/W_K/W_V are [n_heads, d_model, d_head] and W_O is [n_heads, d_head, d_model].
    """
    if isinstance(source, torch.nn.Module):
        cfg = Config.from_hf(source.config)
        sd = {k: v.detach() for k, v in source.state_dict().items()}
    elif cfg is None:
        raise TypeError("demo_state_dict(tensors, cfg): a state dict needs the model's Config")
    else:
        sd = dict(source)
    prefix = "transformer." if "transformer.wte.weight" in sd else ""
    if f"{prefix}wte.weight" not in sd:
        raise ValueError("demo_state_dict expects a GPT2LMHeadModel or GPT2Model (or its state dict)")

    def heads_in(w: Tensor) -> Tensor:
        return einops.rearrange(w, "d_model (n d_head) -> n d_model d_head", n=cfg.n_heads)

    def heads_bias(b: Tensor) -> Tensor:
        return einops.rearrange(b, "(n d_head) -> n d_head", n=cfg.n_heads)

    W_E = sd[f"{prefix}wte.weight"]
    # GPT-2 ties the unembedding to the embedding; an untied lm_head wins when present.
    W_U = sd.get("lm_head.weight", W_E).T
    out: dict[str, Tensor] = {
        "embed.W_E": W_E,
        "pos_embed.W_pos": sd[f"{prefix}wpe.weight"],
        "ln_final.w": sd[f"{prefix}ln_f.weight"],
        "ln_final.b": sd[f"{prefix}ln_f.bias"],
        "unembed.W_U": W_U,
        "unembed.b_U": sd.get("lm_head.bias", torch.zeros(cfg.d_vocab, dtype=W_E.dtype)),
    }
    for i in range(cfg.n_layers):
        hf = f"{prefix}h.{i}."
        demo = f"blocks.{i}."
        W_Q, W_K, W_V = sd[hf + "attn.c_attn.weight"].split(cfg.d_model, dim=1)
        b_Q, b_K, b_V = sd[hf + "attn.c_attn.bias"].split(cfg.d_model, dim=0)
        out.update({
            demo + "ln1.w": sd[hf + "ln_1.weight"],
            demo + "ln1.b": sd[hf + "ln_1.bias"],
            demo + "attn.W_Q": heads_in(W_Q),
            demo + "attn.W_K": heads_in(W_K),
            demo + "attn.W_V": heads_in(W_V),
            demo + "attn.b_Q": heads_bias(b_Q),
            demo + "attn.b_K": heads_bias(b_K),
            demo + "attn.b_V": heads_bias(b_V),
            demo + "attn.W_O": einops.rearrange(
                sd[hf + "attn.c_proj.weight"], "(n d_head) d_model -> n d_head d_model", n=cfg.n_heads
            ),
            demo + "attn.b_O": sd[hf + "attn.c_proj.bias"],
            demo + "ln2.w": sd[hf + "ln_2.weight"],
            demo + "ln2.b": sd[hf + "ln_2.bias"],
            demo + "mlp.W_in": sd[hf + "mlp.c_fc.weight"],
            demo + "mlp.b_in": sd[hf + "mlp.c_fc.bias"],
            demo + "mlp.W_out": sd[hf + "mlp.c_proj.weight"],
            demo + "mlp.b_out": sd[hf + "mlp.c_proj.bias"],
        })
    # Contiguous copies (one copy each), so the demo model never shares storage with the HF model.
    return {k: v.clone(memory_format=torch.contiguous_format) for k, v in out.items()}


def load_weights(model: torch.nn.Module, state_dict: dict[str, Tensor]) -> torch.nn.Module:
    """Copy ``state_dict`` (e.g. from ``demo_state_dict``) into ``model``'s parameters; return ``model``.

    Every parameter must be matched: a parameter the weights lack, a weight the model has
    no parameter for, or a shape that differs raises a ValueError naming each one. Buffers
    are the exception: a model may create its own constants (the classic text registers the
    mask value with ``register_buffer("IGNORE", ...)``, which puts it in the state dict),
    and those keep the value the model gave them.
    """
    import difflib

    params = dict(model.named_parameters(remove_duplicate=False))  # tied weights under each name
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    missing = sorted(set(params) - set(state_dict))
    extra = sorted(set(state_dict) - set(params) - buffers)
    # A missing parameter next to an extra weight of a similar name is most likely a misspelling.
    renamed = {}
    for name in missing:
        close = difflib.get_close_matches(name, [e for e in extra if e not in renamed.values()], n=1, cutoff=0.6)
        if close:
            renamed[name] = close[0]
    problems = [f"the model calls {name!r} what the weights call {renamed[name]!r}" if name in renamed
                else f"the model's parameter {name!r} is not in the weights" for name in missing]
    problems += [f"the weights have {name!r}, which the model has no parameter for"
                 for name in extra if name not in renamed.values()]
    problems += [
        f"{name!r} has shape {tuple(params[name].shape)} in the model but {tuple(tensor.shape)} in the weights"
        for name, tensor in state_dict.items()
        if name in params and params[name].shape != tensor.shape
    ]
    if problems:
        raise ValueError(
            f"cannot load the weights into {type(model).__name__}: " + "; ".join(problems)
            + ". Parameter names and shapes must follow the course's (W_E, W_pos, W_Q of shape "
            "[n_heads, d_model, d_head], ln1.w, ...)."
        )
    with torch.no_grad():
        for name, tensor in state_dict.items():
            if name in params:
                params[name].copy_(tensor)
    return model
