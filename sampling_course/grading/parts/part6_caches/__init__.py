"""Part 6, caches for long and fast generation: its exercises (what each asks, three graded
hints), its planted mistakes and its planted correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 6
TITLE = "Caches for long and fast generation"
SECTIONS = {"6b": "Fast decoding on a GPU"}  # notebook 06b's exercises: part 6 in the map, listed as "6b"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "fuse_qkv", 6, "fast_path", "fuse_qkv",
        "Lay W_Q, W_K and W_V side by side in one (d_model, 3 * n_heads * d_head) matrix (and their biases "
        "in one vector), and flatten W_O to (n_heads * d_head, d_model).",
        "One matmul that reads the three weights in one sweep replaces three. The columns must come in the "
        "order (Q, K, V), then head, then d_head, so that the output views as (..., 3, n_heads, d_head).",
        "einops.rearrange(W, 'n d h -> d (n h)') turns one (n_heads, d_model, d_head) weight into "
        "(d_model, n_heads * d_head); torch.cat the three along dim 1. Biases: b.flatten(), concatenated. "
        "W_O: rearrange 'n h d -> (n h) d'.",
        "W_QKV = torch.cat([einops.rearrange(W, 'n d h -> d (n h)') for W in (attn.W_Q, attn.W_K, attn.W_V)], dim=1)\n"
        "b_QKV = torch.cat([b.flatten() for b in (attn.b_Q, attn.b_K, attn.b_V)])\n"
        "W_O = einops.rearrange(attn.W_O, 'n h d -> (n h) d')",
    ),
    exercise(
        "StaticKeyValueCache.update", 6, "caches", "StaticKeyValueCache.update",
        "Write one layer's new keys and values into the next free slots of the preallocated buffer, in place, "
        "and return the keys and values of every filled slot.",
        "The new positions go to slots seq_len .. seq_len + new_pos - 1 of rows 0 .. batch - 1. Attention must "
        "read only the filled prefix: the slots after it hold numbers from nobody (torch.empty) or from a "
        "cropped continuation.",
        "Assign into self.buffer[layer, 0, :self.batch, start:end] (keys) and [layer, 1, ...] (values), then "
        "return the views self.buffer[layer, 0, :self.batch, :end] and the same for values. Do not move "
        "seq_len here: commit does, once, after every layer has written.",
        "end = self.seq_len + k.shape[1]\n"
        "self.buffer[layer, 0, :self.batch, self.seq_len:end] = k\n"
        "self.buffer[layer, 1, :self.batch, self.seq_len:end] = v\n"
        "return self.buffer[layer, 0, :self.batch, :end], self.buffer[layer, 1, :self.batch, :end]",
    ),
    exercise(
        "StaticKeyValueCache.reorder", 6, "caches", "StaticKeyValueCache.reorder",
        "Beam search: make row i of the cache hold what row rows[i] held, inside the same buffer.",
        "A permutation done row by row in place overwrites rows that later rows still have to read "
        "(rows = [1, 0]: row 0 becomes row 1, then row 1 copies the new row 0). Read first, then write.",
        "Only rows with rows[i] != i move. Layer by layer, first save (clone) every row that a move reads "
        "but another move overwrites, then copy each moving row from its source (the saved copy where there "
        "is one); at the end set self.batch. Gathering every row with index_select and writing them back is "
        "also correct, at the cost of a copy of every row.",
        "moves = [(i, row) for i, row in enumerate(rows.tolist()) if row != i]\n"
        "overwritten = {i for i, _ in moves}\n"
        "for layer in range(self.buffer.shape[0]):\n"
        "    filled = self.buffer[layer, :, :, :self.seq_len]\n"
        "    saved = {row: filled[:, row].clone() for _, row in moves if row in overwritten}\n"
        "    for i, row in moves:\n"
        "        filled[:, i] = saved[row] if row in saved else filled[:, row]\n"
        "self.batch = len(rows)",
    ),
    exercise(
        "fast_forward", 6, "fast_path", "FusedQKV",
        "The fast path: the model's own forward pass with queries, keys and values from one matmul over the "
        "weights fused once, at load (fuse_at_load), instead of three.",
        "fuse_qkv's W_QKV is (d_model, 3 * n_heads * d_head): a row of inputs times it gives the queries, keys "
        "and values of every head side by side, in the order (Q, K, V), then head, then d_head.",
        "Treat the positions as rows: x.reshape(batch * pos, d_model). torch.addmm(b_QKV, rows, W_QKV) is the "
        "matmul and the bias in one call; view the result as (batch, pos, 3, n_heads, d_head) and unbind "
        "dimension 2 into q, k and v, each (batch, pos, n_heads, d_head) as Attention.forward expects.",
        "qkv = torch.addmm(fused.b_QKV, x.reshape(batch * pos, d_model), fused.W_QKV)\n"
        "q, k, v = qkv.view(batch, pos, 3, n_heads, d_head).unbind(2)",
    ),
    exercise(
        "SinkCache.positions", 6, "sink_cache", "SinkCache.positions",
        "The position ids of the next new_pos tokens of the text, by the cache's position rule.",
        "Tokens seen, seen + 1, ... of the text. The 'cache' rule gives each token its index in the window "
        "(counting from the oldest token the window holds, the token itself included); the 'absolute' rule its "
        "position in the text, capped at the last position the model has learned.",
        "Until the window is full, token t's index in the window is t; once it is full, the new token replaces "
        "the oldest recent one and is the last of window_length, at index window_length - 1. So 'cache' is "
        "min(t, window_length - 1) and 'absolute' is min(t, n_ctx - 1): torch.arange(...).clamp(max=...).",
        "t = torch.arange(self.seen, self.seen + new_pos, device=device)\n"
        "last = self.window_length - 1 if self.position_rule == 'cache' else self.n_ctx - 1\n"
        "return t.clamp(max=last)",
    ),
    exercise(
        "SinkCache.update", 6, "sink_cache", "SinkCache.update",
        "Store a layer's new keys and values: in the free slots while there are any, then over the oldest "
        "recent token, never over a sink; return the keys and values the new tokens attend to.",
        "Slots 0 .. num_sink_tokens - 1 hold the sinks forever. The other slots form a ring: self.ring counts "
        "from the first slot after the sinks, so the slot to overwrite is num_sink_tokens + self.ring.",
        "If seq_len + new_pos <= window_length, write at slots seq_len .. seq_len + new_pos - 1 and return the "
        "filled prefix. Otherwise (your part then sees one token: several that overflow the window are given "
        "code's) write at num_sink_tokens + ring and return all window_length slots. Leave seen and ring "
        "alone: commit moves them after the last layer.",
        "held, new_pos = self.seq_len, k.shape[1]\n"
        "if held + new_pos <= self.window_length: start, end = held, held + new_pos\n"
        "else: start = self.num_sink_tokens + self.ring; end = start + 1; held = self.window_length\n"
        "self.buffer[layer, 0, :, start:end] = k; self.buffer[layer, 1, :, start:end] = v\n"
        "return self.buffer[layer, 0, :, :max(held, end)], self.buffer[layer, 1, :, :max(held, end)]",
    ),
)

_C = "caches.py"
_F = "fast_path.py"
_K = "sink_cache.py"

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(6, "static cache attends to unfilled slots", _C,
            "return self.buffer[layer, 0, : self.batch, :end], self.buffer[layer, 1, : self.batch, :end]",
            "return self.buffer[layer, 0, : self.batch], self.buffer[layer, 1, : self.batch]",
            why=("attention reads every slot of the preallocated buffer, including slots not yet written; "
                 "only the first seq_len + new positions hold keys.")),
    Mistake(6, "static cache returns the old keys only (the new token misses itself)", _C,
            "return self.buffer[layer, 0, : self.batch, :end], self.buffer[layer, 1, : self.batch, :end]",
            "return self.buffer[layer, 0, : self.batch, : self.seq_len], self.buffer[layer, 1, : self.batch, : self.seq_len]",
            why=("the cache returns the keys held before this step's write, so a new token cannot attend "
                 "to itself.")),
    Mistake(6, "static cache writes every step at slot 0", _C,
            "        self.buffer[layer, 0, : self.batch, self.seq_len : end] = k\n"
            "        self.buffer[layer, 1, : self.batch, self.seq_len : end] = v\n",
            "        self.buffer[layer, 0, : self.batch, : k.shape[1]] = k\n"
            "        self.buffer[layer, 1, : self.batch, : k.shape[1]] = v\n",
            why=("every step writes its keys and values at slot 0 instead of at the cache's current "
                 "length.")),
    Mistake(6, "fused QKV in the order K, Q, V", _F,
            "for W in (attn.W_Q, attn.W_K, attn.W_V)], dim=1)", "for W in (attn.W_K, attn.W_Q, attn.W_V)], dim=1)",
            why=("the fused projection stacks the weights as K, Q, V, so the slices taken as queries are "
                 "keys.")),
    Mistake(6, "fused weights flattened head-last (d_head, then head)", _F,
            'W_QKV = torch.cat([einops.rearrange(W, "n d h -> d (n h)")',
            'W_QKV = torch.cat([einops.rearrange(W, "n d h -> d (h n)")',
            why=("the fused weights are flattened with d_head outside and the head inside, so the columns "
                 "no longer follow the heads' order.")),
    # The fast path is the model's one forward pass: its classic mistakes now sit where that pass does the work,
    # and the fast path's tests (the forward on the static cache, QKV fused) are the ones that must catch them.
    Mistake(6, "fast path forgets the positions the cache gives", "transformer.py",
            "residual = self.embed(step.new_tokens) + self.pos_embed.W_pos[step.positions]",
            "residual = self.embed(step.new_tokens) + self.pos_embed.W_pos[: step.new_tokens.shape[1]]",
            exercise="fast_forward",
            why=("the pass embeds new tokens at positions 0, 1, ... instead of at the positions the cache gives, "
                 "after the tokens it already holds.")),
    Mistake(6, "fast path drops the attention mask (the static cache's pads are attended)", _C,
            "return step_after(self.seq_len, tokens, attention_mask)", "return step_after(self.seq_len, tokens)",
            exercise="fast_forward",
            why=("the static cache's step drops the attention mask, so the pads of a left-padded batch are "
                 "attended and counted as positions.")),
    Mistake(6, "fast path uses SDPA's is_causal=True (top-left: wrong for several new tokens on a cache)", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=1,", exercise="fast_forward",
            why=("the causal mask is aligned to the top left, as SDPA's is_causal=True aligns it, so new tokens "
                 "on top of a cache see only the first keys.")),
    Mistake(6, "fast path uses the exact GELU instead of GPT-2's tanh approximation", "transformer.py",
            "return gelu_new(pre) @ self.W_out", "return torch.nn.functional.gelu(pre) @ self.W_out", exercise="fast_forward",
            why=("the pass uses the exact GELU; GPT-2 was trained with the tanh approximation "
                 "(gelu_new).")),
    Mistake(6, "fused QKV split head-first (the heads' q, k, v interleaved)", _F,
            "q, k, v = qkv.view(batch, pos, 3, n_heads, d_head).unbind(2)",
            "q, k, v = qkv.view(batch, pos, n_heads, 3, d_head).unbind(3)",
            why=("the fused output is viewed as (n_heads, 3, d_head), but fuse_qkv lays out the queries of every "
                 "head first, then the keys, then the values: (3, n_heads, d_head).")),
    Mistake(6, "sink cache evicts the sink tokens (the ring covers every slot)", _K,
            "            start = self.num_sink_tokens + self.ring\n",
            "            start = self.ring\n",
            why=("the ring buffer of the sliding window covers the sink slots too, so the first tokens are"
                 " evicted like the others.")),
    Mistake(6, "sink window one position off (the window counts as full one token early)", _K,
            "        if held + new_pos <= self.window_length:\n",
            "        if held + new_pos < self.window_length:\n",
            why="the window counts as full one token early, so it holds one token fewer than its length."),
    Mistake(6, "sink positions off by one (a full window's tokens at window_length)", _K,
            'last = self.window_length - 1 if self.position_rule == "cache" else self.n_ctx - 1',
            'last = self.window_length if self.position_rule == "cache" else self.n_ctx - 1',
            why=("once the window is full, new tokens get position window_length instead of their index in"
                 " the window (window_length - 1 for the newest).")),
    Mistake(6, "sink positions counted from 1", _K,
            "        t = torch.arange(self.seen, self.seen + new_pos, device=device)\n",
            "        t = torch.arange(self.seen + 1, self.seen + new_pos + 1, device=device)\n",
            why="positions inside the sink cache are counted from 1 instead of 0."),
    Mistake(6, "sink positions wrap around the window (t % window)", _K,
            "        return t.clamp(max=last)\n",
            "        return t % (last + 1)\n",
            why="positions wrap around (t % window_length) once the window is full, where the newest token stays last",
            fix="clamp t at the last index, window_length - 1 (n_ctx - 1 for 'absolute')"),
]

# Correct implementations in other styles: every test of their exercise must pass.
VARIANTS: list[Variant] = [
    Variant(6, "fuse_qkv", "permute and reshape instead of einops, W_O by view", _F,
            '    W_QKV = torch.cat([einops.rearrange(W, "n d h -> d (n h)") for W in (attn.W_Q, attn.W_K, attn.W_V)], dim=1)\n'
            "    b_QKV = torch.cat([b.flatten() for b in (attn.b_Q, attn.b_K, attn.b_V)])\n"
            '    W_O = einops.rearrange(attn.W_O, "n h d -> (n h) d")\n',
            "    n_heads, d_model, d_head = attn.W_Q.shape\n"
            "    W_QKV = torch.stack([attn.W_Q, attn.W_K, attn.W_V]).permute(2, 0, 1, 3).reshape(d_model, 3 * n_heads * d_head)\n"
            "    b_QKV = torch.stack([attn.b_Q, attn.b_K, attn.b_V]).reshape(-1)\n"
            "    W_O = attn.W_O.reshape(n_heads * d_head, d_model)\n"),
    Variant(6, "fuse_qkv", "one einsum-free cat of per-head slices", _F,
            '    W_QKV = torch.cat([einops.rearrange(W, "n d h -> d (n h)") for W in (attn.W_Q, attn.W_K, attn.W_V)], dim=1)\n',
            "    W_QKV = torch.cat([W[head] for W in (attn.W_Q, attn.W_K, attn.W_V) for head in range(W.shape[0])], dim=1)\n"),
    Variant(6, "StaticKeyValueCache.update", "narrow and copy_, then slice the returned views", _C,
            "        end = self.seq_len + k.shape[1]\n"
            "        self.buffer[layer, 0, : self.batch, self.seq_len : end] = k\n"
            "        self.buffer[layer, 1, : self.batch, self.seq_len : end] = v\n",
            "        end = self.seq_len + k.shape[1]\n"
            "        rows = self.buffer[layer, :, : self.batch]\n"
            "        rows[0].narrow(1, self.seq_len, k.shape[1]).copy_(k)\n"
            "        rows[1].narrow(1, self.seq_len, k.shape[1]).copy_(v)\n"),
    Variant(6, "StaticKeyValueCache.update", "keys and values written together with torch.stack", _C,
            "        self.buffer[layer, 0, : self.batch, self.seq_len : end] = k\n"
            "        self.buffer[layer, 1, : self.batch, self.seq_len : end] = v\n",
            "        self.buffer[layer, :, : self.batch, self.seq_len : end] = torch.stack([k, v])\n"),
    Variant(6, "fast_forward", "a matmul and the bias added after, split with chunk", _F,
            "        qkv = torch.addmm(fused.b_QKV, x.reshape(batch * pos, d_model), fused.W_QKV)\n"
            "        q, k, v = qkv.view(batch, pos, 3, n_heads, d_head).unbind(2)\n",
            "        qkv = x @ fused.W_QKV + fused.b_QKV\n"
            "        q, k, v = (t.reshape(batch, pos, n_heads, d_head) for t in qkv.chunk(3, dim=-1))\n"),
    Variant(6, "fast_forward", "F.linear on the transposed weight, einops to split", _F,
            "        qkv = torch.addmm(fused.b_QKV, x.reshape(batch * pos, d_model), fused.W_QKV)\n"
            "        q, k, v = qkv.view(batch, pos, 3, n_heads, d_head).unbind(2)\n",
            "        qkv = torch.nn.functional.linear(x, fused.W_QKV.T, fused.b_QKV)\n"
            '        q, k, v = einops.rearrange(qkv, "b s (three n h) -> three b s n h", three=3, n=n_heads)\n'),
    Variant(6, "SinkCache.positions", "a Python list and torch.minimum", _K,
            "        t = torch.arange(self.seen, self.seen + new_pos, device=device)\n"
            '        last = self.window_length - 1 if self.position_rule == "cache" else self.n_ctx - 1\n'
            "        return t.clamp(max=last)\n",
            "        cap = self.window_length if self.position_rule == 'cache' else self.n_ctx\n"
            "        ids = torch.tensor([self.seen + i for i in range(new_pos)], device=device, dtype=torch.long)\n"
            "        return torch.minimum(ids, torch.full_like(ids, cap - 1))\n"),
    Variant(6, "SinkCache.positions", "torch.where between the text position and the last one", _K,
            "        t = torch.arange(self.seen, self.seen + new_pos, device=device)\n"
            '        last = self.window_length - 1 if self.position_rule == "cache" else self.n_ctx - 1\n'
            "        return t.clamp(max=last)\n",
            "        t = self.seen + torch.arange(new_pos, device=device)\n"
            "        last = torch.tensor(self.window_length - 1 if self.position_rule == 'cache' else self.n_ctx - 1, device=device)\n"
            "        return torch.where(t > last, last, t)\n"),
    Variant(6, "SinkCache.update", "copy_ into narrowed views, one return for both cases", _K,
            "        self.buffer[layer, 0, :, start:end] = k\n"
            "        self.buffer[layer, 1, :, start:end] = v\n"
            "        key_pos = max(held, end)\n",
            "        self.buffer[layer, 0].narrow(1, start, end - start).copy_(k)\n"
            "        self.buffer[layer, 1].narrow(1, start, end - start).copy_(v)\n"
            "        key_pos = min(self.window_length, self.seq_len + new_pos)\n"),
    Variant(6, "SinkCache.update", "index_copy_ into the chosen slots, modular ring arithmetic", _K,
            "        held, new_pos = self.seq_len, k.shape[1]\n"
            "        if held + new_pos <= self.window_length:\n"
            "            start, end = held, held + new_pos\n"
            "        else:\n"
            "            start = self.num_sink_tokens + self.ring\n"
            "            end = start + 1\n"
            "            held = self.window_length\n"
            "        self.buffer[layer, 0, :, start:end] = k\n"
            "        self.buffer[layer, 1, :, start:end] = v\n"
            "        key_pos = max(held, end)\n",
            "        held, new_pos = self.seq_len, k.shape[1]\n"
            "        full = held + new_pos > self.window_length\n"
            "        recent = self.window_length - self.num_sink_tokens\n"
            "        slots = torch.tensor([self.num_sink_tokens + self.ring % recent] if full else list(range(held, held + new_pos)))\n"
            "        self.buffer[layer, 0].index_copy_(1, slots.to(self.buffer.device), k)\n"
            "        self.buffer[layer, 1].index_copy_(1, slots.to(self.buffer.device), v)\n"
            "        key_pos = self.window_length if full else held + new_pos\n"),
]


# ---------------------------------------------------------------------------------------
# Fast decoding on a GPU (notebook 06b, exercises/gpu_decoding.py)
# ---------------------------------------------------------------------------------------

EXERCISES += (
    exercise(
        "fixed_shape_step", 6, "gpu_decoding", "FixedShapeCache",
        "A decode step that does the same work at every position, so that it can be captured as a CUDA "
        "graph: the model's own forward pass on a cache of the protocol whose position is a tensor on the "
        "device; the new keys and values go into slot `position` of the static buffer, and attention reads "
        "every slot through a mask.",
        "Nothing may depend on the position's value on the host: no int(position), no slicing up to it. "
        "The layers are the model's forward pass; what is yours is the cache: prepare gives the new tokens, "
        "their position (a device tensor) and a boolean mask over all max_len slots that shows slots "
        "0 .. position (its own included); update writes the new keys and values in place at a tensor index "
        "(index_copy_) and returns every slot.",
        "self.slot = position.view(1) is a 1-element index (a 0-d tensor index is read back as an int). "
        "prepare: visible = torch.arange(max_len) <= self.position, returned as CacheStep(tokens, "
        "self.slot[None], mask=visible[None, None, None, :]). update(layer, k, v): "
        "buffer[layer, 0].index_copy_(1, self.slot, k), the same for values, and return the two whole "
        "(batch, max_len, n_heads, d_head) views.",
        "visible = torch.arange(max_len, device=tokens.device) <= self.position\n"
        "return CacheStep(tokens, self.slot[None], mask=visible[None, None, None, :])\n"
        "# update:\n"
        "keys, values = self.buffer[layer, 0], self.buffer[layer, 1]\n"
        "keys.index_copy_(1, self.slot, k); values.index_copy_(1, self.slot, v)\n"
        "return keys, values",
        section="6b",
    ),
    exercise(
        "race_sample", 6, "gpu_decoding", "race_sample",
        "Draw one token per row from softmax(logits), torch.multinomial's law, without making the host wait "
        "for the device: the exponential race.",
        "Give each token an alarm clock that rings after an exponential time of rate p_i: clock i rings at "
        "E_i / p_i with E_i ~ Exp(1), and the first to ring is token i with probability exactly p_i. That is "
        "element-wise work and an argmax, all on the device.",
        "probs = softmax(logits); clocks = torch.empty_like(probs).exponential_(generator=generator) (one "
        "clock per token and row, from the generator given); the winner is (probs / clocks).argmax(-1). "
        "Not torch.multinomial: it draws the same way, but PyTorch has long checked its input on the host first.",
        "probs = logits.float().softmax(dim=-1)\n"
        "clocks = torch.empty_like(probs).exponential_(generator=generator)\n"
        "return (probs / clocks).argmax(dim=-1)",
        section="6b",
    ),
    exercise(
        "decode_loop", 6, "gpu_decoding", "decode_loop",
        "Run the decode steps, looking at which rows have finished only every check_every steps, and return "
        "the tokens a loop that looked after every step would return.",
        "bool(finished.all()) makes the host wait for the device: do it only after steps check_every, "
        "2 check_every, ... Keep finished.all() of every step as a device tensor, and at the end drop the "
        "columns after the first step at which every row had finished. step() returns the same tensor every "
        "time: keep a copy of each step's tokens.",
        "columns.append(step().clone()); all_done.append(finished.all()); stop when (i + 1) % check_every == 0 "
        "and bool(all_done[-1]). At the end: done = torch.stack(all_done); keep the first "
        "int(done.long().argmax()) + 1 columns if done.any(), else all of them.",
        "columns, all_done = [], []\n"
        "for i in range(max_new_tokens):\n"
        "    columns.append(step().clone())\n"
        "    all_done.append(finished.all())\n"
        "    if (i + 1) % check_every == 0 and bool(all_done[-1]): break\n"
        "done = torch.stack(all_done)\n"
        "keep = int(done.long().argmax()) + 1 if bool(done.any()) else len(columns)\n"
        "return torch.stack(columns[:keep], dim=1)",
        section="6b",
    ),
)

_G = "gpu_decoding.py"

MISTAKES += [
    Mistake(6, "fixed-shape step hides the new token from itself", _G,
            "visible = torch.arange(max_len, device=tokens.device) <= self.position",
            "visible = torch.arange(max_len, device=tokens.device) < self.position",
            why="the mask shows slots before the position only; the new token must also see its own slot."),
    Mistake(6, "fixed-shape step attends to every slot", _G,
            "return CacheStep(tokens, self.slot[None], mask=visible[None, None, None, :])",
            "return CacheStep(tokens, self.slot[None])",
            why="attention reads every slot of the buffer, the ones not written yet too; mask all but 0 .. position."),
    Mistake(6, "fixed-shape step writes the new keys one slot late", _G,
            "        keys.index_copy_(1, self.slot, k)\n        values.index_copy_(1, self.slot, v)\n",
            "        keys.index_copy_(1, self.slot + 1, k)\n        values.index_copy_(1, self.slot + 1, v)\n",
            why="the new keys and values go to slot position + 1; they belong in slot `position`."),
    Mistake(6, "fixed-shape step embeds every token at position 0", _G,
            "return CacheStep(tokens, self.slot[None], mask=visible[None, None, None, :])",
            "return CacheStep(tokens, torch.zeros_like(self.slot)[None], mask=visible[None, None, None, :])",
            why="the new token gets the embedding of position 0 instead of W_pos[position]."),
    Mistake(6, "fixed-shape step reads the position back to the host", _G,
            "return CacheStep(tokens, self.slot[None], mask=visible[None, None, None, :])",
            "return CacheStep(tokens, torch.tensor([[int(self.position)]], device=tokens.device), "
            "mask=visible[None, None, None, :])",
            why=("int(position) copies the position to the host, which waits for the device: a captured step "
                 "cannot do that. Index with the tensor (position.view(1)).")),
    Mistake(6, "race multiplies by the clocks", _G,
            "    return (probs / clocks).argmax(dim=-1)\n", "    return (probs * clocks).argmax(dim=-1)\n",
            why="the race multiplies p by the clocks; a clock of rate p rings at E / p, so the winner is argmax p / E."),
    Mistake(6, "race with uniform clocks", _G,
            "clocks = torch.empty_like(probs).exponential_(generator=generator)",
            "clocks = torch.empty_like(probs).uniform_(generator=generator)",
            why="the clocks are uniform; only exponential clocks make token i win with probability p_i."),
    Mistake(6, "race won by the last clock to ring", _G,
            "    return (probs / clocks).argmax(dim=-1)\n", "    return (probs / clocks).argmin(dim=-1)\n",
            why="the winner is the smallest p / E, the last clock to ring; it must be the first (argmax p / E)."),
    Mistake(6, "race run on the logits", _G,
            "    return (probs / clocks).argmax(dim=-1)\n", "    return (logits / clocks).argmax(dim=-1)\n",
            why="the race divides the logits by the clocks; it needs the probabilities, softmax(logits)."),
    Mistake(6, "race with one set of clocks for every row", _G,
            "clocks = torch.empty_like(probs).exponential_(generator=generator)",
            "clocks = torch.empty_like(probs[:1]).exponential_(generator=generator)",
            why="every row uses the same clocks, so rows with the same logits always draw the same token."),
    Mistake(6, "race ignores the generator it is given", _G,
            "clocks = torch.empty_like(probs).exponential_(generator=generator)",
            "clocks = torch.empty_like(probs).exponential_()",
            why="the clocks come from torch's global generator instead of the one passed in."),
    Mistake(6, "race drawn with torch.multinomial", _G,
            "    return (probs / clocks).argmax(dim=-1)\n",
            "    return torch.multinomial(probs, 1, generator=generator)[:, 0]\n",
            why=("torch.multinomial draws from the right law, but the exercise is to draw without it: PyTorch has "
                 "long checked its input with values read back to the host, which waits for the device.")),
    Mistake(6, "decode loop looks after every step", _G,
            "        if (i + 1) % check_every == 0 and bool(all_done[-1]):\n",
            "        if bool(all_done[-1]):\n",
            why="the loop reads `finished` after every step; it should look only every check_every steps."),
    Mistake(6, "decode loop keeps the step's own tensor", _G,
            "        columns.append(step().clone())", "        columns.append(step())",
            why="each column is the tensor step() returns, which the next step overwrites: keep a copy."),
    Mistake(6, "decode loop looks one step early", _G,
            "        if (i + 1) % check_every == 0 and bool(all_done[-1]):\n",
            "        if i % check_every == 0 and bool(all_done[-1]):\n",
            why="the looks come after steps 1, check_every + 1, ...; they belong after steps check_every, 2 check_every, ..."),
    Mistake(6, "decode loop keeps the pad columns at the end", _G,
            "    keep = int(done.long().argmax()) + 1 if bool(done.any()) else len(columns)\n",
            "    keep = len(columns)\n",
            why="the columns after the step where the last row finished (pads only) are kept."),
    Mistake(6, "decode loop drops the step where the last row finished", _G,
            "    keep = int(done.long().argmax()) + 1 if bool(done.any()) else len(columns)\n",
            "    keep = int(done.long().argmax()) if bool(done.any()) else len(columns)\n",
            why="the column of the step at which the last row finished (its end token) is dropped."),
]

VARIANTS += [
    Variant(6, "fixed_shape_step", "the mask as 'no later slot', built by comparison the other way", _G,
            "        visible = torch.arange(max_len, device=tokens.device) <= self.position\n",
            "        later = self.position < torch.arange(max_len, device=tokens.device)\n"
            "        visible = ~later\n"),
    Variant(6, "fixed_shape_step", "writes through torch.where on a one-slot mask", _G,
            "        keys.index_copy_(1, self.slot, k)\n        values.index_copy_(1, self.slot, v)\n",
            "        here = (torch.arange(keys.shape[1], device=k.device) == self.position)[None, :, None, None]\n"
            "        keys.copy_(torch.where(here, k, keys))\n"
            "        values.copy_(torch.where(here, v, values))\n"),
    Variant(6, "fixed_shape_step", "writes by indexed assignment (index_put_)", _G,
            "        keys.index_copy_(1, self.slot, k)\n        values.index_copy_(1, self.slot, v)\n",
            "        keys[:, self.slot] = k\n        values[:, self.slot] = v\n"),
    Variant(6, "race_sample", "Gumbel-max: logits minus the log of exponential clocks", _G,
            "    probs = logits.float().softmax(dim=-1)\n"
            "    clocks = torch.empty_like(probs).exponential_(generator=generator)\n"
            "    return (probs / clocks).argmax(dim=-1)\n",
            "    clocks = torch.empty_like(logits, dtype=torch.float).exponential_(generator=generator)\n"
            "    return (logits.float() - clocks.log()).argmax(dim=-1)\n"),
    Variant(6, "race_sample", "the clock that rings first: argmin of clocks / probs", _G,
            "    return (probs / clocks).argmax(dim=-1)\n",
            "    return (clocks / probs).argmin(dim=-1)\n"),
    Variant(6, "race_sample", "inverse of the cumulative distribution with one uniform per row", _G,
            "    clocks = torch.empty_like(probs).exponential_(generator=generator)\n"
            "    return (probs / clocks).argmax(dim=-1)\n",
            "    cdf = probs.cumsum(dim=-1)\n"
            "    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=probs.dtype) * cdf[:, -1:]\n"
            "    return torch.searchsorted(cdf, u, right=True)[:, 0]\n"),
    Variant(6, "decode_loop", "a preallocated output and a device count of the steps before all finished", _G,
            "    columns, all_done = [], []\n"
            "    for i in range(max_new_tokens):\n"
            "        columns.append(step().clone())  # a copy: the next step overwrites the tensor step() returns\n"
            "        all_done.append(finished.all())  # stays on the device: no waiting\n"
            "        if (i + 1) % check_every == 0 and bool(all_done[-1]):\n"
            "            break\n"
            "    done = torch.stack(all_done)\n"
            "    # One look at the end: keep the columns up to the first step after which every row had finished.\n"
            "    keep = int(done.long().argmax()) + 1 if bool(done.any()) else len(columns)\n"
            "    return torch.stack(columns[:keep], dim=1)\n",
            "    out = torch.empty(finished.shape[0], max_new_tokens, dtype=torch.long, device=finished.device)\n"
            "    before_all_done = torch.zeros((), dtype=torch.long, device=finished.device)\n"
            "    ran = 0\n"
            "    for i in range(max_new_tokens):\n"
            "        out[:, i] = step()\n"
            "        ran += 1\n"
            "        before_all_done += (~finished.all()).long()\n"
            "        if (i + 1) % check_every == 0 and bool(finished.all()):\n"
            "            break\n"
            "    return out[:, : int(before_all_done) + 1 if bool(finished.all()) else ran]\n"),
    Variant(6, "decode_loop", "chunks of check_every steps in a while loop, the first finished step by torch.where", _G,
            "    columns, all_done = [], []\n"
            "    for i in range(max_new_tokens):\n"
            "        columns.append(step().clone())  # a copy: the next step overwrites the tensor step() returns\n"
            "        all_done.append(finished.all())  # stays on the device: no waiting\n"
            "        if (i + 1) % check_every == 0 and bool(all_done[-1]):\n"
            "            break\n"
            "    done = torch.stack(all_done)\n"
            "    # One look at the end: keep the columns up to the first step after which every row had finished.\n"
            "    keep = int(done.long().argmax()) + 1 if bool(done.any()) else len(columns)\n"
            "    return torch.stack(columns[:keep], dim=1)\n",
            "    columns, done_after = [], []\n"
            "    ran = 0\n"
            "    while ran < max_new_tokens:\n"
            "        for _ in range(min(check_every, max_new_tokens - ran)):\n"
            "            columns.append(step().clone())\n"
            "            done_after.append(finished.all())\n"
            "            ran += 1\n"
            "        if bool(finished.all()):\n"
            "            break\n"
            "    done = torch.stack(done_after)\n"
            "    steps = torch.arange(len(done), device=done.device)\n"
            "    first = int(torch.where(done, steps, len(done)).min())\n"
            "    return torch.stack(columns[: first + 1], dim=1)\n"),
]
from sampling_course.grading.parts.part6_caches.reorder import REORDER_MISTAKES, REORDER_VARIANTS  # noqa: E402
from sampling_course.grading.parts.part6_caches.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)
MISTAKES = with_fixes(MISTAKES + REORDER_MISTAKES, FIXES)
VARIANTS += REORDER_VARIANTS
