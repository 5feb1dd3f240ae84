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

ROOT = Path(__file__).parents[2]


@pytest.mark.heavy
def test_bench_completes_and_writes_its_files(tmp_path, capsys):
    """A benchmark is not a timed test: this checks that every figure is produced, not how fast."""
    out = tmp_path / "bench"
    args = [
        "bench",
        "--model",
        "tiny-llama",
        "--dtype",
        "float32",
        "--quantize",
        "int8",
        "--prompt-len",
        "6",
        "--new-tokens",
        "8",
        "--threads",
        "2",
        "--gemv",
        "aten",
        "--onnx",
        "--out",
        str(out),
    ]
    assert aotpack(args) == 0
    results = json.loads((out / "bench.json").read_text())
    assert {(r["dtype"], r["system"]) for r in results["runs"]} == {
        ("float32", "hf_eager"),
        ("float32", "hf_compile"),
        ("float32", "aotpack"),
        ("float32", "aotpack_onnx"),
        ("float32", "aotpack_onnx_prepacked"),
        ("int8", "aotpack"),
    }
    for run in results["runs"]:
        for key in ("time_to_first_token_s", "first_request_s", "prefill_ms", "decode_ms_per_token", "peak_rss_mib"):
            assert run[key] > 0, (run["system"], key)
        assert len(run["tokens"]) == 8
    figures = results["derived"]["float32"]
    assert figures["tokens_equal_eager"] is True
    assert 0 < figures["pct_of_floor"] and figures["floor_ms"] > 0 and figures["bandwidth_gb_s"] > 0
    assert figures["gemv_gb_s"] > 0 and figures["gemv_floor_ms"] > 0 and figures["pct_of_gemv_floor"] > 0
    assert figures["onnx_vs_aoti"] > 0 and figures["onnx_prepacked_vs_aoti"] > 0 and figures["onnx_tokens_equal"]
    quantized = results["derived"]["int8"]
    assert quantized["rss_vs_float32"] > 0 and quantized["pct_of_floor"] > 0 and "gemv_gb_s" not in quantized
    assert quantized["reference_perplexity"] > 0 and 0 <= quantized["greedy_agreement"] <= 1
    report = (out / "bench.md").read_text()
    assert "| float32 | aotpack |" in report and "| int8 | aotpack |" in report and "perplexity" in report
    assert "| float32 | aotpack, ONNX Runtime decode |" in report and "ONNX Runtime decode vs AOTInductor's" in report
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "first request" in capsys.readouterr().out


def _synthetic_run(system: str, decode_ms: float, tokens: list[int], round_: int) -> dict:
    return {
        "system": system,
        "dtype": "float32",
        "round": round_,
        "time_to_first_token_s": 1.0 + round_,
        "first_request_s": 2.0 + round_,
        "prefill_ms": 10.0,
        "decode_ms_per_token": decode_ms,
        "peak_rss_mib": 100.0,
        "tokens": tokens,
        "tokens_stable": True,
    }


