"""Part 9, modern decoders: its exercises (what each asks, three graded hints), planted mistakes and correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 9
TITLE = "Modern decoders"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "RMSNorm", 9, "llama", "RMSNorm",
        "Scale each vector by the inverse of its root mean square, then by the learned weight w.",
        "RMSNorm is LayerNorm without the centring and without the bias: the statistic is the mean "
        "of the squares over the last dimension, keepdim=True so it broadcasts back.",
        "Do not subtract the mean, and put eps inside the square root: x * rsqrt(mean(x^2) + eps). "
        "Hugging Face takes the statistic in float32 and casts back before multiplying by w.",
        "x32 = x.float()\n"
        "normalized = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)\n"
        "return normalized.to(x.dtype) * self.w",
    ),
    exercise(
        "Rotary", 9, "llama", "Rotary",
        "Rotate every head of x by its position's angles: positions offset, offset + 1, ... of the sequence, "
        "or, when offset is a tensor (batch_or_1, pos), the positions it holds (a cache's step gives them).",
        "self.cos_sin(positions) gives cos and sin of each position's angles, (..., pos, d_head), each "
        "angle written twice. Insert a heads dimension before the last so they broadcast over (batch, pos, heads, d_head).",
        "Hugging Face pairs dimension i with i + d_head/2 ('rotate half'): split x into halves "
        "(x1, x2); the rotated vector is x * cos + (-x2, x1) * sin. (x2, -x1) turns the wrong way, and "
        "positions must start at offset, not 0, when a cache holds earlier tokens. cos and sin are "
        "float32: give the result back in x's dtype (a bfloat16 model reads bfloat16 keys).",
        "positions = offset if isinstance(offset, Tensor) else torch.arange(offset, offset + x.shape[1], device=x.device)\n"
        "cos, sin = self.cos_sin(positions)\n"
        "first, second = x.chunk(2, dim=-1)\n"
        "return (x * cos[..., None, :] + torch.cat((-second, first), dim=-1) * sin[..., None, :]).to(x.dtype)",
    ),
    exercise(
        "GroupedQueryAttention", 9, "llama", "GroupedQueryAttention",
        "Causal attention with n_heads query heads sharing n_key_value_heads key/value heads, RoPE "
        "on queries and keys, a cache that stores this step's keys and values and returns all of them, and "
        "the family's one mask (apply_causal_mask), which also hides the keys the cache's step mask hides.",
        "Project with W_Q, W_K, W_V (per head, as in part 1, no biases); with cfg.qk_norm apply "
        "q_norm/k_norm to each head first; rotate q and k (never v) with self.rotary at `offset`; "
        "then cache.update(self.layer, k, v) returns every key and value so far.",
        "Query head i reads key/value head i // group (group = n_heads // n_key_value_heads): use "
        "repeat_interleave(group, dim=2), not repeat, which would give head i the KV head i % n_kv. "
        "Scale by sqrt(d_head); in apply_causal_mask the diagonal shifts by the cached length, "
        "triu(key_pos - query_pos + 1), and a step's mask hides where it is False: hidden | ~mask.",
        "q, k, v = (torch.einsum('bsd,ndh->bsnh', x, W) for W in (self.W_Q, self.W_K, self.W_V))\n"
        "q, k = self.rotary(q, offset), self.rotary(k, offset)\n"
        "if cache is not None: k, v = cache.update(self.layer, k, v)\n"
        "k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)\n"
        "scores = torch.einsum('bqnh,bknh->bnqk', q, k) / math.sqrt(d_head)\n"
        "pattern = self.apply_causal_mask(scores, mask).softmax(dim=-1)   # then @ v, W_O",
    ),
    exercise(
        "SwiGLU", 9, "llama", "SwiGLU",
        "The gated MLP: W_out(silu(x W_gate) * (x W_in)).",
        "Two projections of the same input to d_mlp: one goes through SiLU and gates the other "
        "element by element; then one projection back to d_model. No biases.",
        "SiLU (x * sigmoid(x), F.silu) on the gate projection W_gate only, not on W_in and not GELU.",
        "return (F.silu(x @ self.W_gate) * (x @ self.W_in)) @ self.W_out",
    ),
    exercise(
        "LlamaTransformer", 9, "llama", "LlamaTransformer",
        "Chain it all: the cache's step (which tokens are new, at which positions, which keys each may see), "
        "token embedding, every block with those positions, the cache and the mask, the final RMSNorm, unembed.",
        "No positional embedding is added to the stream: positions enter through the rotation "
        "in every attention layer. Without a cache every token is new, at positions 0, 1, ...; with one, "
        "step_cache.prepare(tokens, attention_mask) gives a CacheStep (new_tokens, positions, mask, key_positions).",
        "Ask the cache once, before the loop: each layer adds its keys to it, so its length changes "
        "between the blocks. Apply self.ln_final before W_U.",
        "new_tokens, positions, mask = tokens, 0, None\n"
        "if step_cache is not None:\n"
        "    new_tokens, positions, mask, _ = step_cache.prepare(tokens, attention_mask)\n"
        "residual = self.W_E[new_tokens]\n"
        "for block in self.blocks:\n"
        "    residual = block(residual, positions, step_cache, mask)\n"
        "logits = self.ln_final(residual) @ self.W_U",
    ),
    exercise(
        "rerotate", 9, "rope_sink", "rerotate",
        "Turn keys that were rotated at positions p to positions p - shift: every key by the same angle.",
        "Rotations compose: rotating by the angle of position p and then by that of position -shift "
        "is rotating by p - shift. So one rotation, the same for every key, does it.",
        "rotary.cos_sin(torch.tensor([-shift])) gives that one angle's cos and sin; apply them as in "
        "Rotary.forward. Calling rotary(keys, -shift) instead would turn key i by i - shift, not by -shift.",
        "cos, sin = rotary.cos_sin(torch.tensor([-shift], device=keys.device))\n"
        "first, second = keys.chunk(2, dim=-1)\n"
        "return keys * cos[:, None] + torch.cat((-second, first), dim=-1) * sin[:, None]",
    ),
    exercise(
        "RotatingSinkCache.make_room", 9, "rope_sink", "RotatingSinkCache.make_room",
        "Evict the oldest non-sink positions so that n_new more fit in the capacity, and re-rotate the "
        "window's keys that stay to their new, lower slots.",
        "How many go: max(seq_len + n_new - capacity, 0). They are the first positions after the sinks: "
        "slots n_sink .. n_sink + evict - 1 of every layer's keys and values.",
        "Keep k[:, :n_sink] as they are; the keys after the evicted block move down by evict slots, so "
        "rerotate them by evict. Values carry no position: just drop the evicted ones.",
        "evict = max(self.seq_len + n_new - self.capacity, 0)\n"
        "for layer, (k, v) in enumerate(zip(self.keys, self.values)):\n"
        "    kept = rerotate(self.rotary, k[:, self.n_sink + evict:], evict)\n"
        "    self.keys[layer] = torch.cat([k[:, :self.n_sink], kept], dim=1)   # values: the same without rerotate",
    ),
)

_NORMALIZED = "        normalized = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)\n"
_QK_ROTATION = (
    "        if self.q_norm is not None:  # Qwen3: normalise each head, then rotate\n"
    "            q, k = self.q_norm(q), self.k_norm(k)\n"
    "        # Positions live in q and k only: values carry content, and rotating them would not cancel.\n"
    "        q, k = self.rotary(q, offset), self.rotary(k, offset)\n"
)
_REPEAT = "        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)\n"
_OFFSET = "            new_tokens, positions, mask, _ = step_cache.prepare(tokens, attention_mask)\n"

MISTAKES: list[Mistake] = [
    Mistake(9, "RMSNorm with the mean subtracted", "llama.py", _NORMALIZED,
            "        x32 = x32 - x32.mean(dim=-1, keepdim=True)\n" + _NORMALIZED,
            why="the mean is subtracted as in LayerNorm; RMSNorm scales the vector as it is, without centring it"),
    Mistake(9, "RMSNorm eps outside the sqrt", "llama.py", _NORMALIZED,
            "        normalized = x32 / (x32.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps)\n",
            why="eps added after the square root, rms + eps, instead of inside it, sqrt(mean(x^2) + eps)"),
    Mistake(9, "RMSNorm without w", "llama.py", "        return normalized.to(x.dtype) * self.w\n",
            "        return normalized.to(x.dtype)\n",
            why="the learned weight w is never applied to the normalised vector"),
    Mistake(9, "RoPE rotating by the wrong half", "llama.py", "torch.cat((-second, first), dim=-1)",
            "torch.cat((second, -first), dim=-1)",
            why="the rotated half is (x2, -x1) instead of (-x2, x1), which turns every pair the other way "
                "(by minus its angle)"),
    Mistake(9, "RoPE ignores the offset", "llama.py", "torch.arange(offset, offset + x.shape[1], device=x.device)",
            "torch.arange(x.shape[1], device=x.device)",
            why="positions always start at 0, so tokens after a cached offset are rotated as if they began the text"),
    Mistake(9, "Rotary returning float32", "llama.py", "        return (x32 * cos + rotated_half * sin).to(x.dtype)\n",
            "        return x32 * cos + rotated_half * sin\n",
            why="the rotated heads come back in float32 (cos and sin's dtype) whatever x's dtype, so a bfloat16 "
                "model's attention receives float32 queries and keys"),
    Mistake(9, "RoPE on values", "llama.py", "        q, k = self.rotary(q, offset), self.rotary(k, offset)\n",
            "        q, k, v = self.rotary(q, offset), self.rotary(k, offset), self.rotary(v, offset)\n",
            why="the values are rotated too; rotary embeddings apply to queries and keys only"),
    Mistake(9, "repeat instead of repeat_interleave for KV heads", "llama.py", _REPEAT,
            "        k, v = k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1)\n",
            why="the key/value heads are tiled with repeat (query head i reads KV head i % n_key_value_heads) "
                "instead of repeated in place with repeat_interleave (KV head i // group)"),
    Mistake(9, "attention scaled by d_model", "llama.py", "/ math.sqrt(self.cfg.d_head)", "/ math.sqrt(self.cfg.d_model)",
            why="the attention scores are divided by sqrt(d_model) instead of sqrt(d_head)"),
    Mistake(9, "q/k norms after the rotation", "llama.py", _QK_ROTATION,
            "        q, k = self.rotary(q, offset), self.rotary(k, offset)\n"
            "        if self.q_norm is not None:\n"
            "            q, k = self.q_norm(q), self.k_norm(k)\n",
            why="Qwen3's q_norm and k_norm are applied after the rotation instead of before it"),
    Mistake(9, "causal mask not shifted for the cache", "llama.py", ".triu(key_pos - query_pos + 1)", ".triu(1)",
            why="the causal mask's diagonal is not shifted by the number of cached keys, so new tokens "
                "cannot see most of the cache"),
    Mistake(9, "SwiGLU gating the wrong projection", "llama.py",
            "(F.silu(x @ self.W_gate) * (x @ self.W_in))", "((x @ self.W_gate) * F.silu(x @ self.W_in))",
            why="SiLU is applied to the up projection W_in instead of the gate projection W_gate"),
    Mistake(9, "SwiGLU with GELU", "llama.py", "(F.silu(x @ self.W_gate)", "(F.gelu(x @ self.W_gate)",
            why="GELU instead of SiLU on the gate"),
    Mistake(9, "position offset 0 on a cached step", "llama.py", _OFFSET,
            "            new_tokens, _, mask, _ = step_cache.prepare(tokens, attention_mask)\n",
            why="the step's positions are ignored: every step's new tokens are rotated as if they began the text"),
    Mistake(9, "cache length read inside the block loop", "llama.py",
            "            residual = block(residual, positions, step_cache, mask)\n",
            "            residual = block(residual, positions if step_cache is None else step_cache.seq_len, step_cache, mask)\n",
            why="the positions are read from cache.seq_len inside the loop over the blocks; the first block has "
                "already added this step's keys, so every later block rotates the new tokens as if they "
                "came after themselves"),
    Mistake(9, "final RMSNorm skipped", "llama.py", "logits = self.ln_final(residual) @ self.W_U", "logits = residual @ self.W_U",
            why="the final RMSNorm (ln_final) is never applied before unembedding"),
    Mistake(9, "re-rotating the wrong way", "rope_sink.py", "torch.tensor([-shift], device=keys.device)",
            "torch.tensor([shift], device=keys.device)",
            why="the kept keys are turned forward by shift instead of back, to p + shift instead of p - shift"),
    Mistake(9, "re-rotating each key by its own index", "rope_sink.py",
            "    cos, sin = rotary.cos_sin(torch.tensor([-shift], device=keys.device))\n",
            "    cos, sin = rotary.cos_sin(torch.arange(-shift, keys.shape[1] - shift, device=keys.device))\n",
            why="key i is turned by i - shift (as rotary(keys, -shift) would do) instead of every key by -shift"),
    Mistake(9, "kept keys not re-rotated", "rope_sink.py",
            "            kept = rerotate(self.rotary, k[:, self.n_sink + evict :], evict)\n",
            "            kept = k[:, self.n_sink + evict :]\n",
            why="the keys that stay keep their old rotation, so their positions no longer match their slots"),
    Mistake(9, "sinks evicted", "rope_sink.py",
            "            self.keys[layer] = torch.cat([k[:, : self.n_sink], kept], dim=1)\n"
            "            self.values[layer] = torch.cat([v[:, : self.n_sink], v[:, self.n_sink + evict :]], dim=1)\n",
            "            self.keys[layer] = rerotate(self.rotary, k[:, evict:], evict)\n"
            "            self.values[layer] = v[:, evict:]\n",
            why="the oldest positions are evicted whatever they are, sinks included (a plain sliding window)"),
]

_ROTATE = (
    "        x32 = x.float()\n"
    "        first, second = x32.chunk(2, dim=-1)\n"
    "        rotated_half = torch.cat((-second, first), dim=-1)  # (x1, x2) -> (-x2, x1): a quarter turn per pair\n"
    "        return (x32 * cos + rotated_half * sin).to(x.dtype)\n"
)
_ATTENTION_TAIL = (
    _REPEAT
    + "        scores = torch.einsum(\"bqnh,bknh->bnqk\", q, k) / math.sqrt(self.cfg.d_head)\n"
    "        pattern = self.apply_causal_mask(scores, mask).softmax(dim=-1)\n"
    "        z = torch.einsum(\"bnqk,bknh->bqnh\", pattern, v)\n"
    "        return torch.einsum(\"bqnh,nhd->bqd\", z, self.W_O)\n"
)
_SWIGLU = "        return (F.silu(x @ self.W_gate) * (x @ self.W_in)) @ self.W_out\n"
_MODEL = (
    "        new_tokens, positions, mask = tokens, 0, None\n"
    "        if step_cache is not None:\n"
    + _OFFSET
    + "        residual = self.W_E[new_tokens]\n"
    "        for block in self.blocks:\n"
    "            residual = block(residual, positions, step_cache, mask)\n"
    "        logits = self.ln_final(residual) @ self.W_U\n"
)

_REROTATE = (
    "    cos, sin = rotary.cos_sin(torch.tensor([-shift], device=keys.device))\n"
    "    k32 = keys.float()\n"
    "    first, second = k32.chunk(2, dim=-1)\n"
    "    return (k32 * cos[:, None, :] + torch.cat((-second, first), dim=-1) * sin[:, None, :]).to(keys.dtype)\n"
)
_MAKE_ROOM = (
    "        evict = max(self.seq_len + n_new - self.capacity, 0)\n"
    "        if evict == 0:\n"
    "            return 0\n"
    "        for layer, (k, v) in enumerate(zip(self.keys, self.values)):\n"
    "            # The sinks keep their slots; everything after the evicted block moves down by `evict`.\n"
    "            kept = rerotate(self.rotary, k[:, self.n_sink + evict :], evict)\n"
    "            self.keys[layer] = torch.cat([k[:, : self.n_sink], kept], dim=1)\n"
    "            self.values[layer] = torch.cat([v[:, : self.n_sink], v[:, self.n_sink + evict :]], dim=1)\n"
    "        return evict\n"
)

VARIANTS: list[Variant] = [
    # RMSNorm
    Variant(9, "RMSNorm", "division by torch.sqrt, no float32 upcast", "llama.py",
            _NORMALIZED + "        return normalized.to(x.dtype) * self.w\n",
            "        normalized = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)\n"
            "        return normalized * self.w\n"),
    Variant(9, "RMSNorm", "torch.nn.functional.rms_norm", "llama.py",
            _NORMALIZED + "        return normalized.to(x.dtype) * self.w\n",
            "        return F.rms_norm(x32, (x.shape[-1],), eps=self.eps).to(x.dtype) * self.w\n"),
    Variant(9, "RMSNorm", "the vector's norm divided by sqrt(size)", "llama.py", _NORMALIZED,
            "        rms = torch.linalg.vector_norm(x32, dim=-1, keepdim=True) / x32.shape[-1] ** 0.5\n"
            "        normalized = x32 / (rms.pow(2) + self.eps).sqrt()\n"),
    # Rotary
    Variant(9, "Rotary", "explicit pair formulas on the half-size angles", "llama.py", _ROTATE,
            "        half = x.shape[-1] // 2\n"
            "        x1, x2 = x[..., :half], x[..., half:]\n"
            "        c, s = cos[..., :half].to(x.dtype), sin[..., :half].to(x.dtype)  # as Hugging Face does\n"
            "        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)\n"),
    Variant(9, "Rotary", "complex multiplication (first half real, second half imaginary)", "llama.py", _ROTATE,
            "        half = x.shape[-1] // 2\n"
            "        z = torch.complex(x[..., :half].float(), x[..., half:].float())\n"
            "        turned = z * torch.complex(cos[..., :half], sin[..., :half])\n"
            "        return torch.cat((turned.real, turned.imag), dim=-1).to(x.dtype)\n"),
    # GroupedQueryAttention
    Variant(9, "GroupedQueryAttention", "expand and reshape the KV heads (Hugging Face's repeat_kv)", "llama.py",
            _REPEAT,
            "        b, s, kv, h = k.shape\n"
            "        k = k[:, :, :, None].expand(b, s, kv, group, h).reshape(b, s, kv * group, h)\n"
            "        v = v[:, :, :, None].expand(b, s, kv, group, h).reshape(b, s, kv * group, h)\n"),
    Variant(9, "GroupedQueryAttention", "scaled_dot_product_attention with enable_gqa and a boolean mask",
            "llama.py", _ATTENTION_TAIL,
            "        query_pos, key_pos = q.shape[1], k.shape[1]\n"
            "        visible = torch.ones(query_pos, key_pos, dtype=torch.bool, device=x.device).tril(key_pos - query_pos)\n"
            "        visible = visible if mask is None else visible & mask\n"
            "        z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),\n"
            "                                           attn_mask=visible, enable_gqa=True)\n"
            "        return torch.einsum(\"bnqh,nhd->bqd\", z, self.W_O)\n"),
    Variant(9, "GroupedQueryAttention", "queries grouped under their KV head, no copies of keys", "llama.py",
            _ATTENTION_TAIL,
            "        b, q_len, _, h = q.shape\n"
            "        kv = self.cfg.n_key_value_heads\n"
            "        qg = q.view(b, q_len, kv, group, h)\n"
            "        scores = torch.einsum(\"bqkgh,bskh->bkgqs\", qg, k) / h**0.5\n"
            "        s_len = k.shape[1]\n"
            "        future = torch.arange(s_len, device=x.device)[None, :] > torch.arange(s_len - q_len, s_len, device=x.device)[:, None]\n"
            "        if mask is not None:\n"
            "            future = future | ~mask[:, :, None]  # (batch_or_1, 1, 1, q, s) against (b, kv, g, q, s)\n"
            "        pattern = scores.masked_fill(future, float(\"-inf\")).softmax(dim=-1)\n"
            "        z = torch.einsum(\"bkgqs,bskh->bqkgh\", pattern, v).reshape(b, q_len, kv * group, h)\n"
            "        return torch.einsum(\"bqnh,nhd->bqd\", z, self.W_O)\n"),
    # SwiGLU
    Variant(9, "SwiGLU", "F.linear with transposed weights", "llama.py", _SWIGLU,
            "        gate = F.linear(x, self.W_gate.T)\n"
            "        return F.linear(F.silu(gate) * F.linear(x, self.W_in.T), self.W_out.T)\n"),
    Variant(9, "SwiGLU", "einsum and x * sigmoid(x) written out", "llama.py", _SWIGLU,
            "        gate = torch.einsum(\"bsd,dm->bsm\", x, self.W_gate)\n"
            "        up = torch.einsum(\"bsd,dm->bsm\", x, self.W_in)\n"
            "        return torch.einsum(\"bsm,md->bsd\", gate * torch.sigmoid(gate) * up, self.W_out)\n"),
    # LlamaTransformer
    Variant(9, "LlamaTransformer", "F.embedding, an indexed loop and the step's fields by name", "llama.py", _MODEL,
            "        if step_cache is None:\n"
            "            new, where, visible = tokens, 0, None\n"
            "        else:\n"
            "            step = step_cache.prepare(tokens, attention_mask)\n"
            "            new, where, visible = step.new_tokens, step.positions, step.mask\n"
            "        x = F.embedding(new, self.W_E)\n"
            "        for i in range(self.cfg.n_layers):\n"
            "            x = self.blocks[i](x, offset=where, cache=step_cache, mask=visible)\n"
            "        logits = F.linear(self.ln_final(x), self.W_U.T)\n"),
    Variant(9, "LlamaTransformer", "functools.reduce over the blocks, positions made by hand without a cache",
            "llama.py", _MODEL,
            "        import functools\n"
            "\n"
            "        step = step_cache.prepare(tokens, attention_mask) if step_cache else None\n"
            "        start = torch.arange(tokens.shape[1], device=tokens.device)[None] if step is None else step.positions\n"
            "        new = tokens if step is None else step.new_tokens\n"
            "        seen = None if step is None else step.mask\n"
            "        residual = functools.reduce(lambda r, blk: blk(r, start, step_cache, seen), self.blocks, self.W_E[new])\n"
            "        logits = torch.einsum(\"bsd,dv->bsv\", self.ln_final(residual), self.W_U)\n"),
    # rerotate
    Variant(9, "rerotate", "every position as its own batch entry through rotary(..., offset=-shift)", "rope_sink.py",
            _REROTATE,
            "    batch, pos, heads, d_head = keys.shape\n"
            "    return rotary(keys.reshape(batch * pos, 1, heads, d_head), -shift).reshape(batch, pos, heads, d_head)\n"),
    Variant(9, "rerotate", "explicit pair formulas with math.cos and math.sin of each frequency", "rope_sink.py",
            _REROTATE,
            "    angles = -shift * rotary.inv_freq.to(keys.device)\n"
            "    c, s = angles.cos(), angles.sin()\n"
            "    half = keys.shape[-1] // 2\n"
            "    x1, x2 = keys[..., :half], keys[..., half:]\n"
            "    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)\n"),
    # RotatingSinkCache.make_room
    Variant(9, "RotatingSinkCache.make_room", "lists rebuilt with comprehensions, index_select of the kept slots",
            "rope_sink.py", _MAKE_ROOM,
            "        evict = self.seq_len + n_new - self.capacity\n"
            "        if evict <= 0:\n"
            "            return 0\n"
            "        keep = torch.cat([torch.arange(self.n_sink), torch.arange(self.n_sink + evict, self.seq_len)])\n"
            "        keep = keep.to(self.keys[0].device)\n"
            "        sinks = self.n_sink\n"
            "        self.keys = [torch.cat([k[:, :sinks], rerotate(self.rotary, k.index_select(1, keep)[:, sinks:], evict)], 1)\n"
            "                     for k in self.keys]\n"
            "        self.values = [v.index_select(1, keep) for v in self.values]\n"
            "        return evict\n"),
    Variant(9, "RotatingSinkCache.make_room", "re-rotate the whole window, then slice", "rope_sink.py", _MAKE_ROOM,
            "        overflow = self.seq_len + n_new - self.capacity\n"
            "        if overflow > 0:\n"
            "            for i in range(len(self.keys)):\n"
            "                window = rerotate(self.rotary, self.keys[i][:, self.n_sink :], overflow)[:, overflow:]\n"
            "                self.keys[i] = torch.cat((self.keys[i][:, : self.n_sink], window), 1)\n"
            "                self.values[i] = torch.cat((self.values[i][:, : self.n_sink], self.values[i][:, self.n_sink + overflow :]), 1)\n"
            "        return max(overflow, 0)\n"),
]
from sampling_course.grading.parts.part9_modern.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)
MISTAKES = with_fixes(MISTAKES, FIXES)
