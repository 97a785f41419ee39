"""Part 5, the generation engine: its exercises (what each asks, three graded hints), its planted
mistakes, and its planted correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, exercise, with_fixes

PART = 5
TITLE = "The generation engine"
SECTIONS = {"5b": "The sampler chain and penalties"}  # notebook 05b's exercises: part 5 in the map, listed as "5b"

# In the notebooks' order: part 5's engine (05), then the sampler chain and the penalties (05b).
EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "left_pad", 5, "padding", "left_pad",
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
        "masked_forward", 5, "transformer", "Attention",
        "Attention for padded batches: after the causal mask, hide from every query the keys the cache's step "
        "mask hides (the pads), so no real token ever attends to padding.",
        "The cache's step says which keys each new query may see: cache.mask, True where it may, shaped "
        "(batch, 1, new_pos, key_pos) to broadcast over the heads. A pad key is masked exactly like a future key.",
        "Fill the scores where cache.mask is False with self.IGNORE, after apply_causal_mask and before the "
        "softmax. A finite IGNORE (not -inf) keeps a pad query that sees nothing finite.",
        "attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)",
    ),
    exercise(
        "padded_forward", 5, "kv_cache", "step_after",
        "A padding-aware step of the cache: each new token at its position among its row's real tokens, and "
        "the pad keys hidden from every query, with or without a cache.",
        "Only the columns from past on are new. Each sits at its position among its row's real tokens, not at "
        "its column: the whole model reads these positions (W_pos[positions]), so rows may differ.",
        "positions = position_ids_from_mask(attention_mask)[:, past:] (the mask covers the cached columns too, so "
        "slice after counting). The step's mask is True at real keys: (attention_mask == 1) shaped (batch, 1, 1, "
        "key_pos), which broadcasts over the heads and the new queries.",
        "positions = position_ids_from_mask(attention_mask)[:, past:]\n"
        "return CacheStep(new_tokens, positions, mask=(attention_mask == 1)[:, None, None, :])",
    ),
    exercise(
        "top_k_filter", 5, "filters", "top_k_filter",
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
        "top_p_filter", 5, "filters", "top_p_filter",
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
        "min_p_filter", 5, "filters", "min_p_filter",
        "Keep the tokens whose probability is at least min_p times their row's top probability; -inf for the rest.",
        "The bar is relative: min_p times the largest probability of the same row, not min_p itself.",
        "probs = logits.softmax(dim=-1); the bar is min_p * probs.max(dim=-1, keepdim=True).values. "
        "The top token always passes its own bar.",
        "probs = logits.softmax(dim=-1)\n"
        "bar = min_p * probs.max(dim=-1, keepdim=True).values\n"
        'return logits.masked_fill(probs < bar, float("-inf"))',
    ),
    exercise(
        "warp_logits", 5, "batched_sampling", "warp_logits",
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
        "batched_sample", 5, "batched_sampling", "sample",
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
        "StopStringCriteria", 5, "outputs", "StopStringCriteria",
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
        "TextStreamer", 5, "outputs", "TextStreamer",
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
    exercise(
        "typical_filter", 5, "modern_filters", "typical_filter",
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
        section="5b",
    ),
    exercise(
        "epsilon_filter", 5, "modern_filters", "epsilon_filter",
        "Epsilon sampling: remove the tokens whose probability is below epsilon; the row's most likely token always stays.",
        "The bar is a probability, so compare softmax(logits), not the logits, with it.",
        "A flat row can have every token below the bar; removing them all would leave nothing to draw. "
        "Keep every token whose logit equals the row's largest (logits.max(dim=-1, keepdim=True)).",
        "probs = logits.softmax(dim=-1)\n"
        "top = logits.max(dim=-1, keepdim=True).values\n"
        'return logits.masked_fill((probs < epsilon) & (logits < top), float("-inf"))',
        section="5b",
    ),
    exercise(
        "eta_filter", 5, "modern_filters", "eta_filter",
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
        section="5b",
    ),
    exercise(
        "top_n_sigma_filter", 5, "modern_filters", "top_n_sigma_filter",
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
        section="5b", optional=True,
    ),
    exercise(
        "xtc_filter", 5, "modern_filters", "xtc_filter",
        "XTC (llama.cpp): with probability xtc_probability per row, remove every token at or above the threshold but the least likely of them.",
        "Two decisions per row: whether XTC applies this time (one uniform draw per row from the "
        "generator), and which tokens are 'top choices' (probability >= threshold).",
        "Draw torch.rand(batch, generator=generator, device=logits.device) < probability first "
        "(device= as well: a generator on the GPU cannot draw a tensor on the CPU). Among the top choices keep the "
        "least likely one (so a row with a single top choice is left alone): remove those whose probability "
        "is above the smallest top-choice probability of the row.",
        "applies = torch.rand(logits.shape[0], generator=generator, device=logits.device) < probability\n"
        "probs = logits.softmax(-1); above = probs >= threshold\n"
        "least = torch.where(above, probs, 2.0).min(-1, keepdim=True).values\n"
        'return logits.masked_fill(above & (probs > least) & applies[:, None], float("-inf"))',
        section="5b", optional=True,
    ),
    exercise(
        "mirostat_step", 5, "modern_filters", "mirostat_step",
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
        section="5b", optional=True,
    ),
    exercise(
        "apply_repetition_penalty", 5, "penalties", "apply_repetition_penalty",
        "Hugging Face's repetition penalty: divide the positive logits and multiply the negative ones of every token seen.",
        "The penalty must make a seen token less likely whatever its sign: dividing a negative "
        "logit by a penalty above 1 would raise it. Once per distinct token, however often it occurs.",
        "`seen` (given) is a (batch, d_vocab) boolean. Build the penalised logits with "
        "torch.where(logits > 0, logits / penalty, logits * penalty), then keep them only where seen.",
        "penalised = torch.where(logits > 0, logits / penalty, logits * penalty)\n"
        "return torch.where(seen, penalised, logits)",
        section="5b",
    ),
    exercise(
        "apply_presence_and_frequency_penalty", 5, "penalties", "apply_presence_and_frequency_penalty",
        "OpenAI's penalties: subtract presence_penalty once per token seen and frequency_penalty once per occurrence.",
        "`counts` (given) says how often each token occurred in each row. Presence asks whether "
        "(counts > 0), frequency how often (counts).",
        "Both are plain subtractions from the logits; convert counts to the logits' dtype first.",
        "present = (counts > 0).to(logits.dtype)\n"
        "return logits - presence_penalty * present - frequency_penalty * counts.to(logits.dtype)",
        section="5b",
    ),
    exercise(
        "apply_dry_penalty", 5, "penalties", "apply_dry_penalty",
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
        section="5b", optional=True,
    ),
    exercise(
        "ban_bad_words", 5, "penalties", "ban_bad_words",
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
        section="5b",
    ),
)

# The planted mistakes and correct variants live beside this file.
from sampling_course.grading.parts.part5_generation.mistakes import MISTAKES  # noqa: E402, F401
from sampling_course.grading.parts.part5_generation.variants import VARIANTS  # noqa: E402, F401
from sampling_course.grading.parts.part5_generation.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)
MISTAKES = with_fixes(MISTAKES, FIXES)
