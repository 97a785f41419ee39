"""Part 6's StaticKeyValueCache.reorder: its planted mistakes and correct variants (read by the part's home)."""

from __future__ import annotations

from sampling_course.grading.catalogue import Mistake, Variant

_C = "caches.py"
# The solution's moves: only the rows that change, each layer's overwritten sources saved first.
_MOVES = (
    "        moves = [(i, row) for i, row in enumerate(rows.tolist()) if row != i]\n"
    "        overwritten = {i for i, _ in moves}\n"
    "        # Layer by layer: what is saved is a few rows of one layer, never a copy of the whole cache.\n"
    "        for layer in range(self.buffer.shape[0]):\n"
    "            filled = self.buffer[layer, :, :, : self.seq_len]\n"
    "            saved = {row: filled[:, row].clone() for _, row in moves if row in overwritten}\n"
    "            for i, row in moves:\n"
    "                filled[:, i] = saved[row] if row in saved else filled[:, row]\n"
)

REORDER_MISTAKES: list[Mistake] = [
    Mistake(6, "reorder copies row by row in place (overwrites rows still to be read)", _C,
            "            saved = {row: filled[:, row].clone() for _, row in moves if row in overwritten}\n",
            "            saved = {}\n",
            why=("reorder copies rows one by one into the same buffer without saving the rows that a later "
                 "copy reads, so a row can be overwritten before another child reads it.")),
    Mistake(6, "reorder keeps the old batch size", _C,
            "                filled[:, i] = saved[row] if row in saved else filled[:, row]\n        self.batch = len(rows)\n",
            "                filled[:, i] = saved[row] if row in saved else filled[:, row]\n",
            why=("after a reorder the cache keeps its old batch size instead of the number of rows it was "
                 "given.")),
]

REORDER_VARIANTS: list[Variant] = [
    Variant(6, "StaticKeyValueCache.reorder", "advanced indexing on the right-hand side (which copies first), whole cache", _C,
            _MOVES,
            "        filled = self.buffer[:, :, :, : self.seq_len]\n"
            "        filled[:, :, : len(rows)] = filled[:, :, rows]\n"),
    Variant(6, "StaticKeyValueCache.reorder", "clone then index_copy_, layer by layer", _C,
            _MOVES,
            "        for layer in range(self.buffer.shape[0]):\n"
            "            filled = self.buffer[layer, :, :, : self.seq_len]\n"
            "            source = filled.clone()\n"
            "            filled.index_copy_(1, torch.arange(len(rows), device=rows.device), source[:, rows])\n"),
    Variant(6, "StaticKeyValueCache.reorder", "every row gathered with index_select, then written back", _C,
            _MOVES,
            "        filled = self.buffer[:, :, :, : self.seq_len]\n"
            "        gathered = filled.index_select(2, rows)\n"
            "        filled[:, :, : len(rows)] = gathered\n"),
]
