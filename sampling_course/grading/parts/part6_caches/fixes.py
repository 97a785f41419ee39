"""How to put right each of part 6's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "static cache attends to unfilled slots":
        "return only the filled slots, buffer[layer, 0, :batch, :end] with end = seq_len + new positions",
    "static cache returns the old keys only (the new token misses itself)":
        "write this step's keys first, then return the slots up to end = seq_len + new positions",
    "static cache writes every step at slot 0":
        "write at the current length: buffer[layer, 0, :batch, seq_len:end] = k (and likewise v)",
    "reorder copies row by row in place (overwrites rows still to be read)":
        "save (clone) every row that a move reads before any move overwrites it, or gather every row first (index_select) and write them back in one assignment",
    "reorder keeps the old batch size": "set self.batch = len(rows) after the reorder",
    "fused QKV in the order K, Q, V":
        "concatenate the weights in the order W_Q, W_K, W_V, matching how the fused output is split",
    "fused weights flattened head-last (d_head, then head)":
        "flatten each weight with the head outside: einops.rearrange(W, \"n d h -> d (n h)\")",
    "fast path forgets the positions the cache gives":
        "embed each new token at the position the cache's step gives: self.pos_embed.W_pos[step.positions]",
    "fast path drops the attention mask (the static cache's pads are attended)":
        "hand the attention mask on: step_after(self.seq_len, tokens, attention_mask)",
    "fast path uses SDPA's is_causal=True (top-left: wrong for several new tokens on a cache)":
        "align the causal mask to the bottom right: torch.triu(..., diagonal=key_pos - query_pos + 1)",
    "fast path uses the exact GELU instead of GPT-2's tanh approximation": "use gelu_new, the tanh approximation",
    "fused QKV split head-first (the heads' q, k, v interleaved)":
        "view the fused output as (batch, pos, 3, n_heads, d_head) and unbind dimension 2",
    "sink cache evicts the sink tokens (the ring covers every slot)":
        "keep the ring after the sinks: start = num_sink_tokens + ring",
    "sink window one position off (the window counts as full one token early)":
        "treat the window as full only when held + new_pos > window_length (<= still fits)",
    "sink positions off by one (a full window's tokens at window_length)":
        "cap positions at window_length - 1 under the \"cache\" rule (n_ctx - 1 under \"absolute\")",
    "sink positions counted from 1": "count from the tokens seen so far: torch.arange(seen, seen + new_pos)",
    "fixed-shape step hides the new token from itself":
        "show slots 0 to position inclusive: arange(max_len) <= position",
    "fixed-shape step attends to every slot":
        "return the visible mask with the step: CacheStep(tokens, slot[None], mask=visible[None, None, None, :])",
    "fixed-shape step writes the new keys one slot late":
        "write the new keys and values at slot position: keys.index_copy_(1, self.slot, k)",
    "fixed-shape step embeds every token at position 0":
        "give the slot, position.view(1), as the token's position: CacheStep(tokens, self.slot[None], ...)",
    "fixed-shape step reads the position back to the host":
        "index with the device tensor itself, slot = position.view(1), never int(position)",
    "race multiplies by the clocks": "take (probs / clocks).argmax(dim=-1)",
    "race with uniform clocks": "draw exponential clocks: torch.empty_like(probs).exponential_(generator=generator)",
    "race won by the last clock to ring": "take argmax of probs / clocks, not argmin",
    "race run on the logits": "race the probabilities: (logits.softmax(-1) / clocks).argmax(dim=-1)",
    "race with one set of clocks for every row":
        "draw a clock for every entry of every row: torch.empty_like(probs).exponential_(generator=generator)",
    "race ignores the generator it is given": "pass it on: exponential_(generator=generator)",
    "race drawn with torch.multinomial": "draw exponential clocks and return (probs / clocks).argmax(dim=-1)",
    "decode loop looks after every step": "look only when (i + 1) % check_every == 0",
    "decode loop keeps the step's own tensor": "append a copy: columns.append(step().clone())",
    "decode loop looks one step early":
        "look when (i + 1) % check_every == 0, after steps check_every, 2 check_every, ...",
    "decode loop keeps the pad columns at the end":
        "cut the columns after the first step at which every row had finished",
    "decode loop drops the step where the last row finished":
        "keep that step's column too: int(done.long().argmax()) + 1 columns",
}
