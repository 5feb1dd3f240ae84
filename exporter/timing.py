"""Timing calls: the median-of-repeats timer the benchmark's roofline and the attention choice use, and
the interleaved timer the GEMV tuning uses to compare candidates on a machine that may be busy."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Interleaved:
    """Candidates timed in turn: each one's fastest call, its spread, and how much of the cores the
    process got while they ran."""

    best: dict[str, float]  # seconds: each candidate's fastest call
    spread: dict[str, float]  # each candidate's median call over its fastest, less 1
    cpu_share: float  # this process's CPU time over (wall time × threads) during the timing


def interleaved_seconds(fns: dict, *args, threads: int, rounds: int = 5, calls: int = 3) -> Interleaved:
    """Time every candidate `calls` times a round, the candidates in turn (the order reversed every other
    round), after one warming call each. Another process's load then falls on all of them alike rather
    than on whichever ran while it lasted, and the fastest call is each one's figure: load only ever
    adds time."""
    for fn in fns.values():
        fn(*args)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    cpu, wall = time.process_time(), time.perf_counter()
    for round_ in range(rounds):
        for name in list(fns)[:: -1 if round_ % 2 else 1]:
            for _ in range(calls):
                start = time.perf_counter()
                fns[name](*args)
                samples[name].append(time.perf_counter() - start)
    threads = min(threads, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else threads)
    share = (time.process_time() - cpu) / max((time.perf_counter() - wall) * threads, 1e-9)
    return Interleaved(
        best={name: min(s) for name, s in samples.items()},
        spread={name: statistics.median(s) / min(s) - 1 for name, s in samples.items()},
        cpu_share=share,
    )
