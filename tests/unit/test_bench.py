"""The benchmark's own plumbing, without running a model: a crashed worker is told from a failed one,
and llama.cpp is rerun on its plain CPU buffers (and the report says so) when its extra ones crash."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from exporter.bench import BenchError, build
from exporter.bench.report import plain_llama_note, steal_note

CONFIG = SimpleNamespace(new_tokens=4, threads=1, max_cache_len=64)


def test_a_worker_killed_by_a_signal_is_a_crash_and_says_which():
    with pytest.raises(build.WorkerCrashed, match="signal 11"):
        build.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])


def test_a_worker_that_fails_reports_its_exit_status_and_stderr():
    with pytest.raises(BenchError, match=r"exit 3\):\nboom") as e:
        build.run([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])
    assert not isinstance(e.value, build.WorkerCrashed)


def _crash_once(calls):
    def run(cmd, env=None):
        calls.append(cmd)
        if len(calls) == 1:
            raise build.WorkerCrashed("killed by signal 11")
        return json.dumps({"system": "llama_cpp", "dtype": "int8"})

    return run


def test_llama_cpp_crashing_on_its_extra_buffers_is_rerun_on_plain_ones(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(build, "run", _crash_once(calls))
    figures = build.measure("llama_cpp", tmp_path / "m.gguf", "int8", [1, 2], CONFIG, tmp_path)
    assert "--no-extra-bufts" not in calls[0] and calls[1][-1] == "--no-extra-bufts"
    assert figures["llama_cpp_extra_bufts"] is False
    assert "plain CPU buffers" in plain_llama_note([figures])[-1]


def test_only_llama_cpp_is_rerun_after_a_crash(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(build, "run", _crash_once(calls))
    with pytest.raises(build.WorkerCrashed):
        build.measure("aotpack", tmp_path, "int8", [1, 2], CONFIG, tmp_path)
    assert len(calls) == 1
    assert plain_llama_note([{"system": "aotpack", "dtype": "int8"}]) == []


def test_steal_is_the_share_of_cpu_ticks_stolen_and_reported_as_a_range():
    assert build.steal_share((1000, 10), (1400, 110)) == 0.25
    assert build.steal_share(None, (1, 1)) is None and build.steal_share((5, 1), (5, 1)) is None
    note = steal_note([{"cpu_steal": 0.1}, {"cpu_steal": 0.5}, {"cpu_steal": 0.3}, {"cpu_steal": None}])[-1]
    assert "median 30%, 10% to 50%" in note
    assert steal_note([{"system": "aotpack"}]) == []


def test_measure_records_the_steal_during_its_worker(monkeypatch, tmp_path):
    ticks = iter([(1000, 0), (2000, 400)])
    monkeypatch.setattr(build, "cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(build, "run", lambda cmd, env=None: json.dumps({"system": "aotpack"}))
    assert build.measure("aotpack", tmp_path, "int8", [1], CONFIG, tmp_path)["cpu_steal"] == 0.4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "add --serve and --streams N"),
        ({"serve": True, "streams": 8}, "add --llama-cpp-converter"),
        ({"serve": True, "streams": 8, "converter": True, "binary": "missing"}, "is not an executable file"),
    ],
    ids=["without --serve", "without a converter", "no such binary"],
)
def test_llama_server_is_refused_without_what_it_needs(tmp_path, options, message):
    from exporter.bench.config import BenchConfig

    converter = tmp_path / "convert_hf_to_gguf.py"
    converter.write_text("")
    binary = tmp_path / options.get("binary", "llama-server")
    if "binary" not in options:
        binary.write_text("")
        binary.chmod(0o755)
    with pytest.raises(BenchError, match=message):
        BenchConfig(
            dtypes=("float32",), llama_server=binary, serve=options.get("serve", False),
            streams=options.get("streams"), llama_cpp_converter=converter if options.get("converter") else None,
        )  # fmt: skip


def test_llama_server_gets_n_slots_of_the_bundles_cache(tmp_path):
    from exporter.bench.config import BenchConfig
    from exporter.bench.serving import llama_server_command

    (converter := tmp_path / "c.py").write_text("")
    (binary := tmp_path / "llama-server").write_text("")
    binary.chmod(0o755)
    config = BenchConfig(
        dtypes=("float32",), serve=True, streams=8, llama_server=binary, llama_cpp_converter=converter,
        max_cache_len=2048, threads=2,
    )  # fmt: skip
    command = llama_server_command(config, tmp_path / "m.gguf", 1234)
    assert command[command.index("--parallel") + 1] == "8" and command[command.index("-c") + 1] == str(8 * 2048)


@pytest.mark.parametrize(
    ("variant", "hf"), [({"dtypes": ("float32",)}, True), ({"dtypes": (), "quantize": ("int8",)}, False)]
)
def test_transformers_serve_runs_beside_float_bundles_only(monkeypatch, variant, hf):
    """It takes the checkpoint at a float dtype: a quantized bundle has no counterpart there (it was
    started with --dtype int8 and died), as in the batch-1 bench."""
    from exporter.bench import serving
    from exporter.bench.config import BenchConfig

    ran = {}
    monkeypatch.setattr(serving, "run_servers", lambda config, servers, prefix, log, **_: ran.update(servers) or {})
    monkeypatch.setattr(serving, "write_serve_report", lambda results, out: None)
    serving.bench_serve(BenchConfig(serve=True, streams=8, **variant))
    assert "aotpack serve" in ran and any(name in ran for name in serving.HF_SERVERS) == hf


def test_the_serve_report_gives_the_ratios_to_the_servers_that_ran(tmp_path):
    """An int8 run has aotpack serve and llama-server only (the report read transformers serve's figures
    unconditionally and raised KeyError after the whole run)."""
    from exporter.bench import serving

    def server(name, tps, cold, texts):
        figures = {"tokens_per_s": tps, "cold_start_first_token_s": cold, "ttft_p50_s": 0.1}
        return {"server": name, "texts": texts} | figures

    lone = [f"reply {i}" for i in range(8)]
    served = [*lone[:5], "x", "y", "z"]
    results = {
        "config": {"model": "m", "threads": 2, "streams": 8, "new_tokens": 64}, "machine": {"cpu": "cpu"},
        "variant": "int8", "build_s": 1.0, "lone_texts": lone,
        "servers": [server("aotpack serve", 300.0, 2.0, served), server("llama-server", 150, 1.0, lone)],
    }  # fmt: skip
    serving.write_serve_report(results, tmp_path)
    figures = json.loads((tmp_path / "serve.json").read_text())["figures"]
    assert figures["tps_vs_llama_server"] == 2.0 and figures["tps_vs_cb"] is None
    assert figures["same_text_as_lone"] == 5  # llama-server's replies are not compared: other weights
    report = (tmp_path / "serve.md").read_text()
    assert "| aggregate tokens/s, N clients ≥ 1.0× llama-server --parallel N | 2.00× | met |" in report
    assert "equal to the bundle's own, each prompt alone: 5 of 8" in report


@pytest.mark.parametrize(
    "options", [{}, {"serve": True, "streams": 4, "ray": True}], ids=["without --serve", "with --ray"]
)
def test_structured_is_refused_without_one_server_to_time(options):
    from exporter.bench.config import BenchConfig

    with pytest.raises(BenchError, match="--structured times constrained streams on a server"):
        BenchConfig(dtypes=("float32",), structured=True, **options)


def test_prefix_cache_report_puts_later_first_tokens_beside_the_first(tmp_path):
    from exporter.bench.config import BenchConfig
    from exporter.bench.modes import mode_of
    from exporter.bench.prefix import write_prefix_report

    assert mode_of(BenchConfig(dtypes=("float32",), serve=True, streams=2, prefix_cache=True)).report == "prefix.md"
    with pytest.raises(BenchError, match="--prefix-cache times one server's first tokens"):
        BenchConfig(dtypes=("float32",), prefix_cache=True)
    server = {"server": "aotpack serve", "prompt_tokens": 1020, "first_s": 4.0, "later_median_s": 0.5, "ratio": 0.125}
    server["cached_tokens"] = [0, 1000, 1000]
    results = {"config": {"model": "smollm2-135m", "threads": 2, "streams": 2, "long_prompt": 1000,
                          "max_cache_len": 2048}, "variant": "float32"}  # fmt: skip
    write_prefix_report(results | {"machine": {"cpu": "AMD EPYC"}, "servers": [server]}, tmp_path)
    assert "| aotpack serve | 1020 | 4.000 | 0.500 | 0.125× | 1000, 1000 |" in (tmp_path / "prefix.md").read_text()


def test_structured_report_puts_each_server_constrained_beside_free(tmp_path):
    from exporter.bench.config import BenchConfig
    from exporter.bench.modes import mode_of
    from exporter.bench.structured import write_structured_report

    assert mode_of(BenchConfig(dtypes=("int8",), serve=True, streams=8, structured=True)).report == "structured.md"

    def load(n: int, tps: float, itl: float, texts: list[str]) -> dict:
        timing = {"tokens_per_s": tps, "itl_p50_ms": itl, "itl_p99_ms": itl}
        return {"clients": n, "chunks": 64 * n, **timing, "texts": texts}

    servers = [
        {"server": "aotpack serve", "loads": {
            "free@1": load(1, 80.0, 12.0, ["Once"]), "json@1": load(1, 76.0, 12.5, ['{"story": "Once']),
            "free@8": load(8, 200.0, 40.0, ["x"] * 8), "json@8": load(8, 190.0, 42.0, ['{ "story":"'] * 7 + ["{}"]),
        }},
        {"server": "llama-server", "fallback": True, "loads": {
            "free@1": load(1, 60.0, 16.0, ["a"]), "json@1": load(1, 40.0, 24.0, ['{"story":"a']),
            "free@8": load(8, 70.0, 110.0, ["a"] * 8), "json@8": load(8, 50.0, 150.0, ['{"story":"a'] * 8),
        }},
    ]  # fmt: skip
    results = {"config": {"model": "gemma3-270m", "threads": 2, "streams": 8, "new_tokens": 64}, "variant": "int8"}
    write_structured_report(results | {"machine": {"cpu": "AMD EPYC"}, "servers": servers}, tmp_path)
    report = (tmp_path / "structured.md").read_text()
    assert "| aotpack serve | 1 | 80.0 | 76.0 | 12.0 | 12.5 | +0.50 | 1.042× | 1 of 1 |" in report
    assert "| aotpack serve | 8 | 200.0 | 190.0 | 40.0 | 42.0 | +2.00 | 1.050× | 7 of 8 |" in report
    assert "| llama-server (`-nr`) | 8 | 70.0 | 50.0 | 110.0 | 150.0 | +40.00 | 1.364× | 8 of 8 |" in report
    figures = json.loads((tmp_path / "structured.json").read_text())["figures"]
    assert figures["llama-server"]["1"]["itl_ratio"] == 1.5


def test_speculation_report_gives_each_tasks_ratio_and_a_verdict_per_target(tmp_path):
    from exporter.bench.config import BenchConfig
    from exporter.bench.speculation import FREE, GROUNDED, _summary, tasks, write_report

    def run(tps, tokens, drafted=0, accepted=0, verify=0):
        return {"tokens": tokens, "decode_tps": tps, "drafted": drafted, "accepted": accepted, "verify_steps": verify}

    grounded = _summary(GROUNDED, 200, {"plain": [run(20.0, [1, 2, 3])], "drafted": [run(44.0, [1, 2, 3], 8, 6, 2)]})
    free = _summary(FREE, 30, {"plain": [run(20.0, [4, 5])], "drafted": [run(18.0, [4, 6], 4, 0, 1)]})
    assert grounded["ratio"] == pytest.approx(2.2) and grounded["acceptance"] == 0.75 and grounded["identical"]
    assert grounded["tokens_per_verify"] == 4.0 and not free["identical"]
    assert {kind for kind, _ in tasks().values()} == {GROUNDED, FREE}
    config = BenchConfig(model="smollm2-135m", dtypes=("float32",), speculate=4)
    results = {
        "config": {"model": config.model, "threads": 2, "rounds": 1},
        "machine": {"cpu": "AMD EPYC", "isa": ["avx2"]},
        "variant": "float32",
        "measured": {"draft_tokens": 4, "tasks": {"edit": grounded, "story": free}},
    }
    write_report(results, tmp_path)
    report = (tmp_path / "speculation.md").read_text()
    assert "| edit | input-grounded | 200 | 3 | 20.0 | 44.0 | 2.20× | 75% | 4.00 | yes |" in report
    assert "| story | free text |" in report and "**no**" in report
    assert "input-grounded: drafted/plain decode tokens/s >= 1.8× | 2.20× (the lowest) | met |" in report
    assert "free text: drafted/plain decode tokens/s >= 0.95× | 0.90× (the lowest) | **not met** |" in report
    results["measured"]["streams"] = {"streams": 8, "plain_tps": 60.0, "drafted_tps": 75.0, "ratio": 1.25,
                                      "identical": True}  # fmt: skip
    write_report(results, tmp_path)
    report = (tmp_path / "speculation.md").read_text()
    assert "plain 60.0, drafted 75.0 (1.25×), tokens identical: yes" in report
    assert "| 8 streams, requests started together: tokens/s drafted/plain >= 1× | 1.25× | met |" in report
    clients = {"seconds": 30.0, "plain_tps": 100.0, "drafted_tps": 90.0, "ratio": 0.9, "identical": True,
               "requests": {"plain": 40, "drafted": 38}}  # fmt: skip
    results["measured"]["streams"]["clients"] = clients
    write_report(results, tmp_path)
    report = (tmp_path / "speculation.md").read_text()
    assert "plain 100.0, drafted 90.0 (0.90×), 40 and 38 replies, each identical to its client's first: yes" in report
    assert (
        "| 8 streams, clients asking again as each reply ends, 30 s: tokens/s drafted/plain >= 1× "
        "| 0.90× | **not met** |" in report
    )
    with pytest.raises(Exception, match="one variant in one process"):
        BenchConfig(model="x", dtypes=("float32",), speculate=4, streams=2, serve=True)


def test_speculation_clients_count_the_tokens_delivered_within_the_window(monkeypatch):
    """`--speculate K --streams N`'s clients: each asks again as its reply ends; tokens/s counts only the
    tokens stamped inside the window, and every reply is compared with its client's reference."""
    import time
    from types import SimpleNamespace

    import torch

    from exporter.bench import speculation

    monkeypatch.setattr(speculation, "STEADY_SECONDS", 0.3)

    class Handle:
        def __init__(self, prompt, drafts):
            self.prompt, self.times = prompt, []
            self.wrong = drafts is None and prompt == 1  # drafting changes client 1's reply: must be caught

        def __iter__(self):
            for t in range(3):
                time.sleep(0.02)
                self.times.append(time.monotonic())
                yield torch.tensor([10 * self.prompt + t + self.wrong]), None

    engine = SimpleNamespace(steps=0, verify_steps=0, drafted=0, accepted=0)
    rt = SimpleNamespace(
        engine=engine, submit=lambda p, prompt_lookup_num_tokens, **_: Handle(p, prompt_lookup_num_tokens)
    )
    config = SimpleNamespace(streams=2, rounds=1, new_tokens=3)
    reference = [[0, 1, 2], [10, 11, 12]]  # client i's reply to prompt i
    out = speculation._steady(rt, [0, 1], config, lambda *_: None, reference)
    assert not out["identical"] and out["requests"]["plain"] >= 8
    # 2 clients, a token each 20 ms: about 100 tokens/s, never more
    assert 50 < out["plain_tps"] <= 2 / 0.02 and 50 < out["drafted_tps"] <= 2 / 0.02


