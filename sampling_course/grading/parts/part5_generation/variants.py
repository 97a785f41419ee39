"""Part 5's planted correct variants: each exercise written in other correct styles, which every test must accept."""

from __future__ import annotations

from sampling_course.grading.catalogue import Variant

_CHAIN_LOOP = (
    "    for name in order:\n"
    "        if name == \"temperature\":\n"
    "            logits = logits / settings.temperature\n"
    "        elif name == \"top_k\":\n"
    "            logits = top_k_filter(logits, settings.top_k)\n"
    "        elif name == \"top_p\":\n"
    "            logits = top_p_filter(logits, settings.top_p, keep)\n"
    "        elif name == \"min_p\":\n"
    "            logits = min_p_filter(logits, settings.min_p, keep)\n"
    "        elif name == \"typical_p\":\n"
    "            logits = typical_filter(logits, settings.typical_p, keep)\n"
    "        elif name == \"epsilon_cutoff\":\n"
    "            logits = epsilon_filter(logits, settings.epsilon_cutoff, keep)\n"
    "        elif name == \"eta_cutoff\":\n"
    "            logits = eta_filter(logits, settings.eta_cutoff, keep)\n"
    "        elif name == \"top_n_sigma\":\n"
    "            logits = top_n_sigma_filter(logits, settings.top_n_sigma)\n"
    "        elif name == \"xtc\":\n"
    "            logits = xtc_filter(logits, settings.xtc_threshold, settings.xtc_probability, generator)\n"
    "    return logits\n"
)

