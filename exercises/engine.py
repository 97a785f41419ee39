# GENERATED from solutions/engine.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: ddb59bbb74b61f4c070e4f68a3b81d1a8d5674f50707a4d863a1aff235354fce
"""Part 10: the serving loop: the scheduler's step run through the model over the paged cache.

Every step, ``Engine.step`` does three things in order, as nano-vllm's engine loop does:
*schedule* (the scheduler plans the step's work), *run* (``run_step``: one forward pass,
``paged_forward``, and one token per request drawn with that request's own settings and
generator) and *postprocess* (``Scheduler.postprocess``: each request's bookkeeping in one place,
its positions computed, its token appended, and the finished ones retired with their blocks
freed). The forward pass packs the new tokens of
every request into one row, the way vLLM does: a prompt being prefilled and a request being
decoded by one token sit side by side. Everything but attention works token by token, so it
runs on the packed row at once. Attention reads each request's own keys and values from the
paged cache through its block table; the requests decoded by one token run as padded, masked
batches of requests of similar lengths (``split_by_width``: one batch unless padding the short
ones to the longest would cost more than another attention call), and the prompts being
prefilled as another. The mask lets a query read only its own request's positions, so a
request's logits depend on its own tokens only (up to float rounding, which can vary with the
shape of the batch), not on which requests share its step.

On a CPU the step's fixed costs weigh as much as its arithmetic on a small model, so the loop
keeps them down: every layer's fused QKV weights are built once per engine, LayerNorm is
PyTorch's one fused call and the MLP two plain matrix multiplies (on the model's own weights),
attention takes PyTorch's fused kernel (it needs a 4-d mask), and blocks are read into a
buffer the cache reuses. The tokens still go through the model's own embedding, once per step:
every position a step runs passes there, which is where a check of a step's size can count them.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.sampling_settings import SamplerSettings

from .batched_sampling import choose_tokens
from .block_pool import BlockPool, BlockTable, PagedKVCache, blocks_needed
from .outputs import StopStringCriteria
from .penalties import process_logits
from .prefix_cache import PrefixCachingPool
from .scheduler import Request, Scheduler, Step
from .transformer import DemoTransformer


@dataclass
class AttentionGroup:
    """Requests whose attention runs as one padded batch, and where their queries and keys are.

    Row ``r`` is one request: ``rows[r]`` lists its queries' rows in the step's packed tokens,
    ``blocks[r]`` the blocks of its table in order, both padded to the longest request of the
    group; ``valid`` marks the real queries and ``mask`` the keys each may read. ``picked`` lists the
    real queries among the group's ``n_requests * max_new`` (row-major), ``targets`` their packed rows:
    computed once a step, so that each layer copies its outputs back with one indexed copy.
    """

    rows: Int[Tensor, "n_requests max_new"]
    valid: Bool[Tensor, "n_requests max_new"]
    blocks: Int[Tensor, "n_requests max_blocks"]
    mask: Bool[Tensor, "1 n_requests max_new max_keys"]
    picked: Int[Tensor, "n_valid"]
    targets: Int[Tensor, "n_valid"]


def attention_group(n_new: list[int], n_computed: list[int], starts: list[int], blocks: list[list[int]],
                    block_size: int, device: torch.device) -> AttentionGroup:
    """The padded layout of a group's attention: request ``i`` runs ``n_new[i]`` queries after its
    ``n_computed[i]`` cached positions, from row ``starts[i]`` of the packed tokens, over ``blocks[i]``."""
    new, computed = torch.tensor(n_new), torch.tensor(n_computed)
    step = torch.arange(max(n_new))
    valid = step[None] < new[:, None]
    rows = torch.tensor(starts)[:, None] + step[None]
    # A query's position is n_computed + its index; a padding query copies the request's last one,
    # so that every row of the mask reads at least one key (an empty row would give NaN).
    positions = computed[:, None] + torch.minimum(step[None], new[:, None] - 1)
    widest = max(len(b) for b in blocks)
    keys = torch.arange(widest * block_size)
    # Causal: a query reads the positions up to its own. Those are all real, so the unfilled end of a last
    # block and the padding blocks are never read.
    mask = keys[None, None, :] <= positions[:, :, None]
    # Padding blocks are block 0: any block would do, the mask hides them.
    padded = torch.tensor([block for b in blocks for block in b + [0] * (widest - len(b))]).view(len(blocks), widest)
    # The mask gets a leading dimension of 1 for the heads: with a 4-d mask PyTorch's CPU attention takes its
    # fused kernel rather than the plain "math" one (about 3x faster here).
    picked = valid.flatten().nonzero()[:, 0]
    return AttentionGroup(torch.where(valid, rows, 0).to(device), valid.to(device), padded.to(device),
                          mask[None].to(device), picked.to(device), rows.flatten()[picked].to(device))


# What one more attention group costs (building its mask, one more attention call per layer), in padded blocks
# read: about the time of copying and attending over 16 blocks of the story model on a CPU.
GROUP_OVERHEAD_BLOCKS = 16


def split_by_width(widths: list[int], overhead: int) -> list[list[int]]:
    """Indices of ``widths`` in groups, each read as one padded batch: the partition with the least padded
    area (each group's size times its widest) plus ``overhead`` per group.

    In order of width, the best groups are runs of neighbours (moving a request to the group of
    narrower ones never widens that group's padding), so the search is over where to cut the sorted
    list: ``best[j]`` is the cost of its first ``j``, found from every last cut ``i < j``.
    """
    order = sorted(range(len(widths)), key=widths.__getitem__)
    best, cut = [0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + (j - i) * widths[order[j - 1]] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j > 0:
        groups.append(order[cut[j]: j])
        j = cut[j]
    return groups[::-1]


def fused_qkv(attn) -> tuple[Float[Tensor, "d_model three_heads_d_head"], Float[Tensor, "three_heads_d_head"]]:
    """The three (n_heads, d_model, d_head) weights side by side as one (d_model, 3 * n_heads * d_head) matrix,
    and their biases, so that queries, keys and values are one matmul."""
    weight = torch.stack([attn.W_Q, attn.W_K, attn.W_V]).permute(2, 0, 1, 3).flatten(1)
    return weight, torch.stack([attn.b_Q, attn.b_K, attn.b_V]).flatten()


def paged_attention(attn, x: Float[Tensor, "n_new d_model"], cache: PagedKVCache, layer: int,
                    new_slots: Int[Tensor, "n_new"], groups: list[AttentionGroup],
                    fused: tuple[Tensor, Tensor] | None = None) -> Float[Tensor, "n_new d_model"]:
    """One layer's attention for the packed new tokens of a step's requests.

    The new keys and values are written into the cache at their slots first; then each group
    reads its requests' blocks back whole, padded, and runs one masked attention call for all
    of them. ``fused`` is ``fused_qkv(attn)`` computed beforehand (None: computed here).
    """
    weight, bias = fused or fused_qkv(attn)
    q, k, v = torch.addmm(bias, x, weight).view(len(x), 3, *attn.b_Q.shape).unbind(1)
    cache.write(layer, new_slots, k, v)
    z = torch.empty_like(q)
    for group in groups:
        # Whole blocks, already (n_heads, n_requests, keys, d_head): heads lead, requests are a second batch dimension.
        keys, values = cache.read_blocks(layer, group.blocks, reuse=True)  # read before the next group's copy
        queries = q[group.rows].permute(2, 0, 1, 3).contiguous()  # (n_heads, n_requests, max_new, d_head)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group.mask)
        z.index_copy_(0, group.targets, out.permute(1, 2, 0, 3).flatten(0, 1).index_select(0, group.picked))
    return torch.addmm(attn.b_O, z.flatten(1), attn.W_O.flatten(0, 1))


def mlp(block_mlp, x: Float[Tensor, "n_new d_model"]) -> Float[Tensor, "n_new d_model"]:
    """The block's MLP on the packed row from its weights: what ``MLP.forward`` computes, as two plain matrix
    products (one matrix multiply each, not an einsum over a batch of one) around GPT-2's tanh GELU, which is
    PyTorch's ``gelu(approximate="tanh")`` (one call instead of the formula's six)."""
    hidden = F.gelu(torch.addmm(block_mlp.b_in, x, block_mlp.W_in), approximate="tanh")
    return torch.addmm(block_mlp.b_out, hidden, block_mlp.W_out)


def layer_norm(ln, x: Float[Tensor, "n_new d_model"]) -> Float[Tensor, "n_new d_model"]:
    """What ``LayerNorm.forward`` computes (centre, divide by the root of the biased variance plus eps, then
    scale by ``w`` and shift by ``b``), as PyTorch's one fused call with the module's weights and eps: the
    module's own forward is five tensor operations, about a tenth of a step's time on the story model on a CPU."""
    return F.layer_norm(x, x.shape[-1:], ln.w, ln.b, ln.cfg.layer_norm_eps)


class TableSlots:
    """The slots of positions ``start .. end - 1`` of a table, as its own ``BlockTable.slots`` gives them.

    A decoding request needs one new slot per step, and its table changes only when it gains a
    block (every ``block_size`` steps) or is rebuilt after a preemption. So the slots of all the
    table's blocks are asked for once and kept, as plain integers, until the table's block list
    changes. (A ``slots`` call per step and request costs about 40 us on a CPU: 3% of the engine's
    time on 32 story-model requests, against under 1% this way.) Tables are held weakly: a
    retired request's entry goes with its table.
    """

    def __init__(self):
        self.known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, table: BlockTable, start: int, end: int) -> list[int]:
        blocks = tuple(table.blocks)
        known = self.known.get(table)
        if known is None or known[0] != blocks:
            known = self.known[table] = (blocks, table.slots(0, len(blocks) * table.block_size).tolist())
        if end > len(known[1]):
            raise ValueError(f"positions [{start}, {end}) are outside the table's {len(blocks)} blocks")
        return known[1][start:end]


@torch.inference_mode()
def paged_forward(model: DemoTransformer, cache: PagedKVCache, requests: list[Request],
                  slot_reader: TableSlots | None = None, n_new: list[int] | None = None,
                  fused: list[tuple[Tensor, Tensor]] | None = None) -> Float[Tensor, "n_requests d_vocab"]:
    """The logits after the last position each request runs, running only positions not yet in the cache.

    Request ``i`` runs its next ``n_new[i]`` positions (None: all it has not computed, so the logits
    are its next token's; fewer is a chunk of its prompt). Each request's table must already hold
    room for all its tokens (the scheduler grows it). The requests are read, never changed: counting
    the positions as computed is the postprocess's (``Scheduler.postprocess``). ``slot_reader`` keeps tables' slots between
    steps (the engine keeps one); None asks each table afresh. ``fused`` is every layer's
    ``fused_qkv``, computed once (the engine keeps them); None computes them at each call.
    """
    if not requests:
        raise ValueError("paged_forward needs at least one request")
    device = model.embed.W_E.device
    size = cache.block_size
    all_tokens = [r.tokens for r in requests]  # built once: Request.tokens joins two lists at each call
    computed = [r.n_computed for r in requests]
    lengths = [len(t) - c for t, c in zip(all_tokens, computed)]
    if n_new is not None:
        if len(n_new) != len(requests) or not all(1 <= n <= most for n, most in zip(n_new, lengths)):
            raise ValueError(f"n_new gives each request 1 to its {lengths} positions not yet computed, got {n_new}")
        lengths = list(n_new)
    if max(len(t) for t in all_tokens) > model.cfg.n_ctx:
        raise ValueError(f"a request reaches position {max(len(t) for t in all_tokens) - 1}, past the model's "
                         f"n_ctx={model.cfg.n_ctx}")
    spans = [range(c, c + n) for c, n in zip(computed, lengths)]
    tokens = torch.tensor([t for ts, span in zip(all_tokens, spans) for t in ts[span.start : span.stop]], device=device)
    positions = torch.tensor([p for span in spans for p in span], device=device)
    # Where each new position's keys and values go, as each request's table says (BlockTable.slots).
    read = slot_reader or TableSlots()
    new_slots = torch.tensor([s for r, span in zip(requests, spans) for s in read(r.table, span.start, span.stop)],
                             dtype=torch.long, device=device)
    starts = [0] * len(requests)
    for i in range(1, len(requests)):
        starts[i] = starts[i - 1] + lengths[i - 1]
    # Decodes (one query each) and prefills in separate groups, so that one long prompt does not
    # pad every decoding request's single query to its length; decodes of very different lengths in
    # groups of their own too (split_by_width), so that short requests are not padded to the longest.
    decodes = [i for i, n in enumerate(lengths) if n == 1]
    prefills = [i for i, n in enumerate(lengths) if n > 1]
    picks = [[decodes[j] for j in group]
             for group in split_by_width([len(requests[i].table.blocks) for i in decodes], GROUP_OVERHEAD_BLOCKS)]
    groups = [attention_group([lengths[i] for i in picked], [computed[i] for i in picked], [starts[i] for i in picked],
                              [requests[i].table.blocks for i in picked], size, device)
              for picked in picks + ([prefills] if prefills else [])]
    # The packed row is one sequence of n_new tokens to the embedding: every position of the step goes through it
    # once (a check that counts a step's positions watches it). The positions are each request's own.
    residual = model.embed(tokens[None])[0] + model.pos_embed.W_pos[positions]
    for layer, block in enumerate(model.blocks):
        # LayerNorm and the MLP act on each position alone, so they run on the packed row as it is. The residual
        # stream is this function's own tensor: adding in place saves a new one per sublayer.
        residual += paged_attention(block.attn, layer_norm(block.ln1, residual), cache, layer, new_slots, groups,
                                    fused[layer] if fused else None)
        residual += mlp(block.mlp, layer_norm(block.ln2, residual))
    last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths)], device=device)
    unembed = model.unembed
    return torch.addmm(unembed.b_U, layer_norm(model.ln_final, residual[last]), unembed.W_U)


def plain_greedy(request: Request) -> bool:
    """Whether the request's next token is the argmax of its raw logits: greedy, with nothing that changes them
    (the processors ``add_request`` accepts; it refuses DRY, banned sequences, mirostat and XTC)."""
    s = request.settings
    return (s.temperature == 0 and not s.logit_bias and s.repetition_penalty == 1.0 and s.presence_penalty == 0.0
            and s.frequency_penalty == 0.0
            and (request.eos_token_id is None or len(request.output) >= s.min_new_tokens))


class EngineStalled(RuntimeError):
    """A step ran no request and preempted none while requests were still waiting or running: nothing in the
    engine changed, so every later step would do the same, for ever."""


def stall_report(scheduler: Scheduler) -> str:
    """Why a step of ``scheduler`` ran nothing and preempted nothing, in short lines, each a whole sentence (a check's
    panel shows a failure's first lines, each cut to a width): what happened, then which request, then what to check."""
    pool, waiting, running = scheduler.pool, scheduler.waiting, scheduler.running
    lines = [f"A step ran no request and preempted none ({len(waiting)} waiting, {len(running)} running).",
             "Nothing changed, so every later step would do the same."]
    if running:
        # Every running request should run at least one position: the step gave this one nothing.
        first = running[0]
        return "\n".join(lines + [
            f"Request {first.request_id} is running (it was admitted and holds {len(first.table.blocks)} blocks), "
            "but the step gave it no work.",
            "An admitted request goes into the step's prefill list, a running one into its decode list "
            "(Scheduler.schedule)."])
    first = waiting[0]
    need = blocks_needed(len(first.tokens), pool.block_size)
    lines.append(f"Request {first.request_id}, first in the queue, has {len(first.tokens)} positions, which need "
                 f"{need} blocks of {pool.block_size}.")
    lines.append(f"The pool has {pool.n_free} of its {pool.n_blocks} blocks free.")
    if need <= pool.n_free:
        lines += ["Its blocks are free, yet the scheduler did not admit it.",
                  "Check the admit test of Scheduler.schedule: table.blocks_to_grow(len(request.tokens)) against "
                  "pool.n_free."]
    else:
        lines += ["No running request will give blocks back.",
                  f"{pool.n_blocks - pool.n_free} blocks are held outside the running requests, or the pool is too "
                  "small for this request."]
    return "\n".join(lines)


class Engine:
    """A model, a paged cache and a scheduler: add requests, then ``step`` (or ``run``) until all are done.

    ``tokenizer`` is needed only for requests with stop strings. ``prefix_caching=True`` keeps
    full blocks findable by their contents (``prefix_cache``): a request whose prompt starts
    with blocks another request computed reads those blocks and prefills only the rest.
    ``n_prefill_tokens`` counts the positions the engine's prefills ran. ``max_step_tokens`` caps
    the positions one step runs (None: no cap), splitting long prompts into chunks over several
    steps (chunked prefill, see ``scheduler``); a request's tokens are the same either way. A step
    that can do nothing while requests wait raises ``EngineStalled`` rather than loop for ever.
    """

    def __init__(self, model: DemoTransformer, n_blocks: int, block_size: int = 16, max_running: int = 16,
                 tokenizer=None, prefix_caching: bool = False, max_step_tokens: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        weight = model.embed.W_E
        self.pool = PrefixCachingPool(n_blocks, block_size) if prefix_caching else BlockPool(n_blocks, block_size)
        self.cache = PagedKVCache(model.cfg, n_blocks, block_size, device=weight.device, dtype=weight.dtype)
        self.scheduler = Scheduler(self.pool, max_running, weight.device, max_step_tokens)
        self.slot_reader = TableSlots()
        # The attention weights are read once, here: an engine serves the weights its model had when it was built.
        with torch.no_grad():
            self.fused = [fused_qkv(block.attn) for block in model.blocks]
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

    def run_step(self, work: Step) -> list[int | None]:
        """Run the step's work: one forward pass over every request's new positions, then one token for each
        request whose prompt is done (None for a chunk of a prompt that is not its last: those logits are not
        its next token's). Changes no request: their bookkeeping is ``Scheduler.postprocess``'s."""
        n_new = [work.n_new(request) for request in work.requests]
        self.n_prefill_tokens += sum(n_new[: len(work.prefill)])
        logits = paged_forward(self.model, self.cache, work.requests, self.slot_reader, n_new, self.fused)
        # Requests whose token is the argmax of their raw logits share one argmax over their rows; the others
        # draw one at a time, each from its own settings and generator.
        greedy = [plain_greedy(request) for request in work.requests]
        argmax = logits.argmax(dim=-1).tolist() if any(greedy) else None
        tokens: list[int | None] = []
        for i, (request, n) in enumerate(zip(work.requests, n_new)):
            if request.n_computed + n < len(request.tokens):
                tokens.append(None)  # a chunk of its prompt, not the last
            else:
                tokens.append(argmax[i] if greedy[i] else self.next_token(request, logits[i]))
        return tokens

    def step(self) -> list[Request]:
        """One step: schedule, run, postprocess. Returns the requests that finished in it (their blocks already
        freed).

        Raises ``EngineStalled`` when the step runs nothing and preempts nothing while requests wait or run:
        then nothing changed and no later step could do anything else.
        """
        work = self.scheduler.schedule()
        if not work.requests and not work.preempted and not self.scheduler.done:
            raise EngineStalled(stall_report(self.scheduler))
        tokens = self.run_step(work) if work.requests else []
        self.n_steps += 1
        return self.scheduler.postprocess(work, tokens)

    def run(self) -> list[Request]:
        """Step until every request is done; the requests in the order they finished."""
        finished = []
        while not self.scheduler.done:
            finished += self.step()
        return finished
