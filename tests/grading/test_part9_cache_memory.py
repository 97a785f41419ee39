"""Part 9: the KV-cache size formula against memory measured in real caches.

The formula's values for GPT-2 small and Llama-3-8B are checked against the numbers worked
out by hand; the measured side is the bytes of the storages that Hugging Face's own caches
(GPT2LMHeadModel, LlamaForCausalLM) and the course's ``LlamaCache`` hold after a forward pass,
on the meta device (shapes, no memory, no weights).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.config import Config
from sampling_course.kv_memory import LLAMA3_8B, CacheShape, format_bytes, kv_cache_bytes, memory_rows, storage_bytes
from sampling_course.llama_config import LlamaConfig


def test_formula_by_hand():
    # GPT-2 small, fp32, 1 x 1024: 12 layers x 2 x 1024 positions x 12 heads x 64 x 4 bytes = 72 MiB.
    assert kv_cache_bytes(n_layers=12, batch=1, seq_len=1024, n_kv_heads=12, d_head=64) == 75_497_472
    # Llama-3-8B, bf16, 1 x 8192: 32 x 2 x 8192 x 8 KV heads x 128 x 2 bytes = 1 GiB (4 GiB with 32 KV heads).
    assert CacheShape.of("Llama-3-8B", LLAMA3_8B).bytes(1, 8192, torch.bfloat16) == 2**30
    assert CacheShape.of("Llama-3-8B", LLAMA3_8B).bytes(1, 8192, torch.bfloat16, kv_heads=32) == 4 * 2**30
    assert CacheShape.of("GPT-2 small", Config()).n_kv_heads == 12


def test_rows_state_the_saving():
    row, = memory_rows([CacheShape.of("Llama-3-8B", LLAMA3_8B)], batch=1, seq_len=8192, dtype=torch.bfloat16)
    assert row["saving"] == 4.0 and row["per_token"] == 131_072 and format_bytes(row["total"]) == "1.0 GiB"


def test_formula_rejects_nonsense():
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_bytes(n_layers=1, batch=1, seq_len=-1, n_kv_heads=1, d_head=1)


def test_views_of_one_buffer_count_once():
    buffer = torch.zeros(4, 8)
    assert storage_bytes([buffer[:2], buffer[2:], buffer]) == 4 * 8 * 4
    assert storage_bytes([torch.zeros(3), torch.zeros(3)]) == 24


def test_course_cache_holds_what_the_formula_says(impl):
    """The course's LlamaCache after two appends (a prefill of 40 positions, then 1) at Llama-3-8B's shapes."""
    cfg, cache = LLAMA3_8B, impl.llama.LlamaCache(LLAMA3_8B.n_layers)
    shape = (2, 40, cfg.n_key_value_heads, cfg.d_head)
    for step in (shape, (2, 1, *shape[2:])):
        for layer in range(cfg.n_layers):
            cache.update(layer, torch.empty(step, device="meta", dtype=torch.bfloat16),
                         torch.empty(step, device="meta", dtype=torch.bfloat16))
    measured = storage_bytes([*cache.keys, *cache.values])
    assert measured == kv_cache_bytes(n_layers=32, batch=2, seq_len=41, n_kv_heads=8, d_head=128, dtype=torch.bfloat16)


def hf_cache_bytes(model_type: str, cfg_fields: dict, batch: int, seq_len: int, dtype: torch.dtype) -> int:
    """The bytes of Hugging Face's DynamicCache after one forward pass on the meta device."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig as HFLlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        if model_type == "gpt2":
            model = GPT2LMHeadModel(GPT2Config(**cfg_fields)).to(dtype)
        else:
            model = LlamaForCausalLM(HFLlamaConfig(**LlamaConfig(**cfg_fields).hf_kwargs())).to(dtype)
        out = model(torch.zeros(batch, seq_len, dtype=torch.long), use_cache=True, logits_to_keep=1)
    layers = out.past_key_values.layers
    return storage_bytes([t for layer in layers for t in (layer.keys, layer.values)])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_formula_matches_hugging_face_caches(dtype):
    small_llama = LlamaConfig(d_model=128, d_vocab=512, n_ctx=512, d_head=32, d_mlp=384, n_heads=4, n_key_value_heads=1)
    assert hf_cache_bytes("gpt2", {}, 2, 300, dtype) == CacheShape.of("GPT-2 small", Config()).bytes(2, 300, dtype)
    assert hf_cache_bytes("llama", small_llama.to_dict(), 3, 100, dtype) == CacheShape.of("", small_llama).bytes(3, 100, dtype)
    assert hf_cache_bytes("llama", LLAMA3_8B.to_dict(), 1, 2048, dtype) == CacheShape.of("", LLAMA3_8B).bytes(1, 2048, dtype)
