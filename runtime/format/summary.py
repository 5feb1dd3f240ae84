"""A readable summary of a bundle's manifest, for `aotpack inspect`.

Owns: presenting the manifest, including KV-cache memory against what a full-length cache needs.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

from runtime.format.files import GENERATION, GENERATION_DEFAULTS
from runtime.format.manifest import BF16_LOWERINGS, DENSE, NATIVE_ATTENTION, Manifest, chosen_lowerings
from runtime.format.quant import INTEGER


def kv_bytes(manifest: Manifest) -> tuple[int, int]:
    """(allocated KV bytes, bytes if every layer held max_cache_len slots)."""
    m = manifest
    full = sum(replace(layer, slots=m.max_cache_len).nbytes(m.batch_size, m.dtype) for layer in m.cache_layout)
    return sum(m.cache_bytes), full


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summary(m: Manifest, sizes: dict[str, int] | None = None, generation: dict | None = None) -> str:
    """`generation`: the bundle's generation_config.json, whose defaults are shown."""
    ring, full = kv_bytes(m)
    kinds = Counter((layer.kind, layer.slots) for layer in m.cache_layout)
    layers = ", ".join(f"{n}× {kind} ({slots} slots)" for (kind, slots), n in sorted(kinds.items()))
    lines = [
        f"model        {m.model_class}{' (image + text)' if m.is_multimodal else ''}",
        f"format       {m.format_version} (aotpack {m.aotpack_version}, built {m.built_at} in {m.build_seconds:.0f} s)",
        f"built with   torch {m.torch_version}, transformers {m.transformers_version}, Python {m.python_version}",
        f"target       {m.device}{f' ({m.cpu_isa})' if m.cpu_isa else ''}, {m.dtype}, "
        + (f"batch 1 to {m.batch_size} (graphs for {_listed(m.batches)} rows)" if m.batch_size > 1 else "batch 1"),
        f"cache        max_cache_len {m.max_cache_len}; {layers}",
        f"KV memory    {human(ring)} allocated; a full-length cache would need {human(full)}"
        + (f" ({full / ring:.2f}× more)" if full != ring else ""),
        f"decode       inputs {', '.join(m.decode_inputs)}, then {2 * len(m.cache_layout)} KV tensors; "
        f"{len(m.constants)} weight constants lent from the eager model",
        f"parity       {m.parity.steps} steps, max |Δlogit| {m.parity.max_abs_logit_diff:.2e} "
        f"(tolerance {m.parity.tolerance:.2e}), tokens match: {m.parity.tokens_match}",
        *_onnx_lines(m),
        *_quantization_lines(m),
        *_attention_lines(m),
        *_lowering_lines(m),
        *_generation_lines(generation),
        "files",
    ]
    for name, digest in sorted(m.files.items()):
        size = f"{human(sizes[name]):>10}  " if sizes and name in sizes else ""
        lines.append(f"  {size}{name}  sha256 {digest[:16]}…")
    return "\n".join(lines)


def _generation_lines(config: dict | None) -> list[str]:
    shown = {k: config[k] for k in GENERATION_DEFAULTS if config and config.get(k) is not None}
    if not shown:
        return ["generation   no defaults: greedy unless the caller samples"] if config is not None else []
    settings = ", ".join(f"{k} {json.dumps(v)}" for k, v in shown.items())
    return [f"generation   {settings} ({GENERATION}; the caller's options override them)"]


def _onnx_lines(m: Manifest) -> list[str]:
    o = m.onnx
    if o is None:
        return ["onnx         none (export with --onnx for the onnxruntime backend)"]
    return [
        f"onnx         {o.file} (opset {o.opset}), {len(o.initializers)} weights read from model.safetensors; "
        f"parity on ONNX Runtime {o.onnxruntime_version}: max |Δlogit| {o.parity.max_abs_logit_diff:.2e}, "
        f"tokens match: {o.parity.tokens_match}"
    ]


def _quantization_lines(m: Manifest) -> list[str]:
    lines = []
    q = m.quantization
    if q is not None:
        group = f", groups of {q.group_size}" if q.group_size else ", one scale per row"
        embedding = f" + embedding {q.embedding}" + (" (tied to the lm_head)" if q.tied else "") if q.embedding else ""
        lines.append(f"quantized    {q.method}{group}: {len(q.linears)} linear layers{embedding}")
        lines.append(f"  recipe     {_recipe(q)}")
        lines.append(f"  kernels    {_kernels(m)}")
    a = m.accuracy
    if a is not None:
        change = 100 * (a.perplexity / a.reference_perplexity - 1)
        lines.append(
            f"accuracy     perplexity {a.perplexity:.3f} vs float32 {a.reference_perplexity:.3f} ({change:+.2f} %) "
            f"on {a.text_tokens} tokens; greedy agreement {100 * a.greedy_agreement:.1f} % "
            f"over {a.greedy_tokens} tokens"
        )
    return lines


