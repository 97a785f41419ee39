"""Part 5, the generation engine: its exercises (what each asks, three graded hints), its planted
mistakes, and its planted correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise

PART = 5
TITLE = "The generation engine"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "top_k_filter", 5, "generate", "top_k_filter",
        "Keep the top_k largest logits of every row of a (batch, d_vocab) tensor; set the others to -inf.",
        "Work row by row without a loop: every operation takes dim=-1. Removed tokens must get "
        "-inf, so that softmax gives them probability exactly 0.",
        "logits.topk(top_k, dim=-1).values[:, -1:] is each row's k-th largest value, shaped to "
        "broadcast against the row. Remove what is strictly below it; tokens tied with it may all "
        "stay (Hugging Face keeps them).",
        "kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]\n"
        'return logits.masked_fill(logits < kth_largest, float("-inf"))',
    ),
    exercise(
        "top_p_filter", 5, "generate", "top_p_filter",
        "Keep the smallest set of most likely tokens whose probability reaches top_p (inclusive); -inf for the rest.",
        "Sort each row from most to least likely. A token stays while the probability of the "
        "tokens ranked above it is still below top_p, so the token that crosses top_p stays too.",
        "Sort with logits.sort(dim=-1, descending=True), which also gives the vocabulary order "
        "back. mass_above = cumsum(probs) - probs; remove where mass_above >= top_p, but never "
        "the first token; then scatter the decisions back with the sort order.",
        "sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
        "sorted_probs = sorted_logits.softmax(dim=-1)\n"
        "remove_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p\n"
        "remove_sorted[:, 0] = False\n"
        "remove = remove_sorted.scatter(1, order, remove_sorted)\n"
        'return logits.masked_fill(remove, float("-inf"))',
    ),
    exercise(
        "min_p_filter", 5, "generate", "min_p_filter",
        "Keep the tokens whose probability is at least min_p times their row's top probability; -inf for the rest.",
        "The bar is relative: min_p times the largest probability of the same row, not min_p itself.",
        "probs = logits.softmax(dim=-1); the bar is min_p * probs.max(dim=-1, keepdim=True).values. "
        "The top token always passes its own bar.",
        "probs = logits.softmax(dim=-1)\n"
        "bar = min_p * probs.max(dim=-1, keepdim=True).values\n"
        'return logits.masked_fill(probs < bar, float("-inf"))',
    ),
    exercise(
        "warp_logits", 5, "generate", "warp_logits",
        "Apply the temperature, then top-k, then top-p, then min-p, skipping the filters that are switched off.",
        "Order matters: Hugging Face applies the temperature first, so every filter judges the "
        "distribution that will actually be sampled.",
        "Divide by the temperature first. top_k=0, top_p=1.0 and min_p=0.0 mean off: call a filter "
        "only when its setting is on, and feed each filter the output of the previous one.",
        "logits = logits / temperature\n"
        "if top_k > 0: logits = top_k_filter(logits, top_k)\n"
        "if top_p < 1.0: logits = top_p_filter(logits, top_p)\n"
        "if min_p > 0.0: logits = min_p_filter(logits, min_p)\n"
        "return logits",
    ),
    exercise(
        "batched_sample", 5, "generate", "sample",
        "One token per row: argmax at temperature 0, otherwise one draw per row from softmax of warp_logits.",
        "Temperature 0 is greedy and skips every filter. Otherwise warp, turn into probabilities, "
        "and draw one index per row.",
        "torch.multinomial(probs, num_samples=1, generator=generator) draws one index per row of a "
        "2-D tensor; pass the generator, so that a seed gives the same tokens. Return shape (batch,).",
        "if temperature == 0:\n"
        "    return logits.argmax(dim=-1)\n"
        "probs = warp_logits(logits, temperature, top_k, top_p, min_p).softmax(dim=-1)\n"
        "return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]",
    ),
    exercise(
        "apply_repetition_penalty", 5, "generate", "apply_repetition_penalty",
        "Hugging Face's repetition penalty: divide the positive logits and multiply the negative ones of every token seen.",
        "The penalty must make a seen token less likely whatever its sign: dividing a negative "
        "logit by a penalty above 1 would raise it. Once per distinct token, however often it occurs.",
        "`seen` (given) is a (batch, d_vocab) boolean. Build the penalised logits with "
        "torch.where(logits > 0, logits / penalty, logits * penalty), then keep them only where seen.",
        "penalised = torch.where(logits > 0, logits / penalty, logits * penalty)\n"
        "return torch.where(seen, penalised, logits)",
    ),
    exercise(
        "apply_presence_and_frequency_penalty", 5, "generate", "apply_presence_and_frequency_penalty",
        "OpenAI's penalties: subtract presence_penalty once per token seen and frequency_penalty once per occurrence.",
        "`counts` (given) says how often each token occurred in each row. Presence asks whether "
        "(counts > 0), frequency how often (counts).",
        "Both are plain subtractions from the logits; convert counts to the logits' dtype first.",
        "present = (counts > 0).to(logits.dtype)\n"
        "return logits - presence_penalty * present - frequency_penalty * counts.to(logits.dtype)",
    ),
    exercise(
        "left_pad", 5, "generate", "left_pad",
        "Stack prompts of different lengths into (input_ids, attention_mask), padding each on the left up to the longest.",
        "Left, so that every row's last real token sits in the last column and its next-token logits are at "
        "[:, -1]. The mask is 1 at real tokens and 0 at pads.",
        "width is the longest prompt's length. A row is [pad_token_id] * (width - len(ids)) followed by its ids, "
        "its mask [0] * (width - len(ids)) followed by [1] * len(ids); torch.tensor of the lists gives each tensor.",
        "width = max(len(ids) for ids in token_lists)\n"
        "input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]\n"
        "attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]\n"
        "return torch.tensor(input_ids), torch.tensor(attention_mask)",
    ),
    exercise(
        "position_ids_from_mask", 5, "transformer", "position_ids_from_mask",
        "Each token's position among the real tokens of its row: 0, 1, 2, ... whatever padding comes first; pads get 0.",
        "A real token's position is the number of real tokens before it in its row. Pads are never attended, "
        "so their position only has to be a valid one (Hugging Face gives them 0).",
        "attention_mask.long().cumsum(dim=-1) counts the real tokens up to and including each column; subtract "
        "one, then write 0 where the mask is 0 with masked_fill.",
        "positions = attention_mask.long().cumsum(dim=-1) - 1\n"
        "return positions.masked_fill(attention_mask == 0, 0)",
    ),
    exercise(
        "masked_forward", 5, "transformer", "Attention.masked_forward",
        "Attention for padded batches: write the new keys and values into kv's last slots, then let each new query "
        "attend to the real tokens up to its own position, through scaled_dot_product_attention.",
        "q, k and v as in forward. kv already has slots for the new positions, its last new_pos ones: write the new "
        "keys and values there, in place, and attend to all of kv. A pad key is masked exactly like a future key.",
        "One additive mask for every head: apply_causal_mask on zeros of shape (1, 1, new_pos, key_pos) (IGNORE on "
        "future keys, shifted for the cached ones), then IGNORE where attention_mask[:, None, None, :] == 0. Pass it "
        "as attn_mask to F.scaled_dot_product_attention, with q, keys and values transposed to (batch, n_heads, pos, "
        "d_head). (is_causal=True aligns its mask to the top left: wrong as soon as keys are cached.)",
        "kv[0, :, -new_pos:] = einops.einsum(x, self.W_K, ...) + self.b_K   # and kv[1] with W_V, b_V\n"
        "causal = self.apply_causal_mask(q.new_zeros(1, 1, new_pos, key_pos))\n"
        "bias = causal.masked_fill(attention_mask[:, None, None, :] == 0, self.IGNORE)\n"
        "z = F.scaled_dot_product_attention(q.transpose(1, 2), kv[0].transpose(1, 2), kv[1].transpose(1, 2), attn_mask=bias)\n"
        'return einops.einsum(z, self.W_O, "b n q h, n h d -> b q d") + self.b_O',
    ),
    exercise(
        "padded_forward", 5, "transformer", "DemoTransformer.padded_forward",
        "A padding-aware forward pass: each new token embedded at its position among real tokens, each block's "
        "attention through masked_forward, with or without a cache.",
        "Only the columns from past on are new. Embed each at its position among its row's real tokens, not at its "
        "column: PosEmbed gives every row the same positions, so it cannot do that.",
        "positions = position_ids_from_mask(attention_mask)[:, past:] (the mask covers the cached columns too, so "
        "slice after counting); add self.pos_embed.W_pos[positions]. A block's own forward has no mask: call its "
        "ln1, attn.masked_forward(..., kv, attention_mask), ln2 and mlp yourself, adding each to the residual.",
        "positions = position_ids_from_mask(attention_mask)[:, past:]\n"
        "residual = self.embed(tokens[:, past:]) + self.pos_embed.W_pos[positions]\n"
        "for block, kv in zip(self.blocks, cache.unbind(0)):\n"
        "    residual = residual + block.attn.masked_forward(block.ln1(residual), kv, attention_mask)\n"
        "    residual = residual + block.mlp(block.ln2(residual))\n"
        "logits = self.unembed(self.ln_final(residual))",
    ),
    exercise(
        "generate", 5, "generate", "generate",
        "Prefill the left-padded prompts once, then one token per row per step, padding each row once it is finished.",
        "In the loop, the first step is the prefill (every prompt at once) and every later step runs only the new "
        "tokens on top of the cache. A finished row gets the pad token from then on, masked out like the left padding.",
        "Per step: apply_penalties (pass n_prompt, so the presence and frequency penalties count generated tokens "
        "only), sample (whole batch, once), replace the tokens of finished rows by the pad, append tokens and mask, "
        "record scores, then finished |= stopped_rows(...). Stop when every row is finished, not when the first one is.",
        "logits, cache = prefill(...) if cache is None else decode_step(...)\n"
        "processed = apply_penalties(logits, input_ids, attention_mask, ..., n_prompt)\n"
        "next_tokens = sample(processed, temperature, top_k, top_p, min_p, generator).masked_fill(finished, pad_token_id)\n"
        "input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=1)\n"
        "attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=1)\n"
        "finished |= stopped_rows(criteria, input_ids, processed)\n"
        "if finished.all(): break",
    ),
    exercise(
        "StopStringCriteria", 5, "generate", "StopStringCriteria",
        "Stop a row when a stop string ends in the newest token's text, even when it spans several tokens.",
        "One token's text is not enough: a stop string can be split over tokens, and a character "
        "over bytes. Decode the last few tokens together.",
        "Decode the tail with and without the newest token; the newest token's text starts where "
        "the two stop agreeing. A stop string counts when it occurs in the tail and ends at or "
        "after that point.",
        "tail = ids[-self.tail_tokens:]\n"
        "before, text = self.decode(tail[:-1]), self.decode(tail)\n"
        "start = length of the common prefix of before and text\n"
        "return any(s in text[max(0, start - len(s) + 1):] for s in self.stop_strings)",
    ),
    exercise(
        "TextStreamer", 5, "generate", "TextStreamer",
        "Print generated text a word at a time, never half a character, and flush the rest at the end.",
        "Decode all tokens so far every time (a token alone may be half a character), and print "
        "only what you have not printed yet.",
        "Print up to and including the last space or newline: what follows may still grow, and a "
        "split character decodes as '\\ufffd' until its last byte arrives. end() prints the rest.",
        "self.token_ids.extend(token_ids)\n"
        "text = self.decode()\n"
        'safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1\n'
        "if safe_end > self.printed: self.emit(text[self.printed:safe_end]); self.printed = safe_end",
    ),
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(5, "temperature applied after top-p", "generate.py",
            "    logits = logits / temperature\n    if top_k > 0:\n        logits = top_k_filter(logits, top_k)\n"
            "    if top_p < 1.0:\n        logits = top_p_filter(logits, top_p)\n",
            "    if top_k > 0:\n        logits = top_k_filter(logits, top_k)\n"
            "    if top_p < 1.0:\n        logits = top_p_filter(logits, top_p)\n    logits = logits / temperature\n",
            why=("the temperature is applied after the filters, so top-k, top-p and min-p judge a "
                 "distribution that is not the one sampled; Hugging Face divides by the temperature first.")),
    Mistake(5, "top-p judged on the raw logits", "generate.py",
            "    if top_p < 1.0:\n        logits = top_p_filter(logits, top_p)\n",
            "    if top_p < 1.0:\n        raw = logits * temperature\n"
            '        logits = logits.masked_fill(top_p_filter(raw, top_p) == float("-inf"), float("-inf"))\n',
            why=("top-p is judged on the logits before the temperature, so the kept set ignores the "
                 "temperature; every filter should see the tempered logits.")),
    Mistake(5, "top-k keeps one token too many", "generate.py",
            "kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]",
            "kth_largest = logits.topk(min(top_k + 1, logits.shape[-1]), dim=-1).values[:, -1:]",
            why=("top-k keeps the k + 1 largest logits (the bar is the next value below the k-th, not the "
                 "k-th itself).")),
    Mistake(5, "top-p cutoff exclusive", "generate.py",
            "remove_sorted = mass_above >= top_p", "remove_sorted = mass_above + sorted_probs > top_p",
            why=("an exclusive top-p cutoff: the token whose probability carries the running total past "
                 "top_p is dropped, where it must stay.")),
    Mistake(5, "min-p bar not scaled by the top probability", "generate.py",
            "bar = min_p * probs.max(dim=-1, keepdim=True).values", "bar = min_p",
            why=("the min-p bar is min_p itself, where it must be min_p times the row's largest "
                 "probability.")),
    Mistake(5, "sample ignores its generator", "generate.py",
            "torch.multinomial(probs, num_samples=1, generator=generator)", "torch.multinomial(probs, num_samples=1)",
            why=("the draw ignores the torch.Generator it is given, so a seed does not reproduce the "
                 "tokens.")),
    Mistake(5, "repetition penalty multiplies positive logits", "generate.py",
            "penalised = torch.where(logits > 0, logits / penalty, logits * penalty)",
            "penalised = logits * penalty",
            why=("the repetition penalty multiplies every seen token's logit, which makes a positive logit"
                 " larger; positive logits must be divided and negative ones multiplied.")),
    Mistake(5, "presence penalty applied per occurrence", "generate.py",
            "present = (counts > 0).to(logits.dtype)", "present = counts.to(logits.dtype)",
            why=("the presence penalty is subtracted once per occurrence, where it is subtracted once per "
                 "distinct token (per occurrence is the frequency penalty).")),
    Mistake(5, "right padding", "generate.py",
            "input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]\n"
            "    attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]",
            "input_ids = [list(ids) + [pad_token_id] * (width - len(ids)) for ids in token_lists]\n"
            "    attention_mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids in token_lists]",
            why=("prompts padded on the right, so the next token of a short prompt is predicted after "
                 "pads; decoder-only generation pads on the left.")),
    Mistake(5, "positions counted over pads", "transformer.py",
            "positions = attention_mask.long().cumsum(dim=-1) - 1\n    return positions.masked_fill(attention_mask == 0, 0)",
            "return torch.arange(attention_mask.shape[1], device=attention_mask.device).expand(attention_mask.shape)",
            why=("the positions count the pad tokens, so a left-padded row's real tokens start at a "
                 "position above 0; positions must come from the attention mask.")),
    Mistake(5, "positions counted from 1", "transformer.py",
            "positions = attention_mask.long().cumsum(dim=-1) - 1\n", "positions = attention_mask.long().cumsum(dim=-1)\n",
            why=("the running count of real tokens is used as it is, so a row's first real token sits at "
                 "position 1; subtract one.")),
    Mistake(5, "pad keys attended", "transformer.py",
            "bias = causal.masked_fill(attention_mask[:, None, None, :] == 0, self.IGNORE)", "bias = causal",
            why=("queries attend to pad keys: the attention mask must hide every pad position from every "
                 "query.")),
    Mistake(5, "no causal mask in the engine's attention", "transformer.py",
            "causal = self.apply_causal_mask(q.new_zeros(1, 1, new_pos, key_pos))",
            "causal = q.new_zeros(1, 1, new_pos, key_pos)",
            why=("the padded attention drops the causal mask, so each position sees the tokens after "
                 "it.")),
    Mistake(5, "new keys and values written over the cached ones (the first slots)", "transformer.py",
            '        kv[0, :, -new_pos:] = einops.einsum(x, self.W_K, "b new n d, n d h -> b new n h") + self.b_K\n'
            '        kv[1, :, -new_pos:] = einops.einsum(x, self.W_V, "b new n d, n d h -> b new n h") + self.b_V\n',
            '        kv[0, :, :new_pos] = einops.einsum(x, self.W_K, "b new n d, n d h -> b new n h") + self.b_K\n'
            '        kv[1, :, :new_pos] = einops.einsum(x, self.W_V, "b new n d, n d h -> b new n h") + self.b_V\n',
            why=("the new keys and values are written into the first slots of kv, over the cached ones; "
                 "they belong in its last new_pos slots.")),
    Mistake(5, "padded rows embedded at their columns (PosEmbed)", "transformer.py",
            "residual = self.embed(tokens[:, past:]) + self.pos_embed.W_pos[positions]",
            "residual = self.embed(tokens[:, past:]) + self.pos_embed(tokens[:, past:], offset=past)",
            why=("PosEmbed embeds every row at its columns, pads counted, so a left-padded row's tokens sit "
                 "at the wrong positions; index W_pos with each row's positions among its real tokens.")),
    Mistake(5, "positions counted over the new columns only (cached tokens forgotten)", "transformer.py",
            "positions = position_ids_from_mask(attention_mask)[:, past:]",
            "positions = position_ids_from_mask(attention_mask[:, past:])",
            why=("the positions are counted over the new columns only, so with a cache the new tokens start "
                 "again at position 0; count over the whole mask, then keep the new columns.")),
    Mistake(5, "one finished row ends the batch", "generate.py",
            "        if finished.all():\n            break", "        if finished.any():\n            break",
            why=("generation stops when any row finishes; it must go on until every row has finished (or "
                 "the length limit).")),
    Mistake(5, "finished rows not padded", "generate.py",
            "next_tokens = next_tokens.masked_fill(finished, pad_token_id)", "next_tokens = next_tokens",
            why=("a row that has finished keeps sampling tokens; once it has produced the end token it "
                 "must be filled with the pad token.")),
    Mistake(5, "the whole sequence re-run every step (no cache after the prefill)", "generate.py",
            "logits, cache = decode_step(model, input_ids, attention_mask, cache)",
            "logits, cache = prefill(model, input_ids, attention_mask)",
            why=("every step runs the model over the whole sequence instead of feeding only the new token "
                 "with the cache filled by the prefill.")),
    Mistake(5, "presence and frequency penalties count the prompt", "generate.py",
            "repetition_penalty, presence_penalty, frequency_penalty, n_prompt\n",
            "repetition_penalty, presence_penalty, frequency_penalty\n",
            why=("the presence and frequency penalties count the prompt's tokens too; as OpenAI and vLLM "
                 "define them, they count only the tokens generated so far (pass n_prompt).")),
    Mistake(5, "scores taken from the raw logits", "generate.py",
            "drawn_from = processed if temperature == 0 else warp_logits(processed, temperature, top_k, top_p, min_p)",
            "drawn_from = logits",
            why=("the returned scores are taken from the raw logits instead of the processed ones the "
                 "token was drawn from.")),
    Mistake(5, "stop strings checked one token at a time", "generate.py",
            "        tail = ids[-self.tail_tokens :]\n        before, text = self.decode(tail[:-1]), self.decode(tail)\n",
            "        return any(s in self.decode(ids[-1:]) for s in self.stop_strings)\n"
            "        tail = ids[-self.tail_tokens :]\n        before, text = self.decode(tail[:-1]), self.decode(tail)\n",
            why=("a stop string is looked for in the newest token alone, so one that spans several tokens "
                 "is missed; check the decoded tail of the row.")),
    Mistake(5, "streamer prints every token at once, half characters included", "generate.py",
            'safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1', "safe_end = len(text)",
            why=("the streamer prints each token as soon as it arrives, including a multi-byte character "
                 "split across tokens; hold back text until it decodes cleanly.")),
]

# Correct implementations in other styles: every test of the exercise must accept them.
VARIANTS: list[Variant] = [
    Variant(5, "top_k_filter", "exactly k tokens: topk, then scatter into a tensor of -inf", "generate.py",
            "    kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]\n"
            '    return logits.masked_fill(logits < kth_largest, float("-inf"))\n',
            "    top = logits.topk(top_k, dim=-1)\n"
            '    return torch.full_like(logits, float("-inf")).scatter(1, top.indices, top.values)\n'),
    Variant(5, "top_k_filter", "the k-th value from a descending sort", "generate.py",
            "kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]",
            "kth_largest = logits.sort(dim=-1, descending=True).values[:, top_k - 1 : top_k]"),
    Variant(5, "top_p_filter", "torch.searchsorted on the cumulative probabilities", "generate.py",
            "    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs\n"
            "    remove_sorted = mass_above >= top_p\n"
            "    remove_sorted[:, 0] = False\n",
            "    cumulative = sorted_probs.cumsum(dim=-1)\n"
            "    target = torch.full((logits.shape[0], 1), float(top_p), dtype=cumulative.dtype, device=logits.device)\n"
            "    n_keep = (torch.searchsorted(cumulative, target) + 1).clamp(max=logits.shape[-1])\n"
            "    remove_sorted = torch.arange(logits.shape[-1], device=logits.device) >= n_keep\n"),
    Variant(5, "top_p_filter", "a logit threshold at the last kept token", "generate.py",
            "    remove_sorted = mass_above >= top_p\n"
            "    remove_sorted[:, 0] = False\n"
            "    # Put the decisions back in vocabulary order.\n"
            "    remove = remove_sorted.scatter(1, order, remove_sorted)\n"
            '    return logits.masked_fill(remove, float("-inf"))\n',
            "    n_keep = (mass_above < top_p).sum(dim=-1, keepdim=True).clamp(min=1)\n"
            "    threshold = sorted_logits.gather(1, n_keep - 1)\n"
            '    return logits.masked_fill(logits < threshold, float("-inf"))\n'),
    Variant(5, "min_p_filter", "in log space: below the top logit + log(min_p)", "generate.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    bar = min_p * probs.max(dim=-1, keepdim=True).values\n"
            '    return logits.masked_fill(probs < bar, float("-inf"))\n',
            "    bar = logits.max(dim=-1, keepdim=True).values + torch.tensor(float(min_p)).log()\n"
            '    return logits.masked_fill(logits < bar, float("-inf"))\n'),
    Variant(5, "min_p_filter", "each token's probability relative to the top one", "generate.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    bar = min_p * probs.max(dim=-1, keepdim=True).values\n"
            '    return logits.masked_fill(probs < bar, float("-inf"))\n',
            "    ratio = (logits - logits.max(dim=-1, keepdim=True).values).exp()\n"
            '    return logits.masked_fill(ratio < min_p, float("-inf"))\n'),
    Variant(5, "warp_logits", "a loop over (switched on, filter) pairs", "generate.py",
            "    if top_k > 0:\n        logits = top_k_filter(logits, top_k)\n"
            "    if top_p < 1.0:\n        logits = top_p_filter(logits, top_p)\n"
            "    if min_p > 0.0:\n        logits = min_p_filter(logits, min_p)\n    return logits\n",
            "    steps = [\n"
            "        (top_k > 0, lambda x: top_k_filter(x, top_k)),\n"
            "        (top_p < 1.0, lambda x: top_p_filter(x, top_p)),\n"
            "        (min_p > 0.0, lambda x: min_p_filter(x, min_p)),\n"
            "    ]\n"
            "    for switched_on, apply in steps:\n"
            "        if switched_on:\n"
            "            logits = apply(logits)\n"
            "    return logits\n"),
    Variant(5, "warp_logits", "temperature as a multiplication by its inverse", "generate.py",
            "    logits = logits / temperature\n    if top_k > 0:",
            "    logits = logits * (1.0 / temperature)\n    if top_k > 0:"),
    Variant(5, "batched_sample", "inverse CDF: one uniform per row and searchsorted", "generate.py",
            "    probs = warp_logits(logits, temperature, top_k, top_p, min_p).softmax(dim=-1)\n"
            "    # The draw Hugging Face makes: with the same seed, the same tokens.\n"
            "    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n",
            "    probs = warp_logits(logits, temperature, top_k, top_p, min_p).softmax(dim=-1)\n"
            "    cdf = probs.cumsum(dim=-1)\n"
            "    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)\n"
            "    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=probs.shape[-1] - 1)[:, 0]\n"),
    Variant(5, "batched_sample", "the Gumbel-max trick", "generate.py",
            "    probs = warp_logits(logits, temperature, top_k, top_p, min_p).softmax(dim=-1)\n"
            "    # The draw Hugging Face makes: with the same seed, the same tokens.\n"
            "    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n",
            "    warped = warp_logits(logits, temperature, top_k, top_p, min_p)\n"
            "    u = torch.rand(warped.shape, generator=generator, device=warped.device)\n"
            "    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))\n"
            "    return (warped + gumbel).argmax(dim=-1)\n"),
    Variant(5, "apply_repetition_penalty", "a multiplicative factor per token", "generate.py",
            "    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)\n"
            "    return torch.where(seen, penalised, logits)\n",
            "    factor = torch.where(logits > 0, torch.full_like(logits, 1.0 / penalty), torch.full_like(logits, penalty))\n"
            "    return logits * torch.where(seen, factor, torch.ones_like(logits))\n"),
    Variant(5, "apply_repetition_penalty", "a Python loop over each row's seen tokens", "generate.py",
            "    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)\n"
            "    return torch.where(seen, penalised, logits)\n",
            "    out = logits.clone()\n"
            "    for row in range(logits.shape[0]):\n"
            "        for token in seen[row].nonzero().flatten().tolist():\n"
            "            value = out[row, token]\n"
            "            out[row, token] = value / penalty if value > 0 else value * penalty\n"
            "    return out\n"),
    Variant(5, "apply_presence_and_frequency_penalty", "one subtraction of a combined amount", "generate.py",
            "    present = (counts > 0).to(logits.dtype)\n"
            "    return logits - presence_penalty * present - frequency_penalty * counts.to(logits.dtype)\n",
            "    amount = presence_penalty * counts.clamp(max=1) + frequency_penalty * counts\n"
            "    return logits - amount.to(logits.dtype)\n"),
    Variant(5, "apply_presence_and_frequency_penalty", "torch.where for the presence penalty", "generate.py",
            "    present = (counts > 0).to(logits.dtype)\n"
            "    return logits - presence_penalty * present - frequency_penalty * counts.to(logits.dtype)\n",
            "    logits = torch.where(counts > 0, logits - presence_penalty, logits)\n"
            "    return logits - frequency_penalty * counts\n"),
    Variant(5, "position_ids_from_mask", "positions clamped at 0 (pads after real tokens keep a position)", "transformer.py",
            "positions = attention_mask.long().cumsum(dim=-1) - 1\n    return positions.masked_fill(attention_mask == 0, 0)",
            "return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)"),
    Variant(5, "position_ids_from_mask", "torch.where over the running count of real tokens", "transformer.py",
            "positions = attention_mask.long().cumsum(dim=-1) - 1\n    return positions.masked_fill(attention_mask == 0, 0)",
            "seen = torch.cumsum(attention_mask.long(), dim=-1)\n"
            "    return torch.where(attention_mask.bool(), seen - 1, torch.zeros_like(seen))"),
    Variant(5, "masked_forward", "the pad mask added instead of filled in", "transformer.py",
            "bias = causal.masked_fill(attention_mask[:, None, None, :] == 0, self.IGNORE)",
            "bias = causal + (attention_mask[:, None, None, :] == 0) * self.IGNORE"),
    Variant(5, "masked_forward", "attention written out instead of the fused call", "transformer.py",
            "        z = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=bias)\n",
            '        scores = einops.einsum(q, kv[0], "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n'
            "        z = (scores + bias).softmax(dim=-1) @ values\n"),
    Variant(5, "generate", "finished rows padded with torch.where", "generate.py",
            "next_tokens = next_tokens.masked_fill(finished, pad_token_id)",
            "next_tokens = torch.where(finished, torch.full_like(next_tokens, pad_token_id), next_tokens)"),
    Variant(5, "padded_forward", "token and position embeddings with F.embedding", "transformer.py",
            "residual = self.embed(tokens[:, past:]) + self.pos_embed.W_pos[positions]",
            "residual = F.embedding(tokens[:, past:], self.embed.W_E) + F.embedding(positions, self.pos_embed.W_pos)"),
    Variant(5, "padded_forward", "the blocks by index, each layer's cache rows taken by indexing", "transformer.py",
            "        for block, kv in zip(self.blocks, cache.unbind(0)):\n"
            "            # TransformerBlock.forward has no mask argument, so its two residual steps are spelled out here.\n"
            "            residual = residual + block.attn.masked_forward(block.ln1(residual), kv, attention_mask)\n"
            "            residual = residual + block.mlp(block.ln2(residual))\n",
            "        for layer, block in enumerate(self.blocks):\n"
            "            attn_out = block.attn.masked_forward(block.ln1(residual), cache[layer], attention_mask)\n"
            "            resid_mid = residual + attn_out\n"
            "            residual = resid_mid + block.mlp(block.ln2(resid_mid))\n"),
    Variant(5, "left_pad", "left padding with pad_sequence on reversed rows", "generate.py",
            "    width = max(len(ids) for ids in token_lists)\n"
            "    input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]\n"
            "    attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]\n"
            "    return torch.tensor(input_ids), torch.tensor(attention_mask)\n",
            "    rows = [torch.tensor(list(ids)).flip(0) for ids in token_lists]\n"
            "    pad = torch.nn.utils.rnn.pad_sequence\n"
            "    input_ids = pad(rows, batch_first=True, padding_value=pad_token_id).flip(1)\n"
            "    attention_mask = pad([torch.ones_like(row) for row in rows], batch_first=True).flip(1)\n"
            "    return input_ids, attention_mask\n"),
    Variant(5, "left_pad", "tensors of pads filled from the right, row by row", "generate.py",
            "    input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]\n"
            "    attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]\n"
            "    return torch.tensor(input_ids), torch.tensor(attention_mask)\n",
            "    input_ids = torch.full((len(token_lists), width), pad_token_id, dtype=torch.long)\n"
            "    attention_mask = torch.zeros(len(token_lists), width, dtype=torch.long)\n"
            "    for row, ids in enumerate(token_lists):\n"
            "        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)\n"
            "        attention_mask[row, width - len(ids) :] = 1\n"
            "    return input_ids, attention_mask\n"),
    Variant(5, "generate", "finished rows' pads left visible (mask 1), as Hugging Face does", "generate.py",
            "attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=1)",
            "attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)"),
    Variant(5, "StopStringCriteria", "decode the whole row every time", "generate.py",
            "        tail = ids[-self.tail_tokens :]\n", "        tail = ids\n"),
    Variant(5, "StopStringCriteria", "every place a stop string could end, checked by slicing", "generate.py",
            "        start = 0\n"
            "        while start < min(len(before), len(text)) and before[start] == text[start]:\n"
            "            start += 1\n"
            "        # A stop string that ends at or after `start` reaches into the newest token.\n"
            "        return any(s in text[max(0, start - len(s) + 1) :] for s in self.stop_strings)\n",
            '        start = len(before.rstrip("\\ufffd"))\n'
            "        for s in self.stop_strings:\n"
            "            for end in range(max(start + 1, len(s)), len(text) + 1):\n"
            "                if text[end - len(s) : end] == s:\n"
            "                    return True\n"
            "        return False\n"),
    Variant(5, "TextStreamer", "the last whitespace found with a regular expression", "generate.py",
            '        safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1\n',
            "        import re\n\n"
            '        match = re.match(r"(?s).*[ \\n]", text)\n'
            "        safe_end = match.end() if match else 0\n"),
    Variant(5, "TextStreamer", "Hugging Face's rule: everything at a newline, else up to the last space", "generate.py",
            '        safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1\n',
            '        safe_end = len(text) if text.endswith("\\n") else text.rfind(" ") + 1\n'),
]
