"""Part 3's correct variants in the classic course's style: each method written whole.

``Beams.generate`` with einops repeats and the cache rows copied for the children,
``get_topk_non_repeating`` with its given ``None`` branch folded in and a loop over n-gram
windows that writes a large negative log-probability into its own copy, and
``BeamHypotheses.add`` keeping its list sorted by insertion. (``Beams.filter`` and
``beam_search`` have their classic versions beside the other variants.) Every test of the
exercise must pass each one. Part 4 reuses the whole ``generate`` (``CLASSIC_GENERATE``).
"""

from __future__ import annotations

from sampling_course.grading.catalogue import Variant

# The solutions' own text that each variant replaces (as the part's other variants read it).
_GENERATE_TAIL = (
    '        logprobs = logits.log_softmax(dim=-1)\n'
    '        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n'
    '        parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)\n'
    '        new_logprob_sums = (self.logprob_sums[:, None] + topk_logprobs).flatten()\n'
    '        new_tokens = torch.cat([self.tokens[parents], topk_tokens.flatten()[:, None]], dim=-1)\n'
    "        # Each child inherits its parent's cache row: it reads row parents[i], no copy needed.\n"
    '        return self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)\n'
)
_NGRAM = (
    '        n = no_repeat_ngram_size\n'
    '        batch, seq_len = self.tokens.shape\n'
    '        if seq_len >= n:\n'
    '            # Every n-gram of every beam: (batch, n_windows, n).\n'
    '            ngrams = self.tokens.unfold(dimension=1, size=n, step=1)\n'
    '            # An n-gram is "live" when its first n-1 tokens equal the beam\'s last n-1 tokens.\n'
    '            tail = self.tokens[:, seq_len - (n - 1) :]\n'
    '            live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)\n'
    '            # Count live n-grams ending in each token; any count > 0 blocks that token.\n'
    '            blocked = torch.zeros_like(logprobs, dtype=torch.long)\n'
    '            blocked.scatter_add_(1, ngrams[:, :, -1], live.long())\n'
    '            logprobs = logprobs.masked_fill(blocked > 0, float("-inf"))\n'
    '        return logprobs.topk(k, dim=-1)\n'
)

# Beams.generate's whole solution region: the forward pass (with or without a cache) and the tail.
GENERATE_BODY = (
    "        ### BEGIN SOLUTION\n"
    "        if self.kv_cache is None:\n"
    "            logits = self.model(self.tokens)[:, -1]\n"
    "            cache = None\n"
    "        else:\n"
    "            logits, cache = self.model(self.tokens, self.beam_cache)\n"
    "            logits = logits[:, -1]\n"
    "        # Rank by log-probabilities: logits are only defined up to a per-beam constant,\n"
    "        # so adding them to a running sum would compare beams on different scales.\n"
    + _GENERATE_TAIL
    + "        ### END SOLUTION\n"
)
CLASSIC_GENERATE = (
    "        import einops\n"
    "\n"
    "        if self.kv_cache is None:\n"
    "            last_logits = self.model(self.tokens)[:, -1, :]\n"
    "            cache = None\n"
    "        else:\n"
    "            all_logits, cache = self.model(self.tokens, self.beam_cache)\n"
    "            last_logits = all_logits[:, -1, :]\n"
    "        logprobs = last_logits.log_softmax(-1)\n"
    "        top_logprobs, top_ids = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k=k)\n"
    '        sums = einops.repeat(self.logprob_sums, "batch -> batch k", k=k) + top_logprobs\n'
    '        grown = torch.concat([einops.repeat(self.tokens, "batch seq -> batch k seq", k=k), top_ids.unsqueeze(-1)], dim=-1)\n'
    "        parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)\n"
    "        new_cache = None if cache is None else cache[:, :, parents]\n"
    "        return self.new_beams(sums.flatten(), grown.flatten(0, 1), new_cache)\n"
)

CLASSIC_VARIANTS: list[Variant] = [
    Variant(3, "Beams.generate", "classic, whole: einops repeats, children's cache rows copied", "beams.py",
            GENERATE_BODY, CLASSIC_GENERATE),
    Variant(3, "Beams.get_topk_non_repeating", "classic, whole: None branch folded in, window loop on a copy",
            "beams.py",
            "        # Given: without n-gram blocking it is plain top-k (Beams.generate, the exercise before\n"
            "        # this one, runs through here from the start).\n"
            "        if no_repeat_ngram_size is None:\n"
            "            return logprobs.topk(k, dim=-1)\n"
            "        ### BEGIN SOLUTION\n" + _NGRAM + "        ### END SOLUTION\n",
            "        logprobs = logprobs.clone()\n"
            "        batch, seq_len = self.tokens.shape\n"
            "        n = no_repeat_ngram_size\n"
            "        if n is not None and seq_len >= n:\n"
            "            prefix = self.tokens[:, seq_len - n + 1 :]\n"
            "            rows = torch.arange(batch, device=self.tokens.device)\n"
            "            for start in range(seq_len - n + 1):\n"
            "                window = self.tokens[:, start : start + n]\n"
            "                repeated = (window[:, :-1] == prefix).all(dim=-1)\n"
            "                last = window[:, -1]\n"
            "                logprobs[rows, last] = torch.where(repeated, -1.0e4, logprobs[rows, last])\n"
            "        return logprobs.topk(k=k, dim=-1)\n"),
    Variant(3, "BeamHypotheses", "classic: add inserts at its place and drops the worst", "beams.py",
            "        # Hint: append (score, sum, beam), sort by score, best first, and drop what is past num_beams.\n"
            "        self.hypotheses.append((self.score(logprob_sum, length), logprob_sum, beam))\n"
            "        self.hypotheses.sort(key=lambda hypothesis: hypothesis[0], reverse=True)\n"
            "        del self.hypotheses[self.num_beams :]\n",
            "        score = self.score(logprob_sum, length)\n"
            "        place = 0\n"
            "        while place < len(self.hypotheses) and self.hypotheses[place][0] >= score:\n"
            "            place += 1\n"
            "        self.hypotheses.insert(place, (score, logprob_sum, beam))\n"
            "        if len(self.hypotheses) > self.num_beams:\n"
            "            self.hypotheses.pop()\n"),
]
