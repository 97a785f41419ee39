"""Part 9's Llama-style model in the course's engine: parts 3 to 6 decode it unchanged.

Parts 3 to 6 call their model as part 4's ``DemoTransformer`` is called:
``model(tokens)`` gives logits, and ``model(tokens, cache, attention_mask=...)`` runs the
positions of ``tokens`` the cache does not hold yet and gives ``(their logits, the cache)``.
``LlamaForEngine(model)`` puts part 9's ``LlamaTransformer`` behind that call, so part 5's
``generate`` (sampling, greedy, and Hugging Face's beam search with ``num_beams``) and part 3's
``Beams`` run it:

    generate(LlamaForEngine(model), tokenizer, prompts, 20, num_beams=3, temperature=0.0)

It takes three caches:

* part 4's ``KeyValueCache`` (what ``generate`` makes by default; beam search indexes its rows).
  Its shape is ``(n_layers, 2, batch, seq_len, n_key_value_heads, d_head)``: with grouped-query
  attention a layer caches its key/value heads only, so ``cfg``, the configuration the engine
  reads (``d_vocab``, ``n_ctx``, and the cache's shape), has ``n_heads = n_key_value_heads``.
  Each step hands the cached keys to the model as a ``LlamaCache`` and stacks them back.
* part 6's ``StaticKeyValueCache`` (``StaticKeyValueCache.new_empty(engine.cfg, batch,
  max_len)``): the model writes each layer's keys into it through its ``update``, in place,
  and the engine moves its count of filled positions on after the last layer, as part 6's own
  forward pass does. Part 3's ``Beams`` reorders it in place.
* part 9's ``LlamaCache`` (or ``RotatingSinkCache``), which the model fills itself.

The model has no attention mask: its rows are unpadded, each token at its index in the row.
So the prompts of a batch must have one length (left padding is refused, with a ValueError); a
row that ends early and is padded at its end is fine, since nothing of it is read again.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from sampling_course.config import Config


class LlamaForEngine(nn.Module):
    """Part 9's ``LlamaTransformer`` called as part 4's ``DemoTransformer``: ``(tokens, cache, attention_mask)``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        llama = getattr(model, "cfg", None)
        if not all(hasattr(llama, name) for name in ("n_key_value_heads", "d_head", "n_layers")) or not hasattr(model, "new_cache"):
            raise TypeError(f"LlamaForEngine takes part 9's LlamaTransformer, got {type(model).__name__}")
        self.model = model
        # What the engine reads: the vocabulary, the context, and the shape of the cache it makes (key/value heads).
        self.cfg = Config(d_model=llama.d_model, debug=False, d_vocab=llama.d_vocab, n_ctx=llama.n_ctx,
                          d_head=llama.d_head, d_mlp=llama.d_mlp, n_heads=llama.n_key_value_heads,
                          n_layers=llama.n_layers)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        kv_cache=None,
        *,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ):
        """Logits at every position of ``tokens``; with a cache, ``(logits of the positions it lacked, the cache)``."""
        if not isinstance(tokens, Tensor) or tokens.ndim != 2:
            raise ValueError(f"tokens must be a (batch, pos) tensor of token ids, got {tokens!r:.80}")
        if attention_mask is not None:
            check_unpadded(attention_mask, tokens)
        if kv_cache is None:
            return self.model(tokens)
        if isinstance(kv_cache, Tensor):  # part 4's KeyValueCache
            return self.tensor_cache_forward(tokens, kv_cache)
        if all(hasattr(kv_cache, name) for name in ("update", "reorder", "crop", "buffer")):  # part 6's static cache
            return self.static_cache_forward(tokens, kv_cache)
        if isinstance(getattr(kv_cache, "keys", None), list) and hasattr(kv_cache, "update"):  # part 9's LlamaCache
            logits = self.model(tokens[:, kv_cache.seq_len :], kv_cache)
            return logits, kv_cache
        raise TypeError("kv_cache must be part 4's KeyValueCache, part 6's StaticKeyValueCache or part 9's LlamaCache, "
                        f"got {type(kv_cache).__name__}")

    def tensor_cache_forward(
        self, tokens: Int[Tensor, "batch pos"], kv_cache: Tensor
    ) -> tuple[Float[Tensor, "batch new_pos d_vocab"], Tensor]:
        """Part 4's cache, handed to the model as a ``LlamaCache`` (views, no copy) and stacked back after."""
        weight = next(self.model.parameters())
        kv_cache = kv_cache.on_device_of(weight)
        kv_cache.check_compatible(self.cfg, tokens)
        past, raw = kv_cache.seq_len, kv_cache.as_subclass(Tensor)
        cache = self.model.new_cache()
        if past:
            cache.keys, cache.values = list(raw[:, 0].unbind(0)), list(raw[:, 1].unbind(0))
        logits = self.model(tokens[:, past:], cache)
        layers = [torch.stack([k, v]) for k, v in zip(cache.keys, cache.values)]
        return logits, type(kv_cache)(torch.stack(layers))

    def static_cache_forward(
        self, tokens: Int[Tensor, "batch pos"], kv_cache
    ) -> tuple[Float[Tensor, "batch new_pos d_vocab"], object]:
        """Part 6's cache: the model writes into its buffer through ``update``; the filled count moves on after."""
        weight = next(self.model.parameters())
        if kv_cache.seq_len == 0:  # an empty cache made without a device or dtype follows the model
            device = weight.device if kv_cache.follows_device else kv_cache.buffer.device
            dtype = weight.dtype if kv_cache.follows_dtype else kv_cache.buffer.dtype
            if (kv_cache.buffer.device, kv_cache.buffer.dtype) != (device, dtype):
                kv_cache.buffer = torch.empty(kv_cache.buffer.shape, device=device, dtype=dtype)
        if kv_cache.buffer.device != weight.device or kv_cache.buffer.dtype != weight.dtype:
            raise ValueError(f"the cache holds {kv_cache.buffer.dtype} on {kv_cache.buffer.device} but the model computes "
                             f"in {weight.dtype} on {weight.device}: make it with new_empty(engine.cfg, ...) without a "
                             "device or dtype (it follows the model)")
        kv_cache.check_compatible(self.cfg, tokens)
        logits = self.model(tokens[:, kv_cache.seq_len :], kv_cache)
        kv_cache.seq_len = tokens.shape[1]  # every layer has written its slots
        return logits, kv_cache


def check_unpadded(attention_mask: Tensor, tokens: Tensor) -> None:
    """Refuse left padding (a 0 before a 1 in a row): the model has no mask, so a pad would be read as a token."""
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != tokens.shape:
        raise ValueError(f"attention_mask must be a tensor shaped like tokens {tuple(tokens.shape)}, got {attention_mask!r:.80}")
    if bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()) or bool((attention_mask[:, 0] == 0).any()):
        raise ValueError("the Llama-style model has no attention mask, so its prompts take no padding: give the prompts "
                         "of a batch one length in tokens (or run them one at a time)")
