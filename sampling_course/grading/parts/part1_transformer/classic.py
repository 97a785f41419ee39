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
from sampling_course.grading.parts.part1_transformer.texts import (
    LAYER_NORM as _LAYER_NORM, POS_EMBED as _POS_EMBED, CAUSAL_MASK as _CAUSAL_MASK, QKV as _QKV,
    CACHE_HIDES as _PADDING_LINE, SCORES_START as _SCORES_START, SCORES_END as _SCORES_END, MLP as _MLP,
    BLOCK as _BLOCK, UNEMBED as _UNEMBED, DEMO as _DEMO,
)


# Attention.forward's solution lines, from the queries to the output: part 4's cache line and
# part 5's padding line between them stay as they are (they are those parts' exercises), and so
# does the given fast-path branch (part 6) after the cache line.
_CACHE_LINE = (
    "            ### END SOLUTION\n"
    "        if cache is not None:\n"
    "            ### BEGIN SOLUTION\n"
    "            # Hint: the cache keeps the new keys and values and returns every key and value to attend to.\n"
    "            k, v = cache.update(k, v)\n"
    "            ### END SOLUTION\n"
    "        if self.fused_qkv is not None:  # part 6's fast path: attention and W_O as fused kernels (fast_path.FusedQKV.attend)\n"
    "            out = self.fused_qkv.attend(self, q, k, v, None if cache is None else cache.mask)\n"
    "            return out if cache is None else (out, cache.kv)\n"
    "        ### BEGIN SOLUTION\n"
    "        # Hint: scores are q . k / sqrt(d_head); mask them before the softmax.\n"
    "        # Scale by sqrt(d_head) so the scores' variance does not grow with the head size.\n"
)
_ATTENTION_BODY = (
    _QKV
    + _CACHE_LINE
    + _SCORES_START
    + _PADDING_LINE
    + _SCORES_END
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
