"""Part 2's correct variants in the classic course's style: every method written whole.

A learner who pastes a whole method (or writes it in the notebook and checks it with
``check(name, obj=...)``) replaces the given argument checks too, and often works in place
on tensors the method made itself. Those checks are the course's given code, graded by the
tests without an exercise marker, so each method here drops them; every test of the exercise
must still pass. The ``old`` texts run from the first line after the docstring to the end of
the method: the whole method body, checks and solution markers included.
"""

from __future__ import annotations

from sampling_course.grading.catalogue import Variant

# The solutions' own text that each variant replaces (as the part's other variants read it).
_NEXT_TOKEN = (
    '        if temperature == 0:\n'
    '            return int(TransformerSampler.greedy_search(logits))\n'
    '        logits = TransformerSampler.apply_temperature(logits, temperature)\n'
    '        if frequency_penalty != 0.0:\n'
    '            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n'
    '        if top_k > 0:\n'
    '            return int(TransformerSampler.sample_top_k(logits, top_k))\n'
    '        if top_p > 0.0:\n'
    '            return int(TransformerSampler.sample_top_p(logits, top_p))\n'
    '        return int(TransformerSampler.sample_basic(logits))\n'
)
_SAMPLE_BODY = (
    '        input_ids = self.tokenizer.encode(prompt, return_tensors="pt")[0].to(self.device)\n'
    '        if verbose:\n'
    '            print(prompt, end="", flush=True)\n'
    '        for _ in range(max_tokens_generated):\n'
    '            if kv_cache is None:\n'
    '                ### BEGIN SOLUTION\n'
    '                # The model has learned positions 0..n_ctx-1 only, so it sees the last n_ctx tokens.\n'
    '                logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]\n'
    '                ### END SOLUTION\n'
    '            else:\n'
    '                ### BEGIN SOLUTION\n'
    '                # Hint: pass the whole sequence; the cache knows which positions are new.\n'
    '                logits, kv_cache = self.model(input_ids[None], kv_cache)\n'
    '                logits = logits[0, -1]\n'
    '                ### END SOLUTION\n'
    '            ### BEGIN SOLUTION\n'
    '            next_token = self.sample_next_token(input_ids, logits, **kwargs)\n'
    '            input_ids = torch.cat([input_ids, input_ids.new_tensor([next_token])])\n'
    '            ### END SOLUTION\n'
    '            if verbose:  # show the text as it grows\n'
    '                print(self.tokenizer.decode(input_ids[-1]), end="", flush=True)\n'
    '            ### BEGIN SOLUTION\n'
    '            # Stop after, not before, the end-of-text token: it is part of the output.\n'
    '            if next_token == self.tokenizer.eos_token_id:\n'
    '                break\n'
    '            ### END SOLUTION\n'
    '        if verbose:\n'
    '            print()\n'
    '        return self.tokenizer.decode(input_ids)\n'
)
_TOP_P = (
    '        sorted_logits, sorted_tokens = logits.sort(descending=True)\n'
    '        sorted_probs = sorted_logits.softmax(dim=-1)\n'
    '        # Summed from the small end, as Hugging Face does: "cumsum - probs < top_p" rounds\n'
    '        # 0.5 + 0.3 to 0.79999995 < 0.8 and keeps a token too many, and at top_p = 1 the\n'
    '        # float32 running total can reach 1 before the last tokens and drop them.\n'
    '        mass_from_here = sorted_probs.flip(-1).cumsum(dim=-1).flip(-1)\n'
    '        keep = mass_from_here > 1 - top_p\n'
    '        keep[:min_tokens_to_keep] = True\n'
    '        # The mass from a token to the end only shrinks down the sorted list, so the kept tokens are a prefix.\n'
    '        n_kept = int(keep.sum())\n'
    '        return int(sorted_tokens[TransformerSampler.sample_basic(sorted_logits[:n_kept])])\n'
)

_SOLUTION_END = "        ### END SOLUTION\n"

