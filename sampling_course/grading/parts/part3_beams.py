"""Part 3, Beam search: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, exercise

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
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the named test file catches it.
MISTAKES: list[Mistake] = [
    Mistake(3, "beams ranked by logits instead of log-probs", "beams.py",
            "logprobs = logits.log_softmax(dim=-1)", "logprobs = logits", "test_beams.py",
            why="adding raw logits to the beams' sums instead of log-probabilities (log_softmax of the logits)"),
    Mistake(3, "sums not accumulated over steps", "beams.py",
            "new_logprob_sums = (self.logprob_sums[:, None] + topk_logprobs).flatten()",
            "new_logprob_sums = topk_logprobs.flatten()", "test_beams.py",
            why="giving each child only its new token's log-probability instead of adding it to its parent's sum"),
    Mistake(3, "per-beam top-k grouped wrongly (repeat, not repeat_interleave)", "beams.py",
            "parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)",
            "parents = torch.arange(len(self), device=self.tokens.device).repeat(k)", "test_beams.py",
            why="pairing children with the wrong parents: repeat instead of repeat_interleave when copying each parent k times"),
    Mistake(3, "generate ignores no_repeat_ngram_size", "beams.py",
            "self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)",
            "self.get_topk_non_repeating(logprobs, None, k)", "test_beams.py",
            why="not passing no_repeat_ngram_size on to get_topk_non_repeating, so no n-gram is ever blocked"),
    Mistake(3, "filter keeps the first k beams, not the best k", "beams.py",
            "best = self.logprob_sums.topk(min(k, len(self))).indices",
            "best = torch.arange(min(k, len(self)))", "test_beams.py",
            why="keeping the first k beams instead of the k with the highest log-probability sums"),
    Mistake(3, "terminated beams kept alive", "beams.py",
            "return self[best[~ended]], self[best[ended]]", "return self[best], self[best[ended]]", "test_beams.py",
            why="keeping the beams that ended with end-of-text among the beams that continue"),
    Mistake(3, "n-gram blocking switched off", "beams.py",
            "logprobs = logprobs.masked_fill(blocked > 0, float(\"-inf\"))", "pass", "test_beams.py",
            why="never blocking any token, whatever n-grams the beam holds"),
    Mistake(3, "n-gram blocking skips a history of exactly n tokens", "beams.py",
            "if seq_len >= n:", "if seq_len > n:", "test_beams.py",
            why="blocking nothing when the beam is exactly n tokens long (seq_len > n where it should be seq_len >= n)"),
    Mistake(3, "n-gram blocking misses the last n-gram", "beams.py",
            "ngrams = self.tokens.unfold(dimension=1, size=n, step=1)",
            "ngrams = self.tokens[:, :-1].unfold(dimension=1, size=n, step=1)", "test_beams.py",
            why="leaving the beam's last n-gram out of the n-grams it already holds"),
    Mistake(3, "n-gram blocking matches the wrong end of the n-gram", "beams.py",
            "live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)",
            "live = (ngrams[:, :, 1:] == tail[:, None, :]).all(dim=-1)", "test_beams.py",
            why="comparing the beam's last n - 1 tokens with the end of each earlier n-gram instead of its start"),
    Mistake(3, "n-gram tail by negative index (wrong for n = 1)", "beams.py",
            "tail = self.tokens[:, seq_len - (n - 1) :]", "tail = self.tokens[:, -(n - 1) :]", "test_beams.py",
            why="taking the last n - 1 tokens as tokens[:, -(n - 1):], which for n = 1 is the whole beam instead of nothing"),
    Mistake(3, "beam_search does not pass no_repeat_ngram_size", "sampling.py",
            "beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)",
            "beams = beams.generate(k=num_beams)", "test_beams.py",
            why="not passing no_repeat_ngram_size on to Beams.generate"),
    Mistake(3, "beam_search keeps num_return_sequences beams instead of num_beams", "sampling.py",
            "beams, terminated = beams.filter(k=num_beams)",
            "beams, terminated = beams.filter(k=num_return_sequences)", "test_beams.py",
            why="keeping num_return_sequences beams at every step instead of num_beams"),
    Mistake(3, "beam_search drops finished beams", "sampling.py",
            "finished.extend(terminated.logprobs_and_completions)", "pass", "test_beams.py",
            why="dropping the beams that ended with end-of-text instead of keeping them as results"),
    Mistake(3, "beam_search never returns early", "sampling.py",
            "if len(finished) >= num_return_sequences:\n                break",
            "if False:\n                break", "test_beams.py",
            why="carrying on after num_return_sequences beams have finished, instead of returning them"),
    Mistake(3, "beam_search puts live beams before finished ones", "sampling.py",
            "return (finished + beams.logprobs_and_completions)[:num_return_sequences]",
            "return (beams.logprobs_and_completions + finished)[:num_return_sequences]", "test_beams.py",
            why="returning the unfinished beams before the finished ones"),
]