def test_bench_report_takes_medians_over_rounds():
    """Pure report logic on made-up figures: medians per system, the decode range, and both floors
    paired round by round with aotpack's decode."""
    from exporter.bench.report import derived, medians

    runs = [_synthetic_run("aotpack", ms, [1, 2], r) for r, ms in enumerate((50.0, 90.0, 40.0))]
    runs += [_synthetic_run("hf_eager", ms, [1, 2] if r else [1, 3], r) for r, ms in enumerate((80.0, 70.0, 75.0))]
    step = {"weight_bytes": 2e9, "kv_bytes": 1e8, "total_bytes": 2.1e9, "largest_weight": [8, 4]}
    rates = [
        {"dtype": "float32", "round": r, "bandwidth_gb_s": bw, "gemv_gb_s": 50.0}
        for r, bw in enumerate((100.0, 50.0, 100.0))
    ]
    results = {
        "config": {"dtypes": ["float32"]},
        "runs": runs,
        "step_bytes_float32": step,
        "read_rates": rates,
        "builds": {"float32": 60.0},
    }
    summary = medians(results)
    aot = next(r for r in summary if r["system"] == "aotpack")
    assert (aot["decode_ms_per_token"], aot["decode_range_ms"], aot["first_request_s"]) == (50.0, [40.0, 90.0], 3.0)
    figures = derived(results, summary)["float32"]
    assert figures["floor_ms"] == pytest.approx(21.0)  # 2.1 GB at 100 GB/s in rounds 0 and 2 (42 ms in round 1)
    assert figures["pct_of_floor"] == pytest.approx(100 * 42 / 90)  # per round: 42 %, 46.7 %, 52.5 %
    assert figures["gemv_floor_ms"] == pytest.approx(41.0)  # 2 GB at 50 GB/s + 0.1 GB at 100 GB/s
    assert figures["pct_of_gemv_floor"] == pytest.approx(82.0)  # per round: 82 %, 46.7 %, 102.5 %
    assert figures["decode_speedup_vs_eager"] == pytest.approx(1.5)
    assert figures["tokens_equal_eager"] is False  # eager's first round chose other tokens


def test_bench_verdicts_use_the_unrounded_figure():
    """1.197x prints as 1.20x; against a 1.2x target it is not met."""
    from exporter.bench.report import verdict

    assert verdict("decode_speedup_vs_compile", "bfloat16", 1.197) == "**not met**"
    assert verdict("decode_speedup_vs_compile", "bfloat16", 1.2) == "met"
    assert verdict("rss_vs_float32", "int8", 0.35) == "met"
    assert verdict("rss_vs_float32", "float32", 1.0) == ""  # no RSS target for float32
    assert verdict("perplexity_change_pct", "int8", 1.01) == "**not met**"
    assert verdict("perplexity_vs_llama_cpp_pct", "int4", 0.01) == "**not met**"  # int4: against Q4_K_M's
    assert verdict("perplexity_vs_llama_cpp_pct", "int4", 0.0) == "met"
    assert verdict("speedup_vs_int8", "int4", 1.0) == "**not met**"  # faster, not as fast
    assert verdict("tokens_equal_eager", "float32", False) == "**not met**"
    assert verdict("pct_of_gemv_floor", "float32", 50.0) == ""  # a reference, not a target


