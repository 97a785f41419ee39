"""Part 5's planted classic mistakes: each rewrites one piece of the solutions the way a learner might."""

from __future__ import annotations

from sampling_course.grading.catalogue import Mistake

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(5, "temperature applied after top-p", "batched_sampling.py",
            "    for name in order:\n        if name == \"temperature\":\n",
            "    for name in [n for n in order if n in (\"top_k\", \"top_p\")] + [n for n in order if n not in (\"top_k\", \"top_p\")]:\n"
            "        if name == \"temperature\":\n",
            why=("the temperature is applied after the filters, so top-k, top-p and min-p judge a "
                 "distribution that is not the one sampled; Hugging Face divides by the temperature first.")),
    Mistake(5, "top-p judged on the raw logits", "batched_sampling.py",
            "            logits = top_p_filter(logits, settings.top_p, keep)\n",
            "            raw = logits * settings.temperature\n"
            '            logits = logits.masked_fill(top_p_filter(raw, settings.top_p, keep) == float("-inf"), float("-inf"))\n',
            why=("top-p is judged on the logits before the temperature, so the kept set ignores the "
                 "temperature; every filter should see the tempered logits.")),
    Mistake(5, "top-k keeps one token too many", "filters.py",
            "kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]",
            "kth_largest = logits.topk(min(top_k + 1, logits.shape[-1]), dim=-1).values[:, -1:]",
            why=("top-k keeps the k + 1 largest logits (the bar is the next value below the k-th, not the "
                 "k-th itself).")),
    Mistake(5, "top-p cutoff exclusive", "filters.py",
            "remove_sorted = mass_up_to <= 1 - top_p", "remove_sorted = mass_up_to < 1 - top_p + sorted_logits.softmax(dim=-1)",
            why=("an exclusive top-p cutoff: the token whose probability carries the running total past "
                 "top_p is dropped, where it must stay.")),
    Mistake(5, "min-p bar not scaled by the top probability", "filters.py",
            "bar = min_p * probs.max(dim=-1, keepdim=True).values", "bar = min_p",
            why=("the min-p bar is min_p itself, where it must be min_p times the row's largest "
                 "probability.")),
    Mistake(5, "sample ignores its generator", "batched_sampling.py",
            "return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]",
            "return torch.multinomial(probs, num_samples=1)[:, 0]",
            why=("the draw ignores the torch.Generator it is given, so a seed does not reproduce the "
                 "tokens.")),
    Mistake(5, "repetition penalty multiplies positive logits", "penalties.py",
            "penalised = torch.where(logits > 0, logits / penalty, logits * penalty)",
            "penalised = logits * penalty",
            why=("the repetition penalty multiplies every seen token's logit, which makes a positive logit"
                 " larger; positive logits must be divided and negative ones multiplied.")),
    Mistake(5, "presence penalty applied per occurrence", "penalties.py",
            "present = (counts > 0).to(logits.dtype)", "present = counts.to(logits.dtype)",
            why=("the presence penalty is subtracted once per occurrence, where it is subtracted once per "
                 "distinct token (per occurrence is the frequency penalty).")),
    Mistake(5, "right padding", "padding.py",
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
            "attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)", "attn_scores = attn_scores",
            why=("queries attend to pad keys: the attention mask must hide every pad position from every "
                 "query.")),
    Mistake(5, "no causal mask in the engine's attention", "transformer.py",
            "attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)",
            'attn_scores = (einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head))'
            ".masked_fill(~cache.mask, self.IGNORE)",
            why=("the padded attention drops the causal mask (the pad mask is applied to scores computed "
                 "afresh), so each position sees the tokens after it.")),
    Mistake(5, "new keys and values written over the cached ones (the first slots)", "kv_cache.py",
            "kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)",
            "kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)\n        kv[:, :, : k.shape[1]] = torch.stack([k, v])",
            exercise="padded_forward",
            why=("the new keys and values are also written into the first slots, over the cached ones; "
                 "they belong after them only.")),
    Mistake(5, "padded rows embedded at their columns (PosEmbed)", "kv_cache.py",
            "positions = position_ids_from_mask(attention_mask)[:, past:]",
            "positions = torch.arange(past, tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)",
            why=("every row is embedded at its columns, pads counted, as PosEmbed does, so a left-padded "
                 "row's tokens sit at the wrong positions; index W_pos with each row's positions among "
                 "its real tokens.")),
    Mistake(5, "positions counted over the new columns only (cached tokens forgotten)", "kv_cache.py",
            "positions = position_ids_from_mask(attention_mask)[:, past:]",
            "positions = position_ids_from_mask(attention_mask[:, past:])",
            why=("the positions are counted over the new columns only, so with a cache the new tokens start "
                 "again at position 0; count over the whole mask, then keep the new columns.")),
    Mistake(5, "one finished row ends the batch", "generate.py",
            "        if finished.all():\n            break", "        if finished.any():\n            break",
            why=("generation stops when any row finishes; it must go on until every row has finished (or "
                 "the length limit).")),
    Mistake(5, "a generate that keeps sampling finished rows", "generate.py",
            "next_tokens = next_tokens.masked_fill(finished, pad_token_id)", "next_tokens = next_tokens",
            why=("a row that has finished keeps sampling tokens; once it has produced the end token (or a "
                 "criterion stopped it), give it the pad token at every later step: "
                 "next_tokens.masked_fill(finished, pad_token_id).")),
    Mistake(5, "the whole sequence re-run every step (no cache after the prefill)", "generate.py",
            "logits, cache = decode_step(model, input_ids, attention_mask, cache)",
            "logits, cache = prefill(model, input_ids, attention_mask)",
            why=("every step runs the model over the whole sequence instead of feeding only the new token "
                 "with the cache filled by the prefill.")),
    # process_logits is given code; generate's tests (and its probe) are the ones that see it.
    Mistake(5, "presence and frequency penalties count the prompt", "penalties.py",
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
    Mistake(5, "stop strings checked one token at a time", "outputs.py",
            "        tail = ids[-self.tail_tokens :]\n        before, text = self.decode(tail[:-1]), self.decode(tail)\n",
            "        return any(s in self.decode(ids[-1:]) for s in self.stop_strings)\n"
            "        tail = ids[-self.tail_tokens :]\n        before, text = self.decode(tail[:-1]), self.decode(tail)\n",
            why=("a stop string is looked for in the newest token alone, so one that spans several tokens "
                 "is missed; check the decoded tail of the row.")),
    Mistake(5, "streamer prints every token at once, half characters included", "outputs.py",
            'safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1', "safe_end = len(text)",
            why=("the streamer prints each token as soon as it arrives, including a multi-byte character "
                 "split across tokens; hold back text until it decodes cleanly.")),
    Mistake(5, "typical sampling ranks by probability, not by distance from the entropy", "modern_filters.py",
            "gap = (-logprobs - entropy).abs()", "gap = -logprobs",
            why=('typical sampling ranks the tokens by their surprise alone, which is top-p, where it ranks '
                 'them by how far their surprise is from the entropy, |-log p - H|.')),
    Mistake(5, "typical cutoff exclusive", "modern_filters.py",
            "cut = (running < typical_p).sum(dim=-1, keepdim=True)", "cut = ((running <= typical_p).sum(dim=-1, keepdim=True) - 1).clamp(min=0)",
            why=("an exclusive typical cutoff: the token that takes the typical set's mass to typical_p is "
                 'dropped, where it must stay.')),
    Mistake(5, "epsilon compared with the logits", "modern_filters.py",
            "spare_the_best(probs < epsilon, logits, min_tokens_to_keep)",
            "spare_the_best(logits < epsilon, logits, min_tokens_to_keep)",
            why=('epsilon is compared with the logits, where the bar is a probability: compare softmax(logits) '
                 'with it.')),
    Mistake(5, "epsilon removes the top token of a flat row", "modern_filters.py",
            "spare_the_best(probs < epsilon, logits, min_tokens_to_keep)",
            "probs < epsilon",
            why=("every token below epsilon is removed, even the row's most likely one, so a flat row keeps "
                 'nothing; the top token always stays.')),
    Mistake(5, "eta's bar not capped at eta", "modern_filters.py",
            "bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))",
            "bar = math.sqrt(eta) * torch.exp(-entropy)",
            why="eta's bar is sqrt(eta) * exp(-entropy) alone, where it is the smaller of that and eta."),
    Mistake(5, "eta's bar without the square root", "modern_filters.py",
            "bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))",
            "bar = torch.minimum(torch.full_like(entropy, eta), eta * torch.exp(-entropy))",
            why="eta's bar scales exp(-entropy) by eta, where it scales it by sqrt(eta)."),
    Mistake(5, "top-n-sigma counts the removed tokens", "modern_filters.py",
            "    finite = torch.isfinite(logits)\n", "    finite = torch.ones_like(logits, dtype=torch.bool)\n",
            why=('the mean and standard deviation take in the -inf of tokens an earlier filter removed; only '
                 'the finite logits count.')),
    Mistake(5, "top-n-sigma measured from the mean", "modern_filters.py",
            "return logits.masked_fill(logits < top - n * variance.sqrt(), float(\"-inf\"))",
            "return logits.masked_fill(logits < mean - n * variance.sqrt(), float(\"-inf\"))",
            why=('the n standard deviations are measured down from the mean logit, where they are measured '
                 'from the largest.')),
    Mistake(5, "top-n-sigma uses the variance", "modern_filters.py",
            "return logits.masked_fill(logits < top - n * variance.sqrt(), float(\"-inf\"))",
            "return logits.masked_fill(logits < top - n * variance, float(\"-inf\"))",
            why='the variance stands where the standard deviation belongs.'),
    Mistake(5, "XTC removes every top choice", "modern_filters.py",
            "remove = above & (probs > least_above) & applies[:, None]", "remove = above & applies[:, None]",
            why='XTC removes every token above the threshold, where it keeps the least likely of them.'),
    Mistake(5, "XTC applied every time", "modern_filters.py",
            "applies = torch.rand(logits.shape[0], generator=generator, device=logits.device) < probability",
            "applies = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)",
            why='XTC cuts every row, where each row is cut only with probability xtc_probability.'),
    Mistake(5, "XTC threshold compared with the logits", "modern_filters.py",
            "above = probs >= threshold", "above = logits >= threshold",
            why='the XTC threshold is compared with the logits, where it is a probability.'),
    Mistake(5, "chain order ignored", "batched_sampling.py",
            "    for name in order:\n        if name == \"temperature\":\n",
            "    for name in [n for n in (\"temperature\", \"top_k\", \"top_p\", \"min_p\", \"typical_p\", \"epsilon_cutoff\",\n"
            "                             \"eta_cutoff\", \"top_n_sigma\", \"xtc\") if n in order]:\n"
            "        if name == \"temperature\":\n",
            why="the steps run in Hugging Face's order whatever samplers asks for."),
    Mistake(5, "chain settings not passed on by sample", "batched_sampling.py",
            "probs = warp_logits(logits, settings, generator).softmax(dim=-1)",
            "probs = warp_logits(logits, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,\n"
            "                        min_p=settings.min_p, generator=generator).softmax(dim=-1)",
            why=('sample passes only the classic four settings on to warp_logits, so typical_p, eta_cutoff '
                 'and the rest of the chain never run: pass the whole settings object.')),
    Mistake(5, "mirostat surprise in nats", "modern_filters.py",
            "surprise = -logits.log_softmax(dim=-1) / math.log(2)", "surprise = -logits.log_softmax(dim=-1)",
            why='mirostat measures surprise in nats (-log p), where mu and tau are in bits (-log2 p).'),
    Mistake(5, "mirostat moves mu the wrong way", "modern_filters.py",
            "return tokens, mu - eta * (observed - tau), kept", "return tokens, mu + eta * (observed - tau), kept",
            why=('mirostat adds eta times the error to mu, where it subtracts it: a surprising token must make '
                 'the next cut stricter.')),
    Mistake(5, "mirostat error from the probability before the cut", "modern_filters.py",
            "observed = -torch.log2(probs.gather(-1, tokens[:, None])[:, 0])",
            "observed = -torch.log2(logits.softmax(dim=-1).gather(-1, tokens[:, None])[:, 0])",
            why=("mirostat measures the drawn token's surprise before renormalising the kept tokens, where it "
                 'uses the distribution the token was drawn from.')),
    Mistake(5, "mirostat shares one mu across the batch", "modern_filters.py",
            "keep = (surprise <= mu[:, None]) | (logits == top)", "keep = (surprise <= mu.mean()) | (logits == top)",
            why="mirostat cuts every row with the batch's average mu, where each row has its own state."),
    Mistake(5, "DRY ignores the sequence breakers", "penalties.py",
            "limit = int(behind[0]) if len(behind) else n", "limit = n",
            why='DRY lets a repeat reach back across a sequence breaker, where breakers cap every repeat.'),
    Mistake(5, "DRY exponent off by one", "penalties.py",
            "exponent = (longest - allowed_length).clamp(min=0)", "exponent = (longest - allowed_length + 1).clamp(min=0)",
            why=("DRY raises base to repeat length - allowed length + 1, one more than the definition's repeat "
                 'length - allowed length.')),
    Mistake(5, "DRY penalises the token that ended the repeat", "penalties.py",
            "longest.scatter_reduce_(0, ids[n - shifts[counts]], lengths[counts], reduce=\"amax\")",
            "longest.scatter_reduce_(0, ids[n - 1 - shifts[counts]], lengths[counts], reduce=\"amax\")",
            why=('DRY penalises the last token of the earlier repeat, where it penalises the token that '
                 'followed it (the one that would extend the repeat).')),
    Mistake(5, "DRY penalises the sequence breakers", "penalties.py",
            "penalised = (longest >= allowed_length) & ~breakers", "penalised = longest >= allowed_length",
            why=('DRY penalises a sequence-breaker token that would extend a repeat; breakers are never '
                 'penalised.')),
    Mistake(5, "banned sequence matched at the start of the row", "penalties.py",
            "tail = input_ids[:, -len(start) :]\n", "tail = input_ids[:, : len(start)]\n",
            why=("a banned sequence's start is compared with the row's first tokens, where it must match the "
                 "row's last tokens.")),
    Mistake(5, "one-token banned sequences ignored", "penalties.py",
            "        if not start:\n            ban[:, last] = True\n            continue\n",
            "        if not start:\n            continue\n",
            why='a banned sequence of one token is never banned, where it is banned in every row.'),
    Mistake(5, "banned sequences matched on padding", "penalties.py",
            "real = attention_mask[:, -len(start) :].bool().all(dim=-1)",
            "real = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)",
            why=('left padding can complete the start of a banned sequence; positions with mask 0 are not '
                 'tokens.')),
    Mistake(5, "processors skipped in generate", "generate.py",
            "processed = process_logits(logits, input_ids, attention_mask, step, settings, eos_token_id, dry_breakers)",
            "processed = logits",
            why=('generate draws from the raw logits, without logit_bias, the penalties, the banned words and '
                 'min_new_tokens (process_logits).')),
    Mistake(5, "min_new_tokens counted from the start of the sequence", "generate.py",
            "processed = process_logits(logits, input_ids, attention_mask, step, settings, eos_token_id, dry_breakers)",
            "processed = process_logits(logits, input_ids, attention_mask, input_ids.shape[1], settings, eos_token_id,\n"
            "                                   dry_breakers)",
            why=("min_new_tokens counts the prompt's tokens as new ones, so the end-of-text token is allowed "
                 'too early.')),
    Mistake(5, "mirostat state not carried from step to step", "generate.py",
            "next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)",
            "next_tokens, drawn_from, _ = choose_tokens(processed, settings, generator, mu)",
            why="generate drops mirostat's new mu, so every step starts again from 2 tau."),
    # Written into the tensor they were given: generate reports log-probabilities from the raw logits afterwards.
    Mistake(5, "top_k_filter writes -inf into its argument", "filters.py",
            'return logits.masked_fill(logits < kth_largest, float("-inf"))',
            'return logits.masked_fill_(logits < kth_largest, float("-inf"))',
            why=("top_k_filter writes -inf into the logits it was given (masked_fill_), so the caller's tensor "
                 "changes too; return a new tensor with masked_fill.")),
    Mistake(5, "min_p_filter writes -inf into its argument", "filters.py",
            "    remove = spare_the_best(probs < bar, logits, min_tokens_to_keep)\n"
            '    return logits.masked_fill(remove, float("-inf"))\n',
            "    remove = spare_the_best(probs < bar, logits, min_tokens_to_keep)\n"
            '    logits[remove] = float("-inf")\n    return logits\n',
            why=("min_p_filter writes -inf into the logits it was given, so the caller's tensor changes too; "
                 "return a new tensor (masked_fill).")),
    Mistake(5, "repetition penalty written into its argument", "penalties.py",
            "    return torch.where(seen, penalised, logits)\n",
            "    logits[seen] = penalised[seen]\n    return logits\n",
            why=("apply_repetition_penalty writes the penalised values into the logits it was given, so the "
                 "caller's tensor changes too; build a new tensor (torch.where).")),
    Mistake(5, "top-p's running total rounded past top_p (cumsum - p)", "filters.py",
            "    sorted_logits, order = logits.sort(dim=-1)\n"
            "    mass_up_to = sorted_logits.softmax(dim=-1).cumsum(dim=-1)\n"
            "    remove_sorted = mass_up_to <= 1 - top_p\n",
            "    sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
            "    sorted_probs = sorted_logits.softmax(dim=-1)\n"
            "    remove_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p\n"
            "    remove_sorted[:, 0] = False\n",
            why=("the mass above each token is taken as cumsum - p, which rounds: on [0.3, 0.1, 0.1, 0.5] at "
                 "top_p = 0.8 it keeps three tokens where 0.5 + 0.3 already reach 0.8, and at top_p = 1.0 it drops "
                 "the least likely tokens of a long row; sum from the least likely token up instead.")),
    Mistake(5, "top-p ignores min_tokens_to_keep", "filters.py",
            "remove = spare_the_best(remove, logits, min_tokens_to_keep)",
            "remove = spare_the_best(remove, logits, 1)",
            why=("top_p_filter keeps a single token where min_tokens_to_keep asks for more; spare the row's "
                 "min_tokens_to_keep most likely tokens.")),
    Mistake(5, "typical drops tokens tied with the cut token", "modern_filters.py",
            "remove_sorted = sorted_gap > sorted_gap.gather(-1, cut)",
            "remove_sorted = torch.arange(logits.shape[-1], device=logits.device) > cut",
            why=("typical_filter cuts by rank, so tokens exactly as typical as the cut token go (a uniform row "
                 "loses tokens); keep every token whose gap is no larger than the cut token's, as Hugging Face does.")),
    Mistake(5, "bad_words_ids=[[eos]] bans the end of the text", "penalties.py",
            "    bad_words_ids = [banned for banned in bad_words_ids if list(banned) != [eos_token_id]]\n",
            "",
            why=("the one-token sequence [eos] is banned, so rows can never end; Hugging Face leaves it out of "
                 "bad_words_ids (min_new_tokens is the setting that holds the end back).")),
]
