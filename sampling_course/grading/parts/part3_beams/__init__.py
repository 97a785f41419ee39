"""Part 3, Beam search: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 3
TITLE = "Beam search"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "Beams.generate", 3, "beams", "Beams.generate",
        "Extend every beam by each of its k most likely next tokens, adding their log-probs to the beam's sum.",
        "Beams are ranked by the sum of the log-probabilities of their tokens, so take "
        "log_softmax of the last position's logits: raw logits are only defined up to a "
        "per-beam constant and cannot be summed across beams.",
        "Get each beam's k best tokens from get_topk_non_repeating (so n-gram blocking applies). "
        "Every parent is repeated k times, children grouped by parent in order: child sum = "
        "parent sum + the token's log-prob, child tokens = parent tokens + the token.",
        "logprobs = self.model(self.tokens)[:, -1].log_softmax(dim=-1)\n"
        "top_lp, top_tok = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
        "parents = torch.arange(len(self)).repeat_interleave(k)\n"
        "sums = (self.logprob_sums[:, None] + top_lp).flatten()\n"
        "tokens = torch.cat([self.tokens[parents], top_tok.flatten()[:, None]], dim=-1)\n"
        "return self.new_beams(sums, tokens)",
    ),
    exercise(
        "Beams.get_topk_non_repeating", 3, "beams", "Beams.get_topk_non_repeating",
        "The top k next tokens of each beam, never completing an n-gram the beam already contains.",
        "With n = no_repeat_ngram_size, the beam's last n - 1 tokens plus a candidate form an "
        "n-gram. If that n-gram already occurs anywhere in the beam (prompt included), the "
        "candidate is blocked (log-prob -inf) before taking the top k. None means a plain topk.",
        "The rule is Hugging Face's NoRepeatNGramLogitsProcessor: for every earlier window where "
        "tokens[i : i + n - 1] equals the last n - 1 tokens, block tokens[i + n - 1]. Mind the "
        "off-by-one: the window is n - 1 long and the blocked token is the one right after it. "
        "With n = 1 every token already present is blocked; a beam shorter than n blocks nothing.",
        "ngrams = self.tokens.unfold(1, n, 1)                      # (batch, windows, n)\n"
        "tail = self.tokens[:, seq_len - (n - 1):]\n"
        "live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)\n"
        "blocked = torch.zeros_like(logprobs, dtype=torch.long).scatter_add_(1, ngrams[:, :, -1], live.long())\n"
        'return logprobs.masked_fill(blocked > 0, float("-inf")).topk(k, dim=-1)',
    ),
    exercise(
        "Beams.filter", 3, "beams", "Beams.filter",
        "Keep the k best beams and split them into those still going and those that just ended with end-of-text.",
        "Rank all beams by logprob_sums, best first, and keep the top k before splitting them.",
        "A beam whose last token is eos_token_id is finished: it goes to the terminated beams "
        "and must not appear among the continuing ones, or it would be extended past its end.",
        "best = self.logprob_sums.topk(min(k, len(self))).indices\n"
        "ended = self.tokens[best, -1] == self.tokenizer.eos_token_id\n"
        "return self[best[~ended]], self[best[ended]]",
    ),
    exercise(
        "beam_search", 3, "sampling", "TransformerSampler.beam_search",
        "Run beam search from the prompt and return the best num_return_sequences as (log-prob sum, text).",
        "Start from one beam, the prompt, with log-prob sum 0; every step is a generate "
        "followed by a filter.",
        "Each step: beams.generate(k=num_beams, ...), then beams.filter(k=num_beams). Set the "
        "terminated beams aside as finished and return as soon as num_return_sequences have "
        "finished; after max_new_tokens steps, top up with the best unfinished beams.",
        "for _ in range(max_new_tokens):\n"
        "    beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)\n"
        "    beams, terminated = beams.filter(k=num_beams)\n"
        "    finished.extend(terminated.logprobs_and_completions)\n"
        "    if len(finished) >= num_return_sequences: return finished[:num_return_sequences]\n"
        "finished.extend(beams.logprobs_and_completions)\n"
        "return finished[:num_return_sequences]",
    ),
    exercise(
        "BeamHypotheses", 3, "beams", "BeamHypotheses",
        "Hugging Face's finished beams: score = sum / length ** length_penalty, keep the num_beams best, and say when the search may stop (early_stopping True, False or \"never\").",
        "Summed log-probabilities favour short beams: every token adds a negative number. Dividing by "
        "length ** length_penalty puts beams of different lengths on one scale (1: the mean per token).",
        "add: append (score, sum, beam), sort best first, drop what is past num_beams. is_done: never "
        "before num_beams beams have finished; with early_stopping True as soon as they have; otherwise "
        "when the best running beam cannot beat the worst kept score.",
        "How good can a running beam still get? Its sum only falls, so with length_penalty > 0 its best "
        "is its sum now over the longest length, max_new_tokens (\"never\": exact); False scores it at "
        "its current length (a heuristic).\n"
        "if len(self.hypotheses) < self.num_beams: return False\n"
        "if self.early_stopping is True: return True\n"
        "if self.early_stopping == \"never\" and self.length_penalty > 0: length = self.max_new_tokens\n"
        "return self.score(best_running_sum, length) <= self.hypotheses[-1][0]",
    ),
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(3, "beams ranked by logits instead of log-probs", "beams.py",
            "logprobs = logits.log_softmax(dim=-1)", "logprobs = logits",
            why="adding raw logits to the beams' sums instead of log-probabilities (log_softmax of the logits)"),
    Mistake(3, "sums not accumulated over steps", "beams.py",
            "new_logprob_sums = (self.logprob_sums[:, None] + topk_logprobs).flatten()",
            "new_logprob_sums = topk_logprobs.flatten()",
            why="giving each child only its new token's log-probability instead of adding it to its parent's sum"),
    Mistake(3, "per-beam top-k grouped wrongly (repeat, not repeat_interleave)", "beams.py",
            "parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)",
            "parents = torch.arange(len(self), device=self.tokens.device).repeat(k)",
            why="pairing children with the wrong parents: repeat instead of repeat_interleave when copying each parent k times"),
    Mistake(3, "generate ignores no_repeat_ngram_size", "beams.py",
            "self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)",
            "self.get_topk_non_repeating(logprobs, None, k)",
            why="not passing no_repeat_ngram_size on to get_topk_non_repeating, so no n-gram is ever blocked"),
    Mistake(3, "filter keeps the first k beams, not the best k", "beams.py",
            "best = self.logprob_sums.topk(min(k, len(self))).indices",
            "best = torch.arange(min(k, len(self)))",
            why="keeping the first k beams instead of the k with the highest log-probability sums"),
    Mistake(3, "terminated beams kept alive", "beams.py",
            "return self[best[~ended]], self[best[ended]]", "return self[best], self[best[ended]]",
            why="keeping the beams that ended with end-of-text among the beams that continue"),
    Mistake(3, "n-gram blocking switched off", "beams.py",
            "logprobs = logprobs.masked_fill(blocked > 0, float(\"-inf\"))", "pass",
            why="never blocking any token, whatever n-grams the beam holds"),
    Mistake(3, "n-gram blocking skips a history of exactly n tokens", "beams.py",
            "if seq_len >= n:", "if seq_len > n:",
            why="blocking nothing when the beam is exactly n tokens long (seq_len > n where it should be seq_len >= n)"),
    Mistake(3, "n-gram blocking misses the last n-gram", "beams.py",
            "ngrams = self.tokens.unfold(dimension=1, size=n, step=1)",
            "ngrams = self.tokens[:, :-1].unfold(dimension=1, size=n, step=1)",
            why="leaving the beam's last n-gram out of the n-grams it already holds"),
    Mistake(3, "n-gram blocking matches the wrong end of the n-gram", "beams.py",
            "live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)",
            "live = (ngrams[:, :, 1:] == tail[:, None, :]).all(dim=-1)",
            why="comparing the beam's last n - 1 tokens with the end of each earlier n-gram instead of its start"),
    Mistake(3, "n-gram window of n tokens instead of n - 1", "beams.py",
            "        if seq_len >= n:\n"
            "            # Every n-gram of every beam: (batch, n_windows, n).\n"
            "            ngrams = self.tokens.unfold(dimension=1, size=n, step=1)\n"
            "            # An n-gram is \"live\" when its first n-1 tokens equal the beam's last n-1 tokens.\n"
            "            tail = self.tokens[:, seq_len - (n - 1) :]\n",
            "        if seq_len >= n + 1:\n"
            "            ngrams = self.tokens.unfold(dimension=1, size=n + 1, step=1)\n"
            "            tail = self.tokens[:, seq_len - n :]\n",
            why="matching the beam's last n tokens instead of its last n - 1 (the classic off-by-one): that blocks "
                "repeated (n + 1)-grams, so a repeated n-gram gets through",
            fix="compare the first n - 1 tokens of every n-gram with the beam's last n - 1 tokens; the blocked "
                "token is the n-gram's last"),
    Mistake(3, "n-gram tail by negative index (wrong for n = 1)", "beams.py",
            "tail = self.tokens[:, seq_len - (n - 1) :]", "tail = self.tokens[:, -(n - 1) :]",
            why="taking the last n - 1 tokens as tokens[:, -(n - 1):], which for n = 1 is the whole beam instead of nothing"),
    Mistake(3, "beam_search does not pass no_repeat_ngram_size", "sampling.py",
            "beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)",
            "beams = beams.generate(k=num_beams)",
            why="not passing no_repeat_ngram_size on to Beams.generate"),
    Mistake(3, "beam_search keeps num_return_sequences beams instead of num_beams", "sampling.py",
            "beams, terminated = beams.filter(k=num_beams)",
            "beams, terminated = beams.filter(k=num_return_sequences)",
            why="keeping num_return_sequences beams at every step instead of num_beams"),
    Mistake(3, "beam_search drops finished beams", "sampling.py",
            "finished.extend(terminated.logprobs_and_completions)", "pass",
            why="dropping the beams that ended with end-of-text instead of keeping them as results"),
    Mistake(3, "beam_search never returns early", "sampling.py",
            "if len(finished) >= num_return_sequences:\n                break",
            "if False:\n                break",
            why="carrying on after num_return_sequences beams have finished, instead of returning them"),
    Mistake(3, "beam_search puts live beams before finished ones", "sampling.py",
            "return (finished + beams.logprobs_and_completions)[:num_return_sequences]",
            "return (beams.logprobs_and_completions + finished)[:num_return_sequences]",
            why="returning the unfinished beams before the finished ones"),
    Mistake(3, "length penalty multiplies the sum", "beams.py",
            "return logprob_sum / length**self.length_penalty", "return logprob_sum * length**self.length_penalty",
            why="multiplying the summed log-probability by length ** length_penalty instead of dividing by it"),
    Mistake(3, "finished beams kept worst first", "beams.py",
            "self.hypotheses.sort(key=lambda hypothesis: hypothesis[0], reverse=True)",
            "self.hypotheses.sort(key=lambda hypothesis: hypothesis[0])",
            why="sorting the finished beams from worst to best, so that the best are the ones dropped"),
    Mistake(3, "finished beams ranked by their sums", "beams.py",
            "self.hypotheses.append((self.score(logprob_sum, length), logprob_sum, beam))",
            "self.hypotheses.append((logprob_sum, logprob_sum, beam))",
            why="ranking finished beams by their summed log-probabilities, ignoring length_penalty"),
    Mistake(3, "early_stopping=True waits for the bound", "beams.py",
            "        if self.early_stopping is True:\n            return True\n", "",
            why="not stopping as soon as num_beams beams have finished when early_stopping is True"),
    Mistake(3, "\"never\" bounds a running beam at its current length", "beams.py",
            "if self.early_stopping == \"never\" and self.length_penalty > 0:",
            "if self.early_stopping == \"never\" and self.length_penalty < 0:",
            why="with early_stopping=\"never\", scoring a running beam's best at its current length when a positive "
                "length_penalty lets it grow to max_new_tokens"),
    Mistake(3, "\"never\" treated like False (the bound at the current length)", "beams.py",
            "        if self.early_stopping == \"never\" and self.length_penalty > 0:\n"
            "            length = self.max_new_tokens\n",
            "",
            why="with early_stopping=\"never\", scoring the best running beam at its current length, as "
                "early_stopping=False does, though with a positive length_penalty it can still gain by growing",
            fix="with \"never\" and length_penalty > 0, score the best running beam at max_new_tokens, the longest "
                "it can get"),
    Mistake(3, "search stops once one beam has finished", "beams.py",
            "        if len(self.hypotheses) < self.num_beams:\n            return False\n",
            "        if not self.hypotheses:\n            return False\n",
            why="allowing the search to stop before num_beams beams have finished"),
]

# Correct implementations in other styles than the solutions' (the way learners write them);
# `sampling-course plant-mistakes --variants` checks that every test of the exercise accepts each.
_GENERATE_TAIL = (
    "        logprobs = logits.log_softmax(dim=-1)\n"
    "        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
    "        parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)\n"
    "        new_logprob_sums = (self.logprob_sums[:, None] + topk_logprobs).flatten()\n"
    "        new_tokens = torch.cat([self.tokens[parents], topk_tokens.flatten()[:, None]], dim=-1)\n"
    "        # Each child inherits its parent's cache row: it reads row parents[i], no copy needed.\n"
    "        return self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)\n"
)
# generate with Python loops over beams and ranks; the cache rows are copied per child.
_GENERATE_LOOPS = (
    "        logprobs = torch.log_softmax(logits, dim=-1)\n"
    "        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
    "        sums, rows, parents = [], [], []\n"
    "        for beam in range(len(self)):\n"
    "            for rank in range(k):\n"
    "                sums.append(self.logprob_sums[beam] + topk_logprobs[beam, rank])\n"
    "                rows.append(torch.cat([self.tokens[beam], topk_tokens[beam, rank : rank + 1]]))\n"
    "                parents.append(beam)\n"
    "        new_cache = None if cache is None else cache[:, :, torch.tensor(parents, device=self.tokens.device)]\n"
    "        return self.new_beams(torch.stack(sums), torch.stack(rows), new_cache)\n"
)
_NGRAM = (
    "        n = no_repeat_ngram_size\n"
    "        batch, seq_len = self.tokens.shape\n"
    "        if seq_len >= n:\n"
    "            # Every n-gram of every beam: (batch, n_windows, n).\n"
    "            ngrams = self.tokens.unfold(dimension=1, size=n, step=1)\n"
    "            # An n-gram is \"live\" when its first n-1 tokens equal the beam's last n-1 tokens.\n"
    "            tail = self.tokens[:, seq_len - (n - 1) :]\n"
    "            live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)\n"
    "            # Count live n-grams ending in each token; any count > 0 blocks that token.\n"
    "            blocked = torch.zeros_like(logprobs, dtype=torch.long)\n"
    "            blocked.scatter_add_(1, ngrams[:, :, -1], live.long())\n"
    "            logprobs = logprobs.masked_fill(blocked > 0, float(\"-inf\"))\n"
    "        return logprobs.topk(k, dim=-1)\n"
)
_FILTER = (
    "        best = self.logprob_sums.topk(min(k, len(self))).indices\n"
    "        ended = self.tokens[best, -1] == self.tokenizer.eos_token_id\n"
    "        return self[best[~ended]], self[best[ended]]\n"
)
_BEAM_SEARCH = (
    "        finished: list[tuple[float, str]] = []\n"
    "        for _ in tqdm(range(max_new_tokens), desc=\"beam search\", leave=False):\n"
    "            ### BEGIN SOLUTION\n"
    "            beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)\n"
    "            beams, terminated = beams.filter(k=num_beams)\n"
    "            finished.extend(terminated.logprobs_and_completions)\n"
    "            if len(finished) >= num_return_sequences:\n"
    "                break\n"
    "            ### END SOLUTION\n"
    "        ### BEGIN SOLUTION\n"
    "        # Finished beams first, in the order they finished; then the best unfinished ones.\n"
    "        return (finished + beams.logprobs_and_completions)[:num_return_sequences]\n"
)

VARIANTS: list[Variant] = [
    # Beams.generate
    Variant(3, "Beams.generate", "einops repeat/rearrange, cache rows copied with the tokens", "beams.py",
            _GENERATE_TAIL,
            "        import einops\n"
            "\n"
            "        logprobs = logits.log_softmax(dim=-1)\n"
            "        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
            '        new_logprob_sums = einops.rearrange(self.logprob_sums[:, None] + topk_logprobs, "b k -> (b k)")\n'
            '        repeated = einops.repeat(self.tokens, "b s -> (b k) s", k=k)\n'
            '        new_tokens = torch.cat([repeated, einops.rearrange(topk_tokens, "b k -> (b k) 1")], dim=-1)\n'
            "        parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)\n"
            "        return self.new_beams(new_logprob_sums, new_tokens, None if cache is None else cache[:, :, parents])\n"),
    Variant(3, "Beams.generate", "Python loops over beams and ranks", "beams.py", _GENERATE_TAIL, _GENERATE_LOOPS),
    Variant(3, "Beams.generate", "log-prob sums kept in float64", "beams.py", _GENERATE_TAIL,
            "        logprobs = logits.double().log_softmax(dim=-1)\n"
            "        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
            "        parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)\n"
            "        new_logprob_sums = (self.logprob_sums.double().unsqueeze(1) + topk_logprobs).reshape(-1)\n"
            "        new_tokens = torch.cat([self.tokens.repeat_interleave(k, dim=0), topk_tokens.reshape(-1, 1)], dim=1)\n"
            "        return self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)\n"),
    # Beams.get_topk_non_repeating
    Variant(3, "Beams.get_topk_non_repeating", "Python loop over windows, finite fill -100", "beams.py", _NGRAM,
            "        n = no_repeat_ngram_size\n"
            "        logprobs = logprobs.clone()\n"
            "        for row, seq in enumerate(self.tokens.tolist()):\n"
            "            prefix = seq[len(seq) - n + 1 :]\n"
            "            for i in range(len(seq) - n + 1):\n"
            "                if seq[i : i + n - 1] == prefix:\n"
            "                    logprobs[row, seq[i + n - 1]] = -100.0\n"
            "        return logprobs.topk(k, dim=-1)\n"),
    Variant(3, "Beams.get_topk_non_repeating", "dict of n-gram prefixes (HF's _get_ngrams), fill -1e9", "beams.py",
            _NGRAM,
            "        n = no_repeat_ngram_size\n"
            "        banned = torch.zeros_like(logprobs, dtype=torch.bool)\n"
            "        for row, seq in enumerate(self.tokens.tolist()):\n"
            "            followers: dict[tuple[int, ...], list[int]] = {}\n"
            "            for i in range(len(seq) - n + 1):\n"
            "                followers.setdefault(tuple(seq[i : i + n - 1]), []).append(seq[i + n - 1])\n"
            "            for token in followers.get(tuple(seq[len(seq) - n + 1 :]), []):\n"
            "                banned[row, token] = True\n"
            "        return logprobs.masked_fill(banned, -1e9).topk(k, dim=-1)\n"),
    Variant(3, "Beams.get_topk_non_repeating", "loop over window starts, vectorised over the batch", "beams.py",
            _NGRAM,
            "        n = no_repeat_ngram_size\n"
            "        seq_len = self.tokens.shape[1]\n"
            "        blocked = torch.zeros_like(logprobs, dtype=torch.bool)\n"
            "        for start in range(seq_len - n + 1):\n"
            "            window = self.tokens[:, start : start + n]\n"
            "            tail = self.tokens[:, seq_len - n + 1 :]\n"
            "            rows = (window[:, :-1] == tail).all(dim=-1).nonzero().flatten()\n"
            "            blocked[rows, window[rows, -1]] = True\n"
            '        return torch.where(blocked, float("-inf"), logprobs).topk(k, dim=-1)\n'),
    # Beams.filter
    Variant(3, "Beams.filter", "Python lists of indices", "beams.py", _FILTER,
            "        order = self.logprob_sums.argsort(descending=True)[:k].tolist()\n"
            "        eos = self.tokenizer.eos_token_id\n"
            "        going = [i for i in order if self.tokens[i, -1].item() != eos]\n"
            "        ended = [i for i in order if self.tokens[i, -1].item() == eos]\n"
            "        as_index = lambda rows: torch.tensor(rows, dtype=torch.long, device=self.tokens.device)\n"
            "        return self[as_index(going)], self[as_index(ended)]\n"),
    Variant(3, "Beams.filter", "classic: topk indices, membership in nonzero(EOS), plain lists", "beams.py", _FILTER,
            "        top_beam_indices = self.logprob_sums.topk(k=k, dim=0).indices.tolist()\n"
            "        terminated_indices = torch.nonzero(self.tokens[:, -1] == self.tokenizer.eos_token_id)\n"
            "        best_continuing = [i for i in top_beam_indices if i not in terminated_indices]\n"
            "        best_terminated = [i for i in top_beam_indices if i in terminated_indices]\n"
            "        return self[best_continuing], self[best_terminated]\n"),
    Variant(3, "Beams.filter", "sort, then boolean masks over the sorted beams", "beams.py", _FILTER,
            "        order = torch.sort(self.logprob_sums, descending=True).indices[:k]\n"
            "        beams = self[order]\n"
            "        is_eos = beams.tokens[:, -1] == self.tokenizer.eos_token_id\n"
            "        return beams[~is_eos], beams[is_eos]\n"),
    # beam_search
    Variant(3, "beam_search", "while loop with a step counter", "sampling.py", _BEAM_SEARCH,
            "        finished: list[tuple[float, str]] = []\n"
            "        step = 0\n"
            "        while step < max_new_tokens and len(finished) < num_return_sequences:\n"
            "            beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)\n"
            "            beams, terminated = beams.filter(k=num_beams)\n"
            "            finished += terminated.logprobs_and_completions\n"
            "            step += 1\n"
            "        if len(finished) >= num_return_sequences:\n"
            "            return finished[:num_return_sequences]\n"
            "        return finished + beams.logprobs_and_completions[: num_return_sequences - len(finished)]\n"),
    Variant(3, "beam_search", "classic: return from inside the loop", "sampling.py", _BEAM_SEARCH,
            "        final_logprobs_and_completions = []\n"
            "        for _ in range(max_new_tokens):\n"
            "            beams = beams.generate(num_beams, no_repeat_ngram_size)\n"
            "            beams, beams_terminated = beams.filter(num_beams)\n"
            "            final_logprobs_and_completions.extend(beams_terminated.logprobs_and_completions)\n"
            "            if len(final_logprobs_and_completions) >= num_return_sequences:\n"
            "                return final_logprobs_and_completions[:num_return_sequences]\n"
            "        final_logprobs_and_completions.extend(beams.logprobs_and_completions)\n"
            "        return final_logprobs_and_completions[:num_return_sequences]\n"),
    Variant(3, "beam_search", "finished Beams objects kept, converted at the end", "sampling.py", _BEAM_SEARCH,
            "        finished_beams = []\n"
            "        for _ in range(max_new_tokens):\n"
            "            beams, terminated = beams.generate(num_beams, no_repeat_ngram_size).filter(num_beams)\n"
            "            if len(terminated) > 0:\n"
            "                finished_beams.append(terminated)\n"
            "            if sum(len(b) for b in finished_beams) >= num_return_sequences:\n"
            "                break\n"
            "        results = [pair for b in finished_beams for pair in b.logprobs_and_completions]\n"
            "        results += beams.logprobs_and_completions\n"
            "        return results[:num_return_sequences]\n"),
    # The classic precondition: a bare assert where the stub raises a ValueError.
    Variant(3, "beam_search", "classic: assert num_return_sequences <= num_beams", "sampling.py",
            "        if not 1 <= num_return_sequences <= num_beams:\n"
            "            raise ValueError(\n"
            '                f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return_sequences!r}"\n'
            "            )\n",
            "        assert num_return_sequences <= num_beams\n"
            "        if num_return_sequences < 1:\n"
            '            raise ValueError(f"num_return_sequences must be >= 1, got {num_return_sequences!r}")\n'),
    # Written whole, as the classic notebook has it: the one classic assert and none of the
    # course's given argument checks (those are not graded as the learner's).
    Variant(3, "beam_search", "classic, written whole: no argument checks but the assert", "sampling.py",
            "        if num_beams < 1:\n"
            '            raise ValueError(f"num_beams must be >= 1, got {num_beams!r}")\n'
            "        if not 1 <= num_return_sequences <= num_beams:\n"
            "            raise ValueError(\n"
            '                f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return_sequences!r}"\n'
            "            )\n"
            "        if max_new_tokens < 0:\n"
            '            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens!r}")\n'
            "        if no_repeat_ngram_size is not None and no_repeat_ngram_size < 1:\n"
            '            raise ValueError(f"no_repeat_ngram_size must be None or >= 1, got {no_repeat_ngram_size!r}")\n'
            "        if length_penalty is not None and (\n"
            "            isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or length_penalty != length_penalty\n"
            "        ):\n"
            '            raise ValueError(f"length_penalty must be None or a number, got {length_penalty!r}")\n'
            '        if early_stopping is not None and (not isinstance(early_stopping, (bool, str)) or early_stopping not in (True, False, "never")):\n'
            """            raise ValueError(f'early_stopping must be None, True, False or "never", got {early_stopping!r}')\n"""
            "\n"
            '        tokens = self.tokenizer.encode(prompt, return_tensors="pt").to(self.device)\n'
            "        if tokens.shape[1] + max_new_tokens > self.cfg.n_ctx:\n"
            "            raise ValueError(\n"
            '                f"the prompt ({tokens.shape[1]} tokens) plus max_new_tokens={max_new_tokens} is longer than the "\n'
            """                f"model's n_ctx={self.cfg.n_ctx}; beam search keeps every beam's whole history, so shorten one of them"\n"""
            "            )\n"
            "        beams = Beams(self.model, self.tokenizer, torch.zeros(1, device=tokens.device), tokens, kv_cache)\n",
            "        assert num_return_sequences <= num_beams\n"
            '        tokens = self.tokenizer.encode(prompt, return_tensors="pt").to(self.device)\n'
            "        beams = Beams(self.model, self.tokenizer, torch.zeros(1, device=tokens.device), tokens, kv_cache)\n"),
    Variant(3, "BeamHypotheses", "a heap of the best finished beams", "beams.py",
            "        self.hypotheses.append((self.score(logprob_sum, length), logprob_sum, beam))\n"
            "        self.hypotheses.sort(key=lambda hypothesis: hypothesis[0], reverse=True)\n"
            "        del self.hypotheses[self.num_beams :]\n",
            "        import heapq\n\n"
            "        best = heapq.nlargest(self.num_beams, self.hypotheses + [(self.score(logprob_sum, length), logprob_sum, beam)],\n"
            "                              key=lambda hypothesis: hypothesis[0])\n"
            "        self.hypotheses[:] = best\n"),
    Variant(3, "BeamHypotheses", "the normalising power computed with torch", "beams.py",
            "        return logprob_sum / length**self.length_penalty\n",
            "        return logprob_sum / float(torch.tensor(float(length), dtype=torch.float64).pow(self.length_penalty))\n"),
    Variant(3, "BeamHypotheses", "is_done written as one condition", "beams.py",
            "        if len(self.hypotheses) < self.num_beams:\n"
            "            return False\n"
            "        if self.early_stopping is True:\n"
            "            return True\n"
            "        if self.early_stopping == \"never\" and self.length_penalty > 0:\n"
            "            length = self.max_new_tokens\n"
            "        return self.score(best_running_sum, length) <= self.hypotheses[-1][0]\n",
            "        full = len(self.hypotheses) >= self.num_beams\n"
            "        longest = self.max_new_tokens if self.early_stopping == \"never\" and self.length_penalty > 0 else length\n"
            "        worst = min((score for score, _, _ in self.hypotheses), default=float(\"-inf\"))\n"
            "        return full and (self.early_stopping is True or not self.score(best_running_sum, longest) > worst)\n"),
]
from sampling_course.grading.parts.part3_beams.classic import CLASSIC_VARIANTS  # noqa: E402  (reads the texts above)
from sampling_course.grading.parts.part3_beams.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)

VARIANTS += CLASSIC_VARIANTS
MISTAKES = with_fixes(MISTAKES, FIXES)