@pytest.mark.slow
def test_streams_report_reads_the_targets_from_the_measurements(tmp_path):
    """The continuous-batching report: ratios and verdicts from synthetic measurements."""
    from exporter.bench.concurrency import figures, write_streams_report

    admission = {"itl_p50_before_ms": 100.0, "itl_p99_during_ms": 250.0, "stall_max_ms": 260.0,
                 "long_prompt_tokens": 512, "long_prompt_first_token_s": 2.0}  # fmt: skip
    graphs = [{"batch": b, "step_ms": ms, "ms_per_row": ms / b} for b, ms in ((1, 40.0), (8, 64.0))]
    measured = {
        "rows": 8,
        "decode_attention": {"chosen": "native", "us_per_call": {"grouped": 91.4, "native": 40.2}},
        "max_cache_len": 2048,
        "graphs": graphs,
        "one": {"streams": 1, "tokens_per_s": 20.0, "itl_p50_ms": 50.0, "itl_p99_ms": 55.0},
        "many": {"streams": 8, "tokens_per_s": 110.0, "itl_p50_ms": 72.0, "itl_p99_ms": 90.0},
        "rounds_gain": [6.0, 5.5, 4.0],
        "rounds_itl_growth": [1.2, 1.44, 1.5],
        "admission": [admission | {"prefill_chunk": None, "p99_over_p50": 9.0},
                      admission | {"prefill_chunk": 32, "p99_over_p50": 3.5},
                      admission | {"prefill_chunk": 32, "prefill_budget": 1.0, "p99_over_p50": 2.5,
                                   "rounds_p99_over_p50": [3.1, 2.5, 2.0]}],
    }  # fmt: skip
    assert figures(measured) == pytest.approx(
        {"throughput_gain": 5.5, "itl_growth": 1.44, "budgeted_p99_over_p50": 2.5, "chunked_p99_over_p50": 3.5,
         "whole_p99_over_p50": 9.0}
    )  # fmt: skip
    config = {"model": "m", "threads": 2, "prompt_len": 32, "new_tokens": 64}
    machine = {"cpu": "cpu", "isa": ["avx2"], "torch": "2.13"}
    write_streams_report({"config": config, "machine": machine, "build_s": 1.0, "variant": "bfloat16",
                          "measured": measured}, tmp_path)  # fmt: skip
    report = (tmp_path / "streams.md").read_text()
    assert report.count("| met |") == 3 and "chunks of 32 |" in report and "1× a step's time, at most 32" in report
    assert "| 8 | 64.0 | 8.0 | 1.60× |" in report  # each graph's step, per row and against batch 1
    assert "| 2.50 | 2.00 | 3.10, 2.50, 2.00 |" in report  # the median admission, and every one's ratio
    assert "gain 6.00×, 5.50×, 4.00×, ITL p50 growth 1.20×, 1.44×, 1.50×" in report  # every round of 1 beside 8
    assert (
        "8 cache rows and the native decode attention (timed at export, µs a layer call: grouped 91, native 40)"
        in report
    )
    write_streams_report({"config": config, "machine": machine, "build_s": 1.0, "variant": "bfloat16",
                          "measured": measured | {"decode_attention": "grouped"}}, tmp_path)  # fmt: skip
    assert "8 cache rows and the grouped decode attention built in" in (tmp_path / "streams.md").read_text()  # older


def test_serve_report_compares_with_transformers_serve():
    from exporter.bench.serving import figures

    def server(name, cold, tps, texts):
        return {"server": name, "cold_start_first_token_s": cold, "tokens_per_s": tps, "texts": texts}

    results = {"servers": [
        server("aotpack serve", 2.0, 90.0, ["a", "b"]),
        server("transformers serve", 4.0, 20.0, ["a", "c"]),
        server("transformers serve --compile", 40.0, 30.0, ["a", "c"]),
        server("transformers serve --continuous-batching", 5.0, 50.0, ["x", "c"]),
    ]}  # fmt: skip
    found = figures(results)
    assert found.pop("tps_vs_llama_server") is None  # llama-server was not run
    assert found.pop("same_text_as_lone") is None  # nor the bundle alone
    assert found == pytest.approx(
        {
            "cold_vs_compile": 20.0,
            "cold_vs_plain": 0.5,
            "tps_vs_cb": 1.8,
            "same_text_as_plain": 1,
            "plain_same_as_cb": 1,
        }
    )
    results["servers"].append(server("llama-server", 1.0, 60.0, ["a", "b"]))
    results["lone_texts"] = ["a", "c"]
    found = figures(results)
    assert found["tps_vs_llama_server"] == pytest.approx(1.5) and found["same_text_as_lone"] == 1


@pytest.mark.heavy
def test_portable_cpu_isa_bundle(bundle, checkpoint, tmp_path):
    out = tmp_path / "portable"
    args = ["export", str(checkpoint("tiny-llama")), "--out", str(out), "--max-cache-len", "160", "--cpu-isa", "avx2"]
    assert aotpack(args) == 0
    portable = load(out)
    assert portable.manifest.cpu_isa == "AVX2"
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    native = load(bundle("tiny-llama"))
    assert torch.equal(
        portable.generate(input_ids=ids, max_new_tokens=20), native.generate(input_ids=ids, max_new_tokens=20)
    )


@pytest.mark.heavy
def test_seed_example_runs_offline(bundle):
    done = subprocess.run(
        [sys.executable, "examples/seed_gemma3.py", "--out", str(bundle("tiny-gemma3-vlm"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
