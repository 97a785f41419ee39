# GENERATED from solutions/scheduler.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 2a4046ab33ff79e30cd15aeb3f9f6d08d86c53fafd660538e87b4dbc1491a2cb
"""Part 10: requests and the scheduler that decides, at every step, which of them run.

Part 5's engine is static batching: a batch starts together and every row keeps its place
until the last one ends. A server schedules at every step instead (continuous batching, Yu et
al., Orca, 2022), the shape vLLM and its small from-scratch descendants share:

* a ``Request`` carries its own tokens, its own sampler settings and its own seeded
  generator, and a block table of the paged cache (``block_pool``);
* the ``Scheduler`` keeps a waiting queue and a running queue. Each step it first makes room
  for one more position of every running request, preempting the most recently admitted
  ones when the pool runs out; then, if nothing was preempted, it admits waiting requests
  while their prompts fit in the free blocks. What it returns is the step's work: the
  prompts to prefill and the requests to decode by one token;
* after the step's forward pass, the engine's postprocess does each request's bookkeeping in one
  place (nano-vllm's shape: schedule, run, postprocess): the positions it computed, the token it
  drew, and, when it finished, its retirement (``retire``), its blocks going back to the pool at
  once, so a waiting request can take them at the next step.

A server also bounds the work of one step. With ``max_step_tokens`` the scheduler gives each
step at most that many positions (vLLM's ``max_num_batched_tokens``): the running requests'
one-token decodes first, then the prompts being prefilled, which take what is left. A prompt
longer than what is left is prefilled a chunk at a time over several steps (chunked prefill,
Agrawal et al., *SARATHI*, 2023), so a long prompt that arrives cannot make every running
request wait a whole long step for its next token. Its blocks are all taken when it is
admitted, as without a budget; it draws its first token after its last chunk.

Preemption here is by recomputation: a preempted request gives back all its blocks and goes
to the front of the waiting queue with the tokens it has; when it is admitted again its
prompt and the tokens it already generated are prefilled together. Its generator is not
reset, so it goes on drawing where it stopped and its output is the same as if it had never
been preempted.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import torch

from sampling_course.sampling_settings import SamplerSettings

from .block_pool import BlockPool, BlockTable, blocks_needed
from .prefix_cache import PrefixCachingPool, block_hashes

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"

request_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """One request: its prompt and generated tokens, settings, generator, block table and state.

    ``n_computed`` counts the positions whose keys and values are in the paged cache: the
    next forward pass runs ``tokens[n_computed:]``. ``seed`` seeds the request's own
    ``torch.Generator``, so its draws depend on nothing another request does.
    """

    prompt: list[int]
    max_new_tokens: int
    settings: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int | None = None
    eos_token_id: int | None = None
    output: list[int] = field(default_factory=list)
    state: str = WAITING
    n_computed: int = 0
    n_preemptions: int = 0
    request_id: int = field(default_factory=lambda: next(request_ids))
    table: BlockTable | None = None
    generator: torch.Generator | None = None
    # Stops the request when its text reaches a stop string (part 5's StopStringCriteria); None: no stop strings.
    stop: object | None = None
    # The hashes of its computed full blocks, in order (prefix caching registers each block once), and how many of
    # its table's blocks have been registered since the table was last emptied.
    block_hashes: list = field(default_factory=list)
    n_registered: int = 0

    def __post_init__(self):
        if not isinstance(self.prompt, (list, tuple)) or not self.prompt or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.prompt
        ):
            raise ValueError(f"a request's prompt is a non-empty list of token ids, got {self.prompt!r:.80}")
        self.prompt = list(self.prompt)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.settings, SamplerSettings):
            raise TypeError(f"settings must be a SamplerSettings, got {type(self.settings).__name__}")

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def n_tokens(self) -> int:
        """``len(self.tokens)`` without building the list (the scheduler asks several times a step per request)."""
        return len(self.prompt) + len(self.output)

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    def append(self, token: int) -> None:
        """Add a generated token; the request is finished at its end-of-text token or its last new token."""
        self.output.append(token)
        if token == self.eos_token_id or len(self.output) >= self.max_new_tokens:
            self.state = FINISHED
        elif self.stop is not None and self.stop.row_stops(self.tokens):
            self.state = FINISHED


@dataclass
class Step:
    """One step's work: requests whose tokens are prefilled, and requests decoded by one token.

    ``chunks`` gives the positions a prefill runs this step when a token budget cut its prompt
    into chunks; a request not in it runs every position it has not computed (``n_new``).
    ``n_new`` is read before the engine's postprocess counts the step's positions as computed.
    """

    prefill: list[Request]
    decode: list[Request]
    preempted: list[Request]
    chunks: dict = field(default_factory=dict)

    def n_new(self, request: Request) -> int:
        """The positions ``request`` runs this step."""
        return self.chunks.get(request, request.n_tokens - request.n_computed)

    @property
    def requests(self) -> list[Request]:
        return self.prefill + self.decode


class Scheduler:
    """Waiting and running queues over one ``BlockPool``; ``schedule`` plans a step, ``retire`` ends requests.

    ``max_step_tokens`` (None: no limit) caps the positions one step runs, prefills chunked to fit.
    It must be at least ``max_running``, so that every running request can run one position each
    step (vLLM asks the same of its ``max_num_batched_tokens``).
    """

    def __init__(self, pool: BlockPool, max_running: int = 16, device: torch.device | str = "cpu",
                 max_step_tokens: int | None = None):
        if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
            raise ValueError(f"max_running must be an integer >= 1, got {max_running!r}")
        if max_step_tokens is not None and (isinstance(max_step_tokens, bool) or not isinstance(max_step_tokens, int)
                                            or max_step_tokens < max_running):
            raise ValueError(f"max_step_tokens must be None (no limit) or an integer >= max_running ({max_running}), "
                             f"so that every running request runs at least one position a step; got {max_step_tokens!r}")
        self.pool = pool
        self.max_running = max_running
        self.max_step_tokens = max_step_tokens
        self.partial: set[Request] = set()  # running requests whose last chunk left part of their prompt to run
        self.device = torch.device(device)  # where requests' generators draw: the model's device
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        """Queue a request; refuse one that could never fit, even alone in the empty pool."""
        if request.state != WAITING or request.table is not None:
            raise ValueError("only a new request (waiting, no block table yet) can be added")
        most = len(request.prompt) + request.max_new_tokens
        if blocks_needed(most, self.pool.block_size) > self.pool.n_blocks:
            raise ValueError(
                f"the request may reach {most} positions, {blocks_needed(most, self.pool.block_size)} blocks of "
                f"{self.pool.block_size}, but the pool has {self.pool.n_blocks}: it could never finish"
            )
        request.table = BlockTable(self.pool.block_size)
        if request.seed is not None:
            request.generator = torch.Generator(device=self.device).manual_seed(request.seed)
        self.waiting.append(request)

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def preempt(self, request: Request) -> None:
        """Give back all of ``request``'s blocks; it waits at the front, to be recomputed first."""
        request.table.release(self.pool)
        self.partial.discard(request)
        request.n_computed = request.n_registered = 0
        request.state = WAITING
        request.n_preemptions += 1
        self.running.remove(request)
        self.waiting.appendleft(request)

    def match_prefix(self, request: Request) -> None:
        """With a ``PrefixCachingPool``: give a request being admitted the cached blocks of its longest cached
        prefix, one holder each, and count their positions as computed. Its last token is always left to
        run (the step needs its logits), so only full blocks before it are looked up."""
        if not isinstance(self.pool, PrefixCachingPool) or request.table.blocks:
            return
        size = self.pool.block_size
        for block_hash in block_hashes(request.tokens[: len(request.tokens) - 1], size):
            block = self.pool.lookup(block_hash)
            if block is None:
                break  # a prefix ends at its first miss: later blocks' hashes include this one
            request.table.blocks.append(block)
        request.table.n_tokens = request.n_computed = len(request.table.blocks) * size

    def unmatch(self, request: Request) -> None:
        """Give back the cached blocks ``match_prefix`` gave a request that was not admitted after all."""
        if request.state == WAITING and request.table is not None and request.table.blocks:
            request.table.release(self.pool)
            request.n_computed = request.n_registered = 0

    def register_full_blocks(self, request: Request, n_positions: int) -> None:
        """With a ``PrefixCachingPool``: register every full block of ``request``'s first ``n_positions``
        positions, the positions it holds once this step's forward pass has run.

        This is the one place blocks are registered, when the step is planned, before the pass fills them
        (vLLM caches a step's full blocks when it allocates them, nano-vllm when it appends a block): a
        request admitted later in the same step finds them and reads them in that same pass, since every
        layer writes the new keys and values of all the step's requests before any request reads its blocks.
        """
        if not isinstance(self.pool, PrefixCachingPool):
            return
        size, hashes = self.pool.block_size, request.block_hashes
        n_full = min(n_positions // size, len(request.table.blocks))
        if n_full > len(hashes):
            parent = hashes[-1] if hashes else None
            hashes += block_hashes(request.tokens[len(hashes) * size : n_full * size], size, parent)
        for index in range(request.n_registered, n_full):
            self.pool.register(request.table.blocks[index], hashes[index])
        request.n_registered = max(request.n_registered, n_full)

    def take_chunk(self, request: Request, left: int | float, chunks: dict) -> None:
        """Give a prefill as many of its positions as ``left`` allows; note it if some are left for later.
        The full blocks those positions fill are registered now (``register_full_blocks``)."""
        remaining = request.n_tokens - request.n_computed
        chunks[request] = min(left, remaining)
        if chunks[request] < remaining:
            self.partial.add(request)
        else:
            self.partial.discard(request)
        self.register_full_blocks(request, request.n_computed + chunks[request])

    def schedule(self) -> Step:
        """Room for every running request's next position (preempting from the back), then admissions;
        under ``max_step_tokens``, decodes first, then prefills (unfinished ones first) while positions are left."""
        decode, preempted = [], []
        # Oldest first: when blocks run out, the requests admitted last give theirs back.
        for request in list(self.running):
            if request.state != RUNNING:
                continue  # preempted earlier in this loop
            while request.table.blocks_to_grow(request.n_tokens) > self.pool.n_free:
                victim = self.running[-1]
                self.preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.state == RUNNING:
                request.table.grow(self.pool, request.n_tokens)
                decode.append(request)
        # Prompts a budget cut short go on being prefilled; the others run their one new token.
        unfinished = [request for request in decode if request in self.partial]
        decode = [request for request in decode if request not in self.partial]
        for request in decode:
            self.register_full_blocks(request, request.n_tokens)  # its one new position may fill a block
        left = math.inf if self.max_step_tokens is None else self.max_step_tokens
        left -= len(decode)  # never below 0: at most max_running decode, and the budget is at least that
        prefill, chunks = [], {}
        for request in unfinished:
            if left == 0:
                break  # it keeps its blocks and goes on at a later step
            self.take_chunk(request, left, chunks)
            left -= chunks[request]
            prefill.append(request)
        # Admitting while others were just preempted would only preempt again: wait for blocks to come back.
        while not preempted and self.waiting and len(self.running) < self.max_running and left > 0:
            request = self.waiting[0]
            self.match_prefix(request)  # with prefix caching: its cached blocks first, positions already computed
            # Hint: admit the first waiting request only when all its tokens fit in the free blocks.
            raise NotImplementedError()
            if request.state == RUNNING:
                self.take_chunk(request, left, chunks)  # its positions this step; their full blocks registered
                left -= chunks[request]
        if self.waiting:
            self.unmatch(self.waiting[0])  # not admitted this step: it holds no blocks while it waits
        return Step(prefill, decode, preempted, chunks)

    def retire(self) -> list[Request]:
        """Take finished requests out of the running queue and give their blocks back, now."""
        finished = [request for request in self.running if request.finished]
        for request in finished:
            request.table.release(self.pool)
            self.running.remove(request)
        return finished
