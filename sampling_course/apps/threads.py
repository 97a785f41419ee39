"""How many threads torch uses: the course's policy, for every command and the notebooks.

torch starts one thread per physical core. While another process keeps a core busy, every
parallel operation then waits for the thread that has no core of its own: on two shared
cores with one busy process, ``sampling-course demo`` took 2 min 39 s instead of 13 s.
The policy, applied unless ``--threads N`` or ``$OMP_NUM_THREADS`` says otherwise:

* models with ``d_model`` below 512 (the course's ``story``, ``story-draft`` and ``tiny``)
  run on one thread: their matrices are too small to gain from splitting, and one thread
  cannot be kept waiting by a busy core;
* larger models (GPT-2 small) get one thread per core that no other process is using when
  the command starts, never more than torch's own default (the physical cores).

The pytest plugin runs the tests on one thread (or ``$OMP_NUM_THREADS``) for the same reason.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator

# Below this width, one thread (see the module's docstring).
SMALL_D_MODEL = 512


def busy_cores_elsewhere(samples: int = 3, gap_s: float = 0.01) -> float:
    """How many cores other processes keep busy now: the median of a few counts of running threads
    system-wide (Linux), less this process's own; elsewhere the 1-minute load average."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as file:
                running = int(file.read().split()[3].split("/")[0])
            own = 0
            for task in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{task}/stat") as stat:
                    own += stat.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, ValueError, IndexError):
            break
        counts.append(max(0, running - own))
        if i + 1 < samples:
            time.sleep(gap_s)
    if counts:
        return float(statistics.median(counts))
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def free_cores() -> int:
    """Cores no other process is using now (at least one): how many processes ``progress`` runs its tests in."""
    return max(1, _cores() - round(busy_cores_elsewhere()))


def course_threads(requested: int | None = None, d_model: int | None = None) -> int | None:
    """Torch threads by the course's policy (see the module): ``requested`` when given; None when
    $OMP_NUM_THREADS is set (torch already follows it); else by the model's width and the free cores."""
    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if d_model is not None and d_model < SMALL_D_MODEL:
        return 1
    import torch

    free = _cores() - round(busy_cores_elsewhere())
    return max(1, min(free, torch.get_num_threads()))


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (None: leave them as they are), then restore them."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def use_course_threads(d_model: int | None = None) -> int:
    """Set torch's threads by the course's policy for the rest of the process (the notebooks); return them."""
    import torch

    threads = course_threads(None, d_model)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
