# GENERATED from solutions/engine.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 5af0b06e38b7c77515f8116b436243cd427409c79e800f6d7d9860f9618a052b
"""Part 10: the serving loop: the scheduler's step run through the model over the paged cache.

Every step, ``Engine.step`` asks the scheduler for its work, runs it in one forward pass
(``paged_forward``), draws one token per request with that request's own settings and
generator, and retires the requests that finished. The forward pass packs the new tokens of
every request into one row, the way vLLM does: a prompt being prefilled and a request being
decoded by one token sit side by side. Everything but attention works token by token, so it
runs on the packed row at once; attention runs per request, each reading its own keys and
values from the paged cache through its block table. A request's logits therefore depend on
its own tokens only, not on which requests share its step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.sampling_settings import SamplerSettings

from .batched_sampling import choose_tokens
from .block_pool import BlockPool, PagedKVCache
from .outputs import StopStringCriteria
from .penalties import process_logits
from .prefix_cache import PrefixCachingPool
from .scheduler import Request, Scheduler
from .transformer import DemoTransformer


def paged_attention(attn, x: Float[Tensor, "n_new d_model"], cache: PagedKVCache, layer: int,
                    requests: list[Request], starts: list[int]) -> Float[Tensor, "n_new d_model"]:
    """One layer's attention for the packed new tokens of ``requests``.

    The new keys and values are written into the cache through each request's table first,
    then each request's queries attend to all of its positions so far, read back in order.
    """
    q = torch.einsum("td,ndh->tnh", x, attn.W_Q) + attn.b_Q
    k = torch.einsum("td,ndh->tnh", x, attn.W_K) + attn.b_K
    v = torch.einsum("td,ndh->tnh", x, attn.W_V) + attn.b_V
    outputs = []
    for request, start in zip(requests, starts):
        n_new, end = len(request.tokens) - request.n_computed, len(request.tokens)
        rows = slice(start, start + n_new)
        cache.write(layer, request.table.slots(request.n_computed, end), k[rows], v[rows])
        keys, values = cache.gather(layer, request.table, end)
        # The new queries are the last n_new positions: the causal mask's diagonal shifts by the cached ones.
        future = torch.ones(n_new, end, dtype=torch.bool, device=x.device).triu(end - n_new + 1)
        scores = torch.einsum("qnh,knh->nqk", q[rows], keys) / math.sqrt(attn.cfg.d_head)
        pattern = scores.masked_fill(future, attn.IGNORE).softmax(dim=-1)
        outputs.append(torch.einsum("nqk,knh->qnh", pattern, values))
    z = torch.cat(outputs)
    return torch.einsum("tnh,nhd->td", z, attn.W_O) + attn.b_O


@torch.inference_mode()
def paged_forward(model: DemoTransformer, cache: PagedKVCache, requests: list[Request]) -> Float[Tensor, "n_requests d_vocab"]:
    """The next-token logits of every request, running only its positions not yet in the cache.

    Each request's table must already hold room for all its tokens (the scheduler grows it).
    """
    if not requests:
        raise ValueError("paged_forward needs at least one request")
    device = model.embed.W_E.device
    tokens = torch.tensor([t for r in requests for t in r.tokens[r.n_computed:]], device=device)
    positions = torch.cat([torch.arange(r.n_computed, len(r.tokens)) for r in requests]).to(device)
    if int(positions.max()) >= model.cfg.n_ctx:
        raise ValueError(f"a request reaches position {int(positions.max())}, past the model's n_ctx={model.cfg.n_ctx}")
    lengths = [len(r.tokens) - r.n_computed for r in requests]
    starts = [sum(lengths[:i]) for i in range(len(requests))]
    residual = model.embed.W_E[tokens] + model.pos_embed.W_pos[positions]
    for layer, block in enumerate(model.blocks):
        # LayerNorm and the MLP act on each position alone, so the packed row is (1, n_new, d_model) to them.
        normed = block.ln1(residual[None])[0]
        residual = residual + paged_attention(block.attn, normed, cache, layer, requests, starts)
        residual = residual + block.mlp(block.ln2(residual[None]))[0]
    last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths)], device=device)
    for request in requests:
        request.n_computed = len(request.tokens)
    return model.unembed(model.ln_final(residual[last][None]))[0]


class Engine:
    """A model, a paged cache and a scheduler: add requests, then ``step`` (or ``run``) until all are done.

    ``tokenizer`` is needed only for requests with stop strings. ``prefix_caching=True`` keeps
    full blocks findable by their contents (``prefix_cache``): a request whose prompt starts
    with blocks another request computed reads those blocks and prefills only the rest.
    ``n_prefill_tokens`` counts the positions the engine's prefills ran.
    """

    def __init__(self, model: DemoTransformer, n_blocks: int, block_size: int = 16, max_running: int = 16,
                 tokenizer=None, prefix_caching: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        weight = model.embed.W_E
        self.pool = PrefixCachingPool(n_blocks, block_size) if prefix_caching else BlockPool(n_blocks, block_size)
        self.cache = PagedKVCache(model.cfg, n_blocks, block_size, device=weight.device, dtype=weight.dtype)
        self.scheduler = Scheduler(self.pool, max_running, weight.device)
        self.n_steps = 0
        self.n_prefill_tokens = 0

    def add_request(self, prompt: list[int], max_new_tokens: int, settings: SamplerSettings | None = None,
                    seed: int | None = None, eos_token_id: int | None = None,
                    stop_strings: str | list[str] | None = None) -> Request:
        """Queue a request with its own settings, seed (None: greedy, or torch's global generator),
        end-of-text token and stop strings; it ends at whichever comes first, or at ``max_new_tokens``."""
        settings = SamplerSettings.of(settings)
        if settings.mirostat or settings.dry_multiplier > 0 or settings.bad_words_ids or settings.xtc_probability > 0:
            raise ValueError("this engine applies the chain, logit_bias and the repetition, presence and frequency "
                             "penalties per request; mirostat, DRY, bad_words_ids and XTC are not supported here")
        if any(t >= self.model.cfg.d_vocab for t in prompt):
            raise ValueError(f"the prompt holds a token id outside the vocabulary [0, {self.model.cfg.d_vocab})")
        request = Request(list(prompt), max_new_tokens, settings, seed, eos_token_id)
        if stop_strings:
            if self.tokenizer is None:
                raise ValueError("stop_strings need the text of the tokens: give the Engine a tokenizer")
            request.stop = StopStringCriteria(self.tokenizer, stop_strings)
        if len(request.prompt) + max_new_tokens > self.model.cfg.n_ctx:
            raise ValueError(f"the prompt plus max_new_tokens is more than the model's n_ctx={self.model.cfg.n_ctx}")
        self.scheduler.add(request)
        return request

    def next_token(self, request: Request, logits: Float[Tensor, "d_vocab"]) -> int:
        """One token for ``request``, from its own settings and generator (its row alone, as part 5 draws it)."""
        settings = request.settings
        input_ids: Int[Tensor, "1 seq"] = torch.tensor([request.tokens], device=logits.device)
        processed = process_logits(logits[None], input_ids, torch.ones_like(input_ids), len(request.output),
                                   settings, request.eos_token_id)
        token, _, _ = choose_tokens(processed, settings, request.generator)
        return int(token[0])

    def step(self) -> list[Request]:
        """One scheduling step; returns the requests that finished in it (their blocks already freed)."""
        work = self.scheduler.schedule()
        if work.requests:
            self.n_prefill_tokens += sum(len(r.tokens) - r.n_computed for r in work.prefill)
            logits = paged_forward(self.model, self.cache, work.requests)
            for request, row in zip(work.requests, logits):
                self.scheduler.register_full_blocks(request)  # before append: its new token is not in the cache yet
                request.append(self.next_token(request, row))
        self.n_steps += 1
        return self.scheduler.retire()

    def run(self) -> list[Request]:
        """Step until every request is done; the requests in the order they finished."""
        finished = []
        while not self.scheduler.done:
            finished += self.step()
        return finished
