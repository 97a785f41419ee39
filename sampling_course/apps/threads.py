"""Torch threads for one command, given back afterwards (commands also run inside tests and notebooks)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (None: leave them as they are), then restore them."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
