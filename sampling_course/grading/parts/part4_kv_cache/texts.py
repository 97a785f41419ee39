"""The solutions' own text of part 4 that its planted mistakes and correct variants replace, read by the
part's variants (``__init__``) and its classic-style ones (``classic``).
"""

from __future__ import annotations

CACHE_METHODS = (
    "        return cls(torch.empty(cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head, device=device, dtype=dtype))\n"
    "        ### END SOLUTION\n"
    "\n"
    "    @property\n"
    "    def k(self) -> Float[Tensor, \"n_layers batch seq_len n_heads d_head\"]:\n"
    "        ### BEGIN SOLUTION\n"
    "        return self.as_subclass(torch.Tensor)[:, 0]\n"
    "        ### END SOLUTION\n"
    "\n"
    "    @property\n"
    "    def v(self) -> Float[Tensor, \"n_layers batch seq_len n_heads d_head\"]:\n"
    "        ### BEGIN SOLUTION\n"
    "        return self.as_subclass(torch.Tensor)[:, 1]\n"
    "        ### END SOLUTION\n"
    "\n"
    "    @property\n"
    "    def batch(self) -> int:\n"
    "        ### BEGIN SOLUTION\n"
    "        return self.shape[2]\n"
    "        ### END SOLUTION\n"
    "\n"
    "    @property\n"
    "    def seq_len(self) -> int:\n"
    "        ### BEGIN SOLUTION\n"
    "        return self.shape[3]\n"
)
CACHED_FORWARD = (
    "        step = cache.prepare(tokens, attention_mask)\n"
    "        residual = self.embed(step.new_tokens) + self.pos_embed.W_pos[step.positions]\n"
    "        for layer, block in enumerate(self.blocks):\n"
    "            residual, _ = block(residual, LayerCache(cache, layer, step.mask))\n"
)
