"""torch.export and AOTInductor: the only place that knows how the decode step becomes a `.so`.

Owns: the export call, the example inputs and dynamic dimensions it traces with (both read off the
signature, runtime.format.contract), the Inductor options, and packaging one graph per batch bucket
into one `.pt2`. Options are passed explicitly per call; nothing global is set.

Each AOTInductor graph has a static batch (its bucket): Inductor then generates its reductions for
exactly that many rows, each weight vector loaded (and dequantized) once and multiplied into one
accumulator per row, where a dynamic batch loops over rows around the weight. The span stays dynamic.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from exporter.compat import SERIAL_UP_TO, aoti_compile, aoti_package, grouped_query_sdpa
from runtime.errors import ExportError
from runtime.format.contract import BATCH, INPUT_NAMES, METADATA_KEY, SPAN, STEP_INPUTS, DecodeContract, graph_name
from runtime.format.manifest import NativeKernels, Quantization
from runtime.format.quant import INDUCTOR
from runtime.model.cache import allocate
from runtime.quant import SCHEMES, attention, dense


@torch.no_grad()
def export_decode(step, contract: DecodeContract, batch: int | None = None, tokens: int = 1):
    """Trace `step` for exactly `batch` rows, or for a dynamic batch (None: 1..batch_size, as decode.onnx
    takes it), over a dynamic span; `tokens` a row (k + 1: a verify graph)."""
    with grouped_query_sdpa():
        inputs = example_inputs(contract, batch, tokens)
        return torch.export.export(step, inputs, dynamic_shapes=dynamic_shapes(contract, batch), strict=False)


def example_inputs(contract: DecodeContract, batch: int | None = None, tokens: int = 1) -> tuple:
    """Inputs to trace with, at `batch` rows (None: the largest), `tokens` a row and the largest span: a
    dynamic dimension traced at 1 would be specialised."""
    batch, span, device = batch or contract.batch_size, contract.max_cache_len, contract.device
    fixed = [
        torch.zeros(contract.shape(s, batch, span, tokens), dtype=getattr(torch, s.dtype), device=device)
        for s in STEP_INPUTS
    ]
    fixed[INPUT_NAMES.index("cache_position")] += torch.arange(1, batch + 1)  # rows stand apart
    fixed[INPUT_NAMES.index("position_ids")] += torch.arange(tokens)  # a verify row's tokens follow each other
    fixed[INPUT_NAMES.index("pad_mask")] |= True
    return (*fixed, *allocate(contract.layout, batch, getattr(torch, contract.dtype), device))


def dynamic_shapes(contract: DecodeContract, batch: int | None = None):
    """The span is dynamic (1..L), so one graph attends to exactly the cache indices in use; the batch is
    `batch` rows, or dynamic (1..B) where `batch` is None. A dimension whose largest size is 1 stays
    static: export specialises a dimension traced at size 1 anyway."""
    dims = {SPAN: contract.max_cache_len} | ({BATCH: contract.batch_size} if batch is None else {})
    dims = {name: torch.export.Dim(name, min=1, max=size) for name, size in dims.items() if size > 1}

    def spec(shape) -> dict | None:
        found = {i: dims[d] for i, d in enumerate(shape) if d in dims}
        return found or None

    kv = tuple({0: dims[BATCH]} if BATCH in dims else None for _ in range(2 * len(contract.layout)))
    return (*(spec(s.shape) for s in STEP_INPUTS), kv)


def kernel_options(device: str, cpu_isa: str, dequantizing: bool = False) -> dict:
    """How Inductor compiles kernels for this target. `dequantizing` (a quantization of the inductor
    family) lets the C++ compiler reassociate and fuse float arithmetic: a dequantizing reduction is
    bound by the latency of its one vector accumulator (an add every 8 weights); reassociation lets GCC
    split that chain, and the int8/int4 kernels read 30-70 % faster on AVX2 here (float GEMVs, bound by
    memory, gained nothing, so float bundles keep strict IEEE order). NaN and Inf keep their meaning
    (`-fno-finite-math-only` stays), and the parity gate checks the result as always."""
    options = {
        "aot_inductor.package_constants_in_so": False,  # weights live once, in the bundle's safetensors
        "cpp.dynamic_threads": True,  # torch.set_num_threads governs the .so at run time
    }
    if device == "cpu" and dequantizing:
        options |= {"cpp.enable_unsafe_math_opt_flag": True, "cpp.enable_floating_point_contract_flag": "fast"}
    if device == "cpu" and cpu_isa == "avx2":
        options |= {"cpp.simdlen": 256, "cpp.march": "x86-64-v3"}  # portable to any AVX2 x86-64 CPU
    return options


def inductor_options(
    device: str,
    cpu_isa: str,
    contract: DecodeContract,
    batch: int | None = None,
    quantization: Quantization | None = None,
    native: NativeKernels | None = None,
    tokens: int = 1,
    chunk: bool = False,
) -> dict:
    """The options of one decode graph: kernel_options, the contract's fingerprint in its metadata, and for
    the integer family's layers or the `dense` lowering, aotpack's kernels (`native`; see native_options)."""
    dequantizing = quantization is not None and quantization.kernels == INDUCTOR
    options = kernel_options(device, cpu_isa, dequantizing)
    # What the .so was compiled for, inside the .so: load() refuses a manifest that says otherwise.
    options["aot_inductor.metadata"] = {
        METADATA_KEY: contract.fingerprint(batch, tokens, chunk),
        "aotpack_serial_up_to": str(SERIAL_UP_TO),  # how its small loops were generated (serial_small_loops)
    }
    return options | native_options(native)


def native_options(native: NativeKernels | None) -> dict:
    """A graph that calls aotpack's kernels calls their C shims directly (a call through AOTInductor's
    proxy executor cost 19 us, 2.5 ms a Gemma step, against under 1 us) and links against them by soname
    (exporter.kernels.linkable shows the linker where they are)."""
    if native is None:
        return {}
    shims = {s.op: [s.c_shim] for s in SCHEMES.values() if s.c_shim}
    shims |= {s.cat_op: [s.cat_shim] for s in SCHEMES.values() if s.cat_op} | {
        dense.OP: [dense.SHIM],
        dense.TILES_OP: [dense.TILES_SHIM],
        dense.DPBF16_OP: [dense.DPBF16_SHIM],
        attention.OP: [attention.SHIM],
    }
    return {"aot_inductor.custom_ops_to_c_shims": shims, "aot_inductor.custom_op_libs": [f":{native.soname}"]}


def compile_graph(exported, options: dict, into: Path) -> list:
    """One graph compiled by AOTInductor: the files that go into the package under its name, copied
    into the directory `into` at once (see _kept)."""
    try:
        files = aoti_compile(exported, options)
    except OSError as e:  # e.g. BlockingIOError: no process could be forked for the C++ compiler
        raise ExportError(
            f"the C++ compiler could not run ({type(e).__name__}: {e}); free memory or processes, then retry"
        ) from None
    return _kept(files, into, options["aot_inductor.metadata"])


def _kept(files: list, into: Path, metadata: dict) -> list:
    """AOTInductor names its files in the machine's shared Inductor cache by the generated code alone,
    and writes the graph's metadata (our contract fingerprint) beside them as `*_metadata.json`: an
    export of the same graph for another bundle, in another process, rewrote that file with its own
    fingerprint before this export packaged it (two test workers at once; the load check refused the
    bundle). So each graph's files are copied out as soon as they exist, and the copies' metadata
    says this graph's."""
    into.mkdir(parents=True, exist_ok=True)
    kept = []
    for file in files:
        if not isinstance(file, str) or not os.path.isfile(file):
            kept.append(file)  # the "" and Weights entries package_aoti also takes
            continue
        copy = into / os.path.basename(file)
        shutil.copyfile(file, copy)
        if copy.name.endswith("_metadata.json"):
            copy.write_text(json.dumps(json.loads(copy.read_text()) | metadata))
        kept.append(str(copy))
    return kept


def package_graphs(compiled: dict[tuple[int, int, bool], list], package: Path) -> Path:
    """One `.pt2` holding each (batch, tokens, chunk) graph under runtime.format.contract.graph_name of them."""
    return Path(aoti_package(str(package), {graph_name(*key): files for key, files in compiled.items()}))
