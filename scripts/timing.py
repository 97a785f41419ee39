"""What the timing scripts share: the machine's load, and a median with its spread.

Imported by ``time_checks.py`` and ``time_threads.py``, which run as ``python scripts/NAME.py``
(so this folder is on ``sys.path``).
"""

from __future__ import annotations

import os
import statistics


def load_average() -> str:
    """The 1- and 5-minute load averages and the core count, as printed next to a timing."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def median_and_spread(seconds: list[float]) -> tuple[float, float, float]:
    """(median, fastest, slowest) of interleaved runs: the median is judged, the spread printed beside it."""
    return statistics.median(seconds), min(seconds), max(seconds)
