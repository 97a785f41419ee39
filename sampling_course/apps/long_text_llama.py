"""Part 6's long-text experiment on the Llama-style story model (part 9), where sinks can keep their positions.

The texts and the table are part 6's (``long_text.story_texts``, ``long_text_results``): held-out
stories, each after ``<|endoftext|>``, read with teacher forcing; at each position ``t`` the
negative log-likelihood of the true token ``t + 1``. The methods, for a budget of ``W`` tokens:

* **full attention** while the text fits (``t < n_ctx``), from one forward pass: the ceiling;
* **full attention past n_ctx**: the same pass over the whole text. A rotary model has no
  table of positions to run out of, so it runs; but it never saw positions past ``n_ctx`` in
  training;
* **sliding window, recomputed**: the last ``W`` tokens from scratch at positions ``0 .. W - 1``,
  every ``stride``-th position (the reference for a budget of ``W`` tokens);
* **window, re-prefilled when full**: a cache of ``W`` positions, one token per step; when it is
  full it starts afresh with one prefill of the last ``W / 2`` tokens at positions from 0;
* **window cache, re-rotated**: part 9's ``RotatingSinkCache`` without sinks: a sliding window
  whose keys are turned back to slots ``0 .. W - 1`` as it slides;
* **sink cache, re-rotated**: the same with the first ``num_sink_tokens`` tokens kept for ever.

Two ablations separate what the re-rotation does from what the window does (``ablations=True``):

* **window cache, text positions**: the same window, its keys left at the rotation of their
  position in the text and each query numbered by its own position in the text (``TextPositionCache``).
  Rotary scores depend on the distance between query and key only, so this is the re-rotated
  window computed another way; what both keep is that every distance stays under the window;
* **sink cache, text positions**: the same with the sinks, whose distance to the query grows with
  ``t`` (past ``n_ctx`` it is a distance the model never trained on): what re-rotating the sinks avoids.

Every method reads all texts at once (one batch). ``entropy_floor_of_texts`` gives the source's
entropy rate on the complete stories of the texts, the loss no model can beat on average.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import TYPE_CHECKING

from jaxtyping import Bool, Float, Int

from sampling_course.apps.long_text_results import FULL, REPREFILL, SLIDING, LongTextResults, MethodResult
from sampling_course.apps.sign_flip import SignFlip, sign_flip

if TYPE_CHECKING:
    from torch import Tensor

EXTRAPOLATED = "full attention past n_ctx"
WINDOW_CACHE = "window cache, re-rotated"
SINK_CACHE = "sink cache, re-rotated"
WINDOW_TEXT = "window cache, text positions"
SINK_TEXT = "sink cache, text positions"


class TextPositionCache:
    """The ablation's cache: the first ``n_sink`` positions and the most recent ``window``, each key left at
    the rotation of its position in the text (nothing re-rotated).

    A cache of part 9's protocol (``prepare``, ``update``, ``commit``), like the rotating sink cache, except
    that each new token is numbered by its position in the text, not by its slot.
    """

    def __init__(self, n_layers: int, n_sink: int, window: int, step: type):
        """``step``: the implementation's ``CacheStep`` (``llama.CacheStep``), the named tuple ``prepare`` returns."""
        if n_sink < 0 or window < 1:
            raise ValueError(f"n_sink must be >= 0 and window >= 1, got {n_sink} and {window}")
        self.step = step
        self.keys: list = [None] * n_layers
        self.values: list = [None] * n_layers
        self.n_sink, self.window, self.seen, self.new_pos = n_sink, window, 0, 0

    @property
    def seq_len(self) -> int:
        """Positions held (at most n_sink + window)."""
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def prepare(self, tokens, attention_mask=None):
        import torch

        new_tokens = tokens[:, self.seen :]
        self.make_room(new_tokens.shape[1])
        self.new_pos = new_tokens.shape[1]
        return self.step(new_tokens, torch.arange(self.seen, self.seen + self.new_pos, device=tokens.device)[None])

    def update(self, layer: int, k, v):
        import torch

        if self.keys[layer] is not None:
            k, v = torch.cat([self.keys[layer], k], dim=1), torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def commit(self) -> "TextPositionCache":
        self.seen += self.new_pos
        self.new_pos = 0
        return self

    def make_room(self, n_new: int) -> int:
        import torch

        evict = max(self.seq_len + n_new - (self.n_sink + self.window), 0)
        if evict:
            # The sinks and the newest keys stay, the oldest after the sinks go: the slots kept, by index.
            kept = torch.cat([torch.arange(self.n_sink), torch.arange(self.n_sink + evict, self.seq_len)])
            kept = kept.to(self.keys[0].device)
            self.keys = [k.index_select(1, kept) for k in self.keys]
            self.values = [v.index_select(1, kept) for v in self.values]
        return evict


