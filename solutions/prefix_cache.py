"""Part 10: prefix caching: a full block found again by its tokens and everything before them.

Requests to a server often start the same way: one system prompt, one long document asked
about many times. Their keys and values for that common start are the same, so a server can
compute them once and let every later request read the same blocks (vLLM's automatic prefix
caching, built on the block tables of Kwon et al. 2023).

A block is found by a hash of its tokens *and* of the blocks before it, chained: block ``i``'s
hash is the hash of (block ``i - 1``'s hash, block ``i``'s tokens). Keys and values at a
position depend on every token before it, so two blocks with the same tokens after different
prefixes hold different keys and values and must not be confused. Only full blocks get a hash:
a partly filled block's keys and values are still being added to.

``PrefixCachingPool`` is a ``BlockPool`` that remembers, for every full block it was told
about (``register``), the hash of its contents. ``lookup`` finds a block by that hash and adds
a holder. A block whose last holder freed it goes back on the free list but keeps its hash,
so a later request can still find it; only when ``allocate`` hands it out for new contents
is its hash forgotten. Freed blocks join the back of the free list, so the ones freed longest
ago are reused first.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .block_pool import BlockPool


def block_hashes(tokens: Sequence[int], block_size: int, parent: Hashable | None = None) -> list[Hashable]:
    """The hash of every *full* block of ``tokens``, in order, each chained to the hashes before it.

    ``parent`` is the hash of the block before ``tokens[0]`` (None at the start of a request),
    so the hashes of a request's blocks can be computed a few blocks at a time. Equal hashes
    mean equal tokens from position 0 to the block's end (up to collisions of ``hash``).
    """
    ### BEGIN SOLUTION
    # Hint: each block's hash covers its tokens and the previous block's hash, so its whole prefix.
    hashes = []
    # range stops at the last full block: a partly filled block gets no hash.
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        hashes.append(parent)
    return hashes
    ### END SOLUTION


class PrefixCachingPool(BlockPool):
    """A ``BlockPool`` whose full blocks can be found again by ``block_hashes`` of their contents."""

    def __init__(self, n_blocks: int, block_size: int):
        super().__init__(n_blocks, block_size)
        self.block_of: dict[Hashable, int] = {}  # hash -> the block holding those contents
        self.hash_of: dict[int, Hashable] = {}   # block -> the hash of its contents

    def allocate(self) -> int:
        """A free block for new contents: whatever it cached before is forgotten."""
        block = super().allocate()
        old = self.hash_of.pop(block, None)
        if old is not None:
            del self.block_of[old]
        return block

    def cached(self, block_hash: Hashable) -> int | None:
        """The block holding the contents ``block_hash`` names, or None; takes no holder."""
        return self.block_of.get(block_hash)

    def lookup(self, block_hash: Hashable) -> int | None:
        """The block holding the contents ``block_hash`` names, with one more holder; None when none does."""
        block = self.block_of.get(block_hash)
        if block is None:
            return None
        if self.ref_counts[block] == 0:
            # Cached but free: take it off the free list, so allocate cannot hand it out while it is read.
            self.free_blocks.remove(block)
            self.ref_counts[block] = 1
        else:
            self.share(block)
        return block

    def register(self, block: int, block_hash: Hashable) -> None:
        """Remember that ``block``, now full, holds the contents ``block_hash`` names.

        When another block already holds the same contents (a request never looks up the block
        that holds its last token, so it computes that block again), the first one stays the one
        found; ``block`` is not cached.
        """
        self.check_block(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is free: only a held block, just filled, can be registered")
        if block_hash in self.block_of or block in self.hash_of:
            return
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
