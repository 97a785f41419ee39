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
        "typical_filter", 5, "generate", "typical_filter",
        "Typical sampling: keep the tokens whose surprise -log p is closest to the row's entropy, up to a mass of typical_p.",
        "The entropy H is the average surprise, -sum(p log p). A token is typical when its own surprise "
        "-log p is close to H, whether it is likely or not: on a flat row a very likely token is atypical.",
        "Work like top-p, but rank by the gap |-log p - H| (smallest first) instead of by probability: "
        "sort the gaps, keep a token while the probability ranked before it is below typical_p (so the "
        "token that reaches typical_p stays), never remove the first, and scatter back. Removed tokens "
        "have p = 0 and log p = -inf: sum p log p with nansum.",
        "logprobs = logits.log_softmax(-1); probs = logprobs.exp()\n"
        "entropy = -(probs * logprobs).nansum(-1, keepdim=True)\n"
        "gap = (-logprobs - entropy).abs()\n"
        "sorted_gap, order = gap.sort(dim=-1); sorted_probs = probs.gather(-1, order)\n"
        "remove_sorted = sorted_probs.cumsum(-1) - sorted_probs >= typical_p; remove_sorted[:, 0] = False\n"
        'return logits.masked_fill(remove_sorted.scatter(1, order, remove_sorted), float("-inf"))',
    ),
    exercise(
        "epsilon_filter", 5, "generate", "epsilon_filter",
        "Epsilon sampling: remove the tokens whose probability is below epsilon; the row's most likely token always stays.",
        "The bar is a probability, so compare softmax(logits), not the logits, with it.",
        "A flat row can have every token below the bar; removing them all would leave nothing to draw. "
        "Keep every token whose logit equals the row's largest (logits.max(dim=-1, keepdim=True)).",
        "probs = logits.softmax(dim=-1)\n"
        "top = logits.max(dim=-1, keepdim=True).values\n"
        'return logits.masked_fill((probs < epsilon) & (logits < top), float("-inf"))',
    ),
    exercise(
        "eta_filter", 5, "generate", "eta_filter",
        "Eta sampling: remove the tokens below min(eta, sqrt(eta) * exp(-entropy)); the top token always stays.",
        "Like epsilon sampling, with a bar per row that falls as the row's entropy H (in nats) grows: a "
        "flat, uncertain row keeps more of its many plausible tokens.",
        "H = -sum(p log p) per row (nansum, keepdim=True). The bar is the smaller of eta and "
        "sqrt(eta) * exp(-H) (torch.minimum, or clamp(max=eta)); compare the probabilities with it and "
        "keep the row's top token, as in epsilon_filter.",
        "logprobs = logits.log_softmax(-1); probs = logprobs.exp()\n"
        "entropy = -(probs * logprobs).nansum(-1, keepdim=True)\n"
        "bar = (math.sqrt(eta) * torch.exp(-entropy)).clamp(max=eta)\n"
        "top = logits.max(dim=-1, keepdim=True).values\n"
        'return logits.masked_fill((probs < bar) & (logits < top), float("-inf"))',
    ),
    exercise(
        "top_n_sigma_filter", 5, "generate", "top_n_sigma_filter",
        "Top-n-sigma (llama.cpp): keep the tokens whose logit is at least max - n * std of the row's logits.",
        "It works on logits, not probabilities: the statistics are the largest logit and the standard "
        "deviation of the logits still in the row.",
        "Tokens an earlier filter removed hold -inf: leave them out of the mean and the standard deviation "
        "(torch.isfinite gives the mask; sum only where it is True and divide by its count). The standard "
        "deviation is the population one (divide by the count, as llama.cpp does).",
        "finite = torch.isfinite(logits); count = finite.sum(-1, keepdim=True)\n"
        "mean = torch.where(finite, logits, 0).sum(-1, keepdim=True) / count\n"
        "std = (torch.where(finite, (logits - mean) ** 2, 0).sum(-1, keepdim=True) / count).sqrt()\n"
        'return logits.masked_fill(logits < logits.max(-1, keepdim=True).values - n * std, float("-inf"))',
    ),
    exercise(
        "xtc_filter", 5, "generate", "xtc_filter",
        "XTC (llama.cpp): with probability xtc_probability per row, remove every token at or above the threshold but the least likely of them.",
        "Two decisions per row: whether XTC applies this time (one uniform draw per row from the "
        "generator), and which tokens are 'top choices' (probability >= threshold).",
        "Draw torch.rand(batch, generator=generator) < probability first. Among the top choices keep the "
        "least likely one (so a row with a single top choice is left alone): remove those whose probability "
        "is above the smallest top-choice probability of the row.",
        "applies = torch.rand(logits.shape[0], generator=generator) < probability\n"
        "probs = logits.softmax(-1); above = probs >= threshold\n"
        "least = torch.where(above, probs, 2.0).min(-1, keepdim=True).values\n"
        'return logits.masked_fill(above & (probs > least) & applies[:, None], float("-inf"))',
    ),
    exercise(
        "warp_logits", 5, "generate", "warp_logits",
        "Apply the steps of `order` one after the other: the temperature and each filter that is switched on.",
        "Order matters: Hugging Face applies the temperature first, so every filter judges the "
        "distribution that will actually be sampled; llama.cpp applies it last. `order` (given) already "
        "holds the steps to run, in the order asked for.",
        "Walk `order`: \"temperature\" divides the logits by the temperature, every other name calls its "
        "filter with its setting (\"xtc\" also takes the generator). Feed each step the output of the one "
        "before, and return the last.",
        "for name in order:\n"
        "    if name == \"temperature\": logits = logits / temperature\n"
        "    elif name == \"top_k\": logits = top_k_filter(logits, top_k)\n"
        "    ... one branch per step ...\n"
        "    elif name == \"xtc\": logits = xtc_filter(logits, xtc_threshold, xtc_probability, generator)\n"
        "return logits",
    ),
    exercise(
        "batched_sample", 5, "generate", "sample",
        "One token per row: argmax at temperature 0, otherwise one draw per row from softmax of warp_logits (passing **chain on).",
        "Temperature 0 is greedy and skips every filter. Otherwise warp, turn into probabilities, "
        "and draw one index per row.",
        "torch.multinomial(probs, num_samples=1, generator=generator) draws one index per row of a "
        "2-D tensor; pass the generator, so that a seed gives the same tokens. Return shape (batch,).",
        "if temperature == 0:\n"
        "    return logits.argmax(dim=-1)\n"
        "probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain).softmax(dim=-1)\n"
        "return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]",
    ),
    exercise(
        "mirostat_step", 5, "generate", "mirostat_step",
        "Mirostat v2 (llama.cpp): keep the tokens with surprise at most mu (bits), draw, and move each row's mu towards the target tau.",
        "Surprise is measured in bits: -log2 p. Each row has its own mu; a row keeps the tokens whose "
        "surprise is at most its mu, and always its most likely token.",
        "Cut with (surprise <= mu[:, None]) | (logits == row max), renormalise (softmax of the cut logits), "
        "draw one token per row with the generator. The error is the drawn token's surprise under the "
        "renormalised distribution minus tau; mu moves against it: mu - eta * error.",
        "surprise = -logits.log_softmax(-1) / math.log(2)\n"
        "keep = (surprise <= mu[:, None]) | (logits == logits.max(-1, keepdim=True).values)\n"
        'kept = logits.masked_fill(~keep, float("-inf")); probs = kept.softmax(-1)\n'
        "tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]\n"
        "observed = -torch.log2(probs.gather(-1, tokens[:, None])[:, 0])\n"
        "return tokens, mu - eta * (observed - tau), kept",
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
        "apply_dry_penalty", 5, "generate", "apply_dry_penalty",
        "DRY (llama.cpp): lower the logit of each token that would extend a repeat of at least allowed_length tokens, by multiplier * base ** (length - allowed_length).",
        "For every earlier position, how many tokens ending there equal the tokens ending at the last "
        "position (a common suffix)? The token right after that earlier position is the one that would "
        "make the repeat longer.",
        "Reverse the row (rev[0] is the last token): for a shift k the repeat length is the run of "
        "rev[i] == rev[i + k] from i = 0 (cumprod of the matches, summed), and the token after it is "
        "ids[n - k]. Cap every length at the number of tokens after the most recent sequence breaker; "
        "per token keep the longest length (scatter_reduce with amax); never penalise a breaker.",
        "rev = ids.flip(0); shifts = torch.arange(1, n)\n"
        "index = torch.arange(n)[None, :] + shifts[:, None]\n"
        "same = (index < n) & (rev[index.clamp(max=n - 1)] == rev[None, :])\n"
        "lengths = same.long().cumprod(-1).sum(-1).clamp(max=limit)\n"
        "longest.scatter_reduce_(0, ids[n - shifts[ok]], lengths[ok], reduce='amax')\n"
        "logits[row] -= where(penalised, multiplier * base ** (longest - allowed_length), 0)",
    ),
    exercise(
        "ban_bad_words", 5, "generate", "ban_bad_words",
        "Hugging Face's bad_words_ids: ban a one-token sequence everywhere, and the last token of a longer one where the row ends with the rest of it.",
        "Only the last token of a banned sequence is ever banned, and only where writing it would complete "
        "the sequence: the row's last len - 1 tokens must be the sequence's first len - 1 tokens.",
        "Compare input_ids[:, -(len - 1):] with the sequence's start for all rows at once (.all(dim=-1)); "
        "a position with attention_mask 0 is padding and never matches. One-token sequences are banned in "
        "every row.",
        "*start, last = banned\n"
        "if not start: ban[:, last] = True; continue\n"
        "tail = input_ids[:, -len(start):]\n"
        "real = attention_mask[:, -len(start):].bool().all(-1)\n"
        "ban[(tail == torch.tensor(start)).all(-1) & real, last] = True",
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
        "Per step: process_logits (the processors; it counts the last `step` columns as generated, for the presence "
        "and frequency penalties and min_new_tokens), choose_tokens (whole batch, once; it also returns mirostat's new "
        "state: keep it for the next step), replace the tokens of finished rows by the pad, append tokens and mask, "
        "record, then finished |= stopped_rows(...). Stop when every row is finished, not when the first one is.",
        "logits, cache = prefill(...) if cache is None else decode_step(...)\n"
        "processed = process_logits(logits, input_ids, attention_mask, step, settings)\n"
        "next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)\n"
        "next_tokens = next_tokens.masked_fill(finished, pad_token_id)\n"
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

_CHAIN_LOOP = (
    "    for name in order:\n"
    "        if name == \"temperature\":\n"
    "            logits = logits / temperature\n"
    "        elif name == \"top_k\":\n"
    "            logits = top_k_filter(logits, top_k)\n"
    "        elif name == \"top_p\":\n"
    "            logits = top_p_filter(logits, top_p)\n"
    "        elif name == \"min_p\":\n"
    "            logits = min_p_filter(logits, min_p)\n"
    "        elif name == \"typical_p\":\n"
    "            logits = typical_filter(logits, typical_p)\n"
    "        elif name == \"epsilon_cutoff\":\n"
    "            logits = epsilon_filter(logits, epsilon_cutoff)\n"
    "        elif name == \"eta_cutoff\":\n"
    "            logits = eta_filter(logits, eta_cutoff)\n"
    "        elif name == \"top_n_sigma\":\n"
    "            logits = top_n_sigma_filter(logits, top_n_sigma)\n"
    "        elif name == \"xtc\":\n"
    "            logits = xtc_filter(logits, xtc_threshold, xtc_probability, generator)\n"
    "    return logits\n"
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(5, "temperature applied after top-p", "generate.py",
            "    for name in order:\n        if name == \"temperature\":\n",
            "    for name in [n for n in order if n in (\"top_k\", \"top_p\")] + [n for n in order if n not in (\"top_k\", \"top_p\")]:\n"
            "        if name == \"temperature\":\n",
            why=("the temperature is applied after the filters, so top-k, top-p and min-p judge a "
                 "distribution that is not the one sampled; Hugging Face divides by the temperature first.")),
    Mistake(5, "top-p judged on the raw logits", "generate.py",
            "            logits = top_p_filter(logits, top_p)\n",
            "            raw = logits * temperature\n"
            '            logits = logits.masked_fill(top_p_filter(raw, top_p) == float("-inf"), float("-inf"))\n',
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
            "return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]",
            "return torch.multinomial(probs, num_samples=1)[:, 0]",
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
    # process_logits is given code; generate's tests (and its probe) are the ones that see it.
    Mistake(5, "presence and frequency penalties count the prompt", "generate.py",
            "            logits, input_ids[:, n_prompt:], settings.presence_penalty, settings.frequency_penalty,\n"
            "            attention_mask[:, n_prompt:],\n",
            "            logits, input_ids, settings.presence_penalty, settings.frequency_penalty,\n"
            "            attention_mask,\n",
            exercise="generate",
            why=("the presence and frequency penalties count the prompt's tokens too; as OpenAI and vLLM "
                 "define them, they count only the tokens generated so far.")),
    Mistake(5, "scores taken from the raw logits", "generate.py",
            "record.step(logits, drawn_from, next_tokens, finished)",
            "record.step(logits, logits, next_tokens, finished)",
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
    Mistake(5, "typical sampling ranks by probability, not by distance from the entropy", "generate.py",
            "gap = (-logprobs - entropy).abs()", "gap = -logprobs",
            why=('typical sampling ranks the tokens by their surprise alone, which is top-p, where it ranks '
                 'them by how far their surprise is from the entropy, |-log p - H|.')),
    Mistake(5, "typical cutoff exclusive", "generate.py",
            "remove_sorted = mass_before >= typical_p", "remove_sorted = mass_before + sorted_probs > typical_p",
            why=("an exclusive typical cutoff: the token that takes the typical set's mass to typical_p is "
                 'dropped, where it must stay.')),
    Mistake(5, "epsilon compared with the logits", "generate.py",
            "return logits.masked_fill((probs < epsilon) & (logits < top), float(\"-inf\"))",
            "return logits.masked_fill((logits < epsilon) & (logits < top), float(\"-inf\"))",
            why=('epsilon is compared with the logits, where the bar is a probability: compare softmax(logits) '
                 'with it.')),
    Mistake(5, "epsilon removes the top token of a flat row", "generate.py",
            "return logits.masked_fill((probs < epsilon) & (logits < top), float(\"-inf\"))",
            "return logits.masked_fill(probs < epsilon, float(\"-inf\"))",
            why=("every token below epsilon is removed, even the row's most likely one, so a flat row keeps "
                 'nothing; the top token always stays.')),
    Mistake(5, "eta's bar not capped at eta", "generate.py",
            "bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))",
            "bar = math.sqrt(eta) * torch.exp(-entropy)",
            why="eta's bar is sqrt(eta) * exp(-entropy) alone, where it is the smaller of that and eta."),
    Mistake(5, "eta's bar without the square root", "generate.py",
            "bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))",
            "bar = torch.minimum(torch.full_like(entropy, eta), eta * torch.exp(-entropy))",
            why="eta's bar scales exp(-entropy) by eta, where it scales it by sqrt(eta)."),
    Mistake(5, "top-n-sigma counts the removed tokens", "generate.py",
            "    finite = torch.isfinite(logits)\n", "    finite = torch.ones_like(logits, dtype=torch.bool)\n",
            why=('the mean and standard deviation take in the -inf of tokens an earlier filter removed; only '
                 'the finite logits count.')),
    Mistake(5, "top-n-sigma measured from the mean", "generate.py",
            "return logits.masked_fill(logits < top - n * variance.sqrt(), float(\"-inf\"))",
            "return logits.masked_fill(logits < mean - n * variance.sqrt(), float(\"-inf\"))",
            why=('the n standard deviations are measured down from the mean logit, where they are measured '
                 'from the largest.')),
    Mistake(5, "top-n-sigma uses the variance", "generate.py",
            "return logits.masked_fill(logits < top - n * variance.sqrt(), float(\"-inf\"))",
            "return logits.masked_fill(logits < top - n * variance, float(\"-inf\"))",
            why='the variance stands where the standard deviation belongs.'),
    Mistake(5, "XTC removes every top choice", "generate.py",
            "remove = above & (probs > least_above) & applies[:, None]", "remove = above & applies[:, None]",
            why='XTC removes every token above the threshold, where it keeps the least likely of them.'),
    Mistake(5, "XTC applied every time", "generate.py",
            "applies = torch.rand(logits.shape[0], generator=generator, device=logits.device) < probability",
            "applies = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)",
            why='XTC cuts every row, where each row is cut only with probability xtc_probability.'),
    Mistake(5, "XTC threshold compared with the logits", "generate.py",
            "above = probs >= threshold", "above = logits >= threshold",
            why='the XTC threshold is compared with the logits, where it is a probability.'),
    Mistake(5, "chain order ignored", "generate.py",
            "    for name in order:\n        if name == \"temperature\":\n",
            "    for name in [n for n in (\"temperature\", \"top_k\", \"top_p\", \"min_p\", \"typical_p\", \"epsilon_cutoff\",\n"
            "                             \"eta_cutoff\", \"top_n_sigma\", \"xtc\") if n in order]:\n"
            "        if name == \"temperature\":\n",
            why="the steps run in Hugging Face's order whatever samplers asks for."),
    Mistake(5, "chain settings not passed on by sample", "generate.py",
            "probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain).softmax(dim=-1)",
            "probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator).softmax(dim=-1)",
            why=('sample does not pass typical_p, eta_cutoff and the other settings of **chain on to '
                 'warp_logits, so those filters never run.')),
    Mistake(5, "mirostat surprise in nats", "generate.py",
            "surprise = -logits.log_softmax(dim=-1) / math.log(2)", "surprise = -logits.log_softmax(dim=-1)",
            why='mirostat measures surprise in nats (-log p), where mu and tau are in bits (-log2 p).'),
    Mistake(5, "mirostat moves mu the wrong way", "generate.py",
            "return tokens, mu - eta * (observed - tau), kept", "return tokens, mu + eta * (observed - tau), kept",
            why=('mirostat adds eta times the error to mu, where it subtracts it: a surprising token must make '
                 'the next cut stricter.')),
    Mistake(5, "mirostat error from the probability before the cut", "generate.py",
            "observed = -torch.log2(probs.gather(-1, tokens[:, None])[:, 0])",
            "observed = -torch.log2(logits.softmax(dim=-1).gather(-1, tokens[:, None])[:, 0])",
            why=("mirostat measures the drawn token's surprise before renormalising the kept tokens, where it "
                 'uses the distribution the token was drawn from.')),
    Mistake(5, "mirostat shares one mu across the batch", "generate.py",
            "keep = (surprise <= mu[:, None]) | (logits == top)", "keep = (surprise <= mu.mean()) | (logits == top)",
            why="mirostat cuts every row with the batch's average mu, where each row has its own state."),
    Mistake(5, "DRY ignores the sequence breakers", "generate.py",
            "limit = int(behind[0]) if len(behind) else n", "limit = n",
            why='DRY lets a repeat reach back across a sequence breaker, where breakers cap every repeat.'),
    Mistake(5, "DRY exponent off by one", "generate.py",
            "exponent = (longest - allowed_length).clamp(min=0)", "exponent = (longest - allowed_length + 1).clamp(min=0)",
            why=("DRY raises base to repeat length - allowed length + 1, one more than the definition's repeat "
                 'length - allowed length.')),
    Mistake(5, "DRY penalises the token that ended the repeat", "generate.py",
            "longest.scatter_reduce_(0, ids[n - shifts[counts]], lengths[counts], reduce=\"amax\")",
            "longest.scatter_reduce_(0, ids[n - 1 - shifts[counts]], lengths[counts], reduce=\"amax\")",
            why=('DRY penalises the last token of the earlier repeat, where it penalises the token that '
                 'followed it (the one that would extend the repeat).')),
    Mistake(5, "DRY penalises the sequence breakers", "generate.py",
            "penalised = (longest >= allowed_length) & ~breakers", "penalised = longest >= allowed_length",
            why=('DRY penalises a sequence-breaker token that would extend a repeat; breakers are never '
                 'penalised.')),
    Mistake(5, "banned sequence matched at the start of the row", "generate.py",
            "tail = input_ids[:, -len(start) :]\n", "tail = input_ids[:, : len(start)]\n",
            why=("a banned sequence's start is compared with the row's first tokens, where it must match the "
                 "row's last tokens.")),
    Mistake(5, "one-token banned sequences ignored", "generate.py",
            "        if not start:\n            ban[:, last] = True\n            continue\n",
            "        if not start:\n            continue\n",
            why='a banned sequence of one token is never banned, where it is banned in every row.'),
    Mistake(5, "banned sequences matched on padding", "generate.py",
            "real = attention_mask[:, -len(start) :].bool().all(dim=-1)",
            "real = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)",
            why=('left padding can complete the start of a banned sequence; positions with mask 0 are not '
                 'tokens.')),
    Mistake(5, "processors skipped in generate", "generate.py",
            "processed = process_logits(logits, input_ids, attention_mask, step, settings)", "processed = logits",
            why=('generate draws from the raw logits, without logit_bias, the penalties, the banned words and '
                 'min_new_tokens (process_logits).')),
    Mistake(5, "min_new_tokens counted from the start of the sequence", "generate.py",
            "processed = process_logits(logits, input_ids, attention_mask, step, settings)",
            "processed = process_logits(logits, input_ids, attention_mask, input_ids.shape[1], settings)",
            why=("min_new_tokens counts the prompt's tokens as new ones, so the end-of-text token is allowed "
                 'too early.')),
    Mistake(5, "mirostat state not carried from step to step", "generate.py",
            "next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)",
            "next_tokens, drawn_from, _ = choose_tokens(processed, settings, generator, mu)",
            why="generate drops mirostat's new mu, so every step starts again from 2 tau."),
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
    Variant(5, "warp_logits", "temperature as a multiplication by its inverse", "generate.py",
            "            logits = logits / temperature\n        elif name == \"top_k\":",
            "            logits = logits * (1.0 / temperature)\n        elif name == \"top_k\":"),
    Variant(5, "batched_sample", "inverse CDF: one uniform per row and searchsorted", "generate.py",
            "    probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain).softmax(dim=-1)\n"
            "    # The draw Hugging Face makes: with the same seed, the same tokens.\n"
            "    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n",
            "    probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain).softmax(dim=-1)\n"
            "    cdf = probs.cumsum(dim=-1)\n"
            "    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)\n"
            "    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=probs.shape[-1] - 1)[:, 0]\n"),
    Variant(5, "batched_sample", "the Gumbel-max trick", "generate.py",
            "    probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain).softmax(dim=-1)\n"
            "    # The draw Hugging Face makes: with the same seed, the same tokens.\n"
            "    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n",
            "    warped = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain)\n"
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
    Variant(5, "typical_filter", "Hugging Face's way: a bar on the gap at the last kept token (ties kept)", "generate.py",
            "    remove_sorted = mass_before >= typical_p\n"
            "    remove_sorted[:, 0] = False\n"
            "    remove = remove_sorted.scatter(1, order, remove_sorted)\n"
            "    return logits.masked_fill(remove, float(\"-inf\"))\n",
            "    n_keep = (mass_before < typical_p).sum(dim=-1, keepdim=True).clamp(min=1)\n"
            "    bar = sorted_gap.gather(1, n_keep - 1)\n"
            "    return logits.masked_fill(gap > bar, float(\"-inf\"))\n"),
    Variant(5, "typical_filter", "entropy from torch.distributions.Categorical", "generate.py",
            "    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)\n    gap = (-logprobs - entropy).abs()\n",
            "    entropy = torch.distributions.Categorical(logits=logits).entropy()[:, None]\n"
            "    gap = (logprobs + entropy).abs()\n"),
    Variant(5, "epsilon_filter", "in log space, the top token found by argmax", "generate.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    top = logits.max(dim=-1, keepdim=True).values\n"
            "    return logits.masked_fill((probs < epsilon) & (logits < top), float(\"-inf\"))\n",
            "    below = logits.log_softmax(dim=-1) < torch.tensor(float(epsilon)).log()\n"
            "    best = torch.zeros_like(below).scatter(1, logits.argmax(dim=-1, keepdim=True), True)\n"
            "    return logits.masked_fill(below & ~best, float(\"-inf\"))\n"),
    Variant(5, "epsilon_filter", "torch.where and a comparison with the row maximum", "generate.py",
            "    return logits.masked_fill((probs < epsilon) & (logits < top), float(\"-inf\"))\n",
            "    keep = (probs >= epsilon) | (logits == top)\n"
            "    return torch.where(keep, logits, torch.full_like(logits, float(\"-inf\")))\n"),
    Variant(5, "eta_filter", "Categorical's entropy and a clamped bar", "generate.py",
            "    logprobs = logits.log_softmax(dim=-1)\n"
            "    probs = logprobs.exp()\n"
            "    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)\n"
            "    bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))\n",
            "    probs = logits.softmax(dim=-1)\n"
            "    entropy = torch.distributions.Categorical(logits=logits).entropy()[:, None]\n"
            "    bar = (eta**0.5 * torch.exp(-entropy)).clamp(max=eta)\n"),
    Variant(5, "eta_filter", "the bar in log space", "generate.py",
            "    bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))\n"
            "    top = logits.max(dim=-1, keepdim=True).values\n"
            "    return logits.masked_fill((probs < bar) & (logits < top), float(\"-inf\"))\n",
            "    log_bar = torch.clamp(0.5 * math.log(eta) - entropy, max=math.log(eta))\n"
            "    top = logits.max(dim=-1, keepdim=True).values\n"
            "    return logits.masked_fill((logprobs < log_bar) & (logits < top), float(\"-inf\"))\n"),
    Variant(5, "top_n_sigma_filter", "nanmean over the logits with -inf turned into nan", "generate.py",
            "    finite = torch.isfinite(logits)\n"
            "    count = finite.sum(dim=-1, keepdim=True)\n"
            "    values = torch.where(finite, logits, torch.zeros_like(logits))\n"
            "    mean = values.sum(dim=-1, keepdim=True) / count\n"
            "    variance = torch.where(finite, (logits - mean) ** 2, torch.zeros_like(logits)).sum(dim=-1, keepdim=True) / count\n",
            "    values = logits.masked_fill(~torch.isfinite(logits), float(\"nan\"))\n"
            "    mean = values.nanmean(dim=-1, keepdim=True)\n"
            "    variance = ((values - mean) ** 2).nanmean(dim=-1, keepdim=True)\n"),
    Variant(5, "top_n_sigma_filter", "a loop over the rows with torch.std(correction=0)", "generate.py",
            "    finite = torch.isfinite(logits)\n"
            "    count = finite.sum(dim=-1, keepdim=True)\n"
            "    values = torch.where(finite, logits, torch.zeros_like(logits))\n"
            "    mean = values.sum(dim=-1, keepdim=True) / count\n"
            "    variance = torch.where(finite, (logits - mean) ** 2, torch.zeros_like(logits)).sum(dim=-1, keepdim=True) / count\n"
            "    top = logits.max(dim=-1, keepdim=True).values\n"
            "    return logits.masked_fill(logits < top - n * variance.sqrt(), float(\"-inf\"))\n",
            "    out = logits.clone()\n"
            "    for row in range(logits.shape[0]):\n"
            "        kept = logits[row][torch.isfinite(logits[row])]\n"
            "        bar = kept.max() - n * kept.std(correction=0)\n"
            "        out[row][logits[row] < bar] = float(\"-inf\")\n"
            "    return out\n"),
    Variant(5, "xtc_filter", "llama.cpp's way: sort, and drop all but the last of the leading run", "generate.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    above = probs >= threshold\n"
            "    least_above = torch.where(above, probs, torch.full_like(probs, 2.0)).min(dim=-1, keepdim=True).values\n"
            "    remove = above & (probs > least_above) & applies[:, None]\n"
            "    return logits.masked_fill(remove, float(\"-inf\"))\n",
            "    sorted_probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)\n"
            "    n_above = (sorted_probs >= threshold).sum(dim=-1, keepdim=True)\n"
            "    ranks = torch.arange(logits.shape[-1], device=logits.device)\n"
            "    drop_sorted = (ranks < n_above - 1) & applies[:, None]\n"
            "    drop = drop_sorted.scatter(1, order, drop_sorted)\n"
            "    return logits.masked_fill(drop, float(\"-inf\"))\n"),
    Variant(5, "xtc_filter", "a loop over the rows", "generate.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    above = probs >= threshold\n"
            "    least_above = torch.where(above, probs, torch.full_like(probs, 2.0)).min(dim=-1, keepdim=True).values\n"
            "    remove = above & (probs > least_above) & applies[:, None]\n"
            "    return logits.masked_fill(remove, float(\"-inf\"))\n",
            "    out = logits.clone()\n"
            "    for row in range(logits.shape[0]):\n"
            "        probs = logits[row].softmax(dim=-1)\n"
            "        top = (probs >= threshold).nonzero().flatten()\n"
            "        if applies[row] and len(top) >= 2:\n"
            "            keep = top[probs[top].argmin()]\n"
            "            out[row, top[top != keep]] = float(\"-inf\")\n"
            "    return out\n"),
    Variant(5, "mirostat_step", "llama.cpp's way: sort, count the leading tokens within mu", "generate.py",
            "    surprise = -logits.log_softmax(dim=-1) / math.log(2)\n"
            "    top = logits.max(dim=-1, keepdim=True).values\n"
            "    keep = (surprise <= mu[:, None]) | (logits == top)\n"
            "    kept = logits.masked_fill(~keep, float(\"-inf\"))\n",
            "    sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
            "    sorted_surprise = -torch.log2(sorted_logits.softmax(dim=-1))\n"
            "    n_keep = (sorted_surprise <= mu[:, None]).sum(dim=-1, keepdim=True).clamp(min=1)\n"
            "    keep_sorted = torch.arange(logits.shape[-1], device=logits.device) < n_keep\n"
            "    keep = keep_sorted.scatter(1, order, keep_sorted)\n"
            "    kept = logits.masked_fill(~keep, float(\"-inf\"))\n"),
    Variant(5, "mirostat_step", "probabilities and log2 throughout, Gumbel-max draws", "generate.py",
            "    probs = kept.softmax(dim=-1)\n"
            "    tokens = torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n"
            "    observed = -torch.log2(probs.gather(-1, tokens[:, None])[:, 0])\n",
            "    u = torch.rand(kept.shape, generator=generator, device=kept.device)\n"
            "    tokens = (kept - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(dim=-1)\n"
            "    observed = -kept.log_softmax(dim=-1).gather(-1, tokens[:, None])[:, 0] / math.log(2)\n"),
    Variant(5, "apply_dry_penalty", "the definition as plain Python loops", "generate.py",
            "        rev = ids.flip(0)\n"
            "        shifts = torch.arange(1, n, device=ids.device)\n"
            "        index = torch.arange(n, device=ids.device)[None, :] + shifts[:, None]\n"
            "        same = (index < n) & (rev[index.clamp(max=n - 1)] == rev[None, :])\n"
            "        lengths = same.long().cumprod(dim=-1).sum(dim=-1).clamp(max=limit)\n"
            "        # Shift k: the repeat ends k tokens before the last one; the token after it is ids[n - k].\n"
            "        counts = lengths >= allowed_length\n"
            "        if not counts.any():\n"
            "            continue\n"
            "        longest = torch.zeros(logits.shape[-1], dtype=torch.long, device=ids.device)\n"
            "        longest.scatter_reduce_(0, ids[n - shifts[counts]], lengths[counts], reduce=\"amax\")\n",
            "        seq = ids.tolist()\n"
            "        longest = torch.zeros(logits.shape[-1], dtype=torch.long, device=ids.device)\n"
            "        for end in range(n - 1):\n"
            "            length = 0\n"
            "            while length <= end and seq[end - length] == seq[n - 1 - length]:\n"
            "                length += 1\n"
            "            length = min(length, limit)\n"
            "            if length >= allowed_length:\n"
            "                longest[seq[end + 1]] = max(int(longest[seq[end + 1]]), length)\n"),
    Variant(5, "apply_dry_penalty", "one shift at a time, a dict of lengths, the penalty added token by token", "generate.py",
            "        rev = ids.flip(0)\n"
            "        shifts = torch.arange(1, n, device=ids.device)\n"
            "        index = torch.arange(n, device=ids.device)[None, :] + shifts[:, None]\n"
            "        same = (index < n) & (rev[index.clamp(max=n - 1)] == rev[None, :])\n"
            "        lengths = same.long().cumprod(dim=-1).sum(dim=-1).clamp(max=limit)\n"
            "        # Shift k: the repeat ends k tokens before the last one; the token after it is ids[n - k].\n"
            "        counts = lengths >= allowed_length\n"
            "        if not counts.any():\n"
            "            continue\n"
            "        longest = torch.zeros(logits.shape[-1], dtype=torch.long, device=ids.device)\n"
            "        longest.scatter_reduce_(0, ids[n - shifts[counts]], lengths[counts], reduce=\"amax\")\n"
            "        penalised = (longest >= allowed_length) & ~breakers\n"
            "        exponent = (longest - allowed_length).clamp(min=0)\n"
            "        if max_exponent is not None:\n"
            "            exponent = exponent.clamp(max=max_exponent)\n"
            "        penalty = multiplier * torch.pow(torch.tensor(float(base), device=logits.device), exponent.to(logits.dtype))\n"
            "        logits[row] = logits[row] - torch.where(penalised, penalty, torch.zeros_like(penalty))\n",
            "        rev = ids.flip(0)\n"
            "        found: dict[int, int] = {}\n"
            "        for k in range(1, n):\n"
            "            run = int((rev[: n - k] == rev[k:]).long().cumprod(dim=0).sum())\n"
            "            run = min(run, limit)\n"
            "            token = int(ids[n - k])\n"
            "            if run >= allowed_length and not breakers[token]:\n"
            "                found[token] = max(found.get(token, 0), run)\n"
            "        for token, run in found.items():\n"
            "            exponent = run - allowed_length\n"
            "            if max_exponent is not None:\n"
            "                exponent = min(exponent, max_exponent)\n"
            "            logits[row, token] -= multiplier * float(base) ** exponent\n"),
    Variant(5, "ban_bad_words", "row by row with Python lists", "generate.py",
            "    ban = torch.zeros_like(logits, dtype=torch.bool)\n"
            "    for banned in bad_words_ids:\n"
            "        *start, last = banned\n"
            "        if not start:\n"
            "            ban[:, last] = True\n"
            "            continue\n"
            "        if input_ids.shape[1] < len(start):\n"
            "            continue\n"
            "        tail = input_ids[:, -len(start) :]\n"
            "        real = attention_mask[:, -len(start) :].bool().all(dim=-1)\n"
            "        matches = (tail == torch.tensor(start, device=input_ids.device)).all(dim=-1) & real\n"
            "        ban[matches, last] = True\n"
            "    return logits.masked_fill(ban, float(\"-inf\"))\n",
            "    out = logits.clone()\n"
            "    for row in range(logits.shape[0]):\n"
            "        history = input_ids[row][attention_mask[row].bool()].tolist()\n"
            "        for banned in bad_words_ids:\n"
            "            n = len(banned) - 1\n"
            "            if n == 0 or (len(history) >= n and history[len(history) - n :] == list(banned[:-1])):\n"
            "                out[row, banned[-1]] = float(\"-inf\")\n"
            "    return out\n"),
    Variant(5, "ban_bad_words", "padding replaced by -1 so that it never matches", "generate.py",
            "        tail = input_ids[:, -len(start) :]\n"
            "        real = attention_mask[:, -len(start) :].bool().all(dim=-1)\n"
            "        matches = (tail == torch.tensor(start, device=input_ids.device)).all(dim=-1) & real\n",
            "        visible = input_ids.masked_fill(attention_mask == 0, -1)\n"
            "        matches = torch.stack([visible[:, -len(start) + i] == token for i, token in enumerate(start)]).all(dim=0)\n"),
    Variant(5, "warp_logits", "a table of steps, looked up by name", "generate.py",
            _CHAIN_LOOP,
            "    steps = {\n"
            "        \"temperature\": lambda x: x / temperature,\n"
            "        \"top_k\": lambda x: top_k_filter(x, top_k),\n"
            "        \"top_p\": lambda x: top_p_filter(x, top_p),\n"
            "        \"min_p\": lambda x: min_p_filter(x, min_p),\n"
            "        \"typical_p\": lambda x: typical_filter(x, typical_p),\n"
            "        \"epsilon_cutoff\": lambda x: epsilon_filter(x, epsilon_cutoff),\n"
            "        \"eta_cutoff\": lambda x: eta_filter(x, eta_cutoff),\n"
            "        \"top_n_sigma\": lambda x: top_n_sigma_filter(x, top_n_sigma),\n"
            "        \"xtc\": lambda x: xtc_filter(x, xtc_threshold, xtc_probability, generator),\n"
            "    }\n"
            "    for name in order:\n"
            "        logits = steps[name](logits)\n"
            "    return logits\n"),
]