def test_one_stream_and_many_are_measured_in_turn_and_the_median_round_kept(monkeypatch):
    """The machine's speed drifts between rounds; within one it falls on both sides alike, so the streams
    bench alternates one stream and N and keeps the round with the median gain, listing every round's."""
    from exporter.bench import streams

    rates = iter([100.0, 600.0, 150.0, 600.0, 120.0, 600.0])  # gains 6.0, 4.0, 5.0
    calls = []

    def concurrent(rt, prompts, new_tokens):
        calls.append(len(prompts))
        return {"streams": len(prompts), "tokens_per_s": next(rates), "itl_p50_ms": 10.0 * len(prompts)}

    monkeypatch.setattr(streams, "concurrent", concurrent)
    got = streams.side_by_side(None, list("abcdefgh"), 8)
    assert calls == [1, 8, 1, 8, 1, 8]
    assert got["one"]["tokens_per_s"] == 120.0 and got["many"]["tokens_per_s"] == 600.0  # the median gain, 5.0
    assert got["rounds_gain"] == [6.0, 4.0, 5.0] and got["rounds_itl_growth"] == [8.0, 8.0, 8.0]


def test_each_admission_is_run_a_few_times_and_the_median_kept(monkeypatch):
    """One admission's p99 is nearly its largest gap, so the streams bench runs each way of prefilling on
    distinct long prompts and keeps the admission with the median ratio, listing every one."""
    from exporter.bench import streams

    ratios = iter([4.0, 2.0, 2.5])
    seen = []

    def admission(rt, prompts, long_prompt, new_tokens, chunk, budget):
        seen.append(long_prompt)
        return {"p99_over_p50": next(ratios), "prompt": long_prompt}

    monkeypatch.setattr(streams, "admission", admission)
    got = streams.admissions(None, [], ["a", "b", "c"], 8, 32, 1.0)
    assert got == {"p99_over_p50": 2.5, "prompt": "c", "rounds_p99_over_p50": [4.0, 2.0, 2.5]}
    assert seen == ["a", "b", "c"]
