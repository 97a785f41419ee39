"""Part 1's correct variants in the classic course's style: each forward written whole.

The classic course's model code works in place on tensors it has just made (``masked_fill_``
on the fresh attention scores, ``+=`` of a bias onto a fresh matmul result), spells its einsum
dimensions out in full, and adds a sub-layer's output before the residual. None of that changes
a number, so every test of the exercise must pass. Attention's
variant rewrites each of part 1's regions and keeps the one-line hooks of parts 4 and 5 between
them: these variants are also the model those parts run on (``mistakes.downstream_groups``).
"""

from __future__ import annotations

from sampling_course.grading.catalogue import Variant

# The solutions' own text that each variant replaces (as the part's other variants read it).
_BLOCK = (
    '        resid_mid = resid_pre + self.attn(self.ln1(resid_pre))\n'
    '        return resid_mid + self.mlp(self.ln2(resid_mid))\n'
)
_CAUSAL_MASK = (
    '        query_pos, key_pos = attn_scores.shape[-2:]\n'
    '        # diagonal=key_pos - query_pos + 1 shifts the mask right by the number of cached keys.\n'
    '        future = torch.triu(\n'
    '            torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device),\n'
    '            diagonal=key_pos - query_pos + 1,\n'
    '        )\n'
    '        return attn_scores.masked_fill(future, self.IGNORE)\n'
)
_DEMO = (
    "            residual = self.embed(tokens) + self.pos_embed(tokens)\n"
    "            for block in self.blocks:\n"
    "                residual = block(residual)\n"
    "            return self.unembed(self.ln_final(residual))\n"
)
_LAYER_NORM = (
    "        # (residual - mean) / sqrt(variance + eps) * w + b, with the biased variance (divide by d_model, not\n"
    "        # d_model - 1), as in GPT-2: exactly what F.layer_norm computes, in one kernel where the formula\n"
    "        # written out takes nine, at every LayerNorm of every decode step.\n"
    "        return F.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)\n"
)
_MLP = (
    "        pre = normalized_resid_mid @ self.W_in + self.b_in\n"
    "        return gelu_new(pre) @ self.W_out + self.b_out\n"
)
_POS_EMBED = (
    '        batch, seq_len = tokens.shape\n'
    '        positions = self.W_pos[offset : offset + seq_len]\n'
    '        return einops.repeat(positions, "pos d_model -> batch pos d_model", batch=batch)\n'
)
_QKV = (
    '            x = einops.repeat(normalized_resid_pre, "b s d -> b s n d", n=self.cfg.n_heads)\n'
    '            q = einops.einsum(x, self.W_Q, "b s n d, n d h -> b s n h") + self.b_Q\n'
    '            k = einops.einsum(x, self.W_K, "b s n d, n d h -> b s n h") + self.b_K\n'
    '            v = einops.einsum(x, self.W_V, "b s n d, n d h -> b s n h") + self.b_V\n'
)
_UNEMBED = "        return normalized_resid_final @ self.W_U + self.b_U\n"

# Attention.forward's solution lines, from the queries to the output: part 4's cache line and
# part 5's padding line between them stay as they are (they are those parts' exercises).
_CACHE_LINE = (
    "            ### END SOLUTION\n"
    "        if cache is not None:\n"
    "            ### BEGIN SOLUTION\n"
    "            # Hint: the cache keeps the new keys and values and returns every key and value to attend to.\n"
    "            k, v = cache.update(k, v)\n"
    "            ### END SOLUTION\n"
    "        ### BEGIN SOLUTION\n"
    "        # Hint: scores are q . k / sqrt(d_head); mask them before the softmax.\n"
    "        # Scale by sqrt(d_head) so the scores' variance does not grow with the head size.\n"
)
_PADDING_LINE = (
    "        ### END SOLUTION\n"
    "        if cache is not None and cache.mask is not None:\n"
    "            ### BEGIN SOLUTION\n"
    "            # Hint: a key the cache hides (padding, part 5) is masked like a future key.\n"
    "            attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)\n"
    "            ### END SOLUTION\n"
    "        ### BEGIN SOLUTION\n"
)
_ATTENTION_BODY = (
    _QKV
    + _CACHE_LINE
    + '        attn_scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n'
    "        attn_scores = self.apply_causal_mask(attn_scores)\n"
    + _PADDING_LINE
    + "        pattern = attn_scores.softmax(dim=-1)\n"
    '        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")\n'
    "        # Each head writes into the residual stream through its own slice of W_O; sum the heads.\n"
    '        out = einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O\n'
)