def token_nll(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos_minus_1"]:
    """NLL of each true next token: position t's logits against token t + 1."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None])[..., 0]


def reprefill_logits(model, llama: ModuleType, tokens: Int[Tensor, "batch pos"], window: int) -> Float[Tensor, "batch pos d_vocab"]:
    """One token per step through a cache of ``window`` positions, restarted with the last ``window // 2``
    tokens (one prefill at positions 0 ..) whenever it is full."""
    import torch

    keep = window // 2
    cache, start = llama.LlamaCache(model.cfg.n_layers), 0
    steps = []
    for t in range(tokens.shape[1]):
        if cache.seq_len == window:
            cache, start = llama.LlamaCache(model.cfg.n_layers), t - keep
            model(tokens[:, start:t], cache)  # their logits were already scored
        steps.append(model(tokens[:, start : t + 1], cache)[0])  # the cache's text so far: it runs token t
    return torch.cat(steps, dim=1)


def sliding_positions(n: int, window: int, stride: int) -> Bool[Tensor, "pos_minus_1"]:
    """The positions ``t`` (last token read) of ``n`` tokens that the recomputed window scores."""
    import torch

    scored = torch.zeros(n - 1, dtype=torch.bool)
    scored[: window - 1] = True
    scored[window - 1 + stride :: stride] = True
    return scored


def sliding_nll(model, tokens: Int[Tensor, "batch pos"], window: int, stride: int) -> Float[Tensor, "batch pos_minus_1"]:
    """The recomputed window: for every ``stride``-th position past the window, a fresh pass over the
    last ``window`` tokens; the whole prefix while it fits. NaN where not scored."""
    import torch

    n = tokens.shape[1]
    nll = torch.full((tokens.shape[0], n - 1), float("nan"))
    nll[:, : window - 1] = token_nll(model(tokens[:, :window]), tokens[:, :window])
    past_window = sliding_positions(n, window, stride)
    past_window[: window - 1] = False  # scored above, in one pass over the prefix
    for t in past_window.nonzero()[:, 0].tolist():  # t: the last token read
        piece = tokens[:, t - window + 1 : t + 2]
        logp = torch.log_softmax(model(piece[:, :-1])[:, -1].float(), dim=-1)
        nll[:, t] = -logp.gather(-1, piece[:, -1:])[:, 0]
    return nll


def run_llama_experiment(model, llama: ModuleType, rope_sink: ModuleType, texts: Int[Tensor, "text pos"],
                         window: int = 256, num_sink_tokens: int = 4, stride: int = 8,
                         model_name: str = "story-llama", recompute_window: bool = True,
                         ablations: bool = False) -> LongTextResults:
    """Every method on ``texts``; ``llama`` and ``rope_sink`` are the implementation's part 9 modules.

    ``recompute_window=False`` leaves out the recomputed sliding window, the slowest method (a
    ``window``-token pass every ``stride``-th position); the table still averages over the positions
    it would have scored, so that results with and without it compare the same positions. ``ablations=True``
    adds the window and the sink cache with keys at their text positions (``TextPositionCache``)."""
    import torch

    n_ctx, n = model.cfg.n_ctx, texts.shape[1]
    if not 2 <= window <= n_ctx or not 0 <= num_sink_tokens < window or stride < 1:
        raise ValueError(f"need 2 <= window <= n_ctx ({n_ctx}), 0 <= num_sink_tokens < window and stride >= 1; got "
                         f"window={window}, num_sink_tokens={num_sink_tokens}, stride={stride}")
    cfg = model.cfg
    per_position = 2 * cfg.n_layers * cfg.n_key_value_heads * cfg.d_head * 4  # float32 keys and values
    results = LongTextResults(model_name=model_name, n_ctx=n_ctx, window=window, num_sink_tokens=num_sink_tokens,
                              stride=stride, tokens=texts)

    def timed(run):
        start = time.perf_counter()
        with torch.inference_mode():
            out = run()
        return out, time.perf_counter() - start

    logits, seconds = timed(lambda: model(texts))
    whole = token_nll(logits, texts)
    inside = whole.clone()
    inside[:, n_ctx:] = float("nan")  # t >= n_ctx: the model reads positions it never trained on
    results.methods[FULL] = MethodResult(FULL, inside, seconds * min(n_ctx, n - 1) / (n - 1),
                                         per_position * min(n_ctx, n), "one pass, t < n_ctx")
    results.methods[EXTRAPOLATED] = MethodResult(EXTRAPOLATED, whole, seconds, per_position * n,
                                                 f"one pass over all {n} positions")
    if recompute_window:
        nll, seconds = timed(lambda: sliding_nll(model, texts, window, stride))
        results.methods[SLIDING] = MethodResult(SLIDING, nll, seconds, 0, f"the last {window} tokens from scratch")
    else:
        results.scored_positions = sliding_positions(n, window, stride)
    logits, seconds = timed(lambda: reprefill_logits(model, llama, texts, window))
    results.methods[REPREFILL] = MethodResult(REPREFILL, token_nll(logits, texts), seconds, per_position * window,
                                              f"{window} positions, restarted with {window // 2}")
    caches = [(WINDOW_CACHE, 0, True), (WINDOW_TEXT, 0, False), (SINK_CACHE, num_sink_tokens, True),
              (SINK_TEXT, num_sink_tokens, False)]
    for name, sinks, rerotated in caches:
        if not rerotated and not ablations:
            continue
        if rerotated:
            cache = rope_sink.RotatingSinkCache(cfg, n_sink=sinks, window=window - sinks)
        else:
            cache = TextPositionCache(cfg.n_layers, n_sink=sinks, window=window - sinks, step=llama.CacheStep)
        logits, seconds = timed(lambda: rope_sink.stream_logits(model, texts, cache))
        how = "keys re-rotated" if rerotated else "keys at text positions"
        results.methods[name] = MethodResult(name, token_nll(logits, texts), seconds, per_position * window,
                                             f"{sinks} sinks + {window - sinks} recent, {how}")
    return results


def paired_difference(results: LongTextResults, a: str, b: str, start: int, end: int,
                      confidence: float = 0.95) -> SignFlip:
    """Method ``a``'s mean NLL minus method ``b``'s over positions ``start .. end - 1`` (the table's positions),
    with the exact sign-flip interval and p-value over the texts (``sign_flip``). The two methods read the same
    texts, so the difference is paired: each text gives its own total difference over its scored positions.
    The assumption: the texts are independent, and each text's difference is as likely to fall a given amount
    above the true one as below it."""
    import torch

    common = results.common_positions(start, end)
    per_text = []
    for name in (a, b):
        nll = results.methods[name].nll[:, start:end]
        per_text.append(torch.stack([row[keep].double().sum() for row, keep in zip(nll, common)]))
    return sign_flip(per_text[0] - per_text[1], common.sum(dim=1).double(), confidence)


def entropy_floor_of_texts(tokenizer, texts: Int[Tensor, "text pos"]) -> float:
    """The source's entropy rate, nats per token, on the complete stories of ``texts`` (the cut-off last
    story of each text left out): what a perfect model's NLL averages to on them."""
    from sampling_course.stories import parse_story

    eos = tokenizer.eos_token_id
    nats, count = 0.0, 0
    for row in texts.tolist():
        starts = [i for i, token in enumerate(row) if token == eos] + [len(row)]
        for begin, end in zip(starts[:-2], starts[1:-1]):  # each story ends where the next <|endoftext|> is
            logprob = parse_story(tokenizer.decode(row[begin + 1 : end]))
            if logprob is None:
                raise ValueError("a story in the texts does not parse under the grammar")
            nats -= logprob
            count += end - begin  # the story's tokens and the <|endoftext|> after it
    return nats / count
