"""Benchmark output: bench.json (every figure), bench.md (tables) and bench.png (chart).

Owns: the per-system medians over rounds, the derived figures (roofline percentages, ratios against
the issue's targets) and their presentation. Pure functions of the results dictionary.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from exporter.bench.llama_cpp import GGUF_TYPE
from exporter.bench.worker import WARM_REQUESTS

LABELS = {
    "hf_eager": "HF eager (static cache)",
    "hf_compile": "HF + torch.compile",
    "aotpack": "aotpack",
    "aotpack_onnx": "aotpack, ONNX Runtime decode",
    "aotpack_onnx_prepacked": "aotpack, ONNX Runtime decode, prepacked",
    "llama_cpp": "llama.cpp",
}
# decode speed against llama.cpp at the matching precision: the cache-size issue's targets for the float
# variants, the integer-kernel issue's for the quantized ones
LLAMA_TARGETS = {"float32": 0.9, "bfloat16": 0.9, "int8": 1.25, "int4": 1.25}
RSS_TARGETS = {"int8": 0.35, "int4": 0.2}  # peak RSS against the float32 bundle's
PERPLEXITY_TARGETS = {"int8": 1.0}  # % above the float32 model's perplexity
LLAMA_PERPLEXITY_TARGETS = {"int4": 0.0}  # % above llama.cpp's at the matching GGUF type (Q4_K_M), same text


# (target, figure key, how the measured figure reads)
TARGETS = (
    (
        "decode ≥ 70 % of the bandwidth floor",
        "pct_of_floor",
        lambda d: f"{d['pct_of_floor']:.0f} % (floor {d['floor_ms']:.3g} ms/tok at {d['bandwidth_gb_s']:.1f} GB/s)",
    ),
    (
        "(not a target) decode vs torch's GEMV ceiling",
        "pct_of_gemv_floor",
        lambda d: (
            f"{d['pct_of_gemv_floor']:.0f} % (ceiling {d['gemv_floor_ms']:.3g} ms/tok at {d['gemv_gb_s']:.1f} GB/s)"
        ),
    ),
    ("decode ≥ 1.5× HF eager", "decode_speedup_vs_eager", lambda d: f"{d['decode_speedup_vs_eager']:.2f}×"),
    (
        "decode ≥ 1.2× HF + torch.compile",
        "decode_speedup_vs_compile",
        lambda d: f"{d['decode_speedup_vs_compile']:.2f}×",
    ),
    (
        "first request ≥ 10× shorter than HF + torch.compile",
        "first_request_speedup_vs_compile",
        lambda d: f"{d['first_request_speedup_vs_compile']:.1f}× shorter",
    ),
    (
        "first request ≤ HF eager's",
        "first_request_vs_eager",
        lambda d: f"{d['first_request_vs_eager']:.2f}× HF eager's",
    ),
    ("peak RSS ≤ 1.1× HF eager's", "rss_vs_eager", lambda d: f"{d['rss_vs_eager']:.2f}×"),
    ("bundle build ≤ 180 s", "build_s", lambda d: f"{d['build_s']:.0f} s"),
    ("greedy tokens equal HF eager's", "tokens_equal_eager", lambda d: str(d["tokens_equal_eager"])),
    (
        "decode ≥ {llama_target}× llama.cpp {gguf}",
        "decode_vs_llama_cpp",
        lambda d: f"{d['decode_vs_llama_cpp']:.2f}× ({d['llama_cpp_ms']:.1f} ms/tok)",
    ),
    ("peak RSS ≤ {rss_target}× the float32 bundle's", "rss_vs_float32", lambda d: f"{d['rss_vs_float32']:.2f}×"),
    (
        "perplexity ≤ {ppl_target} % above float32's",
        "perplexity_change_pct",
        lambda d: f"{d['perplexity_change_pct']:+.2f} % ({d['perplexity']:.3f} vs {d['reference_perplexity']:.3f})",
    ),
    (
        "perplexity ≤ llama.cpp {gguf}'s{llama_ppl}",
        "perplexity_vs_llama_cpp_pct",
        lambda d: (
            f"{d['perplexity_vs_llama_cpp_pct']:+.2f} % ({d['perplexity']:.3f} vs {d['llama_cpp_perplexity']:.3f})"
        ),
    ),
    ("decode faster than int8's", "speedup_vs_int8", lambda d: f"{d['speedup_vs_int8']:.2f}× int8's speed"),
    (
        "(not a target) ONNX Runtime decode vs AOTInductor's",
        "onnx_vs_aoti",
        lambda d: f"{d['onnx_vs_aoti']:.2f}× ({d['onnx_ms']:.1f} ms/tok; prepacked {d['onnx_prepacked_vs_aoti']:.2f}×)",
    ),
    (
        "(not a target) ONNX Runtime decode's tokens equal AOTInductor's",
        "onnx_tokens_equal",
        lambda d: str(d["onnx_tokens_equal"]),
    ),
    (
        "(not a target) greedy agreement with float32 over 256 tokens",
        "greedy_agreement",
        lambda d: f"{100 * d['greedy_agreement']:.1f} %",
    ),
)


# target key -> (comparison, threshold for a variant or None): the verdict uses the unrounded figure
BOUNDS = {
    "pct_of_floor": (">=", lambda v: 70.0),
    "decode_speedup_vs_eager": (">=", lambda v: 1.5),
    "decode_speedup_vs_compile": (">=", lambda v: 1.2),
    "first_request_speedup_vs_compile": (">=", lambda v: 10.0),
    "first_request_vs_eager": ("<=", lambda v: 1.0),
    "rss_vs_eager": ("<=", lambda v: 1.1),
    "build_s": ("<=", lambda v: 180.0),
    "tokens_equal_eager": ("==", lambda v: True),
    "decode_vs_llama_cpp": (">=", LLAMA_TARGETS.get),
    "rss_vs_float32": ("<=", RSS_TARGETS.get),
    "perplexity_change_pct": ("<=", PERPLEXITY_TARGETS.get),
    "perplexity_vs_llama_cpp_pct": ("<=", LLAMA_PERPLEXITY_TARGETS.get),
    "speedup_vs_int8": (">", lambda v: 1.0 if v == "int4" else None),
}


def verdict(key: str, variant: str, value) -> str:
    """'met', 'not met', or '' for a figure that is not a target for this variant."""
    compare, bound = BOUNDS.get(key, (None, lambda v: None))
    return verdict_of(value, (compare, bound(variant)))


def verdict_of(value, bound: tuple) -> str:
    """'met' or 'not met' against (comparison, threshold); '' where the threshold is None."""
    compare, threshold = bound
    if threshold is None:
        return ""
    ok = {
        ">=": value >= threshold,
        "<=": value <= threshold,
        "<": value < threshold,
        ">": value > threshold,
        "==": value == threshold,
    }
    return "met" if ok[compare] else "**not met**"


def variants(results: dict) -> list[str]:
    return results.get("variants") or results["config"]["dtypes"]


# how a templated target reads for a variant that has no such target but has the figure
UNTARGETED = {
    "decode ≥ {llama_target}× llama.cpp {gguf}": "(not a target) decode vs llama.cpp {gguf}",
    "peak RSS ≤ {rss_target}× the float32 bundle's": "(not a target) peak RSS vs the float32 bundle's",
    "perplexity ≤ {ppl_target} % above float32's": "(not a target) perplexity vs float32's",
    "perplexity ≤ llama.cpp {gguf}'s{llama_ppl}": "(not a target) perplexity vs llama.cpp {gguf}'s",
}


def _label(template: str, variant: str) -> str:
    fields = {
        "llama_target": LLAMA_TARGETS.get(variant),
        "rss_target": RSS_TARGETS.get(variant),
        "ppl_target": PERPLEXITY_TARGETS.get(variant),
        "llama_ppl": "" if variant in LLAMA_PERPLEXITY_TARGETS else None,
    }
    if any(value is None and "{" + key + "}" in template for key, value in fields.items()):
        template = UNTARGETED[template]
    return template.format(gguf=GGUF_TYPE.get(variant, ""), **fields)


FIGURES = ("time_to_first_token_s", "first_request_s", "prefill_ms", "decode_ms_per_token", "peak_rss_mib")


def _median_run(runs: list[dict]) -> dict:
    """One system in one dtype over its rounds: the median of each figure, the decode range, and
    whether every round chose the same tokens."""
    out = {key: statistics.median(r[key] for r in runs) for key in FIGURES}
    decode = [r["decode_ms_per_token"] for r in runs]
    return out | {
        "system": runs[0]["system"],
        "dtype": runs[0]["dtype"],
        "rounds": len(runs),
        "decode_range_ms": [min(decode), max(decode)],
        "tokens": runs[0]["tokens"],
        "tokens_stable": all(r["tokens"] == runs[0]["tokens"] and r.get("tokens_stable", True) for r in runs),
    }


def medians(results: dict) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in results["runs"]:
        groups.setdefault((run["dtype"], run["system"]), []).append(run)
    return [_median_run(runs) for runs in groups.values()]


def _run(summary: list[dict], system: str, dtype: str) -> dict | None:
    return next((r for r in summary if r["system"] == system and r["dtype"] == dtype), None)


def _round_floors(results: dict, dtype: str) -> dict[int, dict]:
    """Per round: the bandwidth floor and torch's GEMV ceiling (ms/token) from that round's read rates."""
    step = results[f"step_bytes_{dtype}"]
    floors = {}
    for rate in (r for r in results["read_rates"] if r["dtype"] == dtype):
        floor = {
            "floor_ms": step["total_bytes"] / rate["bandwidth_gb_s"] / 1e6,
            "bandwidth_gb_s": rate["bandwidth_gb_s"],
        }
        if "gemv_gb_s" in rate:  # float variants: torch's own GEMV over the model's largest weight
            gemv_s = step["weight_bytes"] / rate["gemv_gb_s"] + step["kv_bytes"] / rate["bandwidth_gb_s"]
            floor |= {"gemv_floor_ms": gemv_s / 1e6, "gemv_gb_s": rate["gemv_gb_s"]}
        floors[rate["round"]] = floor
    return floors


def _roofline(results: dict, dtype: str) -> dict:
    """Medians over rounds of the floors, and of aotpack's decode as a percentage of each, taken
    round by round (each round's floor is measured beside that round's decode)."""
    floors = _round_floors(results, dtype)
    out = {key: statistics.median(f[key] for f in floors.values()) for key in next(iter(floors.values()))}
    decode = {
        r["round"]: r["decode_ms_per_token"]
        for r in results["runs"]
        if r["system"] == "aotpack" and r["dtype"] == dtype
    }
    if decode:
        for key, pct in (("floor_ms", "pct_of_floor"), ("gemv_floor_ms", "pct_of_gemv_floor")):
            if key in out:
                out[pct] = statistics.median(100 * floors[n][key] / ms for n, ms in decode.items())
    return out


def derived(results: dict, summary: list[dict]) -> dict:
    """Per variant: floors, % of them, and each target ratio (absent where a system was not run)."""
    out = {}
    for dtype in variants(results):
        aot, eager, comp = (_run(summary, s, dtype) for s in ("aotpack", "hf_eager", "hf_compile"))
        d = _roofline(results, dtype) | {"build_s": results["builds"][dtype]}
        if aot and eager:
            d["decode_speedup_vs_eager"] = eager["decode_ms_per_token"] / aot["decode_ms_per_token"]
            d["first_request_vs_eager"] = aot["first_request_s"] / eager["first_request_s"]
            d["rss_vs_eager"] = aot["peak_rss_mib"] / eager["peak_rss_mib"]
            d["tokens_equal_eager"] = (
                aot["tokens"] == eager["tokens"] and aot["tokens_stable"] and eager["tokens_stable"]
            )
        if aot and comp:
            d["decode_speedup_vs_compile"] = comp["decode_ms_per_token"] / aot["decode_ms_per_token"]
            d["first_request_speedup_vs_compile"] = comp["first_request_s"] / aot["first_request_s"]
        out[dtype] = d | _against_llama_and_float32(results, summary, dtype, aot) | _against_onnx(summary, dtype, aot)
    return out


def _against_onnx(summary: list[dict], variant: str, aot: dict | None) -> dict:
    """aotpack's AOTInductor decode against its ONNX Runtime decode of the same bundle (speed ratio, as
    AOTInductor's ms over ONNX Runtime's: below 1 is slower), and whether they chose the same tokens."""
    onnx, prepacked = _run(summary, "aotpack_onnx", variant), _run(summary, "aotpack_onnx_prepacked", variant)
    if not (aot and onnx and prepacked):
        return {}
    return {
        "onnx_ms": onnx["decode_ms_per_token"],
        "onnx_vs_aoti": aot["decode_ms_per_token"] / onnx["decode_ms_per_token"],
        "onnx_prepacked_vs_aoti": aot["decode_ms_per_token"] / prepacked["decode_ms_per_token"],
        "onnx_tokens_equal": onnx["tokens"] == aot["tokens"] == prepacked["tokens"],
    }


def _against_llama_and_float32(results: dict, summary: list[dict], variant: str, aot: dict | None) -> dict:
    d = {}
    llama, float32 = _run(summary, "llama_cpp", variant), _run(summary, "aotpack", "float32")
    if aot and llama:
        d["llama_cpp_ms"] = llama["decode_ms_per_token"]
        d["decode_vs_llama_cpp"] = llama["decode_ms_per_token"] / aot["decode_ms_per_token"]
    if aot and float32 and variant in RSS_TARGETS:
        d["rss_vs_float32"] = aot["peak_rss_mib"] / float32["peak_rss_mib"]
    accuracy = results.get("accuracy", {}).get(variant)
    if accuracy:
        d |= {key: accuracy[key] for key in ("perplexity", "reference_perplexity", "greedy_agreement")}
        d["perplexity_change_pct"] = 100 * (accuracy["perplexity"] / accuracy["reference_perplexity"] - 1)
    llama_ppl = results.get("llama_cpp_perplexity", {}).get(variant)
    if accuracy and llama_ppl:
        d["llama_cpp_perplexity"] = llama_ppl
        d["perplexity_vs_llama_cpp_pct"] = 100 * (accuracy["perplexity"] / llama_ppl - 1)
    int8 = _run(summary, "aotpack", "int8")
    if aot and int8 and variant == "int4":
        d["speedup_vs_int8"] = int8["decode_ms_per_token"] / aot["decode_ms_per_token"]
    return d


def markdown(results: dict, summary: list[dict], figures: dict) -> str:
    c, m = results["config"], results["machine"]
    rounds = c.get("rounds", 1)
    flags = "".join(f" --dtype {d}" for d in c.get("dtypes", ()))
    flags += "".join(f" --quantize {q}" for q in c.get("quantize", ()))
    flags += " --onnx" if c.get("onnx") else ""
    flags += " --llama-cpp-converter …" if c.get("llama_cpp_converter") else ""
    cpu = m["cpu"] + (f" ({', '.join(m['isa'])})" if m.get("isa") else "")
    lines = [
        (
            f"`aotpack bench --model {c['model']}{flags} --rounds {rounds}`: prompt {c['prompt_len']} tokens, "
            f"{c['new_tokens']} new tokens, greedy, batch 1, {c['threads']} threads; {cpu}. Each figure is the "
            f"median over {rounds} fresh-process round(s), each over every variant and system in turn; "
            f"decode is the median step of {WARM_REQUESTS} warm requests per round, with its range over rounds."
        ),
        "",
        "| variant | system | time to first token | first request | prefill | decode | tok/s | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        low, high = r["decode_range_ms"]
        spread = f" ({low:.1f}–{high:.1f})" if r["rounds"] > 1 else ""
        lines.append(
            f"| {r['dtype']} | {_system_label(r)} | {r['time_to_first_token_s']:.2f} s | "
            f"{r['first_request_s']:.2f} s | {r['prefill_ms']:.0f} ms | "
            f"{r['decode_ms_per_token']:.1f} ms/tok{spread} | {1e3 / r['decode_ms_per_token']:.1f} | "
            f"{r['peak_rss_mib']:.0f} MiB |"
        )
    lines += ["", "| variant | target | measured | verdict |", "|---|---|---|---|"]
    for dtype, d in figures.items():
        for label, key, show in TARGETS:
            if key in d:
                lines.append(f"| {dtype} | {_label(label, dtype)} | {show(d)} | {verdict(key, dtype, d[key])} |")
    rows, cols = results[f"step_bytes_{variants(results)[0]}"]["largest_weight"]
    gemv = ", ".join(f"{d['gemv_gb_s']:.1f} GB/s in {dtype}" for dtype, d in figures.items() if "gemv_gb_s" in d)
    lines += [
        "",
        (
            f"torch's GEMV ceiling: torch's own batch-1 `linear` over a {rows}×{cols} weight (the model's largest) "
            f"reads {gemv}; every system's decode step is a chain of such calls, so this rate, not the bandwidth, "
            "bounds it."
        ),
        "",
        f"torch.compile: {results['hf_compile_how']}.",
        *plain_llama_note(results["runs"]),
        *steal_note(results["runs"]),
    ]
    return "\n".join(lines) + "\n"


def attention_choice(manifest) -> dict | None:
    """A bundle's decode attention as a report keeps it: the kernel its export chose and each candidate's
    time per layer call there ({} when it was named, not timed); None for the model's own attention."""
    a = manifest.decode_attention
    return {"chosen": a.chosen, "us_per_call": dict(a.us_per_call)} if a else None


