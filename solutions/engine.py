"""Part 10: the serving loop: schedule, run, postprocess, with the learner's own model over the paged cache.

Every step, ``Engine.step`` does three things in order, as nano-vllm's engine loop does:

* *schedule*: the scheduler plans the step's work (``Scheduler.schedule``): which requests
  are prefilled, and by how many positions, and which are decoded by one token;
* *run*: ``run_step`` runs that work through the model, the model of parts 1 and 4, with its
  one forward pass, ``DemoTransformer.forward(tokens, kv_cache)``, and the paged cache as the
  cache (``block_pool.PagedKVCache``), then draws one token for every request whose prompt is
  done, with that request's own settings and generator;
* *postprocess*: each request's bookkeeping, in one place (``Engine.postprocess``): the
  positions it ran count as computed, it takes its token (which may finish it), and the
  requests that finished are retired, their blocks back in the pool at once.

The requests being decoded run as one batch, one request a row (its one new token, attending
to all its positions, read through its block table); the prompts being prefilled run as one
row of their own, packed one after the other, each attending only to its own positions. A
request's logits depend on its own tokens only (up to float rounding, which can vary with the
shape of the batch), not on which requests share its step.
"""

from __future__ import annotations

import weakref

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.sampling_settings import SamplerSettings

from .batched_sampling import choose_tokens
from .block_pool import BlockPool, BlockTable, PagedKVCache, Segment, blocks_needed
from .outputs import StopStringCriteria
from .padding import takes_logits_to_keep
from .penalties import process_logits
from .prefix_cache import PrefixCachingPool
from .scheduler import Request, Scheduler, Step
from .transformer import DemoTransformer


class TableSlots:
    """The slots of positions ``start .. end - 1`` of a table, as its own ``BlockTable.slots`` gives them.

    A decoding request needs one new slot per step, and its table changes only when it gains a
    block (every ``block_size`` steps) or is rebuilt after a preemption. So the slots of all the
    table's blocks are asked for once and kept, as one tensor, until the table's block list changes;
    each step takes a view of it. (A ``slots`` call per step and request costs about 40 us on a CPU,
    and turning a decode step's few thousand slots into a tensor again from Python ints about 0.2 ms;
    a view costs about 1 us.) Tables are held weakly: a retired request's entry goes with its table.
    """

    def __init__(self):
        self.known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, table: BlockTable, start: int, end: int) -> Int[Tensor, "n"]:
        blocks = tuple(table.blocks)
        known = self.known.get(table)
        if known is None or known[0] != blocks:
            slots = torch.as_tensor(table.slots(0, len(blocks) * table.block_size), dtype=torch.long)
            known = self.known[table] = (blocks, slots)
        if end > len(known[1]):
            raise ValueError(f"positions [{start}, {end}) are outside the table's {len(blocks)} blocks")
        return known[1][start:end]


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
        self.keeps_logits = takes_logits_to_keep(model)  # the course's models do; a stand-in may not
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

    @torch.inference_mode()
    def forward(self, requests: list[Request], n_new: list[int], packed: bool) -> Float[Tensor, "n_requests d_vocab"]:
        """The logits after the last position each request runs this step: request ``i`` runs its next ``n_new[i]``
        positions, through the model and the paged cache, one request a row or (``packed``) all in one row."""
        segments = []
        for request, n in zip(requests, n_new):
            start = request.n_computed
            end = start + n
            # Where its positions live, as its table says (BlockTable.slots): the new ones are written there.
            segments.append(Segment(request.tokens[start:end], start, self.slot_reader(request.table, 0, end)))
        step = self.cache.plan([segments] if packed else [[segment] for segment in segments])
        if step.tokens.shape[0] == 1 and step.tokens.shape[1] > 1 and self.keeps_logits:
            # Only a segment's last position draws a token: the unembedding (a d_model x d_vocab matmul per position)
            # runs on those alone (logits_to_keep as a tensor of positions, Hugging Face's form for this case).
            logits, _ = self.model(step.tokens, self.cache, logits_to_keep=step.last)
            return logits[0]
        logits, _ = self.model(step.tokens, self.cache)
        return logits.flatten(0, 1)[step.last]

    def run_step(self, work: Step) -> list[int | None]:
        """Run the step's work: one token for each request whose prompt is done, None for a chunk of a prompt that is
        not its last (those logits are not its next token's). Changes no request: the postprocess does.

        Requests decoded by one token run in one pass, a row each; prompts (and chunks of them) in another, packed
        in one row, so that a long prompt does not pad every decoding request's row to its length."""
        n_new = [work.n_new(request) for request in work.requests]
        self.n_prefill_tokens += sum(n_new[: len(work.prefill)])
        logits: list[Tensor | None] = [None] * len(work.requests)
        best: list[int] = [0] * len(work.requests)  # each row's argmax, all of a pass's rows in one call
        for packed in (False, True):
            picked = [i for i, n in enumerate(n_new) if (n > 1) == packed]
            if picked:
                rows = self.forward([work.requests[i] for i in picked], [n_new[i] for i in picked], packed)
                for i, row, top in zip(picked, rows, rows.argmax(-1).tolist()):
                    logits[i], best[i] = row, top
        tokens: list[int | None] = []
        for request, n, row, top in zip(work.requests, n_new, logits, best):
            if request.n_computed + n < request.n_tokens:
                tokens.append(None)  # a chunk of its prompt, not the last
            elif plain_greedy(request):
                tokens.append(top)
            else:
                tokens.append(self.next_token(request, row))
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
        ### BEGIN SOLUTION
        # Hint: run the work (if there is any), count the step, then hand the work and its tokens to postprocess.
        tokens = self.run_step(work) if work.requests else []
        self.n_steps += 1
        return self.postprocess(work, tokens)
        ### END SOLUTION

    def postprocess(self, work: Step, tokens: list[int | None]) -> list[Request]:
        """After the step's forward pass, each request's bookkeeping in one place; the requests that finished.

        ``tokens[i]`` is the token drawn for ``work.requests[i]``, None for a chunk of a prompt that is not its
        last. Each request counts the positions it ran as computed and takes its token (which may finish it);
        then the finished ones are retired, their blocks freed (``Scheduler.retire``).
        """
        if len(tokens) != len(work.requests):
            raise ValueError(f"postprocess takes one token (or None) per request of the step: {len(work.requests)} "
                             f"requests, {len(tokens)} tokens")
        ### BEGIN SOLUTION
        # Hint: n_computed grows by the positions the request ran (work.n_new), before anything else reads it.
        for request, token in zip(work.requests, tokens):
            request.n_computed += work.n_new(request)
            if token is not None:
                request.append(token)
        return self.scheduler.retire()
        ### END SOLUTION

    def run(self) -> list[Request]:
        """Step until every request is done; the requests in the order they finished."""
        finished = []
        while not self.scheduler.done:
            finished += self.step()
        return finished
