"""Part 9's Llama-style model in the course's engine: parts 3 to 6 decode it unchanged.

``LlamaTransformer.forward`` is called as part 4's ``DemoTransformer`` is: ``model(tokens)`` gives
logits, and ``model(tokens, cache, attention_mask=...)`` takes the whole sequence so far, runs
the positions the cache does not hold yet and gives ``(their logits, the cache)``. Both meet
every cache of the course through the same protocol (``prepare``, ``update``, ``commit``:
solutions/kv_cache.py), so part 4's ``KeyValueCache`` (beam search indexes its rows), part 6's
``StaticKeyValueCache`` and part 9's own caches all run it, left-padded batches included.

What the engine needs besides is a GPT-2 ``Config`` (``engine.cfg``): part 5 reads ``d_vocab`` and
``n_ctx`` from it, and parts 4 and 6 make their caches from it, of shape ``(n_layers, 2, batch,
seq_len, n_key_value_heads, d_head)`` (with grouped-query attention a layer caches its
key/value heads only, so ``cfg.n_heads`` is ``n_key_value_heads``). ``LlamaForEngine(model)``
is the model with that ``cfg``:

    generate(LlamaForEngine(model), tokenizer, prompts, 20, num_beams=3, temperature=0.0)
"""

from __future__ import annotations

from jaxtyping import Int
from torch import Tensor, nn


class LlamaForEngine(nn.Module):
    """Part 9's ``LlamaTransformer`` with the GPT-2 ``Config`` the engine and its caches read (``cfg``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        llama = getattr(model, "cfg", None)
        if not callable(getattr(llama, "cache_config", None)) or not hasattr(model, "new_cache"):
            raise TypeError(f"LlamaForEngine takes part 9's LlamaTransformer, got {type(model).__name__}")
        self.model = model
        self.cfg = llama.cache_config()

    def new_cache(self):
        """Part 9's own cache for the model (``LlamaCache``)."""
        return self.model.new_cache()

    def forward(self, tokens: Int[Tensor, "batch pos"], kv_cache=None, *, attention_mask: Int[Tensor, "batch pos"] | None = None):
        """The model's own forward pass: logits, or with a cache ``(logits of the new positions, the cache)``."""
        return self.model(tokens, kv_cache, attention_mask=attention_mask)
