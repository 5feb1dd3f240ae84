"""Timing calls: the median-of-repeats timer the benchmark's roofline and the attention choice use, the
interleaved timer the GEMV tuning uses to compare candidates on a machine that may be busy, and the
timed weights' memory: held as the runtime holds a bundle's."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file


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


def held_as_loaded(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """CPU `tensors`, the same values held as the runtime holds a bundle's weights, in order: views of a
    private mapping of a safetensors file in TMPDIR (runtime.model.weights; `load()` maps a bundle's copy
    there), its pages synced, as a bundle's are clean (on a tmpfs TMPDIR, shared memory either way). Which
    build of the integer kernels streams a weight faster depends on that memory: Gemma 3 270M int4's
    weights on an AMD EPYC Zen 4, mapped from a file, went faster with one tile a pass in 15 interleaved
    timings of 16; copied into fresh allocations, with several in 6 of 8. The builds' race, which timed
    such copies, had kept the build whose step was 0.5-1 ms slower (artifacts/bench/epyc-zen4/held/)."""
    with tempfile.TemporaryDirectory(prefix="aotpack-timed-") as folder:
        path = Path(folder) / "timed.safetensors"
        save_file({str(i): t.contiguous() for i, t in enumerate(tensors)}, str(path))
        with open(path, "rb") as written:  # clean pages, as a bundle's are: no writeback during the timing
            os.fsync(written.fileno())
        from runtime.model.weights import read_weights  # transformers with it: only when weights are held

        loaded = read_weights(path)  # the mapping outlives the file's name
    return [loaded[str(i)] for i in range(len(tensors))]