CLASSIC_VARIANTS: list[Variant] = [
    Variant(1, "LayerNorm", "classic: centred copy divided, scaled and shifted in place", "transformer.py",
            _LAYER_NORM,
            "        mean = residual.mean(dim=-1, keepdim=True)\n"
            "        variance = residual.var(dim=-1, keepdim=True, unbiased=False)\n"
            "        normalised = residual - mean\n"
            "        normalised /= (variance + self.cfg.layer_norm_eps).sqrt()\n"
            "        normalised *= self.w\n"
            "        normalised += self.b\n"
            "        return normalised\n"),
    Variant(1, "Embed", "classic: rows of W_E for the flattened ids, viewed back", "transformer.py",
            "        return self.W_E[tokens]\n",
            "        rows = self.W_E[tokens.flatten()]\n"
            "        return rows.view(*tokens.shape, self.cfg.d_model)\n"),
    Variant(1, "PosEmbed", "classic: zeros for the batch, the positions added in place", "transformer.py",
            _POS_EMBED,
            "        batch, seq_len = tokens.shape\n"
            "        embedded = self.W_pos.new_zeros(batch, seq_len, self.cfg.d_model)\n"
            "        embedded += self.W_pos[offset : offset + seq_len]\n"
            "        return embedded\n"),
    # The classic course's mask, written into the scores in place: they are a fresh tensor that
    # Attention.forward made and never reads again.
    Variant(1, "apply_causal_mask", "classic: masked_fill_ on the scores, returned", "transformer.py", _CAUSAL_MASK,
            "        n_queries, n_keys = attn_scores.size(-2), attn_scores.size(-1)\n"
            "        ones = torch.ones(n_queries, n_keys, device=attn_scores.device)\n"
            "        mask = torch.triu(ones, diagonal=n_keys - n_queries + 1).bool()\n"
            "        attn_scores.masked_fill_(mask, self.IGNORE)\n"
            "        return attn_scores\n"),
    Variant(1, "Attention", "classic: einsums with full names, biases and the scale applied in place",
            "transformer.py", _ATTENTION_BODY,
            "            x = normalized_resid_pre\n"
            '            q = einops.einsum(x, self.W_Q, "batch posn d_model, nheads d_model d_head -> batch posn nheads d_head")\n'
            '            k = einops.einsum(x, self.W_K, "batch posn d_model, nheads d_model d_head -> batch posn nheads d_head")\n'
            '            v = einops.einsum(x, self.W_V, "batch posn d_model, nheads d_model d_head -> batch posn nheads d_head")\n'
            "            q += self.b_Q\n"
            "            k += self.b_K\n"
            "            v += self.b_V\n"
            + _CACHE_LINE
            + "        attn_scores = einops.einsum(\n"
            '            q, k, "batch posn_q nheads d_head, batch posn_k nheads d_head -> batch nheads posn_q posn_k"\n'
            "        )\n"
            "        attn_scores /= self.cfg.d_head**0.5\n"
            "        attn_scores = self.apply_causal_mask(attn_scores)\n"
            + _PADDING_LINE
            + "        attn_pattern = attn_scores.softmax(-1)\n"
            "        z = einops.einsum(\n"
            '            v, attn_pattern, "batch posn_k nheads d_head, batch nheads posn_q posn_k -> batch posn_q nheads d_head"\n'
            "        )\n"
            '        out = einops.einsum(z, self.W_O, "batch posn_q nheads d_head, nheads d_head d_model -> batch posn_q d_model")\n'
            "        out += self.b_O\n"),
    Variant(1, "MLP", "classic: einsums with full names, biases added in place", "transformer.py", _MLP,
            '        pre = einops.einsum(normalized_resid_mid, self.W_in, "batch posn d_model, d_model d_mlp -> batch posn d_mlp")\n'
            "        pre += self.b_in\n"
            '        out = einops.einsum(gelu_new(pre), self.W_out, "batch posn d_mlp, d_mlp d_model -> batch posn d_model")\n'
            "        out += self.b_out\n"
            "        return out\n"),
    Variant(1, "TransformerBlock", "classic: each sub-layer's output first, then the residual", "transformer.py", _BLOCK,
            "        resid_mid = self.attn(self.ln1(resid_pre)) + resid_pre\n"
            "        resid_post = self.mlp(self.ln2(resid_mid)) + resid_mid\n"
            "        return resid_post\n"),
    Variant(1, "Unembed", "classic: einsum with full names, bias added in place", "transformer.py", _UNEMBED,
            "        logits = einops.einsum(\n"
            '            normalized_resid_final, self.W_U, "batch posn d_model, d_model d_vocab -> batch posn d_vocab"\n'
            "        )\n"
            "        logits += self.b_U\n"
            "        return logits\n"),
    Variant(1, "DemoTransformer", "classic: positions embedded first, the logits named", "transformer.py", _DEMO,
            "            residual = self.pos_embed(tokens) + self.embed(tokens)\n"
            "            for block in self.blocks:\n"
            "                residual = block(residual)\n"
            "            logits = self.unembed(self.ln_final(residual))\n"
            "            return logits\n"),
]
