"""The benchmark's context sweep, end to end (a file of its own: the scheduler gives each file one worker,
and this one runs beside the bench's batch-1 run in tests/slow/test_tools.py)."""

from __future__ import annotations

import json

import pytest

from exporter.cli import main as aotpack
from exporter.names import ATTENTION_KERNELS


@pytest.mark.heavy
def test_bench_context_sweep_completes_and_writes_its_files(tmp_path):
    """`--contexts` over two cache sizes: each context that fits, decode, and the engine against the step."""
    out = tmp_path / "contexts"
    args = ["bench", "--model", "tiny-llama", "--dtype", "float32", "--contexts", "8,40", "--max-cache-len", "64"]
    args += ["--vs-cache", "32", "--new-tokens", "8", "--threads", "2", "--gemv", "aten", "--out", str(out)]
    assert aotpack(args) == 0
    results = json.loads((out / "contexts.json").read_text())
    got = {(r["cache"], r["context"]) for r in results["figures"]}
    assert got == {(64, 8), (64, 40), (32, 8)}  # 40 tokens and 8 new ones do not fit 32 slots
    for row in results["figures"]:
        assert row["decode_ms"] > 0 and row["prefill_ms"] > 0 and row["engine_over_step"] > 0
    assert "64-slot cache decodes at" in (out / "contexts.md").read_text()
    chosen = results["attention"]  # each bundle's choice and its candidates' times, read from its manifest
    assert set(chosen) == {"float32-64", "float32-32"}
    assert {c["chosen"] for c in chosen.values()} <= set(ATTENTION_KERNELS)
    assert all(c["chosen"] in c["us_per_call"] for c in chosen.values())  # timed at export, the choice among them
    words = f"the float32-64 bundle: the {chosen['float32-64']['chosen']} decode attention (timed at export"
    assert words in (out / "contexts.md").read_text()
