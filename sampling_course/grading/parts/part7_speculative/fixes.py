"""How to put right each of part 7's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "accepting when r >= p/q": "accept the proposal when r < p[i, x] / q[i, x]",
    "replacement drawn from p instead of max(0, p - q)":
        "draw the replacement from residual_probs(p[i], q[i]), max(0, p - q) normalised",
    "no bonus token when every proposal is accepted":
        "when all proposals are accepted, draw one more token from the target's last distribution and append it",
    "residual not normalised": "divide max(0, p - q) by its sum (falling back to p when the sum is 0)",
    "residual_probs returns p": "return max(0, p - q) divided by its sum, or p when that sum is 0",
    "target cache not cropped": "crop it to the accepted length: target_cache = crop_cache(target_cache, keep)",
    "draft cache not cropped":
        "crop it to the accepted length: crop_cache(draft_cache, min(keep, draft_cache.seq_len))",
    "caches cropped one position late (the rejected proposal stays)":
        "keep len(tokens) + len(new) - 1 positions: the last new token has no keys in the cache yet",
    "crop_cache slices the batch dimension": "slice the position dimension, the fourth: kv_cache[:, :, :, :n]",
    "target's p read from the first positions of its logits":
        "read the last gamma + 1 positions: logits[0, -(gamma + 1):]",
    "temperature applied twice to the draft's logits (as in HF assisted generation)":
        "pass the raw logits to filtered_probs, which divides by the temperature once",
    "draft samples without top-k / top-p (filters shape p only)":
        "filter q exactly as p: filtered_probs(logits, temperature, top_k, top_p)",
    "temperature applied twice, to p and q alike": "divide the logits by the temperature once",
    "exclusive top-p cutoff": "keep a token while the mass ranked above it, cumsum - probs, is below top_p",
    "top-p applied before top-k": "apply top-k first, then top-p to what top-k kept",
    "prompt lookup takes the first occurrence": "take the most recent match: start = int(matches[-1]) + n",
    "prompt lookup matches the ending with itself":
        "search only the windows that end before the last token: tokens[:length - 1].unfold(0, n, 1)",
    "prompt lookup tries the shortest n-gram first": "try n from min(max_ngram_size, length - 1) down to 1",
    "prompt lookup proposes the matched n-gram itself":
        "propose the tokens after the match: start = int(matches[-1]) + n",
}
