"""Part 10, serving: its exercises (what each asks, three graded hints), planted mistakes and correct variants."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes

PART = 10
TITLE = "Serving"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "BlockPool", 10, "block_pool", "BlockPool",
        "allocate: take the free block that was freed longest ago (the front of the free list) and give it "
        "one holder. free: drop one holder, and put the block back at the end of the free list only when no "
        "holder is left; return whether it went back.",
        "Every block has a reference count (self.ref_counts). Sharing a block adds a holder; freeing "
        "drops one. The free list (self.free_blocks, a deque) holds exactly the blocks with count 0, first "
        "in, first out: popleft to take, append to give back.",
        "A block that another request still shares must not go back on the free list: the next "
        "allocate would hand it out and a new request would overwrite keys another one reads. "
        "Decrement first, then return the block only at 0.",
        "allocate: block = self.free_blocks.popleft(); self.ref_counts[block] = 1; return block\n"
        "free:     self.ref_counts[block] -= 1\n"
        "          if self.ref_counts[block] > 0: return False\n"
        "          self.free_blocks.append(block); return True",
    ),
    exercise(
        "BlockTable", 10, "block_pool", "BlockTable",
        "blocks_to_grow: how many more blocks n_tokens positions need. release: give every block back to "
        "the pool, the last block first. slots: the flat slot (block * block_size + offset) of each position "
        "start .. end - 1, the block-table read that the paged cache's write and gather go through.",
        "Every block but the last is full, so n positions take ceil(n / block_size) blocks. Release walks "
        "the table backwards, so its first block goes back to the pool last. Position p lives in the "
        "(p // block_size)-th block of the table, at offset p % block_size.",
        "Integer ceiling division is (n + block_size - 1) // block_size; n // block_size + 1 asks for "
        "a block too many whenever the last block is exactly full. Read the blocks in the table's "
        "order, never in the order of their ids: a fragmented pool hands them out in any order. The pool "
        "reuses the block freed longest ago first, and a cached prefix is found from its first block on: "
        "freed first to last, a prefix would lose its head first and with it every block after.",
        "blocks_to_grow: return max(0, (n_tokens + self.block_size - 1) // self.block_size - len(self.blocks))\n"
        "release: for block in reversed(self.blocks): pool.free(block)\n"
        "slots: positions = torch.arange(start, end)\n"
        "       blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // self.block_size]\n"
        "       return blocks * self.block_size + positions % self.block_size",
    ),
    exercise(
        "PagedKVCache.update", 10, "block_pool", "PagedKVCache.update",
        "The paged cache's side of attention, for one layer of the step that plan laid out: write the real "
        "queries' new keys and values into their slots (step.write_slots), then read back, for every row "
        "of the step, the keys and values at step.read_slots (its requests' positions, through their block "
        "tables), shaped (rows, key_pos, n_heads, d_head).",
        "self.flat(layer) is the layer's (2, n_slots, n_heads, d_head) view: [0] keys, [1] values. keys[step.valid] "
        "picks the real queries' new keys in the order of step.write_slots; index_copy_ along the slot dimension "
        "writes them. Reading is indexing with step.read_slots, a (rows, key_pos) tensor of slots.",
        "Write before you read: a prompt's queries attend to their own new keys, which must already be in "
        "their slots. Padding queries (step.valid False) have no slot: write keys[step.valid], not every row.",
        "kv = self.flat(layer)\n"
        "kv[0].index_copy_(0, step.write_slots, keys[step.valid])\n"
        "kv[1].index_copy_(0, step.write_slots, values[step.valid])\n"
        "return kv[0][step.read_slots], kv[1][step.read_slots]",
    ),
    exercise(
        "Scheduler.schedule", 10, "scheduler", "Scheduler.schedule",
        "The admit step: move waiting requests to the running queue, first come first served, while "
        "all the tokens of the first waiting request fit in the free blocks; grow each one's table to all "
        "its tokens, make it RUNNING, and put it in self.running and in the step's prefill list (prefill), "
        "which is what the step's forward pass runs.",
        "A request is admitted with every token it has (its prompt, and after a preemption the "
        "tokens it already generated): request.table.blocks_to_grow(len(request.tokens)) blocks. "
        "Compare blocks with self.pool.n_free, not tokens with blocks.",
        "Stop at the first request that does not fit (break): skipping it for a shorter one behind "
        "it lets long requests starve. A preempted request comes back with the tokens it generated: "
        "len(request.tokens), not len(request.prompt). An admitted request that is not in prefill gets "
        "no work, and the engine stalls.",
        "request = self.waiting[0]\n"
        "if request.table.blocks_to_grow(len(request.tokens)) > self.pool.n_free: break\n"
        "self.waiting.popleft(); request.table.grow(self.pool, len(request.tokens))\n"
        "request.state = RUNNING; self.running.append(request); prefill.append(request)",
    ),
    exercise(
        "Engine.step", 10, "engine", "Engine",
        "step: schedule, run, postprocess. The schedule is done for you; run the step's work (self.run_step, "
        "only when there is some), count the step (self.n_steps), and return what postprocess returns. "
        "postprocess: each request's bookkeeping in one place: its positions computed grow by the positions "
        "it ran this step, it takes its token unless that is None, then the finished requests are retired.",
        "run_step(work) gives one token per request of work.requests, in that order, None for a chunk of a "
        "prompt that is not its last. work.n_new(request) is how many positions the request ran this step.",
        "Count a request's positions as computed with work.n_new(request), not 1: a prompt runs many at once. "
        "Retire after every token is appended (self.scheduler.retire()), so that a request finished by this "
        "step's token leaves this step, its blocks freed.",
        "step:        tokens = self.run_step(work) if work.requests else []\n"
        "             self.n_steps += 1; return self.postprocess(work, tokens)\n"
        "postprocess: for request, token in zip(work.requests, tokens):\n"
        "                 request.n_computed += work.n_new(request)\n"
        "                 if token is not None: request.append(token)\n"
        "             return self.scheduler.retire()",
    ),
    exercise(
        "block_hashes", 10, "prefix_cache", "block_hashes",
        "The hash of every full block of tokens, in order, each chained to the hash of the block before "
        "it (parent for the first), so that equal hashes mean equal tokens from position 0 to the "
        "block's end. A partly filled last block gets no hash.",
        "Walk the tokens a block at a time, for as many full blocks as they hold: len(tokens) // "
        "block_size of them. Python's hash of a tuple of ints is a good enough hash here.",
        "A block's keys and values depend on every token before it, so its hash must too: hash the "
        "pair (previous hash, this block's tokens as a tuple), and make that the previous hash of the "
        "next block. Hashing the block's tokens alone confuses the same block after different prefixes.",
        "hashes = []\n"
        "for start in range(0, len(tokens) - block_size + 1, block_size):\n"
        "    parent = hash((parent, tuple(tokens[start : start + block_size])))\n"
        "    hashes.append(parent)\n"
        "return hashes",
    ),
)

_FREE = (
    "        self.ref_counts[block] -= 1\n"
    "        if self.ref_counts[block] > 0:\n"
    "            return False  # still shared: another holder reads it, so it must not be handed out\n"
    "        self.free_blocks.append(block)\n"
    "        return True\n"
)
_ALLOCATE = (
    "        block = self.free_blocks.popleft()\n"
    "        self.ref_counts[block] = 1\n"
    "        return block\n"
)
_NEEDED = "        needed = (n_tokens + self.block_size - 1) // self.block_size\n"
_SLOTS = (
    "        positions = torch.arange(start, end)\n"
    "        blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // self.block_size]\n"
    "        return blocks * self.block_size + positions % self.block_size\n"
)
_FITS = "            if request.table.blocks_to_grow(len(request.tokens)) > self.pool.n_free:\n"
_ADMIT = (
    _FITS
    + "                break  # first come, first served: a later, shorter request does not jump the queue\n"
    "            self.waiting.popleft()\n"
    "            request.table.grow(self.pool, len(request.tokens))\n"
)
_RELEASE = "        for block in reversed(self.blocks):\n"
_WRITE = (
    "        kv[0].index_copy_(0, step.write_slots, keys[step.valid])\n"
    "        kv[1].index_copy_(0, step.write_slots, values[step.valid])\n"
)
_READ_SETUP = (
    "        read = step.read_slots.flatten()\n"
    "        shape = (*step.read_slots.shape, *kv.shape[2:])\n"
)
_READ_INTO = (
    "        into_keys, into_values = self.reading(read.shape[0])\n"
    "        read_keys = torch.index_select(kv[0].flatten(1), 0, read, out=into_keys)\n"
    "        read_values = torch.index_select(kv[1].flatten(1), 0, read, out=into_values)\n"
)
_READ_RETURN = "        return read_keys.view(shape), read_values.view(shape)\n"
_READ = _READ_SETUP + _READ_INTO + _READ_RETURN
_POST = (
    "        for request, token in zip(work.requests, tokens):\n"
    "            request.n_computed += work.n_new(request)\n"
    "            if token is not None:\n"
    "                request.append(token)\n"
    "        return self.scheduler.retire()\n"
)
_CHAIN = "        parent = hash((parent, tuple(tokens[start : start + block_size])))\n"
_FULL = "    for start in range(0, len(tokens) - block_size + 1, block_size):\n"

MISTAKES: list[Mistake] = [
    Mistake(10, "block freed while shared", "block_pool.py", _FREE,
            "        self.ref_counts[block] = 0\n"
            "        self.free_blocks.append(block)\n"
            "        return True\n",
            why="free puts the block back on the free list at once, while another request still shares it: the "
                "next allocate hands it out and its keys and values are overwritten",
            fix="decrement the reference count and return the block to the free list only when it reaches 0"),
    Mistake(10, "free ignores the reference count", "block_pool.py", _FREE,
            "        self.ref_counts[block] -= 1\n"
            "        self.free_blocks.append(block)\n"
            "        return True\n",
            why="free drops one holder but puts the block on the free list whatever the count left: a block "
                "another request still shares is handed out again (and a shared block is listed free twice)"),
    Mistake(10, "free list reused newest first", "block_pool.py", "        block = self.free_blocks.popleft()\n",
            "        block = self.free_blocks.pop()\n",
            why="allocate takes the block freed last (the end of the free list), not the one freed longest ago: "
                "a block a request just gave back, which prefix caching could still find, is overwritten first"),
    Mistake(10, "prefix evicted from its head", "block_pool.py", _RELEASE,
            "        for block in self.blocks:\n",
            why="release frees a request's blocks first to last, so with the first-in, first-out free list a "
                "cached prefix's first block is reused first; a prefix is found from its first block on, so the "
                "whole prefix is lost while its later blocks sit unreachable"),
    Mistake(10, "off-by-one in the last block's fill", "block_pool.py", _NEEDED,
            "        needed = n_tokens // self.block_size + 1\n",
            why="the block count is n // block_size + 1, one block too many whenever the last block is exactly full",
            fix="use the ceiling, (n_tokens + block_size - 1) // block_size"),
    Mistake(10, "block table read in the wrong order", "block_pool.py",
            "        blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // self.block_size]\n",
            "        blocks = torch.tensor(sorted(self.blocks), dtype=torch.long)[positions // self.block_size]\n",
            why="the blocks are read in the order of their ids instead of the table's order, as if the pool always "
                "handed them out in order: positions land in another block than the one that holds them"),
    Mistake(10, "free blocks compared with tokens", "scheduler.py", _FITS,
            "            if len(request.tokens) > self.pool.n_free:\n",
            why="a request's tokens are compared with the number of free blocks, not the blocks they need, so "
                "requests wait while their blocks are free"),
    Mistake(10, "admitted by prompt length", "scheduler.py", _ADMIT,
            _ADMIT.replace("len(request.tokens)", "len(request.prompt)"),
            why="a request is admitted, and its table grown, for its prompt only: a preempted request comes back "
                "with the tokens it already generated, which then have no blocks to go to"),
    Mistake(10, "admitted request given no work", "scheduler.py",
            "            self.running.append(request)\n            prefill.append(request)\n",
            "            self.running.append(request)\n",
            why="an admitted request joins the running queue but not the step's prefill list, so the step's "
                "forward pass never runs it: it holds its blocks and gets no work"),
    Mistake(10, "keys read before the new ones are written", "block_pool.py",
            _WRITE + _READ,
            _READ_SETUP + _READ_INTO + _WRITE + _READ_RETURN,
            why="the keys and values are read from the slots before this step's new ones are written there, so "
                "every query misses the keys of the positions this step runs, its own included"),
    Mistake(10, "values written over the keys", "block_pool.py", _WRITE,
            "        kv[0].index_copy_(0, step.write_slots, keys[step.valid])\n"
            "        kv[0].index_copy_(0, step.write_slots, values[step.valid])\n",
            why="the new values are written into the keys' half of the cache (kv[0]), over the new keys, and the "
                "values' half is never written"),
    Mistake(10, "padding queries written too", "block_pool.py", _WRITE,
            "        kv[0].index_copy_(0, step.write_slots, keys.flatten(0, 1))\n"
            "        kv[1].index_copy_(0, step.write_slots, values.flatten(0, 1))\n",
            why="every query's new key and value is written, the padding of a short row too, though only the real "
                "queries have slots (step.write_slots lines up with keys[step.valid])"),
    Mistake(10, "positions computed counted one a step", "engine.py", _POST,
            _POST.replace("request.n_computed += work.n_new(request)", "request.n_computed += 1"),
            why="a request's positions computed grow by 1 a step, not by the positions it ran: after a prompt the "
                "engine thinks most of it is still to run, and runs it again at every step"),
    Mistake(10, "a chunk given a token", "engine.py", _POST,
            "        for request, token in zip(work.requests, tokens):\n"
            "            request.n_computed += work.n_new(request)\n"
            "            request.append(token)\n"
            "        return self.scheduler.retire()\n",
            why="every request takes its token, also a chunk of a prompt that is not its last, whose token is None: "
                "None joins the request's tokens"),
    Mistake(10, "retired before the step's tokens are taken", "engine.py", _POST,
            "        finished = self.scheduler.retire()\n"
            "        for request, token in zip(work.requests, tokens):\n"
            "            request.n_computed += work.n_new(request)\n"
            "            if token is not None:\n"
            "                request.append(token)\n"
            "        return finished\n",
            why="the finished requests are retired before this step's tokens are appended, so a request finished by "
                "its last token stays running a step more, is decoded once too often and frees its blocks late"),
    Mistake(10, "the step not counted", "engine.py",
            "        self.n_steps += 1\n        return self.postprocess(work, tokens)\n",
            "        return self.postprocess(work, tokens)\n",
            why="step never counts itself (self.n_steps stays 0), so whatever reads the engine's step count, a "
                "stream that adds a request every few steps, sees no time pass"),
    Mistake(10, "block hashed without its prefix", "prefix_cache.py", _CHAIN,
            "        parent = hash(tuple(tokens[start : start + block_size]))\n",
            why="each block is hashed from its own tokens only: the same tokens after a different prefix find "
                "a block whose keys and values were computed for another text",
            fix="hash the previous block's hash together with this block's tokens"),
    Mistake(10, "partly filled block hashed", "prefix_cache.py", _FULL,
            "    for start in range(0, len(tokens), block_size):\n",
            why="the last, partly filled block gets a hash too, so a request can find a block whose later "
                "positions another request is still filling",
            fix="stop the range at the last full block: range(0, len(tokens) - block_size + 1, block_size)"),
]

VARIANTS: list[Variant] = [
    # BlockPool
    Variant(10, "BlockPool", "the count incremented from 0", "block_pool.py",
            _ALLOCATE, "        block = self.free_blocks.popleft()\n"
            "        self.ref_counts[block] += 1\n        return block\n"),
    Variant(10, "BlockPool", "the front of the free list read, then removed", "block_pool.py",
            _ALLOCATE, "        block = self.free_blocks[0]\n"
            "        del self.free_blocks[0]\n"
            "        self.ref_counts[block] = 1\n        return block\n"),
    Variant(10, "BlockPool", "the last holder tested before decrementing", "block_pool.py", _FREE,
            "        last = self.ref_counts[block] == 1\n"
            "        self.ref_counts[block] -= 1\n"
            "        if last:\n"
            "            self.free_blocks.append(block)\n"
            "        return last\n"),
    # BlockTable
    Variant(10, "BlockTable", "math.ceil of the quotient", "block_pool.py", _NEEDED + "        return max(0, needed - len(self.blocks))\n",
            "        import math\n\n"
            "        return max(0, math.ceil(n_tokens / self.block_size) - len(self.blocks))\n"),
    Variant(10, "BlockTable", "release popping the table's last block until it is empty", "block_pool.py",
            _RELEASE + "            pool.free(block)\n",
            "        while self.blocks:\n"
            "            pool.free(self.blocks.pop())\n"),
    Variant(10, "BlockTable", "release by index, from the end", "block_pool.py",
            _RELEASE + "            pool.free(block)\n",
            "        for i in range(len(self.blocks) - 1, -1, -1):\n"
            "            pool.free(self.blocks[i])\n"),
    Variant(10, "BlockTable", "divmod per position", "block_pool.py", _SLOTS,
            "        slots = []\n"
            "        for p in range(start, end):\n"
            "            index, offset = divmod(p, self.block_size)\n"
            "            slots.append(self.blocks[index] * self.block_size + offset)\n"
            "        return torch.tensor(slots, dtype=torch.long)\n"),
    # Scheduler.schedule
    Variant(10, "Scheduler.schedule", "free positions compared with the request's tokens", "scheduler.py", _FITS,
            "            if len(request.tokens) > self.pool.n_free * self.pool.block_size:\n"),
    Variant(10, "Scheduler.schedule", "blocks_needed against the free blocks", "scheduler.py", _FITS,
            "            if blocks_needed(len(request.tokens), self.pool.block_size) > self.pool.n_free:\n"),
    # PagedKVCache.update
    Variant(10, "PagedKVCache.update", "index assignment and indexing by the slot tensors", "block_pool.py",
            _WRITE + _READ,
            "        kv[0][step.write_slots] = keys[step.valid]\n"
            "        kv[1][step.write_slots] = values[step.valid]\n"
            "        return kv[0][step.read_slots], kv[1][step.read_slots]\n"),
    Variant(10, "PagedKVCache.update", "one row at a time, stacked", "block_pool.py",
            _READ,
            "        rows = [kv[:, slots] for slots in step.read_slots]  # each (2, key_pos, n_heads, d_head)\n"
            "        both = torch.stack(rows, dim=1)\n"
            "        return both[0], both[1]\n"),
    # Engine.step
    Variant(10, "Engine.step", "the positions of each request listed before any is changed", "engine.py", _POST,
            "        ran = [work.n_new(request) for request in work.requests]\n"
            "        for request, n, token in zip(work.requests, ran, tokens):\n"
            "            request.n_computed = request.n_computed + n\n"
            "            if token is None:\n"
            "                continue\n"
            "            request.append(token)\n"
            "        return self.scheduler.retire()\n"),
    Variant(10, "Engine.step", "an if for the run, the count first", "engine.py",
            "        tokens = self.run_step(work) if work.requests else []\n"
            "        self.n_steps += 1\n        return self.postprocess(work, tokens)\n",
            "        self.n_steps += 1\n"
            "        tokens = []\n"
            "        if work.requests:\n"
            "            tokens = self.run_step(work)\n"
            "        return self.postprocess(work, tokens)\n"),
    # block_hashes
    Variant(10, "block_hashes", "SHA-256 of the parent's hash and the block's tokens", "prefix_cache.py", _CHAIN,
            "        import hashlib\n\n"
            "        block = tuple(tokens[start : start + block_size])\n"
            "        parent = hashlib.sha256(repr((parent, block)).encode()).hexdigest()\n"),
    Variant(10, "block_hashes", "the number of full blocks counted first", "prefix_cache.py", _FULL,
            "    for start in [i * block_size for i in range(len(tokens) // block_size)]:\n"),
]
from sampling_course.grading.parts.part10_serving.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)
MISTAKES = with_fixes(MISTAKES, FIXES)
