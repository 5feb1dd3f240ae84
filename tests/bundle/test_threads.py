"""After `load()`, the calling thread holds no OpenMP team: a server's main thread loads and then never
submits (which would free it), and a second team in the process makes every decode barrier sleep
(runtime.engine.openmp)."""

from __future__ import annotations

import pytest
import torch
from helpers import in_fresh_thread, parallel_op, steady_tasks

from runtime import load
from runtime.engine.openmp import _pause_functions

pytestmark = pytest.mark.skipif(
    not _pause_functions() or torch.get_num_threads() < 2,
    reason="needs libgomp with omp_pause_resource_all and at least 2 threads",
)


def test_load_leaves_its_caller_without_an_openmp_team(bundle):
    path = bundle("tiny-llama")

    def body():
        parallel_op()  # whatever load does, this thread owns a team now
        with_team = steady_tasks()
        rt = load(path)
        after = steady_tasks()
        rt.engine.close()
        return with_team, after

    with_team, after = in_fresh_thread(body)
    assert after <= with_team - (torch.get_num_threads() - 1)
