"""The solutions' own text of part 1 that its planted mistakes and correct variants replace: the
part's mistakes and variants (``__init__``) and its classic-style variants (``classic``) read them here.
"""

from __future__ import annotations

LAYER_NORM = (
    "        # (residual - mean) / sqrt(variance + eps) * w + b, with the biased variance (divide by d_model, not\n"
    "        # d_model - 1), as in GPT-2: exactly what F.layer_norm computes, in one kernel where the formula\n"
    "        # written out takes nine, at every LayerNorm of every decode step.\n"
    "        return F.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)\n"
)
POS_EMBED = (
    "        batch, seq_len = tokens.shape\n"
    "        positions = self.W_pos[offset : offset + seq_len]\n"
    '        return einops.repeat(positions, "pos d_model -> batch pos d_model", batch=batch)\n'
)
CAUSAL_MASK = (
    "        query_pos, key_pos = attn_scores.shape[-2:]\n"
    "        # diagonal=key_pos - query_pos + 1 shifts the mask right by the number of cached keys.\n"
    "        future = torch.triu(\n"
    "            torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device),\n"
    "            diagonal=key_pos - query_pos + 1,\n"
    "        )\n"
    "        return attn_scores.masked_fill(future, self.IGNORE)\n"
)
# Attention's queries, keys and values (inside the branch taken when part 6 has not fused them).
QKV = (
    '            x = einops.repeat(normalized_resid_pre, "b s d -> b s n d", n=self.cfg.n_heads)\n'
    '            q = einops.einsum(x, self.W_Q, "b s n d, n d h -> b s n h") + self.b_Q\n'
    '            k = einops.einsum(x, self.W_K, "b s n d, n d h -> b s n h") + self.b_K\n'
    '            v = einops.einsum(x, self.W_V, "b s n d, n d h -> b s n h") + self.b_V\n'
)
# The scores (masked by the causal mask), then what a cache hides (part 4's and 5's given lines,
# kept as they are by every variant), then the pattern, the values mixed and the output.
SCORES_START = (
    '        attn_scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n'
    "        attn_scores = self.apply_causal_mask(attn_scores)\n"
)
CACHE_HIDES = (
    "        ### END SOLUTION\n"
    "        if cache is not None and cache.mask is not None:\n"
    "            ### BEGIN SOLUTION\n"
    "            # Hint: a key the cache hides (padding, part 5) is masked like a future key.\n"
    "            attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)\n"
    "            ### END SOLUTION\n"
    "        ### BEGIN SOLUTION\n"
)
SCORES_END = (
    "        pattern = attn_scores.softmax(dim=-1)\n"
    '        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")\n'
    "        # Each head writes into the residual stream through its own slice of W_O; sum the heads.\n"
    '        out = einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O\n'
)
MLP = (
    "        pre = normalized_resid_mid @ self.W_in + self.b_in\n"
    "        return gelu_new(pre) @ self.W_out + self.b_out\n"
)
BLOCK = (
    "        resid_mid = resid_pre + self.attn(self.ln1(resid_pre))\n"
    "        return resid_mid + self.mlp(self.ln2(resid_mid))\n"
)
UNEMBED = "        return normalized_resid_final @ self.W_U + self.b_U\n"
DEMO = (
    "            residual = self.embed(tokens) + self.pos_embed(tokens)\n"
    "            for block in self.blocks:\n"
    "                residual = block(residual)\n"
    "            return self.unembed(self.ln_final(residual))\n"
)
