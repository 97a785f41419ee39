"""The tensor operations a piece of code runs: what a step replayed as a CUDA graph may do.

A step captured as a CUDA graph replays the same operations on the same shapes every time,
and it can never read a value back to the host (``.item()``, ``int(tensor)``, a shape that
depends on data): the host would wait for the device at every step. ``OpRecorder`` is a torch
dispatch mode that writes down every operation run inside it, its name and the shapes of what
it returns, so both can be checked on the CPU:

    with OpRecorder() as recorder:
        step(...)
    recorder.host_reads()   # [] for a step that never waits

When the code under test runs in another process (a submission graded in a sandbox), the
recording is made there, by this same class, and its operations come back as plain data
(``extend``). The connection's own work while a recorder is on is left out (``paused``): only
the code's operations are written down.

A record made in the process of the code under test is that code's to change: it can convict
the code, not clear it. ``recorder.verdict(ok, message)`` fails the test (``AssertionError``)
when the verdict does not hold, wherever the operations were recorded (only the code's own
process could have written the operations that fail it); a verdict that holds on a record made
elsewhere (``elsewhere``) is counted as unverified (``take_unverified``), and the grade's reports
say so. The same holds for the other records made beside the code under test (``MethodCalls``'
calls, ``PlannedSteps``' blocks held): a test whose checks on one held calls ``own_record_held``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sampling_course.beside import elsewhere

__all__ = ["HOST_READS", "MAX_OPS", "OpRecorder", "own_record_held", "take_unverified"]

# Operations that make the host wait for the device (a value read back, a shape that depends on data).
HOST_READS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "multinomial", "unique", "item"})
MAX_OPS = 1_000_000  # operations one recording keeps; a recording that ran more keeps the first ones

_state = threading.local()  # per thread: the recorders on (innermost last), and whether recording is paused
_unverified = [0]  # verdicts that held on a record made elsewhere, since they were last taken


def take_unverified() -> int:
    """How many verdicts held on a record made in another process since the last call (then none)."""
    taken, _unverified[0] = _unverified[0], 0
    return taken


def own_record_held(record: Any) -> None:
    """Checks on ``record``, made beside the code under test (``beside.made_beside``), held: counted for
    ``take_unverified`` when it was kept in another process (a handle to it), which could have changed it."""
    if elsewhere(record):
        _unverified[0] += 1


def _active() -> list["OpRecorder"]:
    if not hasattr(_state, "active"):
        _state.active, _state.paused = [], 0
    return _state.active


class OpRecorder(TorchDispatchMode):
    """Records every tensor operation run inside it: ``ops`` is a list of ``(name, shapes)``, where
    ``shapes`` holds the shape of each tensor the operation returned."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[tuple[int, ...], ...]]] = []
        self.elsewhere = False  # some of the code ran in another process, which recorded its operations itself

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(_state, "paused", 0) and len(self.ops) < MAX_OPS:
            shapes = tuple(tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            self.ops.append((func._overloadpacket.__name__, shapes))
        return out

    def __enter__(self) -> "OpRecorder":
        _active().append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        active = _active()
        if self in active:
            active.remove(self)

    def host_reads(self) -> list[str]:
        """The names of the recorded operations that read a value back to the host, in order."""
        return [name for name, _ in self.ops if name in HOST_READS]

    def verdict(self, ok: bool, message: str) -> None:
        """A verdict on this record: ``AssertionError(message)`` when it does not hold. One that holds on a record
        made partly in another process (which that process could change) is counted for ``take_unverified``."""
        if not ok:
            raise AssertionError(message)
        if self.elsewhere:
            _unverified[0] += 1

    def extend(self, ops: Any) -> None:
        """Add operations recorded elsewhere, given as plain data: ``[[name, [[size, ...], ...]], ...]``."""
        if not isinstance(ops, list):
            raise TypeError("recorded operations must be a list of [name, shapes]")
        for op in ops[: max(0, MAX_OPS - len(self.ops))]:
            if not (isinstance(op, (list, tuple)) and len(op) == 2 and isinstance(op[0], str)
                    and isinstance(op[1], (list, tuple))
                    and all(isinstance(s, (list, tuple)) and all(type(n) is int for n in s) for s in op[1])):
                raise TypeError(f"a recorded operation must be [name, shapes], got {str(op)[:80]}")
            self.ops.append((op[0][:100], tuple(tuple(s) for s in op[1])))

    @staticmethod
    def recording() -> list["OpRecorder"]:
        """The recorders on in this thread, outermost first (none: an empty list)."""
        return [] if getattr(_state, "paused", 0) else list(_active())

    @staticmethod
    @contextlib.contextmanager
    def paused() -> Iterator[None]:
        """No recorder of this thread writes down what runs inside (the connection's own work)."""
        _active()
        _state.paused += 1
        try:
            yield
        finally:
            _state.paused -= 1
