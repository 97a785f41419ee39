"""How to put right each of part 3's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "beams ranked by logits instead of log-probs": "add logits.log_softmax(dim=-1) to the sums, not the raw logits",
    "sums not accumulated over steps":
        "add each child's log-probability to its parent's sum: logprob_sums[:, None] + topk_logprobs",
    "per-beam top-k grouped wrongly (repeat, not repeat_interleave)":
        "copy each parent k times in a row with repeat_interleave(k), matching the flattened (beam, k) order",
    "generate ignores no_repeat_ngram_size":
        "pass no_repeat_ngram_size on: get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)",
    "filter keeps the first k beams, not the best k":
        "keep logprob_sums.topk(min(k, len(self))).indices, the k best sums",
    "terminated beams kept alive": "continue only the best beams that did not end: self[best[~ended]]",
    "n-gram blocking switched off":
        "set every blocked token's log-probability to -inf with masked_fill before taking the top k",
    "n-gram blocking skips a history of exactly n tokens":
        "block as soon as the beam holds one whole n-gram: seq_len >= n",
    "n-gram blocking misses the last n-gram":
        "unfold the whole beam, tokens.unfold(1, n, 1), so its last n-gram counts too",
    "n-gram blocking matches the wrong end of the n-gram":
        ("compare the beam's last n - 1 tokens with each n-gram's first n - 1, ngrams[..., :-1], and block its last "
         "token"),
    "n-gram tail by negative index (wrong for n = 1)":
        "slice the tail from a positive index, tokens[:, seq_len - (n - 1):], which is empty for n = 1",
    "beam_search does not pass no_repeat_ngram_size":
        "pass it on: beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)",
    "beam_search keeps num_return_sequences beams instead of num_beams":
        "filter to num_beams at every step; cut to num_return_sequences only when returning",
    "beam_search drops finished beams":
        "add the terminated beams to the finished list: finished.extend(terminated.logprobs_and_completions)",
    "beam_search never returns early": "stop as soon as len(finished) >= num_return_sequences",
    "beam_search puts live beams before finished ones":
        "return the finished beams first: (finished + beams.logprobs_and_completions)[:num_return_sequences]",
    "length penalty multiplies the sum":
        "divide the sum by the length to the power of the penalty: logprob_sum / length ** length_penalty",
    "finished beams kept worst first":
        "sort the hypotheses by score with reverse=True, so the worst is last and is the one dropped",
    "finished beams ranked by their sums":
        "rank each finished beam by score(logprob_sum, length), the length-normalised score",
    "early_stopping=True waits for the bound":
        "with early_stopping=True, return True as soon as num_beams beams have finished",
    "\"never\" bounds a running beam at its current length":
        ("bound at max_new_tokens only when early_stopping is \"never\" and length_penalty > 0; otherwise use the "
         "current length"),
    "search stops once one beam has finished": "return False while fewer than num_beams beams have finished",
}
