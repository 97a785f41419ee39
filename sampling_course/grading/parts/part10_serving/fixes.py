"""How to put right each of part 10's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "block table read in the wrong order":
        "index the table as it is: torch.tensor(self.blocks)[positions // block_size]",
    "free blocks compared with tokens":
        "compare the blocks the request still needs, table.blocks_to_grow(len(tokens)), with pool.n_free",
}
