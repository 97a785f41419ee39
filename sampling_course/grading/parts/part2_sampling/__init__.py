"""Part 2, Sampling: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 2
TITLE = "Sampling"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "greedy_search", 2, "sampling", "TransformerSampler.greedy_search",
        "Pick the most likely next token from one position's logits; return it as an int.",
        "Greedy decoding has no randomness. Softmax keeps the order of the logits, so you do "
        "not need probabilities at all.",
        "Take the argmax of the (d_vocab,) logits and turn the 0-d tensor into a Python int "
        "(int(...) or .item()). On ties argmax returns the first index, as Hugging Face does.",
        "return int(logits.argmax())",
    ),
    exercise(
        "sample_basic", 2, "sampling", "TransformerSampler.sample_basic",
        "Draw one token at random from softmax(logits); return it as an int.",
        "Turn the logits into probabilities over the vocabulary, then draw one index according to them.",
        "torch.multinomial(probs, num_samples=1) draws an index with those probabilities (it is "
        "the draw Hugging Face makes); torch.distributions.Categorical(logits=logits).sample() "
        "works as well. Return a Python int.",
        "probs = logits.softmax(dim=-1)\n"
        "return int(torch.multinomial(probs, num_samples=1))",
    ),
    exercise(
        "apply_temperature", 2, "sampling", "TransformerSampler.apply_temperature",
        "Scale the logits by the temperature: below 1 sharpens the distribution, above 1 flattens it.",
        "Think about the limits: as the temperature goes to 0 sampling should become greedy, "
        "and as it grows the distribution should approach uniform.",
        "Divide the logits by the temperature; multiplying does the opposite of what you want. "
        "Temperature 0 never reaches this function: sample_next_token treats it as greedy.",
        "return logits / temperature",
    ),
    exercise(
        "apply_frequency_penalty", 2, "sampling", "TransformerSampler.apply_frequency_penalty",
        "Lower each token's logit by freq_penalty for every time it already occurs in input_ids.",
        "A token that occurs n times in the input so far loses n * freq_penalty; tokens that "
        "never occurred keep their logit.",
        "torch.bincount(input_ids, minlength=d_vocab) counts every token id in one call and "
        "gives a vector as long as the vocabulary. The penalty is per occurrence, not once per "
        "distinct token.",
        "counts = torch.bincount(input_ids, minlength=logits.shape[-1])\n"
        "return logits - freq_penalty * counts.to(logits.dtype)",
    ),
    exercise(
        "sample_top_k", 2, "sampling", "TransformerSampler.sample_top_k",
        "Draw the next token from the k most likely tokens only, renormalised.",
        "Keep the k largest logits, sample among them, then translate the position you drew "
        "back into a vocabulary id.",
        "logits.topk(k) returns the values and their token ids. Sampling from the kept logits "
        "with sample_basic renormalises them for you; it gives a position among the k, so look "
        "up the token id at that position.",
        "top_logits, top_tokens = logits.topk(k)\n"
        "return int(top_tokens[TransformerSampler.sample_basic(top_logits)])",
    ),
    exercise(
        "sample_top_p", 2, "sampling", "TransformerSampler.sample_top_p",
        "Nucleus sampling: draw from the smallest set of most likely tokens whose probability adds up to at least top_p.",
        "Sort the tokens from most to least likely and walk down the list adding up their "
        "probabilities; stop as soon as the total reaches top_p.",
        "The cutoff is inclusive: the token that takes the running total to top_p or past it is "
        "kept. Equivalently, keep a token when the probability of the tokens ranked above it "
        "is still < top_p, that is when the mass from it down to the end of the list is > "
        "1 - top_p. Sum that mass from the small end (flip, cumsum, flip): cumsum minus the "
        "token's own probability rounds 0.5 + 0.3 to just under 0.8 in float32. Always keep at "
        "least min_tokens_to_keep tokens, and map the sorted position you draw back to a token id.",
        "sorted_logits, sorted_tokens = logits.sort(descending=True)\n"
        "probs = sorted_logits.softmax(dim=-1)\n"
        "keep = probs.flip(-1).cumsum(dim=-1).flip(-1) > 1 - top_p\n"
        "keep[:min_tokens_to_keep] = True\n"
        'choice = TransformerSampler.sample_basic(sorted_logits.masked_fill(~keep, float("-inf")))\n'
        "return int(sorted_tokens[choice])",
    ),
    exercise(
        "sample_next_token", 2, "sampling", "TransformerSampler.sample_next_token",
        "Turn one position's logits into the next token according to the decoding settings.",
        "Temperature 0 means greedy decoding: return greedy_search's token and ignore the other settings.",
        "Otherwise the order is fixed: apply the temperature, then the frequency penalty (only "
        "when it is non-zero), then top-k or top-p (whichever is set), else plain sampling. "
        "Return a Python int.",
        "if temperature == 0: return int(greedy_search(logits))\n"
        "logits = apply_temperature(logits, temperature)\n"
        "if frequency_penalty != 0.0: logits = apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
        "if top_k > 0: return int(sample_top_k(logits, top_k))\n"
        "if top_p > 0.0: return int(sample_top_p(logits, top_p))\n"
        "return int(sample_basic(logits))",
    ),
    exercise(
        "sample", 2, "sampling", "TransformerSampler.sample",
        "The generation loop: run the model, pick a token, append it, until max_tokens_generated or end-of-text.",
        "Only the logits of the last position matter for the next token, and the model must "
        "never see more than n_ctx positions.",
        "Each step: logits = model(input_ids[None, -n_ctx:])[0, -1], then "
        "sample_next_token(input_ids, logits, **kwargs), then append the token. Stop after "
        "(not before) the end-of-text token, and decode the whole sequence, prompt included.",
        "for _ in range(max_tokens_generated):\n"
        "    logits = self.model(input_ids[None, -self.cfg.n_ctx:])[0, -1]\n"
        "    next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
        "    input_ids = torch.cat([input_ids, input_ids.new_tensor([next_token])])\n"
        "    if next_token == self.tokenizer.eos_token_id: break\n"
        "return self.tokenizer.decode(input_ids)",
    ),
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(2, "greedy takes the least likely token", "sampling.py",
            "return int(logits.argmax())", "return int(logits.argmin())",
            why="taking the least likely token (argmin) instead of the most likely one (argmax)"),
    Mistake(2, "temperature multiplied instead of divided", "sampling.py",
            "return logits / temperature", "return logits * temperature",
            why="multiplying the logits by the temperature instead of dividing them by it"),
    Mistake(2, "presence penalty (once per distinct token) instead of frequency penalty", "sampling.py",
            "counts = torch.bincount(input_ids, minlength=logits.shape[-1])",
            "counts = (torch.bincount(input_ids, minlength=logits.shape[-1]) > 0).long()",
            why="a presence penalty: each token that occurs is penalised once, instead of once for every time it occurs"),
    Mistake(2, "frequency penalty added instead of subtracted", "sampling.py",
            "return logits - freq_penalty * counts.to(logits.dtype)",
            "return logits + freq_penalty * counts.to(logits.dtype)",
            why="adding the frequency penalty to the logits instead of subtracting it"),
    Mistake(2, "multiplicative frequency penalty", "sampling.py",
            "return logits - freq_penalty * counts.to(logits.dtype)",
            "return logits * (1 - freq_penalty) ** counts.to(logits.dtype)",
            why="multiplying each logit by (1 - freq_penalty) once per occurrence: a factor shrinks large logits "
                "more than small ones and raises negative ones",
            fix="subtract freq_penalty once for every occurrence: logits - freq_penalty * counts"),
    Mistake(2, "frequency penalty written into the caller's logits", "sampling.py",
            "return logits - freq_penalty * counts.to(logits.dtype)",
            "return logits.sub_(freq_penalty * counts.to(logits.dtype))",
            why="subtracting the penalty in place (sub_), which changes the caller's logits as well",
            fix="return a new tensor (logits - ...) and leave the argument alone"),
    Mistake(2, "temperature written into the caller's logits", "sampling.py",
            "return logits / temperature", "return logits.div_(temperature)",
            why="dividing the logits in place (div_), which changes the caller's tensor as well",
            fix="return logits / temperature and leave the argument alone"),
    Mistake(2, "top-k writes -inf into the caller's logits", "sampling.py",
            "        top_logits, top_tokens = logits.topk(k)\n",
            "        logits[logits < logits.topk(k).values[-1]] = float(\"-inf\")\n"
            "        top_logits, top_tokens = logits.topk(k)\n",
            why="writing -inf into the logits it was given (logits[...] = ...), so the caller's logits are filtered too",
            fix="filter a copy, or use masked_fill (not masked_fill_ or item assignment)"),
    Mistake(2, "top-p writes -inf into the caller's logits", "sampling.py",
            "        n_kept = int(keep.sum())\n",
            "        n_kept = int(keep.sum())\n"
            "        logits[sorted_tokens[n_kept:]] = float(\"-inf\")\n",
            why="writing -inf into the logits it was given (logits[...] = ...), so the caller's logits are filtered too",
            fix="filter a copy, or use masked_fill (not masked_fill_ or item assignment)"),
    Mistake(2, "sample_basic returns the argmax", "sampling.py",
            "return int(torch.multinomial(probs, num_samples=1))", "return int(probs.argmax())",
            why="always returning the most likely token instead of drawing one at random from the probabilities"),
    Mistake(2, "sample_basic draws uniformly", "sampling.py",
            "return int(torch.multinomial(probs, num_samples=1))",
            "return int(torch.multinomial(torch.ones_like(probs), num_samples=1))",
            why="drawing every token with the same probability, ignoring the logits"),
    Mistake(2, "top-k from k-1 tokens", "sampling.py",
            "top_logits, top_tokens = logits.topk(k)",
            "top_logits, top_tokens = logits.topk(max(k - 1, 1))",
            why="keeping k - 1 tokens instead of k"),
    Mistake(2, "top-k uniform over the top k", "sampling.py",
            "top_tokens[TransformerSampler.sample_basic(top_logits)]",
            "top_tokens[TransformerSampler.sample_basic(torch.zeros_like(top_logits))]",
            why="drawing uniformly among the top k tokens instead of in proportion to their probabilities"),
    Mistake(2, "top-k returns the rank instead of the token", "sampling.py",
            "return int(top_tokens[TransformerSampler.sample_basic(top_logits)])",
            "return TransformerSampler.sample_basic(top_logits)",
            why="returning the position among the top k (0 to k - 1) instead of the token id at that position"),
    Mistake(2, "top-p cutoff exclusive instead of inclusive", "sampling.py",
            "keep = mass_from_here > 1 - top_p", "keep = sorted_probs.cumsum(dim=-1) < top_p",
            why="an exclusive cutoff: the token that takes the running total to top_p is dropped, when it should be kept"),
    Mistake(2, "top-p ignores min_tokens_to_keep", "sampling.py",
            "keep[:min_tokens_to_keep] = True", "keep[:1] = True",
            why="ignoring min_tokens_to_keep, so fewer tokens than asked for can be kept"),
    Mistake(2, "top-p sorts ascending", "sampling.py",
            "sorted_logits, sorted_tokens = logits.sort(descending=True)",
            "sorted_logits, sorted_tokens = logits.sort(descending=False)",
            why="sorting from least to most likely, so the nucleus is made of the least likely tokens"),
    Mistake(2, "top-p returns the rank instead of the token", "sampling.py",
            "return int(sorted_tokens[TransformerSampler.sample_basic(sorted_logits[:n_kept])])",
            "return TransformerSampler.sample_basic(sorted_logits[:n_kept])",
            why="returning the position in the sorted order instead of the token id at that position"),
    Mistake(2, "frequency penalty applied before the temperature", "sampling.py",
            "        logits = TransformerSampler.apply_temperature(logits, temperature)\n"
            "        if frequency_penalty != 0.0:\n"
            "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n",
            "        if frequency_penalty != 0.0:\n"
            "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
            "        logits = TransformerSampler.apply_temperature(logits, temperature)\n",
            why="applying the frequency penalty before the temperature, so the temperature scales the penalty too (it comes after)"),
    Mistake(2, "sample_next_token ignores top_k", "sampling.py",
            "if top_k > 0:\n", "if False:\n",
            why="ignoring top_k, so the token is drawn from the whole distribution"),
    Mistake(2, "sample_next_token ignores top_p", "sampling.py",
            "if top_p > 0.0:\n", "if False:\n",
            why="ignoring top_p, so the token is drawn from the whole distribution"),
    Mistake(2, "sample passes only the temperature on", "sampling.py",
            "next_token = self.sample_next_token(input_ids, logits, **kwargs)\n",
            "next_token = self.sample_next_token(input_ids, logits, kwargs.get(\"temperature\", 1.0))\n",
            why="passing only the temperature on to sample_next_token, so top_k, top_p and frequency_penalty are ignored"),
    Mistake(2, "sample loop ignores EOS", "sampling.py",
            "if next_token == self.tokenizer.eos_token_id:", "if False:",
            why="not stopping after the end-of-text token"),
    Mistake(2, "sample loop stops before EOS and drops it", "sampling.py",
            "next_token = self.sample_next_token(input_ids, logits, **kwargs)\n",
            "next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
            "            if next_token == self.tokenizer.eos_token_id:\n"
            "                break\n",
            why="stopping before the end-of-text token is appended, so it is missing from the text"),
    Mistake(2, "sample loop generates one token too many", "sampling.py",
            "for _ in range(max_tokens_generated):", "for _ in range(max_tokens_generated + 1):",
            why="generating one token more than max_tokens_generated"),
    Mistake(2, "sample feeds the whole sequence past n_ctx", "sampling.py",
            "logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]",
            "logits = self.model(input_ids[None])[0, -1]",
            why="feeding the model the whole sequence once it is longer than n_ctx, instead of its last n_ctx tokens"),
    Mistake(2, "sample context window off by one", "sampling.py",
            "logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]",
            "logits = self.model(input_ids[None, -self.cfg.n_ctx + 1 :])[0, -1]",
            why="feeding the model the last n_ctx - 1 tokens instead of the last n_ctx"),
]

# Correct implementations in other styles than the solutions' (the way learners write them);
# `sampling-course plant-mistakes --variants` checks that every test of the exercise accepts each.
_GREEDY = "        return int(logits.argmax())\n"
_BASIC = (
    "        probs = logits.softmax(dim=-1)\n"
    "        return int(torch.multinomial(probs, num_samples=1))\n"
)
_TEMPERATURE = "        return logits / temperature\n"
_PENALTY = (
    "        counts = torch.bincount(input_ids, minlength=logits.shape[-1])\n"
    "        return logits - freq_penalty * counts.to(logits.dtype)\n"
)
_TOP_K = (
    "        top_logits, top_tokens = logits.topk(k)\n"
    "        # Sampling from the kept logits renormalises them: no need to leave log space.\n"
    "        return int(top_tokens[TransformerSampler.sample_basic(top_logits)])\n"
)
_TOP_P = (
    "        sorted_logits, sorted_tokens = logits.sort(descending=True)\n"
    "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
    "        # Summed from the small end, as Hugging Face does: \"cumsum - probs < top_p\" rounds\n"
    "        # 0.5 + 0.3 to 0.79999995 < 0.8 and keeps a token too many, and at top_p = 1 the\n"
    "        # float32 running total can reach 1 before the last tokens and drop them.\n"
    "        mass_from_here = sorted_probs.flip(-1).cumsum(dim=-1).flip(-1)\n"
    "        keep = mass_from_here > 1 - top_p\n"
    "        keep[:min_tokens_to_keep] = True\n"
    "        # The mass from a token to the end only shrinks down the sorted list, so the kept tokens are a prefix.\n"
    "        n_kept = int(keep.sum())\n"
    "        return int(sorted_tokens[TransformerSampler.sample_basic(sorted_logits[:n_kept])])\n"
)
_NEXT_TOKEN = (
    "        if temperature == 0:\n"
    "            return int(TransformerSampler.greedy_search(logits))\n"
    "        logits = TransformerSampler.apply_temperature(logits, temperature)\n"
    "        if frequency_penalty != 0.0:\n"
    "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
    "        if top_k > 0:\n"
    "            return int(TransformerSampler.sample_top_k(logits, top_k))\n"
    "        if top_p > 0.0:\n"
    "            return int(TransformerSampler.sample_top_p(logits, top_p))\n"
    "        return int(TransformerSampler.sample_basic(logits))\n"
)
# The whole body of sample() after the argument checks: a learner who writes the method in a
# notebook (check("sample", obj=...)) replaces all of it, loop and printing included.
_SAMPLE_BODY = (
    '        input_ids = self.tokenizer.encode(prompt, return_tensors="pt")[0].to(self.device)\n'
    "        if verbose:\n"
    '            print(prompt, end="", flush=True)\n'
    "        for _ in range(max_tokens_generated):\n"
    "            if kv_cache is None:\n"
    "                ### BEGIN SOLUTION\n"
    "                # The model has learned positions 0..n_ctx-1 only, so it sees the last n_ctx tokens.\n"
    "                logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]\n"
    "                ### END SOLUTION\n"
    "            else:\n"
    "                ### BEGIN SOLUTION\n"
    "                # Hint: pass the whole sequence; the cache knows which positions are new.\n"
    "                logits, kv_cache = self.model(input_ids[None], kv_cache)\n"
    "                logits = logits[0, -1]\n"
    "                ### END SOLUTION\n"
    "            ### BEGIN SOLUTION\n"
    "            next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
    "            input_ids = torch.cat([input_ids, input_ids.new_tensor([next_token])])\n"
    "            ### END SOLUTION\n"
    "            if verbose:  # show the text as it grows\n"
    '                print(self.tokenizer.decode(input_ids[-1]), end="", flush=True)\n'
    "            ### BEGIN SOLUTION\n"
    "            # Stop after, not before, the end-of-text token: it is part of the output.\n"
    "            if next_token == self.tokenizer.eos_token_id:\n"
    "                break\n"
    "            ### END SOLUTION\n"
    "        if verbose:\n"
    "            print()\n"
    "        return self.tokenizer.decode(input_ids)\n"
)
# The same loop written as a while loop over a Python list of token ids.
_SAMPLE_WHILE_LOOP = (
    "        ids: list[int] = self.tokenizer.encode(prompt)\n"
    "        n_prompt = len(ids)\n"
    "        if verbose:\n"
    '            print(prompt, end="", flush=True)\n'
    "        while len(ids) < n_prompt + max_tokens_generated:\n"
    "            sequence = torch.tensor(ids, device=self.device)\n"
    "            if kv_cache is None:\n"
    "                context = sequence[max(0, len(ids) - self.cfg.n_ctx) :]\n"
    "                logits = self.model(context.unsqueeze(0)).squeeze(0)[-1]\n"
    "            else:\n"
    "                output, kv_cache = self.model(sequence.unsqueeze(0), kv_cache=kv_cache)\n"
    "                logits = output[0, -1, :]\n"
    "            token = self.sample_next_token(sequence, logits, **kwargs)\n"
    "            ids.append(int(token))\n"
    "            if verbose:\n"
    '                print(self.tokenizer.decode([ids[-1]]), end="", flush=True)\n'
    "            if ids[-1] == self.tokenizer.eos_token_id:\n"
    "                break\n"
    "        if verbose:\n"
    "            print()\n"
    "        return self.tokenizer.decode(ids)\n"
)

VARIANTS: list[Variant] = [
    # greedy_search
    Variant(2, "greedy_search", "torch.max(...).indices.item()", "sampling.py", _GREEDY,
            "        return torch.max(logits, dim=-1).indices.item()\n"),
    Variant(2, "greedy_search", "returns the 0-d tensor from torch.argmax", "sampling.py", _GREEDY,
            "        return torch.argmax(logits)\n"),
    Variant(2, "greedy_search", "Python list: values.index(max(values))", "sampling.py", _GREEDY,
            "        values = logits.tolist()\n"
            "        return values.index(max(values))\n"),
    # sample_basic
    Variant(2, "sample_basic", "Categorical(logits=...).sample().item()", "sampling.py", _BASIC,
            "        return torch.distributions.Categorical(logits=logits).sample().item()\n"),
    Variant(2, "sample_basic", "inverse CDF: torch.rand and searchsorted on the float64 cumsum", "sampling.py", _BASIC,
            "        cdf = logits.double().softmax(dim=-1).cumsum(dim=-1)\n"
            "        u = torch.rand((), dtype=torch.float64) * cdf[-1]\n"
            "        index = torch.searchsorted(cdf, u, right=True)\n"
            "        return int(index.clamp(max=logits.shape[-1] - 1))\n"),
    Variant(2, "sample_basic", "Gumbel-max trick, returns a 0-d tensor", "sampling.py", _BASIC,
            "        gumbel = -torch.empty_like(logits).exponential_().log()\n"
            "        return (logits + gumbel).argmax()\n"),
    Variant(2, "sample_basic", "torch.multinomial(probs, 1).item() on exp-normalised logits", "sampling.py", _BASIC,
            "        weights = (logits - logits.max()).exp()\n"
            "        return torch.multinomial(weights / weights.sum(), 1).item()\n"),
    # apply_temperature
    Variant(2, "apply_temperature", "torch.div", "sampling.py", _TEMPERATURE,
            "        return torch.div(logits, temperature)\n"),
    Variant(2, "apply_temperature", "multiplied by the reciprocal", "sampling.py", _TEMPERATURE,
            "        inverse = 1.0 / temperature\n"
            "        return logits * inverse\n"),
    Variant(2, "apply_temperature", "divided by a 0-d tensor of the logits' dtype", "sampling.py", _TEMPERATURE,
            "        t = torch.tensor(temperature, dtype=logits.dtype, device=logits.device)\n"
            "        return logits.div(t)\n"),
    # apply_frequency_penalty
    Variant(2, "apply_frequency_penalty", "collections.Counter loop on a clone", "sampling.py", _PENALTY,
            "        from collections import Counter\n"
            "\n"
            "        logits = logits.clone()\n"
            "        for token, count in Counter(input_ids.tolist()).items():\n"
            "            logits[token] -= freq_penalty * count\n"
            "        return logits\n"),
    Variant(2, "apply_frequency_penalty", "scatter_add of ones", "sampling.py", _PENALTY,
            "        counts = torch.zeros_like(logits).scatter_add(0, input_ids, torch.ones_like(input_ids, dtype=logits.dtype))\n"
            "        return logits - counts * freq_penalty\n"),
    Variant(2, "apply_frequency_penalty", "unique(return_counts=True) and index_put(accumulate=True)", "sampling.py", _PENALTY,
            "        tokens, counts = input_ids.unique(return_counts=True)\n"
            "        return logits.index_put((tokens,), -freq_penalty * counts.to(logits.dtype), accumulate=True)\n"),
    Variant(2, "apply_frequency_penalty", "one subtraction per occurrence, in a loop", "sampling.py", _PENALTY,
            "        penalised = logits.clone()\n"
            "        for token in input_ids:\n"
            "            penalised[token] = penalised[token] - freq_penalty\n"
            "        return penalised\n"),
    # sample_top_k
    Variant(2, "sample_top_k", "HF-style mask below the k-th value with -inf (keeps ties)", "sampling.py", _TOP_K,
            "        kth_value = torch.topk(logits, k).values[-1]\n"
            '        return TransformerSampler.sample_basic(logits.masked_fill(logits < kth_value, float("-inf")))\n'),
    Variant(2, "sample_top_k", "scatter the top k into a -inf tensor", "sampling.py", _TOP_K,
            "        values, indices = torch.topk(logits, k)\n"
            '        filtered = torch.full_like(logits, float("-inf")).scatter(0, indices, values)\n'
            "        return TransformerSampler.sample_basic(filtered)\n"),
    Variant(2, "sample_top_k", "sort, -1e10 past the k-th, multinomial", "sampling.py", _TOP_K,
            "        sorted_logits, order = logits.sort(descending=True)\n"
            "        sorted_logits[k:] = -1e10\n"
            "        choice = torch.multinomial(sorted_logits.softmax(dim=-1), 1)\n"
            "        return order[choice].item()\n"),
    Variant(2, "sample_top_k", "Categorical over the top-k logits", "sampling.py", _TOP_K,
            "        top = logits.topk(k)\n"
            "        position = torch.distributions.Categorical(logits=top.values).sample()\n"
            "        return top.indices[position].item()\n"),
    # sample_top_p
    Variant(2, "sample_top_p", "torch.searchsorted on the cumulative probabilities", "sampling.py", _TOP_P,
            "        sorted_logits, sorted_tokens = logits.sort(descending=True)\n"
            "        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)\n"
            "        # The first position whose running total reaches top_p is the last one kept.\n"
            "        n_kept = int(torch.searchsorted(cumulative, top_p)) + 1\n"
            "        n_kept = max(min(n_kept, logits.shape[-1]), min_tokens_to_keep)\n"
            "        return int(sorted_tokens[TransformerSampler.sample_basic(sorted_logits[:n_kept])])\n"),
    Variant(2, "sample_top_p", "HF's TopPLogitsWarper: ascending sort, cumsum <= 1 - top_p removed, scattered back",
            "sampling.py", _TOP_P,
            "        sorted_logits, sorted_indices = torch.sort(logits, descending=False)\n"
            "        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)\n"
            "        sorted_to_remove = cumulative_probs <= (1 - top_p)\n"
            "        sorted_to_remove[-min_tokens_to_keep:] = False\n"
            "        to_remove = sorted_to_remove.scatter(0, sorted_indices, sorted_to_remove)\n"
            '        return TransformerSampler.sample_basic(logits.masked_fill(to_remove, float("-inf")))\n'),
    Variant(2, "sample_top_p", "Python loop over the sorted tokens, -1e10 mask", "sampling.py", _TOP_P,
            "        probs = logits.softmax(dim=-1)\n"
            "        kept: list[int] = []\n"
            "        total = 0.0\n"
            "        for token in probs.argsort(descending=True).tolist():\n"
            "            kept.append(token)\n"
            "            total += probs[token].item()\n"
            "            if total >= top_p and len(kept) >= min_tokens_to_keep:\n"
            "                break\n"
            "        masked = torch.full_like(logits, -1e10)\n"
            "        masked[kept] = logits[kept]\n"
            "        return TransformerSampler.sample_basic(masked)\n"),
    # sample_next_token
    Variant(2, "sample_next_token", "if/elif chain with one return", "sampling.py", _NEXT_TOKEN,
            "        if temperature == 0:\n"
            "            token = TransformerSampler.greedy_search(logits)\n"
            "        else:\n"
            "            logits = TransformerSampler.apply_temperature(logits, temperature)\n"
            "            if frequency_penalty:\n"
            "                logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
            "            if top_k:\n"
            "                token = TransformerSampler.sample_top_k(logits, top_k)\n"
            "            elif top_p:\n"
            "                token = TransformerSampler.sample_top_p(logits, top_p)\n"
            "            else:\n"
            "                token = TransformerSampler.sample_basic(logits)\n"
            "        return token\n"),
    Variant(2, "sample_next_token", "classic: temperature skipped at 1.0, no int()", "sampling.py", _NEXT_TOKEN,
            "        if temperature == 0:\n"
            "            return TransformerSampler.greedy_search(logits)\n"
            "        elif temperature != 1.0:\n"
            "            logits = TransformerSampler.apply_temperature(logits, temperature)\n"
            "        if frequency_penalty != 0.0:\n"
            "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
            "        if top_k > 0:\n"
            "            return TransformerSampler.sample_top_k(logits, top_k)\n"
            "        elif top_p > 0.0:\n"
            "            return TransformerSampler.sample_top_p(logits, top_p)\n"
            "        return TransformerSampler.sample_basic(logits)\n"),
    Variant(2, "sample_next_token", "plain sampling routed through sample_top_k(logits, d_vocab)", "sampling.py",
            _NEXT_TOKEN,
            "        if temperature == 0:\n"
            "            return int(TransformerSampler.greedy_search(logits))\n"
            "        logits = TransformerSampler.apply_temperature(logits, temperature)\n"
            "        logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
            "        if top_p > 0.0:\n"
            "            return int(TransformerSampler.sample_top_p(logits, top_p))\n"
            "        return int(TransformerSampler.sample_top_k(logits, top_k or logits.shape[-1]))\n"),
    # sample
    Variant(2, "sample", "while loop over a Python list of ids", "sampling.py", _SAMPLE_BODY, _SAMPLE_WHILE_LOOP),
    Variant(2, "sample", "context sliced with max(0, len - n_ctx), torch.cat with a new tensor, EOS read back",
            "sampling.py",
            "                logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]\n",
            "                context = input_ids[max(0, input_ids.shape[0] - self.cfg.n_ctx) :]\n"
            "                logits = self.model(context.unsqueeze(0)).squeeze(0)[-1, :]\n"),
    Variant(2, "sample", "append with torch.cat of a device tensor, EOS read from input_ids", "sampling.py",
            "            next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
            "            input_ids = torch.cat([input_ids, input_ids.new_tensor([next_token])])\n"
            "            ### END SOLUTION\n"
            "            if verbose:  # show the text as it grows\n"
            '                print(self.tokenizer.decode(input_ids[-1]), end="", flush=True)\n'
            "            ### BEGIN SOLUTION\n"
            "            # Stop after, not before, the end-of-text token: it is part of the output.\n"
            "            if next_token == self.tokenizer.eos_token_id:\n",
            "            token = self.sample_next_token(input_ids=input_ids, logits=logits, **kwargs)\n"
            "            token_tensor = torch.tensor([token], dtype=torch.long, device=input_ids.device)\n"
            "            input_ids = torch.cat((input_ids, token_tensor), dim=-1)\n"
            "            ### END SOLUTION\n"
            "            if verbose:  # show the text as it grows\n"
            '                print(self.tokenizer.decode(input_ids[-1]), end="", flush=True)\n'
            "            ### BEGIN SOLUTION\n"
            "            if input_ids[-1].item() == self.tokenizer.eos_token_id:\n"),
]
from sampling_course.grading.parts.part2_sampling.classic import CLASSIC_VARIANTS  # noqa: E402  (reads the texts above)
from sampling_course.grading.parts.part2_sampling.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)

VARIANTS += CLASSIC_VARIANTS
MISTAKES = with_fixes(MISTAKES, FIXES)
