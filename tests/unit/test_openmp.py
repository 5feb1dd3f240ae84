"""One OpenMP team while the engine decodes: a caller's idle team is freed when it submits.

libgomp throttles every barrier's spinning (futex sleeps instead) once the process holds more OpenMP
threads than CPUs; runtime.engine.openmp says why that costs a decode step dearly. The team a thread
owns is visible as worker threads in /proc/self/task, so these tests count them.
"""

from __future__ import annotations

import pytest
import torch
from helpers import GREEDY, in_fresh_thread, parallel_op, settles_at, steady_tasks, tasks

from runtime.engine.engine import Engine
from runtime.engine.openmp import _pause_functions, release_team

pytestmark = pytest.mark.skipif(
    not _pause_functions() or torch.get_num_threads() < 2,
    reason="needs libgomp with omp_pause_resource_all and at least 2 threads",
)


def test_release_team_frees_the_calling_threads_workers():
    def body():
        before = steady_tasks()  # threads an earlier test left ending have ended
        parallel_op()
        with_team = tasks()
        release_team()
        # the workers exit a moment after the pause returns: wait for the count, don't sample it once
        return before, with_team, settles_at(before), tasks()

    before, with_team, released, after = in_fresh_thread(body)
    assert with_team == before + torch.get_num_threads() - 1
    assert released, f"{after - before} workers left after release_team"
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
        before = steady_tasks()
        parallel_op()
        assert tasks() == before + torch.get_num_threads() - 1
        generate_once()
        return settles_at(before), tasks() - before  # while this thread, the caller, is alive

    settled, left_over = in_fresh_thread(body)
    assert settled, f"{left_over} threads left over: the caller's team was kept"
