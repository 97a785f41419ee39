"""How to put right each of part 10's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "block table read in the wrong order":
        "index the table as it is: torch.tensor(self.blocks)[positions // block_size]",
    "free blocks compared with tokens":
        "compare the blocks the request still needs, table.blocks_to_grow(len(tokens)), with pool.n_free",
    "free ignores the reference count":
        "append the block to the free list (and return True) only when its count has reached 0",
    "free list reused newest first":
        "take the block at the front of the free list, self.free_blocks.popleft()",
    "prefix evicted from its head":
        "free the table's blocks last first: for block in reversed(self.blocks): pool.free(block)",
    "admitted by prompt length":
        "use len(request.tokens), prompt and generated tokens, both in the admit test and in table.grow",
    "admitted request given no work":
        "after self.running.append(request), add prefill.append(request)",
}