def attention_words(choice: dict | str | None) -> str:
    """`choice` (attention_choice's, or the kernel's name alone, as older reports kept it) as words: "the
    grouped decode attention (timed at export, µs a layer call: flash 120, grouped 90)"."""
    if not choice:
        return ""
    if isinstance(choice, str):
        return f"the {choice} decode attention"
    timed = ", ".join(f"{name} {us:.0f}" for name, us in choice["us_per_call"].items())
    return f"the {choice['chosen']} decode attention" + (
        f" (timed at export, µs a layer call: {timed})" if timed else ""
    )


def steal_note(runs: list[dict]) -> list[str]:
    """How much CPU time the hypervisor took while the systems ran: figures from a round with much
    steal are slower for reasons outside every system."""
    shares = sorted(r["cpu_steal"] for r in runs if r.get("cpu_steal") is not None)
    if not shares:
        return []
    return [
        "",
        f"CPU steal (time the hypervisor gave other guests) during the runs: median {statistics.median(shares):.0%}, "
        f"{shares[0]:.0%} to {shares[-1]:.0%}.",
    ]


def plain_llama_note(runs: list[dict]) -> list[str]:
    plain = sorted({r["dtype"] for r in runs if r.get("llama_cpp_extra_bufts") is False})
    if not plain:
        return []
    return [
        "",
        f"llama.cpp ({', '.join(plain)}): its extra CPU buffer types (AMX, repacked weights) crashed the process "
        "(SIGSEGV), so it ran on its plain CPU buffers (`use_extra_bufts = false`).",
    ]