# Correct implementations in other styles: every test of the exercise must accept them.
VARIANTS: list[Variant] = [
    Variant(5, "top_k_filter", "exactly k tokens: topk, then scatter into a tensor of -inf", "filters.py",
            "    kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]\n"
            '    return logits.masked_fill(logits < kth_largest, float("-inf"))\n',
            "    top = logits.topk(top_k, dim=-1)\n"
            '    return torch.full_like(logits, float("-inf")).scatter(1, top.indices, top.values)\n'),
    Variant(5, "top_k_filter", "the k-th value from a descending sort", "filters.py",
            "kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]",
            "kth_largest = logits.sort(dim=-1, descending=True).values[:, top_k - 1 : top_k]"),
    Variant(5, "top_p_filter", "torch.searchsorted on the cumulative probabilities", "filters.py",
            "    remove_sorted = mass_up_to <= 1 - top_p\n",
            "    bar = torch.full((logits.shape[0], 1), 1 - top_p, dtype=mass_up_to.dtype, device=logits.device)\n"
            "    n_removed = torch.searchsorted(mass_up_to, bar, right=True)\n"
            "    remove_sorted = torch.arange(logits.shape[-1], device=logits.device) < n_removed\n"),
    Variant(5, "top_p_filter", "descending, with the mass above each token from a shifted cumulative sum", "filters.py",
            "    sorted_logits, order = logits.sort(dim=-1)\n"
            "    mass_up_to = sorted_logits.softmax(dim=-1).cumsum(dim=-1)\n"
            "    remove_sorted = mass_up_to <= 1 - top_p\n",
            "    sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
            "    sorted_probs = sorted_logits.softmax(dim=-1)\n"
            "    # The mass strictly above each token, summed from the least likely up (no subtraction to round).\n"
            "    mass_below = sorted_probs.flip(-1).cumsum(dim=-1).flip(-1)\n"
            "    remove_sorted = mass_below <= 1 - top_p\n"),
    Variant(5, "min_p_filter", "in log space: below the top logit + log(min_p)", "filters.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    bar = min_p * probs.max(dim=-1, keepdim=True).values\n"
            "    remove = spare_the_best(probs < bar, logits, min_tokens_to_keep)\n",
            "    bar = logits.max(dim=-1, keepdim=True).values + torch.tensor(float(min_p)).log()\n"
            "    remove = spare_the_best(logits < bar, logits, min_tokens_to_keep)\n"),
    Variant(5, "min_p_filter", "each token's probability relative to the top one", "filters.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    bar = min_p * probs.max(dim=-1, keepdim=True).values\n"
            "    remove = spare_the_best(probs < bar, logits, min_tokens_to_keep)\n",
            "    ratio = (logits - logits.max(dim=-1, keepdim=True).values).exp()\n"
            "    remove = spare_the_best(ratio < min_p, logits, min_tokens_to_keep)\n"),
    Variant(5, "warp_logits", "temperature as a multiplication by its inverse", "batched_sampling.py",
            "            logits = logits / settings.temperature\n",
            "            logits = logits * (1.0 / settings.temperature)\n"),
    Variant(5, "batched_sample", "inverse CDF: one uniform per row and searchsorted", "batched_sampling.py",
            "    # The draw Hugging Face makes: with the same seed, the same tokens.\n"
            "    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n",
            "    cdf = probs.cumsum(dim=-1)\n"
            "    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)\n"
            "    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=probs.shape[-1] - 1)[:, 0]\n"),
    Variant(5, "batched_sample", "the Gumbel-max trick", "batched_sampling.py",
            "    probs = warp_logits(logits, settings, generator).softmax(dim=-1)\n"
            "    # The draw Hugging Face makes: with the same seed, the same tokens.\n"
            "    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n",
            "    warped = warp_logits(logits, settings, generator)\n"
            "    u = torch.rand(warped.shape, generator=generator, device=warped.device)\n"
            "    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))\n"
            "    return (warped + gumbel).argmax(dim=-1)\n"),
    Variant(5, "apply_repetition_penalty", "a multiplicative factor per token", "penalties.py",
            "    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)\n"
            "    return torch.where(seen, penalised, logits)\n",
            "    factor = torch.where(logits > 0, torch.full_like(logits, 1.0 / penalty), torch.full_like(logits, penalty))\n"
            "    return logits * torch.where(seen, factor, torch.ones_like(logits))\n"),
    Variant(5, "apply_repetition_penalty", "a Python loop over each row's seen tokens", "penalties.py",
            "    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)\n"
            "    return torch.where(seen, penalised, logits)\n",
            "    out = logits.clone()\n"
            "    for row in range(logits.shape[0]):\n"
            "        for token in seen[row].nonzero().flatten().tolist():\n"
            "            value = out[row, token]\n"
            "            out[row, token] = value / penalty if value > 0 else value * penalty\n"
            "    return out\n"),
    Variant(5, "apply_presence_and_frequency_penalty", "one subtraction of a combined amount", "penalties.py",
            "    present = (counts > 0).to(logits.dtype)\n"
            "    return logits - presence_penalty * present - frequency_penalty * counts.to(logits.dtype)\n",
            "    amount = presence_penalty * counts.clamp(max=1) + frequency_penalty * counts\n"
            "    return logits - amount.to(logits.dtype)\n"),
    Variant(5, "apply_presence_and_frequency_penalty", "torch.where for the presence penalty", "penalties.py",
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
            "attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)",
            "attn_scores = attn_scores + (~cache.mask) * self.IGNORE"),
    Variant(5, "masked_forward", "torch.where instead of masked_fill", "transformer.py",
            "attn_scores = attn_scores.masked_fill(~cache.mask, self.IGNORE)",
            "attn_scores = torch.where(cache.mask, attn_scores, torch.finfo(attn_scores.dtype).min)"),
    Variant(5, "generate", "finished rows padded with torch.where", "generate.py",
            "next_tokens = next_tokens.masked_fill(finished, pad_token_id)",
            "next_tokens = torch.where(finished, torch.full_like(next_tokens, pad_token_id), next_tokens)"),
    Variant(5, "padded_forward", "positions by the running count written out, the mask as a comparison", "kv_cache.py",
            "    positions = position_ids_from_mask(attention_mask)[:, past:]\n"
            "    return CacheStep(new_tokens, positions, mask=(attention_mask == 1)[:, None, None, :])\n",
            "    positions = (torch.cumsum(attention_mask.long(), dim=1) - 1).clamp(min=0)[:, past:]\n"
            "    return CacheStep(new_tokens, positions, mask=attention_mask[:, None, None, :] > 0)\n"),
    Variant(5, "padded_forward", "positions narrowed to the new columns, the mask by view", "kv_cache.py",
            "    positions = position_ids_from_mask(attention_mask)[:, past:]\n"
            "    return CacheStep(new_tokens, positions, mask=(attention_mask == 1)[:, None, None, :])\n",
            "    all_positions = position_ids_from_mask(attention_mask)\n"
            "    positions = all_positions.narrow(1, past, tokens.shape[1] - past)\n"
            "    visible = attention_mask.bool().view(attention_mask.shape[0], 1, 1, attention_mask.shape[1])\n"
            "    return CacheStep(new_tokens, positions, visible)\n"),
    Variant(5, "left_pad", "left padding with pad_sequence on reversed rows", "padding.py",
            "    width = max(len(ids) for ids in token_lists)\n"
            "    input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]\n"
            "    attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]\n"
            "    return torch.tensor(input_ids), torch.tensor(attention_mask)\n",
            "    rows = [torch.tensor(list(ids)).flip(0) for ids in token_lists]\n"
            "    pad = torch.nn.utils.rnn.pad_sequence\n"
            "    input_ids = pad(rows, batch_first=True, padding_value=pad_token_id).flip(1)\n"
            "    attention_mask = pad([torch.ones_like(row) for row in rows], batch_first=True).flip(1)\n"
            "    return input_ids, attention_mask\n"),
    Variant(5, "left_pad", "tensors of pads filled from the right, row by row", "padding.py",
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
    Variant(5, "StopStringCriteria", "decode the whole row every time", "outputs.py",
            "        tail = ids[-self.tail_tokens :]\n", "        tail = ids\n"),
    Variant(5, "StopStringCriteria", "every place a stop string could end, checked by slicing", "outputs.py",
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
    Variant(5, "TextStreamer", "the last whitespace found with a regular expression", "outputs.py",
            '        safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1\n',
            "        import re\n\n"
            '        match = re.match(r"(?s).*[ \\n]", text)\n'
            "        safe_end = match.end() if match else 0\n"),
    Variant(5, "TextStreamer", "Hugging Face's rule: everything at a newline, else up to the last space", "outputs.py",
            '        safe_end = max(text.rfind(" "), text.rfind("\\n")) + 1\n',
            '        safe_end = len(text) if text.endswith("\\n") else text.rfind(" ") + 1\n'),
    Variant(5, "typical_filter", "the kept set counted, then a bar on the gap of the last kept token", "modern_filters.py",
            "    cut = (running < typical_p).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)\n"
            "    remove_sorted = sorted_gap > sorted_gap.gather(-1, cut)\n",
            "    n_keep = (running < typical_p).sum(dim=-1, keepdim=True) + 1\n"
            "    bar = sorted_gap.gather(-1, (n_keep - 1).clamp(max=logits.shape[-1] - 1))\n"
            "    remove_sorted = sorted_gap > bar\n"),
    Variant(5, "typical_filter", "entropy from torch.distributions.Categorical", "modern_filters.py",
            "    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)\n    gap = (-logprobs - entropy).abs()\n",
            "    entropy = torch.distributions.Categorical(logits=logits).entropy()[:, None]\n"
            "    gap = (logprobs + entropy).abs()\n"),
    Variant(5, "epsilon_filter", "in log space, the best tokens found by topk", "modern_filters.py",
            "    probs = logits.softmax(dim=-1)\n"
            "    return logits.masked_fill(spare_the_best(probs < epsilon, logits, min_tokens_to_keep), float(\"-inf\"))\n",
            "    below = logits.log_softmax(dim=-1) < torch.tensor(float(epsilon)).log()\n"
            "    kth = logits.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).values[:, -1:]\n"
            "    return logits.masked_fill(below & (logits < kth), float(\"-inf\"))\n"),
    Variant(5, "epsilon_filter", "torch.where and a comparison with the k-th best logit", "modern_filters.py",
            "    return logits.masked_fill(spare_the_best(probs < epsilon, logits, min_tokens_to_keep), float(\"-inf\"))\n",
            "    kth = logits.sort(dim=-1, descending=True).values[:, min(min_tokens_to_keep, logits.shape[-1]) - 1 :][:, :1]\n"
            "    keep = (probs >= epsilon) | (logits >= kth)\n"
            "    return torch.where(keep, logits, torch.full_like(logits, float(\"-inf\")))\n"),
    Variant(5, "eta_filter", "Categorical's entropy and a clamped bar", "modern_filters.py",
            "    logprobs = logits.log_softmax(dim=-1)\n"
            "    probs = logprobs.exp()\n"
            "    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)\n"
            "    bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))\n",
            "    probs = logits.softmax(dim=-1)\n"
            "    entropy = torch.distributions.Categorical(logits=logits).entropy()[:, None]\n"
            "    bar = (eta**0.5 * torch.exp(-entropy)).clamp(max=eta)\n"),
    Variant(5, "eta_filter", "the bar in log space", "modern_filters.py",
            "    bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))\n"
            "    return logits.masked_fill(spare_the_best(probs < bar, logits, min_tokens_to_keep), float(\"-inf\"))\n",
            "    log_bar = torch.clamp(0.5 * math.log(eta) - entropy, max=math.log(eta))\n"
            "    return logits.masked_fill(spare_the_best(logprobs < log_bar, logits, min_tokens_to_keep), float(\"-inf\"))\n"),
    Variant(5, "top_n_sigma_filter", "nanmean over the logits with -inf turned into nan", "modern_filters.py",
            "    finite = torch.isfinite(logits)\n"
            "    count = finite.sum(dim=-1, keepdim=True)\n"
            "    values = torch.where(finite, logits, torch.zeros_like(logits))\n"
            "    mean = values.sum(dim=-1, keepdim=True) / count\n"
            "    variance = torch.where(finite, (logits - mean) ** 2, torch.zeros_like(logits)).sum(dim=-1, keepdim=True) / count\n",
            "    values = logits.masked_fill(~torch.isfinite(logits), float(\"nan\"))\n"
            "    mean = values.nanmean(dim=-1, keepdim=True)\n"
            "    variance = ((values - mean) ** 2).nanmean(dim=-1, keepdim=True)\n"),
    Variant(5, "top_n_sigma_filter", "a loop over the rows with torch.std(correction=0)", "modern_filters.py",
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
    Variant(5, "xtc_filter", "llama.cpp's way: sort, and drop all but the last of the leading run", "modern_filters.py",
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
    Variant(5, "xtc_filter", "a loop over the rows", "modern_filters.py",
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
    Variant(5, "mirostat_step", "llama.cpp's way: sort, count the leading tokens within mu", "modern_filters.py",
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
    Variant(5, "mirostat_step", "probabilities and log2 throughout, Gumbel-max draws", "modern_filters.py",
            "    probs = kept.softmax(dim=-1)\n"
            "    tokens = torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]\n"
            "    observed = -torch.log2(probs.gather(-1, tokens[:, None])[:, 0])\n",
            "    u = torch.rand(kept.shape, generator=generator, device=kept.device)\n"
            "    tokens = (kept - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(dim=-1)\n"
            "    observed = -kept.log_softmax(dim=-1).gather(-1, tokens[:, None])[:, 0] / math.log(2)\n"),
    Variant(5, "apply_dry_penalty", "the definition as plain Python loops", "penalties.py",
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
    Variant(5, "apply_dry_penalty", "one shift at a time, a dict of lengths, the penalty added token by token", "penalties.py",
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
    Variant(5, "ban_bad_words", "row by row with Python lists", "penalties.py",
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
    Variant(5, "ban_bad_words", "padding replaced by -1 so that it never matches", "penalties.py",
            "        tail = input_ids[:, -len(start) :]\n"
            "        real = attention_mask[:, -len(start) :].bool().all(dim=-1)\n"
            "        matches = (tail == torch.tensor(start, device=input_ids.device)).all(dim=-1) & real\n",
            "        visible = input_ids.masked_fill(attention_mask == 0, -1)\n"
            "        matches = torch.stack([visible[:, -len(start) + i] == token for i, token in enumerate(start)]).all(dim=0)\n"),
    Variant(5, "warp_logits", "a table of steps, looked up by name", "batched_sampling.py",
            _CHAIN_LOOP,
            "    steps = {\n"
            "        \"temperature\": lambda x: x / settings.temperature,\n"
            "        \"top_k\": lambda x: top_k_filter(x, settings.top_k),\n"
            "        \"top_p\": lambda x: top_p_filter(x, settings.top_p, keep),\n"
            "        \"min_p\": lambda x: min_p_filter(x, settings.min_p, keep),\n"
            "        \"typical_p\": lambda x: typical_filter(x, settings.typical_p, keep),\n"
            "        \"epsilon_cutoff\": lambda x: epsilon_filter(x, settings.epsilon_cutoff, keep),\n"
            "        \"eta_cutoff\": lambda x: eta_filter(x, settings.eta_cutoff, keep),\n"
            "        \"top_n_sigma\": lambda x: top_n_sigma_filter(x, settings.top_n_sigma),\n"
            "        \"xtc\": lambda x: xtc_filter(x, settings.xtc_threshold, settings.xtc_probability, generator),\n"
            "    }\n"
            "    for name in order:\n"
            "        logits = steps[name](logits)\n"
            "    return logits\n"),
]