_TEMPERATURE = (
    "        if not temperature > 0:\n"
    '            raise ValueError(f"temperature must be > 0 here (use greedy_search for 0), got {temperature!r}")\n'
    "        ### BEGIN SOLUTION\n"
    "        return logits / temperature\n" + _SOLUTION_END
)
_TOP_K = (
    "        if not 1 <= k <= logits.shape[-1]:\n"
    '            raise ValueError(f"k must be between 1 and d_vocab={logits.shape[-1]}, got {k!r}")\n'
    "        ### BEGIN SOLUTION\n"
    "        top_logits, top_tokens = logits.topk(k)\n"
    "        # Sampling from the kept logits renormalises them: no need to leave log space.\n"
    "        return int(top_tokens[TransformerSampler.sample_basic(top_logits)])\n" + _SOLUTION_END
)
_TOP_P_CHECKS = (
    "        if not 0.0 <= top_p <= 1.0:\n"
    '            raise ValueError(f"top_p must be in [0, 1], got {top_p!r}")\n'
    "        if min_tokens_to_keep < 1:\n"
    '            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep!r}")\n'
    "        ### BEGIN SOLUTION\n"
)
_NEXT_TOKEN_CHECKS = (
    "        check_sampling_args(logits.shape[-1], temperature, top_k, top_p, frequency_penalty)\n"
    "        if input_ids.ndim != 1 or logits.ndim != 1:\n"
    "            raise ValueError(\n"
    '                f"input_ids must be 1-D (seq_len,) and logits 1-D (d_vocab,), got shapes "\n'
    '                f"{tuple(input_ids.shape)} and {tuple(logits.shape)}"\n'
    "            )\n"
    "        if seed is not None:\n"
    "            torch.manual_seed(seed)\n"
    "        ### BEGIN SOLUTION\n"
)
_TOP_P_HINTS = (
    "        # Hint: keep a token when the probability of the tokens ranked above it is still < top_p,\n"
    "        # Hint: that is, when the mass from it down to the end of the list is > 1 - top_p.\n"
)
_SAMPLE_CHECKS = (
    "        if not isinstance(prompt, str) or not prompt:\n"
    '            raise ValueError("prompt must be a non-empty string")\n'
    "        if not isinstance(max_tokens_generated, int) or max_tokens_generated < 0:\n"
    '            raise ValueError(f"max_tokens_generated must be an integer >= 0, got {max_tokens_generated!r}")\n'
    '        seed = kwargs.pop("seed", None)\n'
    "        check_sampling_args(self.cfg.d_vocab, **kwargs)\n"
    "        if seed is not None:\n"
    "            torch.manual_seed(seed)\n"
    "\n"
)
CLASSIC_SAMPLE = (
    '        seed = kwargs.pop("seed", None)\n'
    "        if seed is not None:\n"
    "            torch.manual_seed(seed)\n"
    '        input_ids = self.tokenizer.encode(prompt, return_tensors="pt").to(self.device)[0]\n'
    "        for _ in range(max_tokens_generated):\n"
    "            if kv_cache is None:\n"
    "                all_logits = self.model(input_ids[None, -self.cfg.n_ctx :])\n"
    "            else:\n"
    "                all_logits, kv_cache = self.model(input_ids[None], kv_cache)\n"
    "            logits = all_logits[0, -1]\n"
    "            next_token = torch.tensor([self.sample_next_token(input_ids, logits, **kwargs)], device=self.device)\n"
    "            input_ids = torch.cat([input_ids, next_token], dim=-1)\n"
    "            if verbose:\n"
    '                print(self.tokenizer.decode(next_token), end="", flush=True)\n'
    "            if next_token == self.tokenizer.eos_token_id:\n"
    "                break\n"
    "        return self.tokenizer.decode(input_ids)\n"
)

# sample()'s whole body, checks included; part 4 plants the same classic sample for its cached loop.
SAMPLE_WHOLE = _SAMPLE_CHECKS + _SAMPLE_BODY

