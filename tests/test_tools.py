"""The benchmark command, the portable-ISA export and the seed example, each run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exporter.cli import main as aotpack
from runtime import load

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_bench_completes_and_writes_its_files(tmp_path, capsys):
    """A benchmark is not a timed test: this checks that every figure is produced, not how fast."""
    out = tmp_path / "bench"
    args = ["bench", "--model", "tiny-llama", "--dtype", "float32", "--prompt-len", "6", "--new-tokens", "8",
            "--threads", "2", "--out", str(out)]
    assert aotpack(args) == 0
    results = json.loads((out / "bench.json").read_text())
    assert {r["system"] for r in results["runs"]} == {"hf_eager", "hf_compile", "aotpack"}
    for run in results["runs"]:
        for key in ("time_to_first_token_s", "first_request_s", "prefill_ms", "decode_ms_per_token", "peak_rss_mib"):
            assert run[key] > 0, (run["system"], key)
        assert len(run["tokens"]) == 8
    figures = results["derived"]["float32"]
    assert figures["tokens_equal_eager"] is True
    assert 0 < figures["pct_of_floor"] and figures["floor_ms"] > 0 and results["bandwidth_gb_s"] > 0
    assert "| float32 | aotpack |" in (out / "bench.md").read_text()
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "first request" in capsys.readouterr().out


@pytest.mark.slow
def test_portable_cpu_isa_bundle(bundle, checkpoint, tmp_path):
    out = tmp_path / "portable"
    args = ["export", str(checkpoint("tiny-llama")), "--out", str(out), "--max-cache-len", "160", "--cpu-isa", "avx2"]
    assert aotpack(args) == 0
    portable = load(out)
    assert portable.manifest.cpu_isa == "AVX2"
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    native = load(bundle("tiny-llama"))
    assert torch.equal(portable.generate(input_ids=ids, max_new_tokens=20), native.generate(input_ids=ids, max_new_tokens=20))


def test_seed_example_runs_offline(bundle):
    done = subprocess.run(
        [sys.executable, "examples/seed_gemma3.py", "--out", str(bundle("tiny-gemma3-vlm"))],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
