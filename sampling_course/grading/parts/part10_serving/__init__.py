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