def _system_label(run: dict) -> str:
    if run["system"] == "llama_cpp":
        return f"llama.cpp ({GGUF_TYPE.get(run['dtype'], run['dtype'])})"
    return LABELS[run["system"]]


def chart(results: dict, summary: list[dict], figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    dtypes = variants(results)
    systems = [s for s in LABELS if any(r["system"] == s for r in summary)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        runs = [_run(summary, system, d) for d in dtypes]
        xs = [j + i * width for j in range(len(dtypes))]
        bars = ax1.bar(xs, [r["first_request_s"] if r else 0 for r in runs], width, alpha=0.35)
        ax1.bar(
            xs, [r["time_to_first_token_s"] if r else 0 for r in runs], width, color=bars.patches[0].get_facecolor()[:3]
        )
        ax2.bar(xs, [1e3 / r["decode_ms_per_token"] if r else 0 for r in runs], width, label=LABELS[system])
    for j, dtype in enumerate(dtypes):
        roof = 1e3 / figures[dtype]["floor_ms"]
        span = (j - width / 2, j + width * (len(systems) - 0.5))
        ax2.hlines(roof, *span, colors="black", linestyles="dashed", label="bandwidth roofline" if j == 0 else None)
        if "gemv_floor_ms" in figures[dtype]:
            ceiling = 1e3 / figures[dtype]["gemv_floor_ms"]
            ax2.hlines(
                ceiling, *span, colors="gray", linestyles="dotted", label="torch GEMV ceiling" if j == 0 else None
            )
    titles = ("time to first token (dark) and first request (light), s from process start", "steady decode (tokens/s)")
    for ax, title in zip((ax1, ax2), titles, strict=True):
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(dtypes))], dtypes)
        ax.set_title(title, fontsize=9)
    ax1.set_yscale("log")
    ax1.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax2.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"{results['config']['model']}: {results['machine']['cpu']}, {results['config']['threads']} threads", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(results: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = medians(results)
    figures = derived(results, summary)
    (out / "bench.json").write_text(json.dumps(results | {"medians": summary, "derived": figures}, indent=2))
    (out / "bench.md").write_text(markdown(results, summary, figures))
    chart(results, summary, figures, out / "bench.png")
