"""One OpenMP team while the engine decodes: a caller's idle team is freed when it submits.

libgomp throttles every barrier's spinning (futex sleeps instead) once the process holds more OpenMP
threads than CPUs; runtime.engine.openmp says why that costs a decode step dearly. The team a thread
owns is visible as worker threads in /proc/self/task, so these tests count them.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from helpers import GREEDY

from runtime.engine.engine import Engine
from runtime.engine.openmp import _pause_functions, release_team

pytestmark = pytest.mark.skipif(
    not _pause_functions() or torch.get_num_threads() < 2,
    reason="needs libgomp with omp_pause_resource_all and at least 2 threads",
)


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_op() -> None:
    torch.ones(4_000_000).sum()  # far above ATen's grain size: runs on the calling thread's team


def _steady_tasks(quiet: float = 0.2, timeout: float = 5.0) -> int:
    """The thread count once it has not changed for `quiet` seconds (threads that were ending, ended)."""
    deadline, count, since = time.monotonic() + timeout, _tasks(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.01)
        if _tasks() != count:
            count, since = _tasks(), time.monotonic()
    return count


def _settles_at(count: int, timeout: float = 5.0) -> bool:
    """Whether the process's thread count comes down to `count` (exiting threads free their teams
    in thread-exit destructors, a moment after Python's join returns)."""
    deadline = time.monotonic() + timeout
    while _tasks() != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return _tasks() == count


def _in_fresh_thread(body):
    """Run body() on a new thread, which starts without a team; re-raise what it raised."""
    outcome = {}

    def run():
        try:
            outcome["value"] = body()
        except BaseException as e:  # handed to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_release_team_frees_the_calling_threads_workers():
    def body():
        before = _tasks()
        _parallel_op()
        with_team = _tasks()
        release_team()
        return before, with_team, _tasks()

    before, with_team, after = _in_fresh_thread(body)
    assert with_team == before + torch.get_num_threads() - 1
    assert after == before
    release_team()  # a thread without a team: nothing to do, no error


def test_a_submission_frees_the_callers_team(eager_runtime):
    """After a caller's own parallel op and one generate call, no worker of the caller's is left."""
    rt = eager_runtime("tiny-llama", rows=2, cache=64)
    request = rt.request(torch.tensor([[5, 6, 7]]), **{**GREEDY, "max_new_tokens": 3, "min_new_tokens": 3})

    def generate_once():
        engine = Engine(rt.model, rt.decode, rt.contract)
        list(engine.submit(request).tokens())
        engine.close()  # the engine's thread (and the team it made) ends

    def body():
        generate_once()  # what a first generate starts once per process (not OpenMP's) is left running
        before = _steady_tasks()
        _parallel_op()
        assert _tasks() == before + torch.get_num_threads() - 1
        generate_once()
        return _settles_at(before), _tasks() - before  # while this thread, the caller, is alive

    settled, left_over = _in_fresh_thread(body)
    assert settled, f"{left_over} threads left over: the caller's team was kept"
