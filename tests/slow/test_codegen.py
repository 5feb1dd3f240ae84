"""exporter.compat.serial_small_loops in Inductor's generated code (the C++ source only, not compiled): a
small loop nest after a large one in the same kernel runs once, inside `omp single`, where the compiling
process has threads; with one thread it keeps Inductor's worksharing loop, since Inductor would leave a
serial nest bare inside the region there (every thread of the run time's team would run it: an in-place
add would land once per thread). Each thread count in a process of its own (torch.set_num_threads is
process-wide)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

_SOURCE = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
import torch._inductor.config as config
from torch._inductor import async_compile
from exporter.compat import serial_small_loops

sources = []

class Captured(Exception):
    pass

def capture(self, argtypes, source_code, *args, **kwargs):
    sources.append(source_code)
    raise Captured

async_compile.AsyncCompile.cpp_pybinding = capture

def step(a, b):
    doubled = a * 2.0  # 8,192 elements: a worksharing loop
    b.add_(doubled[:640].sin())  # 640 elements, in place, in the same kernel's region
    return doubled

options = {"cpp.dynamic_threads": True, "fx_graph_cache": False, "compile_threads": 1}
with serial_small_loops(), config.patch(options):
    try:
        torch.compile(step, fullgraph=True)(torch.randn(8192), torch.randn(640))
    except Exception:
        pass
print("\\n".join(sources))
"""


def _generated(threads: int) -> str:
    done = subprocess.run([sys.executable, "-c", _SOURCE, str(threads)], capture_output=True, text=True, timeout=600)
    assert "extern" in done.stdout, done.stderr[-2000:]
    return done.stdout


def _pragma_before_small_loop(code: str) -> str | None:
    """The OpenMP pragma right before the 640-element loop (with only braces between), or None: a bare
    loop inside the region."""
    loop = code.rindex("for(", 0, code.index("x0<static_cast<int64_t>(640L)"))
    pragma = list(re.finditer(r"#pragma omp (\w+)", code[:loop]))[-1]
    return pragma.group(1) if re.fullmatch(r"[\s{]*", code[pragma.end() : loop]) else None


@pytest.mark.slow
@pytest.mark.parametrize("threads,pragma", [(2, "single"), (1, "for")])
def test_a_small_loop_in_a_region_runs_once_or_is_shared(threads, pragma):
    code = _generated(threads)
    assert code.count("#pragma omp parallel") == 1  # one region: the large loop opened it
    assert _pragma_before_small_loop(code) == pragma
