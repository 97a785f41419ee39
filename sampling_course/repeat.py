"""Many calls of one function with the same arguments: the draws a frequency test counts.

A statistical test calls a sampler thousands of times on the same input and counts what it
drew. ``repeat(function, n, *args)`` makes those calls and gives their results in order, the
same as ``[function(*args) for _ in range(n)]``.

When ``function`` lives in another process (a submission graded in a sandbox, where every call
is a message and its answer), the loop itself runs in that process, with this same code loaded
there: the ``n`` calls are one message, not ``n``. The handle's class says how
(``run_beside``); the results come back as data.
"""

from __future__ import annotations

from typing import Any

__all__ = ["repeat"]


def repeat(function: Any, n: int, /, *args: Any, **kwargs: Any) -> list:
    """``[function(*args, **kwargs) for _ in range(n)]``, in the process where ``function`` runs."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a whole number of calls, 0 or more, got {n!r}")
    beside = getattr(type(function), "run_beside", None)
    if beside is not None:  # a handle to another process's function: the loop runs there
        results = beside(function, f"{__name__}.repeat", n, *args, **kwargs)
        if results is not NotImplemented:
            return results
    return [function(*args, **kwargs) for _ in range(n)]
