"""Stop code that never returns: ``with time_limit(60): ...`` raises ``TookTooLong`` after 60 s.

A learner's ``while`` loop that forgets to advance must not freeze a notebook or a
terminal. Checks run in the caller's thread (in a notebook, the kernel's main thread),
so the limit cannot kill a process or rely on the main thread's signals: a watchdog
thread waits, and when the time is up it asks the interpreter to raise ``TookTooLong``
in the thread being timed (``PyThreadState_SetAsyncExc``).

Limits: the exception arrives at the next Python instruction, so a Python loop stops
within moments, but one long call into C (a single huge torch operation, ``time.sleep``)
finishes first. ``TookTooLong`` derives from ``BaseException``, so ``except Exception``
in the code being timed cannot swallow it; a bare ``except:`` around the loop could. The
watchdog raises it once only: raised again and again, it could land in whatever the
thread runs next (the test framework's own bookkeeping) if the block had already ended.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Raising in another thread is a CPython service; elsewhere the limit is not enforced.
_set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)


class TookTooLong(BaseException):
    """Raised inside a block that ran past its ``time_limit``."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Make ``exc`` pending in the thread ``thread_id``; None withdraws one not raised yet."""
    _set_async_exc(ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc))


def enforceable() -> bool:
    """Whether this interpreter can stop a block from another thread."""
    return _set_async_exc is not None


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``TookTooLong`` in the block if it is still running after ``seconds`` (None or <= 0: no limit)."""
    if not seconds or seconds <= 0 or not enforceable():
        yield
        return
    target = threading.get_ident()
    done = threading.Event()
    lock = threading.Lock()  # the block cannot end between the watchdog's check and its raise

    def watchdog() -> None:
        if done.wait(seconds):
            return
        with lock:
            if not done.is_set():
                _raise_in(target, TookTooLong)

    threading.Thread(target=watchdog, name="sampling-course time limit", daemon=True).start()
    try:
        yield
    finally:
        with lock:
            done.set()
            _raise_in(target, None)  # one raised just as the block ended must not hit the caller
