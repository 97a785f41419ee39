"""How to put right each of part 2's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "greedy takes the least likely token": "return int(logits.argmax()), the most likely token",
    "temperature multiplied instead of divided": "divide the logits by the temperature: logits / temperature",
    "presence penalty (once per distinct token) instead of frequency penalty":
        "count every occurrence, torch.bincount(input_ids, minlength=d_vocab), and subtract freq_penalty * counts",
    "frequency penalty added instead of subtracted": "subtract the penalty: logits - freq_penalty * counts",
    "sample_basic returns the argmax": "draw the token with torch.multinomial(logits.softmax(-1), num_samples=1)",
    "sample_basic draws uniformly":
        "draw from the softmax of the logits: torch.multinomial(logits.softmax(-1), num_samples=1)",
    "top-k from k-1 tokens": "keep exactly k tokens: logits.topk(k)",
    "top-k uniform over the top k":
        "sample among the top k in proportion to their probabilities, sample_basic(top_logits)",
    "top-k returns the rank instead of the token":
        "map the drawn position back to its token id: top_tokens[sample_basic(top_logits)]",
    "top-p cutoff exclusive instead of inclusive":
        ("keep a sorted token while the mass from it to the end is above 1 - top_p, so the token that reaches top_p "
         "stays"),
    "top-p ignores min_tokens_to_keep":
        "force the first min_tokens_to_keep sorted tokens in: keep[:min_tokens_to_keep] = True",
    "top-p sorts ascending": "sort from most to least likely: logits.sort(descending=True)",
    "top-p returns the rank instead of the token":
        "map the drawn position back to its token id: sorted_tokens[sample_basic(sorted_logits[:n_kept])]",
    "frequency penalty applied before the temperature":
        "divide by the temperature first, then subtract the frequency penalty from the tempered logits",
    "sample_next_token ignores top_k": "when top_k > 0, return sample_top_k(logits, top_k)",
    "sample_next_token ignores top_p": "when top_p > 0, return sample_top_p(logits, top_p)",
    "sample passes only the temperature on": "pass every setting on: sample_next_token(input_ids, logits, **kwargs)",
    "sample loop ignores EOS": "append the token, then break when it equals tokenizer.eos_token_id",
    "sample loop stops before EOS and drops it":
        "append the token first and only then break when it is tokenizer.eos_token_id",
    "sample loop generates one token too many": "loop exactly max_tokens_generated times: range(max_tokens_generated)",
    "sample feeds the whole sequence past n_ctx": "feed only the last n_ctx tokens: input_ids[-n_ctx:]",
    "sample context window off by one": "feed the last n_ctx tokens, input_ids[-n_ctx:], not n_ctx - 1",
}
