"""How to put right each of part 5's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "temperature applied after top-p":
        "divide by the temperature first, then run the filters in the order asked for on the tempered logits",
    "top-p judged on the raw logits":
        "pass the tempered logits themselves to top_p_filter: logits = top_p_filter(logits, top_p, keep)",
    "top-k keeps one token too many":
        "take the k-th largest logit as the bar, logits.topk(top_k).values[:, -1:], and remove only logits below it",
    "top-p cutoff exclusive":
        ("remove a sorted token only when the mass up to and including it is at most 1 - top_p (sorting from least "
         "likely up)"),
    "min-p bar not scaled by the top probability": "set the bar to min_p * probs.max(dim=-1, keepdim=True).values",
    "sample ignores its generator": "pass it on: torch.multinomial(probs, num_samples=1, generator=generator)",
    "repetition penalty multiplies positive logits":
        "use torch.where(logits > 0, logits / penalty, logits * penalty) on the seen tokens",
    "presence penalty applied per occurrence":
        "subtract presence_penalty * (counts > 0) and leave the per-occurrence term to frequency_penalty * counts",
    "right padding":
        "put the pads before each prompt, [pad] * (width - len(ids)) + ids, with mask 0 there and 1 on the real tokens",
    "positions counted over pads":
        "number the real tokens from the mask, attention_mask.cumsum(-1) - 1, and set pad positions to 0",
    "positions counted from 1": "subtract one from the running count: attention_mask.long().cumsum(dim=-1) - 1",
    "pad keys attended":
        "after the causal mask, hide what the cache's step hides: attn_scores.masked_fill(~cache.mask, self.IGNORE)",
    "no causal mask in the engine's attention":
        "hide the pad keys on the scores apply_causal_mask has already masked, not on scores computed again",
    "new keys and values written over the cached ones (the first slots)":
        "put the new keys and values after the cached ones only: torch.cat([past_kv, torch.stack([k, v])], dim=2)",
    "padded rows embedded at their columns (PosEmbed)":
        "give each row its own positions from the mask: position_ids_from_mask(attention_mask)[:, past:]",
    "positions counted over the new columns only (cached tokens forgotten)":
        ("count positions over the whole mask, then keep the new columns: position_ids_from_mask(attention_mask)[:, "
         "past:]"),
    "one finished row ends the batch": "break only when finished.all()",
    "a generate that keeps sampling finished rows":
        "after drawing, replace finished rows' tokens with the pad: next_tokens.masked_fill(finished, pad_token_id)",
    "the whole sequence re-run every step (no cache after the prefill)":
        "after the prefill, call decode_step(model, input_ids, attention_mask, cache) so only the new token runs",
    "presence and frequency penalties count the prompt":
        "count only the generated tokens: pass input_ids[:, n_prompt:] and attention_mask[:, n_prompt:]",
    "scores taken from the raw logits":
        "record the processed logits the token was drawn from: record.step(logits, drawn_from, ...)",
    "stop strings checked one token at a time":
        "decode the row's last few tokens together and look for each stop string in that text",
    "streamer prints every token at once, half characters included":
        "print only up to the last space or newline of the decoded text and keep the rest for the next token",
    "typical sampling ranks by probability, not by distance from the entropy":
        "rank by the distance from the entropy: (-logprobs - entropy).abs(), smallest first",
    "typical cutoff exclusive":
        ("keep tokens in gap order up to and including the one whose running mass reaches typical_p: cut = (running < "
         "typical_p).sum(-1)"),
    "epsilon compared with the logits":
        "compare the probabilities, logits.softmax(-1) < epsilon, and spare the best token",
    "epsilon removes the top token of a flat row":
        ("pass the mask through spare_the_best(probs < epsilon, logits, min_tokens_to_keep) so the most likely tokens "
         "stay"),
    "eta's bar not capped at eta": "take the smaller of eta and sqrt(eta) * exp(-entropy) with torch.minimum",
    "eta's bar without the square root": "scale exp(-entropy) by math.sqrt(eta), then cap the bar at eta",
    "top-n-sigma counts the removed tokens": "compute the mean and standard deviation over torch.isfinite(logits) only",
    "top-n-sigma measured from the mean": "measure down from the largest logit: remove logits < max - n * std",
    "top-n-sigma uses the variance": "subtract n times the standard deviation, variance.sqrt(), from the largest logit",
    "XTC removes every top choice":
        "among the tokens at or above the threshold, remove only those more likely than the least likely of them",
    "XTC applied every time": "cut a row only when torch.rand(batch, generator=generator) < xtc_probability",
    "XTC threshold compared with the logits":
        "compare the probabilities with the threshold: logits.softmax(-1) >= threshold",
    "chain order ignored": "run the steps in the order settings.samplers gives: for name in order",
    "chain settings not passed on by sample":
        "call warp_logits(logits, settings, generator) with the whole settings object",
    "mirostat surprise in nats": "measure surprise in bits: -log_softmax(logits) / math.log(2)",
    "mirostat moves mu the wrong way": "update mu - eta * (observed - tau)",
    "mirostat error from the probability before the cut":
        "take the drawn token's surprise from the renormalised kept distribution it was drawn from",
    "mirostat shares one mu across the batch": "compare each row's surprise with its own mu: surprise <= mu[:, None]",
    "DRY ignores the sequence breakers":
        "cap every repeat's length at the distance from the end of the row back to the nearest sequence breaker",
    "DRY exponent off by one": "raise the base to (repeat length - allowed_length), clamped at 0",
    "DRY penalises the token that ended the repeat":
        "penalise the token that followed the earlier occurrence of the repeat, the one that would extend it",
    "DRY penalises the sequence breakers": "exclude breakers from the penalty: (longest >= allowed_length) & ~breakers",
    "banned sequence matched at the start of the row":
        "compare the banned sequence's start with the row's last tokens: input_ids[:, -len(start):]",
    "one-token banned sequences ignored": "ban a one-token sequence's token in every row",
    "banned sequences matched on padding": "match only where the last len(start) mask entries are all 1",
    "processors skipped in generate":
        "draw from process_logits(logits, input_ids, attention_mask, step, settings, ...), not the raw logits",
    "min_new_tokens counted from the start of the sequence":
        "pass the number of tokens generated so far, step, not input_ids.shape[1]",
    "mirostat state not carried from step to step":
        "keep the mu that choose_tokens returns and pass it in on the next step",
    "top_k_filter writes -inf into its argument": "use masked_fill, which returns a new tensor, not masked_fill_",
    "min_p_filter writes -inf into its argument":
        "return logits.masked_fill(remove, float(\"-inf\")) instead of assigning into logits",
    "repetition penalty written into its argument":
        "return torch.where(seen, penalised, logits) instead of assigning into logits",
    "top-p's running total rounded past top_p (cumsum - p)":
        ("sort from the least likely up and remove a token while the running total, itself included, is <= 1 - top_p "
         "(no cumsum - p)"),
    "top-p ignores min_tokens_to_keep": "pass the mask through spare_the_best(remove, logits, min_tokens_to_keep)",
    "typical drops tokens tied with the cut token":
        "remove only the tokens whose gap is larger than the cut token's: sorted_gap > sorted_gap.gather(-1, cut)",
    "bad_words_ids=[[eos]] bans the end of the text":
        "drop the entry [eos_token_id] from bad_words_ids before banning, as Hugging Face does",
}
