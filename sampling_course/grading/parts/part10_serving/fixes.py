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
    "keys read before the new ones are written":
        "index_copy_ the new keys and values into their slots first, then index the cache with step.read_slots",
    "values written over the keys":
        "write the values into the values' half: kv[1].index_copy_(0, step.write_slots, values[step.valid])",
    "padding queries written too":
        "write only the real queries' keys and values, keys[step.valid] and values[step.valid]",
    "positions computed counted one a step":
        "grow n_computed by the positions the request ran: request.n_computed += work.n_new(request)",
    "a chunk given a token":
        "append the token only when it is not None: if token is not None: request.append(token)",
    "retired before the step's tokens are taken":
        "append every request's token first, then return self.scheduler.retire()",
    "the step not counted":
        "add self.n_steps += 1 in step, after the run and before the postprocess",
    "admitted request given no work":
        "after self.running.append(request), add prefill.append(request)",
}