def _recipe(q) -> str:
    if q.method != "int4":
        return "every module at int8"
    scales = "scales fitted per group (mse)" if q.scales == "mse" else "scales from each group's range"
    if not q.int8_paths and not q.int5_paths:
        return f"{q.recipe}: every module at int4; {scales}"
    held = [(method, paths) for method, paths in (("int8", q.int8_paths), ("int5", q.int5_paths)) if paths]
    return f"{q.recipe}: {', '.join(_held(m, paths) for m, paths in held)}, the rest at int4; {scales}"


def _held(method: str, paths: tuple[str, ...]) -> str:
    kinds = Counter(path.rsplit(".", 1)[-1] for path in paths)
    listed = ", ".join(f"{n}× {kind}" if n > 1 else kind for kind, n in sorted(kinds.items()))
    return f"{len(paths)} modules at {method} ({listed})"


def _kernels(m: Manifest) -> str:
    q, n = m.quantization, m.native
    rates = ", ".join(f"{k} {v:.1f} GB/s" for k, v in q.kernel_rates.items())
    timed = f" (timed here: {rates})" if rates else " (chosen, not timed)"
    timed += f"; {q.kernel_noise}: the known-good family kept" if q.kernel_noise else ""
    if q.kernels != INTEGER:  # the bundle may still carry kernels.so, for its native attention
        return f"{q.kernels}: Inductor's dequantizing reductions, fp32 activations, layout {q.layout}{timed}"
    what = f"aotpack's {n.isa} kernels ({n.file}, {n.compiler}), int8 activations per block of 32"
    return f"{q.kernels}: {what}, layout {q.layout}{timed}"


def _attention_lines(m: Manifest) -> list[str]:
    a = m.decode_attention
    if a is None:
        return []
    timed = ", ".join(f"{name} {us:.0f} us" for name, us in a.us_per_call.items())
    own = f" (aotpack's {m.native.isa} kernel, {m.native.file})" if a.chosen == NATIVE_ATTENTION and m.native else ""
    return [f"attention    {a.chosen}{own}" + (f" (per layer over {a.span} slots: {timed})" if timed else " (untimed)")]


def _listed(numbers) -> str:
    return ", ".join(map(str, numbers))


def _timing(lw) -> str:
    """A lowering's candidates as timed: GB/s, the spread of each where recorded, and noise if judged so."""
    if not lw.gb_per_s:
        return " (untimed)"
    spread = {name: f" (median +{value:.0%})" for name, value in lw.spread.items()}
    rates = ", ".join(f"{name} {rate:.1f}{spread.get(name, '')}" for name, rate in lw.gb_per_s.items())
    return f" (GB/s: {rates})" + (f"; {lw.noisy}, kept the known-good choice" if lw.noisy else "")


def _lowering_lines(m: Manifest) -> list[str]:
    lines = []
    for graph in m.graphs:
        p = graph.parity
        lines.append(
            f"  {_graph_label(graph)}: compiled in {graph.compile_seconds:.0f} s, parity max |Δlogit| "
            f"{p.max_abs_logit_diff:.2e} over {p.steps} steps, tokens match: {p.tokens_match}"
        )
        lines += [f"    GEMV {lw.op} {lw.rows}x{lw.cols}: {lw.chosen}{_timing(lw)}" for lw in graph.lowerings]
    n = m.native
    if DENSE in chosen_lowerings(m):  # float graphs calling aotpack's GEMMs
        lines.append(f"  dense: aotpack's GEMM ({n.file}, built for {n.isa} by {n.compiler})")
    for name, how in BF16_LOWERINGS.items():
        if name in chosen_lowerings(m):
            lines.append(f"  {name}: aotpack's bf16 GEMM {how} ({n.file}, built for {n.isa} by {n.compiler})")
    return ["decode graphs one per batch, GEMV kernels chosen per weight shape at build time:", *lines]


def _graph_label(graph) -> str:
    if graph.chunk:
        return f"chunk ({graph.tokens} prompt tokens of one row, for text prompts)"
    return f"batch {graph.batch}" + (f" verify ({graph.tokens} tokens a row)" if graph.tokens > 1 else "")
