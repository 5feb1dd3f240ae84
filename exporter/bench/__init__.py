"""`aotpack bench`: a benchmark, not a test. HF eager, HF + torch.compile, aotpack and llama.cpp on one
model, prompt and machine, each in fresh processes.

plan.py runs it, worker.py measures one system in one process, roofline.py gives the bandwidth floor
and torch's GEMV ceiling, llama_cpp.py converts the checkpoint for llama.cpp, report.py writes
bench.json, bench.md and bench.png.
"""

from runtime.errors import AotpackError


class BenchError(AotpackError):
    """The benchmark refuses an option, or one of its runs failed."""
