"""Part 1, GPT-2 from scratch: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes
from sampling_course.grading.parts.part1_transformer.texts import (
    LAYER_NORM as _LAYER_NORM, POS_EMBED as _POS_EMBED, CAUSAL_MASK as _CAUSAL_MASK, QKV as _QKV,
    SCORES_START as _SCORES_START, CACHE_HIDES as _CACHE_HIDES, SCORES_END as _SCORES_END, MLP as _MLP,
    BLOCK as _BLOCK, UNEMBED as _UNEMBED, DEMO as _DEMO,
)

PART = 1
TITLE = "GPT-2 from scratch"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "LayerNorm", 1, "transformer", "LayerNorm",
        "Normalise each position's residual vector to mean 0 and variance 1, then scale by w and shift by b.",
        "All statistics are taken over the last dimension (d_model) only, separately for every "
        "batch entry and position. keepdim=True lets them broadcast back over the vector.",
        "Subtract the mean, then divide by sqrt(variance + layer_norm_eps). Two classic traps: "
        "GPT-2 uses the biased variance (divide by d_model, i.e. unbiased=False), and eps goes "
        "inside the square root, not added to it afterwards.",
        "x = residual - residual.mean(dim=-1, keepdim=True)\n"
        "x = x / (x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()\n"
        "return x * self.w + self.b",
    ),
    exercise(
        "Embed", 1, "transformer", "Embed",
        "Look up the embedding vector of every token: one row of W_E per token id.",
        "W_E has shape (d_vocab, d_model): row i is the vector of token id i.",
        "Indexing a tensor with an integer tensor works for any shape of index: indexing W_E "
        "with a (batch, pos) tensor of ids gives a (batch, pos, d_model) tensor. No loop needed.",
        "return self.W_E[tokens]",
    ),
    exercise(
        "PosEmbed", 1, "transformer", "PosEmbed",
        "Return the learned embedding of each position, the same for every sequence in the batch.",
        "The result depends only on how many positions there are (tokens.shape[1]), never on "
        "the token ids themselves.",
        "Take rows offset .. offset + seq_len - 1 of W_pos (offset is 0 unless a KV cache already "
        "holds earlier positions) and repeat them along a new batch dimension.",
        "batch, seq_len = tokens.shape\n"
        "positions = self.W_pos[offset : offset + seq_len]\n"
        'return einops.repeat(positions, "pos d_model -> batch pos d_model", batch=batch)',
    ),
    exercise(
        "apply_causal_mask", 1, "transformer", "Attention.apply_causal_mask",
        "Hide every key that lies after its query by writing IGNORE into its attention score.",
        "Score [q, k] must be hidden exactly when key k is in the future of query q. A token "
        "may attend to itself, so the diagonal stays visible and no row is ever fully masked.",
        "Build a boolean (query_pos, key_pos) mask with torch.triu(..., diagonal=1) on the scores' "
        "device and apply it with masked_fill(mask, self.IGNORE). Here the scores are square. "
        "(In part 4 a cache supplies earlier keys, the queries become the last query_pos of the "
        "key_pos positions, and the diagonal shifts to key_pos - query_pos + 1.)",
        "query_pos, key_pos = attn_scores.shape[-2:]\n"
        "future = torch.triu(torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device),\n"
        "                    diagonal=key_pos - query_pos + 1)\n"
        "return attn_scores.masked_fill(future, self.IGNORE)",
    ),
    exercise(
        "Attention", 1, "transformer", "Attention",
        "Causal multi-head self-attention: per-head queries, keys and values, scaled and masked "
        "scores, softmax, weighted values, and the output projection.",
        "Follow the shapes: W_Q, W_K, W_V are (n_heads, d_model, d_head), so q, k and v are "
        "(batch, pos, n_heads, d_head) once b_Q, b_K, b_V are added; the scores are "
        "(batch, n_heads, query_pos, key_pos).",
        "Divide the scores by sqrt(d_head) (not sqrt(d_model)), apply self.apply_causal_mask "
        "before the softmax over key_pos, and mix the values with the pattern. Each head "
        "writes through its own slice of W_O and the heads are summed; b_O is added once.",
        'q = einops.einsum(x, self.W_Q, "b s d, n d h -> b s n h") + self.b_Q   # same for k, v\n'
        'scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n'
        "pattern = self.apply_causal_mask(scores).softmax(dim=-1)\n"
        'z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")\n'
        'return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O',
    ),
    exercise(
        "MLP", 1, "transformer", "MLP",
        "Expand to d_mlp with W_in, apply GPT-2's gelu_new, project back to d_model with W_out.",
        "Two affine maps with a non-linearity between them, and both have a bias (b_in, b_out).",
        "GPT-2's GELU is the tanh approximation: use this module's gelu_new, not torch's default "
        "exact (erf) GELU and not ReLU. The difference is small but the tests see it.",
        "pre = x @ self.W_in + self.b_in\n"
        "return gelu_new(pre) @ self.W_out + self.b_out",
    ),
    exercise(
        "TransformerBlock", 1, "transformer", "TransformerBlock",
        "A pre-LayerNorm block: add attention(ln1(resid)) to the residual stream, then add mlp(ln2(resid_mid)).",
        "Each sub-layer reads a normalised copy of the residual stream and its output is added "
        "to the stream, never substituted for it.",
        "ln2 normalises resid_mid, the stream after the attention output has been added, not "
        "resid_pre. Both residual additions are needed.",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre))\n"
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
    ),
    exercise(
        "Unembed", 1, "transformer", "Unembed",
        "Map the final residual stream to one logit per vocabulary entry with W_U and b_U.",
        "W_U is (d_model, d_vocab): a matrix product over d_model at every position.",
        "Do not drop b_U. GPT-2's own b_U is zero, but the tests also use a non-zero one.",
        "return x @ self.W_U + self.b_U",
    ),
    exercise(
        "DemoTransformer", 1, "transformer", "DemoTransformer",
        "Chain it all: token + positional embeddings, every block in order, the final LayerNorm, unembed.",
        "The residual stream starts as the sum of the token embedding and the positional "
        "embedding of the same tokens.",
        "Feed the stream through self.blocks one after the other (each returns the new stream), "
        "then ln_final, then unembed. The logits come back for every position, not just the last.",
        "residual = self.embed(tokens) + self.pos_embed(tokens)\n"
        "for block in self.blocks:\n"
        "    residual = block(residual)\n"
        "return self.unembed(self.ln_final(residual))",
    ),
)

# The solution's LayerNorm is one F.layer_norm call; its mistakes replace it with the formula written out, wrong.
_LAYER_NORM_CALL = "        return F.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)\n"


def _layer_norm_by_hand(
    scale: str = "(residual.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
    returns: str = "residual / scale * self.w + self.b",
) -> str:
    return ("        residual = residual - residual.mean(dim=-1, keepdim=True)\n"
            f"        scale = {scale}\n"
            f"        return {returns}\n")


# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(1, "LayerNorm with unbiased variance", "transformer.py", _LAYER_NORM_CALL,
            _layer_norm_by_hand("(residual.var(dim=-1, keepdim=True, unbiased=True) + self.cfg.layer_norm_eps).sqrt()"),
            why="the unbiased variance (dividing by d_model - 1 instead of d_model), where GPT-2's LayerNorm divides by d_model"),
    Mistake(1, "LayerNorm eps outside the sqrt", "transformer.py", _LAYER_NORM_CALL,
            _layer_norm_by_hand("residual.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps"),
            why="eps added after the square root, sqrt(var) + eps, instead of inside it, sqrt(var + eps)"),
    Mistake(1, "LayerNorm without w", "transformer.py", _LAYER_NORM_CALL,
            _layer_norm_by_hand(returns="residual / scale + self.b"),
            why="the learned scale w is never applied to the normalised vector"),
    Mistake(1, "LayerNorm without b", "transformer.py", _LAYER_NORM_CALL,
            _layer_norm_by_hand(returns="residual / scale * self.w"),
            why="the learned shift b is never added to the normalised vector"),
    Mistake(1, "attention scaled by d_model", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_model)',
            why="the attention scores are divided by sqrt(d_model) instead of sqrt(d_head)"),
    Mistake(1, "attention not scaled", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k")',
            why="the attention scores are never divided by sqrt(d_head)"),
    Mistake(1, "causal mask hides the diagonal", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos,",
            why="the causal mask also hides the diagonal, so a token cannot attend to itself (torch.triu needs diagonal=1)"),
    # Attention's own checks run without a cache, where this mask is right: the mistake is the mask's.
    Mistake(1, "causal mask ignores the cached keys", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=1,", exercise="apply_causal_mask",
            why="the mask is placed as if the queries started at key 0, so with cached keys (query_pos < key_pos) "
                "each query is hidden from the keys just before it",
            fix="shift the diagonal by the number of cached keys: torch.triu(..., diagonal=key_pos - query_pos + 1)"),
    Mistake(1, "causal mask lets one future token through", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos + 2,",
            why="the causal mask starts one position too late, so every token can also see the token after it"),
    Mistake(1, "MLP with relu", "transformer.py",
            "return gelu_new(pre) @ self.W_out", "return torch.relu(pre) @ self.W_out",
            why="ReLU instead of GPT-2's GELU (gelu_new, the tanh approximation)"),
    Mistake(1, "MLP with erf gelu", "transformer.py",
            "return gelu_new(pre) @ self.W_out", "return torch.nn.functional.gelu(pre) @ self.W_out",
            why="torch's exact (erf) GELU instead of GPT-2's tanh approximation, gelu_new"),
    Mistake(1, "positions not added", "transformer.py",
            "residual = self.embed(tokens) + self.pos_embed(tokens)\n", "residual = self.embed(tokens)\n",
            why="the positional embedding is never added to the token embedding"),
    Mistake(1, "missing b_Q", "transformer.py",
            '"b s n d, n d h -> b s n h") + self.b_Q', '"b s n d, n d h -> b s n h")',
            why="the query bias b_Q is never added"),
    Mistake(1, "missing b_V", "transformer.py",
            '"b s n d, n d h -> b s n h") + self.b_V', '"b s n d, n d h -> b s n h")',
            why="the value bias b_V is never added"),
    Mistake(1, "missing b_O", "transformer.py",
            '"b q n h, n h d -> b q d") + self.b_O', '"b q n h, n h d -> b q d")',
            why="the output bias b_O is never added"),
    Mistake(1, "missing b_in", "transformer.py",
            "pre = normalized_resid_mid @ self.W_in + self.b_in", "pre = normalized_resid_mid @ self.W_in",
            why="the MLP's input bias b_in is never added"),
    Mistake(1, "missing b_out", "transformer.py",
            "return gelu_new(pre) @ self.W_out + self.b_out", "return gelu_new(pre) @ self.W_out",
            why="the MLP's output bias b_out is never added"),
    Mistake(1, "missing b_U", "transformer.py",
            "return normalized_resid_final @ self.W_U + self.b_U", "return normalized_resid_final @ self.W_U",
            why="the unembedding bias b_U is never added"),
]

# Correct implementations in other styles than the solutions' (the way learners write them);
# `sampling-course plant-mistakes --variants` checks that every test of the exercise accepts each.
# Attention's scores with what a cache hides between them (texts.py).
_SCORES = _SCORES_START + _CACHE_HIDES + _SCORES_END

VARIANTS: list[Variant] = [
    # LayerNorm
    Variant(1, "LayerNorm", "var(unbiased=False) and rsqrt", "transformer.py", _LAYER_NORM,
            "        mean = residual.mean(dim=-1, keepdim=True)\n"
            "        var = residual.var(dim=-1, keepdim=True, unbiased=False)\n"
            "        return (residual - mean) * torch.rsqrt(var + self.cfg.layer_norm_eps) * self.w + self.b\n"),
    Variant(1, "LayerNorm", "torch.nn.functional.layer_norm", "transformer.py", _LAYER_NORM,
            "        return torch.nn.functional.layer_norm(\n"
            "            residual, (self.cfg.d_model,), weight=self.w, bias=self.b, eps=self.cfg.layer_norm_eps\n"
            "        )\n"),
    Variant(1, "LayerNorm", "torch.var_mean(correction=0), std via torch.sqrt", "transformer.py", _LAYER_NORM,
            "        var, mean = torch.var_mean(residual, dim=-1, keepdim=True, correction=0)\n"
            "        normalized = (residual - mean) / torch.sqrt(var + self.cfg.layer_norm_eps)\n"
            "        return normalized * self.w + self.b\n"),
    # Embed
    Variant(1, "Embed", "torch.nn.functional.embedding", "transformer.py",
            "        return self.W_E[tokens]\n",
            "        return torch.nn.functional.embedding(tokens, self.W_E)\n"),
    Variant(1, "Embed", "one-hot matmul", "transformer.py",
            "        return self.W_E[tokens]\n",
            "        one_hot = torch.nn.functional.one_hot(tokens, num_classes=self.cfg.d_vocab).to(self.W_E.dtype)\n"
            "        return one_hot @ self.W_E\n"),
    Variant(1, "Embed", "index_select on the flattened ids", "transformer.py",
            "        return self.W_E[tokens]\n",
            "        return self.W_E.index_select(0, tokens.reshape(-1)).reshape(*tokens.shape, self.cfg.d_model)\n"),
    # PosEmbed
    Variant(1, "PosEmbed", "slice, unsqueeze and expand", "transformer.py", _POS_EMBED,
            "        return self.W_pos[offset : offset + tokens.shape[1]].unsqueeze(0).expand(tokens.shape[0], -1, -1)\n"),
    Variant(1, "PosEmbed", "arange position ids through F.embedding (HF style)", "transformer.py", _POS_EMBED,
            "        position_ids = torch.arange(offset, offset + tokens.shape[-1], device=tokens.device)\n"
            "        return torch.nn.functional.embedding(position_ids.expand_as(tokens), self.W_pos)\n"),
    Variant(1, "PosEmbed", "W_pos[arange] repeated over the batch", "transformer.py", _POS_EMBED,
            "        batch, seq_len = tokens.shape\n"
            "        return self.W_pos[torch.arange(seq_len) + offset].repeat(batch, 1, 1)\n"),
    # apply_causal_mask
    Variant(1, "apply_causal_mask", "tril of the visible keys, shifted for a cache", "transformer.py", _CAUSAL_MASK,
            "        query_pos, key_pos = attn_scores.shape[-2:]\n"
            "        visible = torch.ones(query_pos, key_pos, device=attn_scores.device).tril(diagonal=key_pos - query_pos)\n"
            "        return torch.where(visible.bool(), attn_scores, self.IGNORE)\n"),
    Variant(1, "apply_causal_mask", "arange comparisons", "transformer.py", _CAUSAL_MASK,
            "        query_pos, key_pos = attn_scores.shape[-2:]\n"
            "        query_index = torch.arange(key_pos - query_pos, key_pos, device=attn_scores.device)\n"
            "        key_index = torch.arange(key_pos, device=attn_scores.device)\n"
            "        return attn_scores.masked_fill(key_index[None, :] > query_index[:, None], self.IGNORE)\n"),
    Variant(1, "apply_causal_mask", "shifted triu mask filled with torch.finfo(dtype).min", "transformer.py",
            _CAUSAL_MASK,
            "        query_pos, key_pos = attn_scores.shape[-2:]\n"
            "        future = torch.ones(query_pos, key_pos, device=attn_scores.device).triu(key_pos - query_pos + 1)\n"
            "        return attn_scores.masked_fill(future == 1, torch.finfo(attn_scores.dtype).min)\n"),
    # Attention
    Variant(1, "Attention", "one fused QKV matmul, then scores with @ and a reshaped W_O", "transformer.py",
            _QKV,
            "            batch, seq, d_model = normalized_resid_pre.shape\n"
            "            n, h = self.cfg.n_heads, self.cfg.d_head\n"
            "            W_QKV = torch.cat([self.W_Q, self.W_K, self.W_V], dim=0).permute(1, 0, 2).reshape(d_model, 3 * n * h)\n"
            "            q, k, v = (normalized_resid_pre @ W_QKV).view(batch, seq, 3, n, h).unbind(dim=2)\n"
            "            q, k, v = q + self.b_Q, k + self.b_K, v + self.b_V\n"),
    Variant(1, "Attention", "scores with torch.baddbmm over (batch * heads)", "transformer.py",
            '        attn_scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n',
            "        b, q_len, n, h = q.shape\n"
            "        q_ = q.transpose(1, 2).reshape(b * n, q_len, h)\n"
            "        k_ = k.transpose(1, 2).reshape(b * n, k.shape[1], h)\n"
            "        zeros = q_.new_zeros(b * n, q_len, k.shape[1])\n"
            "        attn_scores = torch.baddbmm(zeros, q_, k_.transpose(1, 2), beta=0.0, alpha=1 / math.sqrt(h))\n"
            "        attn_scores = attn_scores.view(b, n, q_len, -1)\n"),
    Variant(1, "Attention", "pattern @ v and one matmul with W_O reshaped to (n_heads * d_head, d_model)",
            "transformer.py",
            '        z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")\n'
            "        # Each head writes into the residual stream through its own slice of W_O; sum the heads.\n"
            '        out = einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O\n',
            "        z = pattern @ v.transpose(1, 2)  # (batch, n_heads, query_pos, d_head)\n"
            "        z = z.transpose(1, 2).reshape(z.shape[0], z.shape[2], -1)  # heads side by side\n"
            "        out = z @ self.W_O.reshape(-1, self.cfg.d_model) + self.b_O\n"),
    Variant(1, "Attention", "F.scaled_dot_product_attention with the model's own mask", "transformer.py", _SCORES,
            "        q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # (batch, n_heads, pos, d_head)\n"
            "        zeros = torch.zeros(q_.shape[-2], k_.shape[-2], dtype=q.dtype, device=q.device)\n"
            "        attn_scores = self.apply_causal_mask(zeros[None, None])  # an additive mask: 0 where visible, IGNORE elsewhere\n"
            + _CACHE_HIDES +
            "        z = torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, attn_mask=attn_scores)\n"
            '        out = torch.einsum("bnqh,nhd->bqd", z, self.W_O) + self.b_O\n'),
    Variant(1, "Attention", "a Python loop over heads", "transformer.py", _SCORES,
            "        attn_scores = torch.stack(\n"
            "            [q[:, :, head] @ k[:, :, head].transpose(-1, -2) / self.cfg.d_head**0.5 for head in range(self.cfg.n_heads)],\n"
            "            dim=1,\n"
            "        )\n"
            "        attn_scores = self.apply_causal_mask(attn_scores)\n"
            + _CACHE_HIDES +
            "        out = self.b_O.expand(q.shape[0], q.shape[1], -1)\n"
            "        for head in range(self.cfg.n_heads):\n"
            "            pattern = attn_scores[:, head].softmax(dim=-1)\n"
            "            out = out + (pattern @ v[:, :, head]) @ self.W_O[head]\n"),
    # MLP
    Variant(1, "MLP", "F.gelu(approximate='tanh') and einops.einsum", "transformer.py", _MLP,
            '        pre = einops.einsum(normalized_resid_mid, self.W_in, "b s d, d m -> b s m") + self.b_in\n'
            '        post = torch.nn.functional.gelu(pre, approximate="tanh")\n'
            '        return einops.einsum(post, self.W_out, "b s m, m d -> b s d") + self.b_out\n'),
    Variant(1, "MLP", "F.linear with the tanh GELU written out", "transformer.py", _MLP,
            "        pre = torch.nn.functional.linear(normalized_resid_mid, self.W_in.T, self.b_in)\n"
            "        post = 0.5 * pre * (1 + torch.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre**3)))\n"
            "        return torch.nn.functional.linear(post, self.W_out.T, self.b_out)\n"),
    Variant(1, "MLP", "torch.einsum and nn.GELU('tanh')", "transformer.py", _MLP,
            '        pre = torch.einsum("bsd,dm->bsm", normalized_resid_mid, self.W_in) + self.b_in\n'
            '        post = nn.GELU(approximate="tanh")(pre)\n'
            '        return torch.einsum("bsm,md->bsd", post, self.W_out) + self.b_out\n'),
    # TransformerBlock
    Variant(1, "TransformerBlock", "one residual variable, reassigned", "transformer.py", _BLOCK,
            "        x = resid_pre\n"
            "        x = x + self.attn(self.ln1(x))\n"
            "        x = x + self.mlp(self.ln2(x))\n"
            "        return x\n"),
    Variant(1, "TransformerBlock", "named sub-layer outputs, in-place += on the new stream", "transformer.py", _BLOCK,
            "        attn_out = self.attn(self.ln1(resid_pre))\n"
            "        resid = resid_pre + attn_out\n"
            "        mlp_out = self.mlp(self.ln2(resid))\n"
            "        resid += mlp_out\n"
            "        return resid\n"),
    Variant(1, "TransformerBlock", "a loop over (norm, sub-layer) pairs", "transformer.py", _BLOCK,
            "        resid = resid_pre\n"
            "        for norm, layer in ((self.ln1, self.attn), (self.ln2, self.mlp)):\n"
            "            resid = resid + layer(norm(resid))\n"
            "        return resid\n"),
    # Unembed
    Variant(1, "Unembed", "einops.einsum", "transformer.py", _UNEMBED,
            '        return einops.einsum(normalized_resid_final, self.W_U, "b s d, d v -> b s v") + self.b_U\n'),
    Variant(1, "Unembed", "F.linear with W_U transposed", "transformer.py", _UNEMBED,
            "        return torch.nn.functional.linear(normalized_resid_final, self.W_U.T, self.b_U)\n"),
    Variant(1, "Unembed", "torch.addmm on the flattened positions", "transformer.py", _UNEMBED,
            "        batch, pos, d_model = normalized_resid_final.shape\n"
            "        flat = torch.addmm(self.b_U, normalized_resid_final.reshape(batch * pos, d_model), self.W_U)\n"
            "        return flat.view(batch, pos, -1)\n"),
    # DemoTransformer
    Variant(1, "DemoTransformer", "nn.Sequential over the blocks", "transformer.py", _DEMO,
            "            x = self.embed(tokens) + self.pos_embed(tokens)\n"
            "            x = nn.Sequential(*self.blocks)(x)\n"
            "            return self.unembed(self.ln_final(x))\n"),
    Variant(1, "DemoTransformer", "functools.reduce over the blocks", "transformer.py", _DEMO,
            "            import functools\n"
            "\n"
            "            embedded = self.pos_embed(tokens, offset=0) + self.embed(tokens)\n"
            "            residual = functools.reduce(lambda resid, block: block(resid), self.blocks, embedded)\n"
            "            logits = self.unembed(self.ln_final(residual))\n"
            "            return logits\n"),
    Variant(1, "DemoTransformer", "indexed loop over range(n_layers)", "transformer.py", _DEMO,
            "            residual = self.embed(tokens)\n"
            "            residual = residual + self.pos_embed(tokens)\n"
            "            for i in range(self.cfg.n_layers):\n"
            "                residual = self.blocks[i](residual)\n"
            "            normalized = self.ln_final(residual)\n"
            "            return self.unembed(normalized)\n"),
]
from sampling_course.grading.parts.part1_transformer.classic import CLASSIC_VARIANTS  # noqa: E402  (reads the texts above)
from sampling_course.grading.parts.part1_transformer.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)

VARIANTS += CLASSIC_VARIANTS
MISTAKES = with_fixes(MISTAKES, FIXES)
