"""OpenMP's worker teams: why a thread that hands work to the engine gives its own team back first.

libgomp (the OpenMP runtime of torch's Linux wheels, and of the AOTInductor `.so`) gives every thread
that enters a parallel region a team of worker threads, kept until that thread exits. While the process
holds more such threads than CPUs, every barrier stops spinning and sleeps on a futex instead
(libgomp's throttled spin count). A decode step runs ~400 parallel regions: measured on 2 cores, Gemma 3
270M fp32 at 2,048 slots, the step made 0 voluntary context switches with one team in the process and
~850 with two, and cost up to 1.3-3× as much through the engine as called directly.

The second team is nearly always the caller's, idle: the main thread's after `load()` (which converts
weights with parallel ops), or a server thread's after preprocessing an image. The engine's thread owns
the team that decodes; so `release_team()` runs on the caller's side of every submission.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

_PAUSE_SOFT = 1  # omp_pause_soft (OpenMP 5.0): a thread's team is freed, its ICVs kept


@functools.cache
def _pause_functions() -> tuple:
    """`omp_pause_resource_all` of every libgomp the process has loaded (torch's own copy, and any a
    second extension brought), found in /proc/self/maps; () off Linux or without libgomp. Other OpenMP
    runtimes (LLVM's, Intel's) share one worker pool across threads, so they have nothing to give back;
    and their pause stops every thread's workers, so it is not called on them."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return ()
    paths = sorted({line.split()[-1] for line in maps.read_text().splitlines() if "/libgomp" in line})
    functions = []
    for path in paths:
        try:
            library = ctypes.CDLL(path)  # already loaded: this only takes a handle to it
        except OSError:
            continue
        pause = getattr(library, "omp_pause_resource_all", None)  # libgomp 9 and later
        if pause is not None:
            pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
            functions.append(pause)
    return tuple(functions)


def release_team() -> None:
    """Free the calling thread's idle OpenMP team, if it has one (libgomp only frees the caller's own,
    and refuses inside a parallel region). It costs microseconds; the thread's next parallel op builds
    a new team."""
    for pause in _pause_functions():
        pause(_PAUSE_SOFT)