CLASSIC_VARIANTS: list[Variant] = [
    Variant(2, "greedy_search", "classic, whole: argmax().item()", "sampling.py",
            "        ### BEGIN SOLUTION\n        return int(logits.argmax())\n" + _SOLUTION_END,
            "        return logits.argmax().item()\n"),
    Variant(2, "sample_basic", "classic, whole: exp and normalise in place, then multinomial", "sampling.py",
            "        ### BEGIN SOLUTION\n"
            "        probs = logits.softmax(dim=-1)\n"
            "        return int(torch.multinomial(probs, num_samples=1))\n" + _SOLUTION_END,
            "        probs = (logits - logits.max()).exp_()\n"
            "        probs /= probs.sum()\n"
            "        return torch.multinomial(probs, 1).item()\n"),
    # The regression this guards: apply_temperature written whole has no check of its own, and
    # temperature 0 never reaches it from sample_next_token.
    Variant(2, "apply_temperature", "classic, whole: logits / temperature with no check", "sampling.py",
            _TEMPERATURE, "        return logits / temperature\n"),
    Variant(2, "apply_temperature", "classic, whole: a copy divided in place", "sampling.py",
            _TEMPERATURE,
            "        scaled = logits.clone()\n"
            "        scaled /= temperature\n"
            "        return scaled\n"),
    Variant(2, "apply_frequency_penalty", "classic, whole: bincount times the penalty, integer counts", "sampling.py",
            "        ### BEGIN SOLUTION\n"
            "        # Hint: torch.bincount counts every token id in one call.\n"
            "        counts = torch.bincount(input_ids, minlength=logits.shape[-1])\n"
            "        return logits - freq_penalty * counts.to(logits.dtype)\n" + _SOLUTION_END,
            "        d_vocab = logits.size(0)\n"
            "        occurrences = input_ids.bincount(minlength=d_vocab)\n"
            "        penalty = occurrences * freq_penalty\n"
            "        return logits - penalty\n"),
    # The regression this guards: sample_top_k written whole, without the given k check.
    Variant(2, "sample_top_k", "classic, whole: Categorical over the top k, no check", "sampling.py", _TOP_K,
            "        top_values, top_ids = logits.topk(k)\n"
            "        position = torch.distributions.categorical.Categorical(logits=top_values).sample()\n"
            "        return top_ids[position].item()\n"),
    Variant(2, "sample_top_k", "classic, whole: -inf written into a sorted copy", "sampling.py", _TOP_K,
            "        ranked, order = logits.sort(descending=True)\n"
            '        ranked[k:] = float("-inf")\n'
            "        return order[TransformerSampler.sample_basic(ranked)].item()\n"),
    Variant(2, "sample_top_p", "classic, whole: searchsorted on the running total, no checks", "sampling.py",
            _TOP_P_CHECKS + _TOP_P_HINTS + _TOP_P + _SOLUTION_END,
            "        ranked, order = logits.sort(descending=True, stable=True)\n"
            "        running = ranked.softmax(dim=-1).cumsum(dim=-1)\n"
            "        # The first position where the running total reaches top_p is the last token kept.\n"
            '        n_keep = torch.searchsorted(running, top_p, side="left").item() + 1\n'
            "        n_keep = max(n_keep, min_tokens_to_keep)\n"
            "        kept = order[:n_keep]\n"
            "        choice = torch.distributions.categorical.Categorical(logits=logits[kept]).sample()\n"
            "        return kept[choice].item()\n"),
    Variant(2, "sample_next_token", "classic, whole: its own asserts, temperature skipped at 1", "sampling.py",
            _NEXT_TOKEN_CHECKS + _NEXT_TOKEN + _SOLUTION_END,
            '        assert input_ids.ndim == 1, "input_ids is one sequence of token ids"\n'
            '        assert temperature >= 0, "the temperature cannot be negative"\n'
            '        assert 0 <= top_p <= 1.0, "top_p is a probability"\n'
            '        assert 0 <= top_k, "top_k cannot be negative"\n'
            '        assert not (top_p != 0 and top_k != 0), "top_k or top_p, not both"\n'
            "        if seed is not None:\n"
            "            torch.manual_seed(seed)\n"
            "        if temperature == 0:\n"
            "            return TransformerSampler.greedy_search(logits)\n"
            "        if temperature != 1.0:\n"
            "            logits = TransformerSampler.apply_temperature(logits, temperature)\n"
            "        if frequency_penalty != 0.0:\n"
            "            logits = TransformerSampler.apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
            "        if top_k > 0:\n"
            "            return TransformerSampler.sample_top_k(logits, top_k)\n"
            "        if top_p > 0.0:\n"
            "            return TransformerSampler.sample_top_p(logits, top_p)\n"
            "        return TransformerSampler.sample_basic(logits)\n"),
    # The seed is the course's contract (it seeds once, before the first token), not an argument
    # check: the variant keeps it and drops the checks.
    Variant(2, "sample", "classic, whole: no given checks, each token a 1-element tensor", "sampling.py",
            SAMPLE_WHOLE, CLASSIC_SAMPLE),
]
