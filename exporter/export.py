"""`export()`: checkpoint in, complete bundle out, or no bundle at all.

Owns: the order of the build stages. Everything is built in a staging directory beside the target and
moved into place only after the parity gate passed (exporter.landing), so a failed or interrupted
export leaves the target exactly as it was.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from exporter import attention as decode_attention
from exporter import generation, kernels, quant_family, quantize, templates
from exporter.accuracy import accuracy, reference
from exporter.compat import package_metadata_and_constants
from exporter.compile import compile_graph, export_decode, inductor_options, native_options, package_graphs
from exporter.config import ExportConfig
from exporter.constants import constant_sources
from exporter.landing import land, readable_by_all, signals_abort, staging_dir
from exporter.lowering import MAX_FUSED_ROWS, fixed, forget_timed_weights, lower, tune, weight_shapes
from exporter.model import cache_layout, decode_module, is_multimodal, load_model, text_config
from exporter.onnx_export import export_onnx
from exporter.parity import check_parity
from exporter.progress import Progress
from exporter.quant_family import Family
from exporter.siblings import fuse_siblings
from exporter.source import checkpoint_dir
from exporter.write import write_model
from runtime.backends.aoti import CompiledDecode
from runtime.backends.onnxruntime import OnnxRuntimeDecode
from runtime.errors import ExportError
from runtime.format.contract import INPUT_NAMES, DecodeContract, graph_name, graph_title
from runtime.format.files import DECODE, DECODE_ONNX, KERNELS, MANIFEST, sha256
from runtime.format.manifest import (
    AOTPACK_VERSION,
    BF16_LOWERINGS,
    DENSE,
    DPBF16,
    FORMAT_VERSION,
    KERNEL_LOWERINGS,
    TILES,
    DecodeGraph,
    Manifest,
    Parity,
    Quantization,
    integer_kernels,
)
from runtime.format.quant import INTEGER
from runtime.format.signing import sign


def export(config: ExportConfig, log=print, progress: Progress | None = None) -> Manifest:
    """Build the bundle and land it at `config.out` whole, or leave nothing. `progress` times and shows
    each stage (load, trace, tune, compile, write, parity); by default only `log` hears of them."""
    out, progress = config.out, progress or Progress(log, live=False)
    with staging_dir(out) as staging, signals_abort() as received:  # Ctrl-C must not leave half a bundle
        try:
            manifest = _build(config, staging, progress)
        finally:
            forget_timed_weights()  # a failed build's too
        readable_by_all(staging)
        if config.sign_key is not None:
            with progress.stage("sign", f"signing with {config.sign_key}"):
                sign(staging, config.sign_key)
        if received:  # the interrupt was swallowed somewhere inside the build: do not land
            raise ExportError(f"export interrupted by signal {received[0]}; {out} was left as it was")
        land(staging, out)
    return manifest


def _build(config: ExportConfig, staging: Path, progress: Progress) -> Manifest:
    start, stage = time.perf_counter(), progress.stage
    with stage("load", f"loading {config.model}"), checkpoint_dir(config.model) as checkpoint:
        model, attention = load_model(checkpoint, config.dtype, config.device)  # refuses unsupported classes first
        preprocessor = _load_preprocessor(checkpoint)
        templates.apply(preprocessor, config.chat_template, config.response_template)
        tokenizer = getattr(preprocessor, "tokenizer", preprocessor)
        defaults = generation.merged(model.generation_config, config.generation, text_config(model).vocab_size)
        float32 = model if config.dtype == "float32" else None  # a float32 export scores its own model
        if config.measures_accuracy and float32 is None:
            float32 = load_model(checkpoint, "float32", config.device)[0]
    plan = None
    if config.quantize:  # refuses what cannot be packed before anything is scored or compiled
        plan = quantize.plan(model, config.quant_spec(INTEGER), config.recipe, config.scale_search)
    ref = None
    if config.measures_accuracy:  # the float32 model is scored before any conversion
        with stage("score", "scoring the float32 model on the accuracy text"):
            ref = reference(float32, tokenizer)
    del float32
    quantization, family = _quantize(config, model, plan, progress) if plan else (None, None)
    integer = integer_kernels(quantization)
    native = family.built if integer else _float_kernels(config, progress)  # Inductor's family: as float graphs
    layout = cache_layout(model, config.max_cache_len, config.speculate, config.chunk_graph)
    step = decode_module(model, layout)
    contract = DecodeContract(
        layout, config.batch_size, config.max_cache_len, config.dtype, config.device, config.speculate,
        config.chunk_graph,
    )  # fmt: skip
    options = inductor_options(config.device, config.cpu_isa, contract, None, quantization)
    kernel = _attention(model, config, attention, options, progress, native is not None)
    graphs, package = _compile_graphs(config, model, step, contract, kernel, quantization, native, progress, staging)
    forget_timed_weights()  # the tuning's held weights, kept between the graphs
    if not integer and not _calls_kernels((lw for g in graphs for lw in g.lowerings), kernel):
        native = None  # no graph calls the kernels: the bundle goes without them
    with stage("write", "writing weights, tokenizer and configs"):
        aliases = write_model(model, preprocessor, staging, defaults)
        manifest = _draft_manifest(config, model, step, layout, package, aliases)
        if native is not None:
            shutil.copyfile(native.path, staging / KERNELS)
    manifest = replace(
        manifest, attn_implementation=attention, quantization=quantization, graphs=tuple(graphs),
        decode_attention=kernel, native=native and native.record, draft_tokens=config.speculate,
        chunk_tokens=config.chunk_graph,
    )  # fmt: skip
    if config.onnx:
        with stage("onnx", "exporting the decode step to ONNX (decode.onnx) for ONNX Runtime"):
            manifest = replace(manifest, onnx=export_onnx(model, layout, contract, staging, aliases))
    with stage("parity", "checking parity against eager generate, each graph at its batch"):
        manifest = _parity(config, staging, manifest, model, tokenizer, package, contract)
    return _finish(config, staging, manifest, model, ref, start)


def _compile_graphs(config, model, step, contract, kernel, quantization, native, progress, staging: Path):
    """Every batch bucket's decode graph, with --speculate its verify graph, and with --chunk-graph the
    chunk graph, compiled in turn (each C++ compile already uses every core) and packaged into one
    decode.pt2; returns (the graphs' manifest entries, the package)."""
    graphs, files = [], {}
    integer = integer_kernels(quantization)
    record = native.record if native and integer else None  # other graphs link them if they call them
    shapes = [(b, 1, False) for b in config.buckets]
    shapes += [(b, config.speculate + 1, False) for b in config.buckets if config.speculate]
    shapes += [(1, config.chunk_graph, True)] if config.chunk_graph else []
    with tempfile.TemporaryDirectory(prefix="aotpack-graphs-") as compiled:  # each graph's own files
        for shape in shapes:
            into = Path(compiled) / graph_name(*shape)
            options = inductor_options(
                config.device, config.cpu_isa, contract, shape[0], quantization, record, *shape[1:]
            )
            with kernels.linkable(native):
                graph, files[shape] = _compile_graph(
                    config, model, step, contract, kernel, shape, options, native, progress, into
                )
            graphs.append(graph)
        return graphs, package_graphs(files, staging / DECODE)


def _quantize(config: ExportConfig, model, plan: Quantization, progress: Progress) -> tuple[Quantization, Family]:
    """The model's layers quantized in place, by the kernel family chosen for this machine. `plan`: the
    bundle's quantization as planned, before that choice."""
    shapes = {p: tuple(model.get_submodule(p).weight.shape) for p in (*plan.linears, *filter(None, [plan.embedding]))}
    with progress.stage("kernels", "choosing the quantized layers' kernels"):
        family = quant_family.choose(config, plan, shapes, progress.log)
    plan = quantize.plan(model, config.quant_spec(family.kernels), config.recipe, config.scale_search)
    plan = replace(plan, kernel_rates=family.rates, kernel_noise=family.noise)
    with progress.stage("quantize", f"quantizing: {plan.method} {plan.recipe}, {plan.kernels} kernels"):
        quantize.quantize_model(model, plan)
    return plan, family


def _compile_graph(config, model, step, contract, kernel, shape, options: dict, native, progress: Progress, into):
    """The graph for exactly `shape` = (batch rows, tokens a row, whether it is the chunk graph): traced,
    its GEMV kernels chosen for its batch x tokens activation rows, compiled (its files kept in the
    directory `into`; linked against aotpack's kernels `native` where a lowering calls them). Returns (its
    manifest entry, parity still to check; the files)."""
    (batch, tokens, chunk), start, stage = shape, time.perf_counter(), progress.stage
    what = graph_title(batch, tokens, chunk)
    message = f"exporting the {what} of {type(model).__name__} ({len(contract.layout)} layers, "
    with stage("trace", message + f"cache {config.max_cache_len})"), decode_attention.installed(model, kernel):
        exported = export_decode(step.without_head() if chunk else step, contract, batch, tokens)
    lowerings = _lowerings(config, weight_shapes(exported), options, batch * tokens, progress, _own(config, native))
    if native is not None and _calls_kernels(lowerings, kernel):
        options = options | native_options(native.record)
    lowered = lower(exported, lowerings)
    if saved := fuse_siblings(lowered):
        progress.log(f"sibling layers on the same activations in one kernel call each: {saved} calls fewer a step")
    with stage("compile", f"compiling with AOTInductor: the {what}"):
        files = compile_graph(lowered, options, into)
    seconds = round(time.perf_counter() - start, 1)
    return DecodeGraph(batch, lowerings, Parity(0, 0.0, 0.0, False), seconds, tokens, chunk), files


def _parity(config, staging: Path, manifest: Manifest, model, tokenizer, package: Path, contract) -> Manifest:
    """Every graph against eager generate with as many rows as it steps; the ONNX decode at two rows.
    The manifest's `parity` is all of them together."""
    compiled = CompiledDecode(package, model, manifest)
    integer = integer_kernels(manifest.quantization)
    graphs = []
    for graph in manifest.graphs:
        name = f"compiled {graph_title(graph.batch, graph.tokens, graph.chunk)}"
        verify = graph.tokens > 1 and not graph.chunk
        report = check_parity(
            model, {name: compiled}, contract, tokenizer, config.parity_steps, graph.batch, integer, verify, graph.chunk
        )
        graphs.append(replace(graph, parity=report[name]))
    reports = [g.parity for g in graphs]
    if config.onnx:
        onnx = OnnxRuntimeDecode(staging / DECODE_ONNX, model, manifest)
        rows = min(config.batch_size, 2)
        report = check_parity(model, {"ONNX decode": onnx}, contract, tokenizer, config.parity_steps, rows)
        manifest = replace(manifest, onnx=replace(manifest.onnx, parity=report["ONNX decode"]))
    return replace(manifest, graphs=tuple(graphs), parity=_together(reports))


def _together(reports: list[Parity]) -> Parity:
    return Parity(
        steps=sum(r.steps for r in reports),
        max_abs_logit_diff=max(r.max_abs_logit_diff for r in reports),
        tolerance=min(r.tolerance for r in reports),
        tokens_match=all(r.tokens_match for r in reports),
    )


def _finish(config, staging: Path, manifest: Manifest, model, ref, start: float) -> Manifest:
    """The manifest's last fields: every file's hash, accuracy and timings."""
    files = {p.name: sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
    manifest = replace(
        manifest,
        files=files,
        accuracy=accuracy(model, ref) if ref else None,
        build_seconds=round(time.perf_counter() - start, 2),
        built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    (staging / MANIFEST).write_text(manifest.to_json())
    return manifest


def _calls_kernels(lowerings, kernel) -> bool:
    """Whether float graphs with these lowerings and attention `kernel` call aotpack's kernels: a `dense`
    or `tiles` lowering, or the native decode attention."""
    native = kernel is not None and kernel.chosen == decode_attention.NATIVE
    return native or any(lw.chosen in KERNEL_LOWERINGS for lw in lowerings)


def _own(config: ExportConfig, native) -> frozenset[str]:
    """aotpack's GEMMs a float weight may take: `dense` wherever the export has its kernels; in a bf16
    bundle `tiles` too where they have the AMX path, granted in this process, and `dpbf16` where they have
    AVX512-BF16."""
    if native is None:
        return frozenset()
    bf16 = [name for name in BF16_LOWERINGS if getattr(native.library, name)] if config.dtype == "bfloat16" else []
    return frozenset({DENSE, *bf16})  # Library.tiles and .dpbf16: whether each runs here


def _attention(model, config: ExportConfig, attention: str, options: dict, progress: Progress, native: bool):
    """The decode step's attention kernel (exporter.attention): timed on this machine unless named;
    `native`: aotpack's kernels are built, so theirs is a candidate."""
    if config.decode_attention != "auto" and attention != "sdpa":
        raise ExportError(
            f"--decode-attention {config.decode_attention} replaces SDPA, and this model runs {attention!r} "
            "attention (transformers' choice for its family, e.g. for attention soft-capping); drop the option"
        )
    timed = config.device == "cpu" and attention == "sdpa" and config.decode_attention == "auto"
    stage = progress.stage("attention", "timing the decode attention kernels") if timed else nullcontext()
    with stage:
        return decode_attention.choose(
            model, config.dtype, config.device, attention, config.max_cache_len, options, progress.log,
            batch=config.batch_size, kernel=config.decode_attention, native_kernels=native,
        )  # fmt: skip


def _lowerings(config: ExportConfig, shapes, options: dict, batch: int, progress: Progress, own: frozenset[str]):
    """`batch`: the graph's activation rows (its batch times its tokens a row); `own`: aotpack's GEMMs
    that are candidates (_own)."""
    dtype = getattr(torch, config.dtype)
    if config.gemv != "tune":
        return fixed(shapes, dtype, config.gemv)
    if batch > MAX_FUSED_ROWS and not own:
        progress.log(f"{batch} activation rows: ATen's mm reads the float weights (fused reductions compile too long)")
        return fixed(shapes, dtype, "aten")
    with progress.stage("tune", f"timing each weight shape's GEMV candidates at batch {batch} on this machine"):
        return tune(shapes, dtype, config.device, options, batch, progress.log, own)


# What a bf16 lowering named by --gemv needs, when the kernels built here cannot run it
_BF16_NEEDS = {
    TILES: "AMX needs a CPU with amx_tile and amx_bf16 and Linux 5.16 or later",
    DPBF16: "it needs a CPU with avx512_bf16",
}


def _float_kernels(config: ExportConfig, progress: Progress):
    """aotpack's kernels for a CPU export without the integer family (float weights, or Inductor's
    dequantizing kernels) whose graphs may choose the `dense` GEMM or the native decode attention, else
    None."""
    attention = config.decode_attention in ("auto", decode_attention.NATIVE)
    if config.device != "cpu" or (config.gemv not in ("tune", DENSE, *BF16_LOWERINGS) and not attention):
        return None
    with progress.stage("kernels", "building aotpack's kernels (dense GEMM and decode attention candidates)"):
        built = kernels.build(config.cpu_isa, log=progress.log)
    if config.gemv in BF16_LOWERINGS and not getattr(built.library, config.gemv):  # Library.tiles, .dpbf16
        raise ExportError(
            f"--gemv {config.gemv} multiplies bf16 {BF16_LOWERINGS[config.gemv]}, which aotpack's kernels cannot "
            f"use here (built for {built.library.isa!r}; {_BF16_NEEDS[config.gemv]}); use --gemv tune or dense"
        )
    return built


def _draft_manifest(config: ExportConfig, model, step, layout, package: Path, aliases: dict[str, str]) -> Manifest:
    """Everything but the file hashes, timings, parity and accuracy, which come last."""
    metadata, names = package_metadata_and_constants(str(package), graph_name(config.buckets[0]))  # a decode graph
    constants = constant_sources(step, model, names, aliases)
    return Manifest(
        format_version=FORMAT_VERSION,
        aotpack_version=AOTPACK_VERSION,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        python_version=platform.python_version(),
        model_class=type(model).__name__,
        attn_implementation="sdpa",
        is_multimodal=is_multimodal(model.config),
        device=config.device,
        cpu_isa=metadata.get("AOTI_CPU_ISA") if config.device == "cpu" else None,
        dtype=config.dtype,
        batch_size=config.batch_size,
        max_cache_len=config.max_cache_len,
        vocab_size=text_config(model).vocab_size,
        cache_layout=layout,
        cache_bytes=tuple(layer.nbytes(config.batch_size, config.dtype) for layer in layout),
        decode_inputs=INPUT_NAMES,
        constants=constants,
        weight_aliases=aliases,
        quantization=None,
        graphs=(),
        decode_attention=None,
        accuracy=None,
        files={},
        build_seconds=0.0,
        built_at="",
        parity=Parity(0, 0.0, 0.0, False),
    )


def _load_preprocessor(checkpoint: Path):
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    multimodal = is_multimodal(AutoConfig.from_pretrained(checkpoint, local_files_only=True))
    auto = AutoProcessor if multimodal else AutoTokenizer
    return auto.from_pretrained(checkpoint, local_files_only=True)
