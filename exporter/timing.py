"""Timing a call: the one median-of-repeats timer the GEMV tuning and the benchmark's roofline share."""

from __future__ import annotations

import statistics
import time


def median_seconds(fn, *args, repeats: int = 7) -> float:
    """The median wall time of `fn(*args)` over `repeats` calls, after one call that warms it up (or
    compiles it)."""
    fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
