"""Part 7, speculative decoding: its exercises (what each asks, three graded hints), its planted
mistakes and its planted correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 7
TITLE = "Speculative decoding"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "filtered_probs", 7, "speculative", "filtered_probs",
        "The distribution both models sample from: temperature, then top-k, then top-p, then softmax; "
        "temperature 0 puts all the mass on the argmax.",
        "Work in logits: divide by the temperature, set the logits of filtered-out tokens to -inf, "
        "and let one softmax at the end renormalise what is left.",
        "Top-k keeps the tokens whose logit is at least the k-th largest (logits.topk(k).values[..., -1:]). "
        "Top-p works on the probabilities after top-k: sort them, and keep a token while the mass ranked "
        "above it is still below top_p (inclusive: the token that reaches top_p stays). The kept mask must "
        "go back from sorted order to vocabulary order (scatter with the sort's indices).",
        "if temperature == 0: return zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)\n"
        "logits = logits / temperature\n"
        "if top_k: logits = logits.masked_fill(logits < logits.topk(top_k).values[..., -1:], -inf)\n"
        "if top_p < 1: sorted_logits, order = logits.sort(descending=True); probs = sorted_logits.softmax(-1)\n"
        "    keep_sorted = probs.cumsum(-1) - probs < top_p\n"
        "    keep = zeros_like(keep_sorted).scatter(-1, order, keep_sorted); logits = logits.masked_fill(~keep, -inf)\n"
        "return logits.softmax(-1)",
    ),
    exercise(
        "draft_tokens", 7, "speculative", "draft_tokens",
        "The draft proposes gamma tokens, one cached forward pass each, and returns them with the "
        "distributions q they were drawn from and its cache.",
        "Each proposal is drawn from filtered_probs of the draft's logits at the last position, with the "
        "same filters the target will use, and then becomes part of the sequence the next forward pass sees.",
        "Keep the growing sequence (tokens followed by the proposals so far) and pass all of it with the "
        "cache: the cache knows which positions are new. Draw with torch.multinomial(q, 1, generator=generator) "
        "so that a seed reproduces the run, and keep every q: the acceptance rule needs them.",
        "sequence, q_rows = tokens, []\n"
        "for _ in range(gamma):\n"
        "    logits, kv_cache = draft(sequence[None], kv_cache)\n"
        "    q = filtered_probs(logits[0, -1], temperature, top_k, top_p)\n"
        "    sequence = torch.cat([sequence, torch.multinomial(q, 1, generator=generator)])\n"
        "    q_rows.append(q)\n"
        "return sequence[len(tokens):], torch.stack(q_rows), kv_cache",
    ),
    exercise(
        "residual_probs", 7, "speculative", "residual_probs",
        "normalize(max(0, p - q)): where a rejected proposal's replacement is drawn from.",
        "Accepting x with probability min(1, p(x)/q(x)) produces each token with probability min(p, q); "
        "what p still lacks is max(0, p - q), and that is what the replacement must supply.",
        "Clamp p - q at 0, divide by its sum over the vocabulary (keepdim=True so that it broadcasts). "
        "The sum is 0 only when p <= q everywhere, i.e. p == q up to rounding: return p there.",
        "residual = (p - q).clamp(min=0)\n"
        "total = residual.sum(dim=-1, keepdim=True)\n"
        "return torch.where(total > 0, residual / total, p)",
    ),
    exercise(
        "accept_or_resample", 7, "speculative", "accept_or_resample",
        "Judge the proposals in order: accept each with probability min(1, p/q); at the first rejection "
        "draw a replacement from the residual and stop; if all are accepted, draw a bonus token from p[-1].",
        "Accept when a uniform draw r in [0, 1) is below p[i][x] / q[i][x] (not at or above it). "
        "A round always ends with exactly one token of the target's: the replacement or the bonus.",
        "Loop over the proposals with one torch.rand((), generator=generator) each. On a rejection return "
        "the proposals before it followed by one draw from residual_probs(p[i], q[i]) (not from p[i]: "
        "acceptance has already supplied min(p, q) of every token). After the loop, append one draw from p[-1].",
        "for i, x in enumerate(proposals.tolist()):\n"
        "    if torch.rand((), generator=generator) < p[i, x] / q[i, x]: continue\n"
        "    return torch.cat([proposals[:i], torch.multinomial(residual_probs(p[i], q[i]), 1, generator=generator)])\n"
        "return torch.cat([proposals, torch.multinomial(p[-1], 1, generator=generator)])",
    ),
    exercise(
        "crop_cache", 7, "speculative", "crop_cache",
        "Keep only the first n positions of a cache: a cache's own crop(n) when it has one, a slice otherwise.",
        "Positions are dimension 3 of a KeyValueCache (n_layers, 2, batch, seq_len, n_heads, d_head).",
        "Slicing that keeps all six dimensions gives a KeyValueCache back. Check hasattr(kv_cache, 'crop') "
        "first; a crop that works in place returns None, and then the cache itself is the answer.",
        "if hasattr(kv_cache, 'crop'):\n"
        "    cropped = kv_cache.crop(n)\n"
        "    return kv_cache if cropped is None else cropped\n"
        "return kv_cache[:, :, :, :n]",
    ),
    exercise(
        "speculative_round", 7, "speculative", "speculative_round",
        "One round: draft gamma tokens, run the target once over all of them, accept or resample, and "
        "crop both caches to the tokens kept.",
        "The target's cache lacks only the last token, so one forward over tokens + proposals runs gamma + 1 "
        "positions, and its last gamma + 1 rows of logits are p for every proposal and for the bonus. "
        "On the first round it runs the whole prompt: take the LAST gamma + 1 rows, not the first.",
        "Filter the target's logits with the same settings as the draft's. After accept_or_resample, keep "
        "len(tokens) + len(new) - 1 positions: the tokens so far and the accepted proposals, not the rejected "
        "one, and not the new last token (no model has run it yet). The draft's cache may be shorter "
        "(it never ran its last proposal): crop it to at most its own length.",
        "proposals, q, draft_cache = draft_tokens(draft, tokens, draft_cache, gamma, temperature, top_k, top_p, generator)\n"
        "logits, target_cache = target(torch.cat([tokens, proposals])[None], target_cache)\n"
        "p = filtered_probs(logits[0, -(gamma + 1):], temperature, top_k, top_p)\n"
        "new = accept_or_resample(p, q, proposals, generator)\n"
        "keep = len(tokens) + len(new) - 1\n"
        "return new, crop_cache(target_cache, keep), crop_cache(draft_cache, min(keep, draft_cache.seq_len))",
    ),
    exercise(
        "prompt_lookup", 7, "speculative", "prompt_lookup",
        "Prompt-lookup drafting: the up to num_tokens tokens that followed the last earlier occurrence of the text's final n-gram (n from max_ngram_size down to 1).",
        "No draft model: text repeats itself (names, phrases), so what followed the same few tokens last "
        "time is a good guess. The proposal is certain (q is a point mass), so speculative decoding accepts "
        "it with probability p(x) and stays exact.",
        "Try the longest n-gram first. The ending itself does not count as an earlier occurrence, but an "
        "occurrence may overlap it. Of several occurrences take the most recent, and return what follows "
        "it (fewer than num_tokens tokens if the text ends first); nothing found for any n: an empty tensor.",
        "for n in range(min(max_ngram_size, len(tokens) - 1), 0, -1):\n"
        "    windows = tokens[:len(tokens) - 1].unfold(0, n, 1)\n"
        "    matches = (windows == tokens[len(tokens) - n:]).all(-1).nonzero()\n"
        "    if len(matches): start = int(matches[-1]) + n; return tokens[start:start + num_tokens]\n"
        "return tokens[:0]",
    ),
)

_S = "speculative.py"

# The solution region of accept_or_resample, replaced whole by one of its variants.
_ACCEPT_BODY = (
    "    for i, x in enumerate(proposals.tolist()):\n"
    "        r = torch.rand((), generator=generator, device=p.device)\n"
    "        # Accept with probability min(1, p/q): always when the target likes x at least as much\n"
    "        # as the draft did. q[i, x] > 0 because x was drawn from q[i].\n"
    "        if r < p[i, x] / q[i, x]:\n"
    "            continue\n"
    "        replacement = torch.multinomial(residual_probs(p[i], q[i]), num_samples=1, generator=generator)\n"
    "        return torch.cat([proposals[:i], replacement])\n"
    "    # Every proposal accepted: the target's distribution after them gives one more token for free.\n"
    "    bonus = torch.multinomial(p[-1], num_samples=1, generator=generator)\n"
    "    return torch.cat([proposals, bonus])\n"
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
MISTAKES: list[Mistake] = [
    Mistake(7, "accepting when r >= p/q", _S,
            "if r < p[i, x] / q[i, x]:", "if r >= p[i, x] / q[i, x]:",
            why=("the acceptance test is reversed: a proposal must be accepted when r < p(x) / q(x) (r "
                 "uniform in [0, 1)).")),
    Mistake(7, "replacement drawn from p instead of max(0, p - q)", _S,
            "torch.multinomial(residual_probs(p[i], q[i]), num_samples=1, generator=generator)",
            "torch.multinomial(p[i], num_samples=1, generator=generator)",
            why=("after a rejection the replacement is drawn from p; it must be drawn from the residual "
                 "max(0, p - q), normalised.")),
    Mistake(7, "no bonus token when every proposal is accepted", _S,
            "    return torch.cat([proposals, bonus])", "    return proposals",
            why=("when every proposal is accepted, no bonus token is drawn from the target's next "
                 "distribution.")),
    Mistake(7, "residual not normalised", _S,
            "return torch.where(total > 0, residual / total, p)", "return torch.where(total > 0, residual, p)",
            why="the residual max(0, p - q) is used without dividing by its sum."),
    Mistake(7, "residual_probs returns p", _S,
            "return torch.where(total > 0, residual / total, p)", "return p",
            why="the residual distribution is p itself; after a rejection it must be max(0, p - q), normalised."),
    Mistake(7, "target cache not cropped", _S,
            "target_cache = crop_cache(target_cache, keep)", "target_cache = target_cache",
            why=("the target's cache keeps the rejected proposals' keys and values; crop it to the "
                 "accepted length.")),
    Mistake(7, "draft cache not cropped", _S,
            "draft_cache = crop_cache(draft_cache, min(keep, draft_cache.seq_len))", "draft_cache = draft_cache",
            why=("the draft's cache keeps the rejected proposals' keys and values; crop it to the accepted"
                 " length.")),
    Mistake(7, "caches cropped one position late (the rejected proposal stays)", _S,
            "keep = len(tokens) + len(new) - 1", "keep = len(tokens) + len(new)",
            why=("the caches are cropped one position late, so the rejected proposal's keys and values "
                 "stay.")),
    Mistake(7, "crop_cache slices the batch dimension", _S,
            "return kv_cache[:, :, :, :n]", "return kv_cache[:, :, :n]",
            why="crop_cache slices the batch dimension instead of the sequence dimension."),
    Mistake(7, "target's p read from the first positions of its logits", _S,
            "p = filtered_probs(logits[0, -(gamma + 1) :], temperature, top_k, top_p)",
            "p = filtered_probs(logits[0, : gamma + 1], temperature, top_k, top_p)",
            why=("the target's probabilities for the proposals are read from the first positions of its "
                 "logits instead of the positions that predict each proposal.")),
    Mistake(7, "temperature applied twice to the draft's logits (as in HF assisted generation)", _S,
            "q = filtered_probs(logits[0, -1], temperature, top_k, top_p)",
            "q = filtered_probs(logits[0, -1] / temperature, temperature, top_k, top_p)",
            why=("the draft's logits are divided by the temperature twice, so q is sharper than the "
                 "draft's real distribution.")),
    Mistake(7, "draft samples without top-k / top-p (filters shape p only)", _S,
            "q = filtered_probs(logits[0, -1], temperature, top_k, top_p)",
            "q = filtered_probs(logits[0, -1], temperature)",
            why=("the draft samples from its unfiltered distribution while p is filtered; q must be "
                 "filtered the same way as p.")),
    Mistake(7, "temperature applied twice, to p and q alike", _S,
            "    logits = logits / temperature\n", "    logits = logits / temperature / temperature\n",
            why=("both distributions are divided by the temperature twice, so the output follows a sharper"
                 " law than the target's at that temperature.")),
    Mistake(7, "exclusive top-p cutoff", _S,
            "keep_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p",
            "keep_sorted = sorted_probs.cumsum(dim=-1) < top_p",
            why=("an exclusive top-p cutoff: the token that carries the running total past top_p is "
                 "dropped, where it must stay.")),
    Mistake(7, "top-p applied before top-k", _S,
            "    if top_k > 0:\n"
            "        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]\n"
            "        logits = logits.masked_fill(logits < kth_largest, float(\"-inf\"))\n"
            "    if top_p < 1.0:\n"
            "        sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
            "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
            "        # Keep a token while the mass ranked above it is still short of top_p.\n"
            "        keep_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p\n"
            "        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)\n"
            "        logits = logits.masked_fill(~keep, float(\"-inf\"))\n",
            "    if top_p < 1.0:\n"
            "        sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
            "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
            "        keep_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p\n"
            "        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)\n"
            "        logits = logits.masked_fill(~keep, float(\"-inf\"))\n"
            "    if top_k > 0:\n"
            "        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]\n"
            "        logits = logits.masked_fill(logits < kth_largest, float(\"-inf\"))\n",
            why="top-p is applied before top-k; the order is temperature, then top-k, then top-p."),
    Mistake(7, "prompt lookup takes the first occurrence", _S,
            "start = int(matches[-1]) + n", "start = int(matches[0]) + n",
            why=('prompt lookup proposes what followed the first occurrence of the n-gram, where it takes the '
                 'most recent one.')),
    Mistake(7, "prompt lookup matches the ending with itself", _S,
            "windows = tokens[: length - 1].unfold(0, n, 1)", "windows = tokens.unfold(0, n, 1)",
            why=("prompt lookup counts the text's ending as an earlier occurrence of itself, after which "
                 'nothing follows.')),
    Mistake(7, "prompt lookup tries the shortest n-gram first", _S,
            "for n in range(min(max_ngram_size, length - 1), 0, -1):",
            "for n in range(1, min(max_ngram_size, length - 1) + 1):",
            why='prompt lookup tries the shortest n-gram first, where the longest goes first.'),
    Mistake(7, "prompt lookup proposes the matched n-gram itself", _S,
            "start = int(matches[-1]) + n", "start = int(matches[-1])",
            why=('prompt lookup proposes the matched n-gram again, where it proposes the tokens that followed '
                 'it.')),
]

# Correct implementations in other styles: every test of their exercise must pass.
VARIANTS: list[Variant] = [
    Variant(7, "filtered_probs", "one_hot for greedy, top-k by scattering the kept indices", _S,
            "        greedy = logits.argmax(dim=-1, keepdim=True)\n"
            "        return torch.zeros_like(logits).scatter(-1, greedy, 1.0)\n"
            "    logits = logits / temperature\n"
            "    if top_k > 0:\n"
            "        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]\n"
            "        logits = logits.masked_fill(logits < kth_largest, float(\"-inf\"))\n",
            "        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)\n"
            "    logits = logits / temperature\n"
            "    if top_k > 0:\n"
            "        top = logits.topk(top_k, dim=-1).indices\n"
            "        kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top, True)\n"
            "        logits = torch.where(kept, logits, torch.full_like(logits, float(\"-inf\")))\n"),
    Variant(7, "filtered_probs", "top-p by the ascending cumulative sum (Hugging Face's way), -1e10 masks", _S,
            "        sorted_logits, order = logits.sort(dim=-1, descending=True)\n"
            "        sorted_probs = sorted_logits.softmax(dim=-1)\n"
            "        # Keep a token while the mass ranked above it is still short of top_p.\n"
            "        keep_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p\n"
            "        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)\n"
            "        logits = logits.masked_fill(~keep, float(\"-inf\"))\n",
            "        sorted_logits, order = logits.sort(dim=-1, descending=False)\n"
            "        drop_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p\n"
            "        drop_sorted[..., -1] = False\n"
            "        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)\n"
            "        logits = logits.masked_fill(drop, -1e10)\n"),
    Variant(7, "draft_tokens", "inverse-CDF draws from the generator, proposals kept in a list", _S,
            "    sequence = tokens\n"
            "    q_rows = []\n"
            "    for _ in range(gamma):\n"
            "        logits, kv_cache = draft(sequence[None], kv_cache)\n"
            "        q = filtered_probs(logits[0, -1], temperature, top_k, top_p)\n"
            "        proposal = torch.multinomial(q, num_samples=1, generator=generator)\n"
            "        sequence = torch.cat([sequence, proposal])\n"
            "        q_rows.append(q)\n"
            "    return sequence[len(tokens) :], torch.stack(q_rows), kv_cache\n",
            "    proposals: list[int] = []\n"
            "    q_rows = torch.empty(gamma, draft.cfg.d_vocab, device=tokens.device)\n"
            "    for i in range(gamma):\n"
            "        sequence = torch.cat([tokens, tokens.new_tensor(proposals)])\n"
            "        logits, kv_cache = draft(sequence[None], kv_cache)\n"
            "        q_rows[i] = filtered_probs(logits[0, -1], temperature, top_k, top_p)\n"
            "        u = torch.rand((), generator=generator, device=tokens.device)\n"
            "        cdf = q_rows[i].cumsum(dim=-1)\n"
            "        token = int(torch.searchsorted(cdf, u * cdf[-1], right=True).clamp(max=len(cdf) - 1))\n"
            "        if q_rows[i, token] == 0:  # only rounding at the very top of the cdf gets here\n"
            "            token = int((q_rows[i] > 0).nonzero()[-1])\n"
            "        proposals.append(token)\n"
            "    return tokens.new_tensor(proposals), q_rows, kv_cache\n"),
    Variant(7, "draft_tokens", "Gumbel-max draws from the generator's uniforms", _S,
            "        proposal = torch.multinomial(q, num_samples=1, generator=generator)\n",
            "        gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=generator, device=q.device).clamp_min(1e-20)))\n"
            "        proposal = (q.log() + gumbel).argmax(dim=-1, keepdim=True)\n"),
    Variant(7, "residual_probs", "relu and an explicit sum", _S,
            "    residual = (p - q).clamp(min=0)\n"
            "    total = residual.sum(dim=-1, keepdim=True)\n"
            "    return torch.where(total > 0, residual / total, p)\n",
            "    residual = torch.relu(p - q)\n"
            "    total = residual.sum(dim=-1, keepdim=True)\n"
            "    safe = torch.where(total > 0, total, torch.ones_like(total))\n"
            "    return torch.where(total > 0, residual / safe, p)\n"),
    Variant(7, "residual_probs", "torch.where on p > q", _S,
            "    residual = (p - q).clamp(min=0)\n",
            "    residual = torch.where(p > q, p - q, torch.zeros_like(p))\n"),
    Variant(7, "accept_or_resample", "all uniforms drawn at once, the first rejection found with cumprod", _S,
            "    for i, x in enumerate(proposals.tolist()):\n"
            "        r = torch.rand((), generator=generator, device=p.device)\n"
            "        # Accept with probability min(1, p/q): always when the target likes x at least as much\n"
            "        # as the draft did. q[i, x] > 0 because x was drawn from q[i].\n"
            "        if r < p[i, x] / q[i, x]:\n"
            "            continue\n"
            "        replacement = torch.multinomial(residual_probs(p[i], q[i]), num_samples=1, generator=generator)\n"
            "        return torch.cat([proposals[:i], replacement])\n",
            "    n = len(proposals)\n"
            "    rows = torch.arange(n, device=p.device)\n"
            "    ratio = (p[rows, proposals] / q[rows, proposals]).clamp(max=1.0)\n"
            "    accepted = torch.rand(n, generator=generator, device=p.device) < ratio\n"
            "    n_accepted = int(accepted.long().cumprod(dim=0).sum())\n"
            "    if n_accepted < n:\n"
            "        i = n_accepted\n"
            "        replacement = torch.multinomial(residual_probs(p[i], q[i]), num_samples=1, generator=generator)\n"
            "        return torch.cat([proposals[:i], replacement])\n"),
    Variant(7, "accept_or_resample", "r * q < p, and draws by inverse CDF from the generator's uniforms", _S,
            _ACCEPT_BODY,
            "    def draw(probs):\n"
            "        cdf = probs.cumsum(dim=-1)\n"
            "        u = torch.rand((), generator=generator, device=probs.device) * cdf[-1]\n"
            "        token = int(torch.searchsorted(cdf, u[None], right=True).clamp(max=len(cdf) - 1))\n"
            "        if probs[token] == 0:  # only rounding at the very top of the cdf gets here\n"
            "            token = int((probs > 0).nonzero()[-1])\n"
            "        return proposals.new_tensor([token])\n"
            "\n"
            "    for i in range(len(proposals)):\n"
            "        x = proposals[i]\n"
            "        if torch.rand((), generator=generator, device=p.device) * q[i, x] < p[i, x]:\n"
            "            continue\n"
            "        return torch.cat([proposals[:i], draw(residual_probs(p[i], q[i]))])\n"
            "    return torch.cat([proposals, draw(p[-1])])\n"),
    Variant(7, "crop_cache", "an ellipsis slice", _S,
            "    return kv_cache[:, :, :, :n]\n", "    return kv_cache[..., :n, :, :]\n"),
    Variant(7, "crop_cache", "getattr for crop, narrow on the plain tensor", _S,
            "    if hasattr(kv_cache, \"crop\"):\n"
            "        cropped = kv_cache.crop(n)\n"
            "        return kv_cache if cropped is None else cropped\n"
            "    return kv_cache[:, :, :, :n]\n",
            "    crop = getattr(kv_cache, \"crop\", None)\n"
            "    if crop is not None:\n"
            "        result = crop(n)\n"
            "        return kv_cache if result is None else result\n"
            "    return type(kv_cache)(kv_cache.as_subclass(torch.Tensor).narrow(3, 0, n))\n"),
    Variant(7, "speculative_round", "p for every row then the last ones; crops counted back from the caches' lengths", _S,
            "    p = filtered_probs(logits[0, -(gamma + 1) :], temperature, top_k, top_p)\n"
            "    new = accept_or_resample(p, q, proposals, generator)\n"
            "    # Keep the positions of the tokens so far and of the accepted proposals. The last new token\n"
            "    # is in neither cache: the next round's forward passes start with it.\n"
            "    keep = len(tokens) + len(new) - 1\n"
            "    target_cache = crop_cache(target_cache, keep)\n"
            "    draft_cache = crop_cache(draft_cache, min(keep, draft_cache.seq_len))\n"
            "    return new, target_cache, draft_cache\n",
            "    p = filtered_probs(logits[0], temperature, top_k, top_p)[-(gamma + 1) :]\n"
            "    new = accept_or_resample(p, q, proposals, generator)\n"
            "    rejected = gamma + 1 - len(new)\n"
            "    target_cache = crop_cache(target_cache, target_cache.seq_len - rejected)\n"
            "    if rejected > 0:\n"
            "        draft_cache = crop_cache(draft_cache, draft_cache.seq_len - rejected + 1)\n"
            "    return new, target_cache, draft_cache\n"),
    Variant(7, "speculative_round", "the extended sequence built once, the proposals sliced from it", _S,
            "    logits, target_cache = target(torch.cat([tokens, proposals])[None], target_cache)\n",
            "    extended = torch.cat([tokens, proposals])\n"
            "    logits, target_cache = target(extended.unsqueeze(0), target_cache)\n"
            "    proposals = extended[len(tokens) :]\n"),
    Variant(7, "prompt_lookup", "plain Python lists, searching backwards", _S,
            "    length = len(tokens)\n"
            "    for n in range(min(max_ngram_size, length - 1), 0, -1):\n"
            "        windows = tokens[: length - 1].unfold(0, n, 1)\n"
            "        matches = (windows == tokens[length - n :]).all(dim=-1).nonzero()\n"
            "        if len(matches):\n"
            "            start = int(matches[-1]) + n\n"
            "            return tokens[start : start + num_tokens]\n"
            "    return tokens[:0]\n",
            "    seq = tokens.tolist()\n"
            "    for n in reversed(range(1, min(max_ngram_size, len(seq) - 1) + 1)):\n"
            "        ending = seq[-n:]\n"
            "        for i in range(len(seq) - n - 1, -1, -1):\n"
            "            if seq[i : i + n] == ending:\n"
            "                return tokens.new_tensor(seq[i + n : i + n + num_tokens])\n"
            "    return tokens.new_tensor([], dtype=torch.long)\n"),
    Variant(7, "prompt_lookup", "torch.equal on each window, from the end", _S,
            "        windows = tokens[: length - 1].unfold(0, n, 1)\n"
            "        matches = (windows == tokens[length - n :]).all(dim=-1).nonzero()\n"
            "        if len(matches):\n"
            "            start = int(matches[-1]) + n\n"
            "            return tokens[start : start + num_tokens]\n",
            "        for i in range(length - n - 1, -1, -1):\n"
            "            if torch.equal(tokens[i : i + n], tokens[length - n :]):\n"
            "                return tokens[i + n : i + n + num_tokens]\n"),
]
from sampling_course.grading.parts.part7_speculative.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)
MISTAKES = with_fixes(MISTAKES, FIXES)
