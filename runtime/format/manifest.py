"""The versioned, frozen manifest: what a bundle holds and what its decode was built for.

Owns: the manifest's records and its strict reader. The exporter writes bundles only through this
package (runtime.format) and the runtime reads them only through it, so both sides agree on one
definition. Metadata is JSON, never pickle. Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

from runtime.errors import ManifestError
from runtime.format.files import DECODE, DECODE_ONNX, KERNELS, json_digest
from runtime.format.layout import FULL, SLIDING, LayerLayout
from runtime.format.quant import INT4, INT5, INT5_GROUP, INT8, INTEGER, LAYOUTS, QuantSpec
from runtime.version import AOTPACK_VERSION  # noqa: F401 (re-exported: the manifest records it)

# 2: weights stored under module paths (with aliases for tied tensors), quantization, the decode step's
# GEMV lowerings and the accuracy report.
# 3: the decode step takes one cache position per row (continuous batching), where format 2 took one
# for the whole batch; the .so of an older bundle cannot serve independent rows, so it is re-exported.
# 4: an optional portable decode (`onnx`: decode.onnx, run by ONNX Runtime).
# 5: the step attends to a span of the cache (its pad_mask is as wide as the indices in use), where 3 and
# 4 attended to every slot of it each step; their decode cannot take a span, so they are re-exported.
# The decode attention kernel chosen at build time (`decode_attention`).
# 6: decode.pt2 holds one graph per batch bucket (`graphs`, each with its own GEMV lowerings and parity),
# where 5 held one graph for every batch, its kernels chosen at batch 1; it is re-exported.
# 7: quantized bundles name their kernel family (`quantization.kernels`: aotpack's integer kernels, carried
# as `native`, or Inductor's), the recipe (int4 with some modules at int8) and how scales were chosen.
# A format-6 manifest still reads: its quantization was Inductor's, uniform, with min/max scales.
# 8: each GEMV lowering records its candidates' timing spread and whether the timing was judged noise
# (`spread`, `noisy`); a format-6 or -7 manifest still reads, its timings taken as they were.
# 9: a quantized bundle records whether the timing behind its kernel family was judged noise
# (`quantization.kernel_noise`); a format-6, -7 or -8 manifest still reads, its choice taken as made.
# 10: speculative decoding: `draft_tokens` (k; 0 without), verify graphs beside the decode graphs (each
# graph's `tokens` per row: 1, or k + 1), and rings k slots beyond their window; a format-6 to -9
# manifest still reads, with no drafts and every graph a decode graph.
# 11: aotpack's kernels (`native`) also in float bundles, for the decode graphs whose lowerings chose the
# `dense` GEMM (runtime.quant.dense); a format-6 to -10 manifest still reads (it carries them only with
# integer kernels, which still holds).
# 12: a prefill-chunk graph (`chunk_tokens`: C; 0 without), which writes C prompt tokens of one row into
# the cache (one-row text prompts go in through it), and rings C - 1 slots beyond their window; each
# graph says whether it is that graph (`chunk`). A format-6 to -11 manifest still reads, without one.
# 13: the decode attention may be aotpack's own kernel (`decode_attention.chosen` "native", runtime.quant.
# attention), carried in `native` like the `dense` GEMM; a format-6 to -12 manifest still reads (none chose it).
# 14: a float lowering may be `tiles` (bf16 on AMX tiles, runtime.quant.dense), carried in `native` like
# `dense`, whose instruction path is then "amx"; a format-6 to -13 manifest still reads (none chose it).
# 15: a float lowering may be `dpbf16` (bf16 with AVX512-BF16's vdpbf16ps, runtime.quant.dense), carried in
# `native` like `dense`, built for a 512-bit path; a format-6 to -14 manifest still reads (none chose it).
# 16: an int4 bundle of the integer family may hold weights at int5 (llama.cpp's Q5_0, runtime.quant.int5_dot:
# `quantization.int5_paths`); a format-6 to -15 manifest still reads (none held any).
FORMAT_VERSION = 16
SUPPORTED_VERSIONS = frozenset({6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
DENSE = "dense"  # the float lowering that calls aotpack's kernels
TILES = "tiles"  # the same on AMX tiles (bf16 weights and activations)
DPBF16 = "dpbf16"  # the same with AVX512-BF16's vdpbf16ps (bf16 weights and activations)
KERNEL_LOWERINGS = frozenset({DENSE, TILES, DPBF16})  # the lowerings that call aotpack's kernels
AMX_ISA = "amx"  # the kernels' instruction path that has the tiles
# The lowerings of bf16 weights only -> how each multiplies, and the kernels' paths that can have it (a
# build with AVX512-BF16 reports one of the 512-bit paths)
BF16_LOWERINGS = {TILES: "on AMX tiles", DPBF16: "with AVX512-BF16"}
_BF16_ISAS = {TILES: frozenset({AMX_ISA}), DPBF16: frozenset({"avx512-vnni", AMX_ISA})}
NATIVE_ATTENTION = "native"  # the decode attention that calls them
RECIPES = ("uniform", "sensitive", "mixed")
MAX_DRAFT_TOKENS = 16  # drafts a verify graph may take per row
MAX_CHUNK_TOKENS = 256  # prompt tokens the chunk graph may take
SCALE_SEARCHES = ("minmax", "mse")
_WHOLE_CACHE = "attends to the whole cache every step"
_REEXPORT = {3: _WHOLE_CACHE, 4: _WHOLE_CACHE, 5: "runs batch-1 kernels at every batch"}

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class Constant:
    """One compiled-decode constant and where its tensor comes from at load time."""

    name: str  # the name AOTInductor gives it (get_constant_fqns)
    module_path: str  # parameter or buffer path in the eager model that lends its storage
    safetensors_key: str | None  # key of the stored tensor; None for non-persistent buffers (rotary inv_freq)
    dtype: str  # what the .so was compiled for; checked at load, since AOTI checks nothing
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Parity:
    """Export-time check: eager HF generate against eager prefill + compiled decode."""

    steps: int
    max_abs_logit_diff: float
    tolerance: float
    tokens_match: bool


@dataclass(frozen=True)
class OnnxDecode:
    """The same decode step as an ONNX graph (`export --onnx`), run by ONNX Runtime instead of the .so.

    It takes the compiled step's inputs under the same names, the KV tensors named `key{i}`/`value{i}`,
    and returns `logits` plus each layer's new keys and values (`new_key{i}`, `new_value{i}`), which the
    runtime writes into the cache. Its weights are not a second copy: each large initializer is
    external data inside model.safetensors (offset and length), so decode.onnx alone loads in any ONNX
    Runtime next to the bundle's weights, and aotpack's runtime lends it the eager model's tensors."""

    file: str  # DECODE_ONNX
    opset: int
    onnxruntime_version: str  # the ONNX Runtime its parity gate ran on
    initializers: tuple[Constant, ...]  # the graph's initializers held in model.safetensors
    parity: Parity


@dataclass(frozen=True)
class Quantization:
    """Which modules hold quantized weights (runtime.quant), how each is packed and which kernels read them."""

    method: str  # the bundle's method, "int8" or "int4"
    group_size: int | None  # int4 only
    kernels: str  # "integer" or "inductor" (runtime.format.quant): the family every quantized layer uses
    layout: str  # how the family stores its weights (runtime.format.quant.LAYOUTS), e.g. "lanes16"
    linears: tuple[str, ...]  # module paths of the quantized linear layers
    embedding: str | None  # module path of the quantized token embedding
    tied: str | None  # the linear (lm_head) that shares the embedding's packed tensors
    recipe: str  # "uniform": every module at `method`; "sensitive", "mixed": an int4 bundle's `int8_paths` at
    # int8 ("mixed" of the integer family: its `int5_paths` at int5 too)
    int8_paths: tuple[str, ...]  # modules (linears, the embedding) an int4 bundle's recipe holds at int8
    int5_paths: tuple[str, ...]  # ...and at int5 (`mixed` in the integer family: Q4_K_M's Q5_0 fallback)
    scales: str  # how int4 scales and mins were chosen: "minmax" (the group's range) or "mse" (searched)
    # each family's weight read rate (GB/s) on the largest weight at export; the integer kernels' builds'
    # over a step's worth of weights ("tiles@1", "one-tile@1", ...)
    kernel_rates: dict[str, float]
    kernel_noise: str | None  # why that timing was not trusted and the known-good family kept, or None

    def spec(self, path: str) -> QuantSpec:
        """The packing of the module at `path` (a linear or the embedding)."""
        if self.method == INT4 and path in self.int5_paths:
            return QuantSpec(INT5, INT5_GROUP, self.kernels)
        if self.method == INT4 and path not in self.int8_paths:
            return QuantSpec(INT4, self.group_size, self.kernels)
        return QuantSpec(INT8, None, self.kernels)


def integer_kernels(quantization: Quantization | None) -> bool:
    """Whether a bundle's quantized layers run aotpack's integer kernels (not Inductor's, not float weights)."""
    return quantization is not None and quantization.kernels == INTEGER


@dataclass(frozen=True)
class NativeKernels:
    """aotpack's own C++ kernels (the integer family; the `dense` GEMM), compiled at export for the target
    and carried in the bundle; the decode graphs link against them by `soname` and the eager prefill of
    an integer-quantized bundle calls them."""

    file: str  # KERNELS
    soname: str  # unique per source, flags and compiler: what decode.pt2's graphs name as a dependency
    isa: str  # the instruction path compiled in: "amx", "avx512-vnni", "avx-vnni", "avx2" or "scalar"
    abi: int  # the version of their C interface (runtime.quant.native checks it)
    compiler: str  # the compiler and target they were built with, e.g. "g++ 12.2.0 -march=native"


@dataclass(frozen=True)
class Lowering:
    """The build-time choice of kernel for the decode step's weights of one shape (rows, cols)."""

    op: str  # "linear" (a float weight), "int8" or "int4"
    rows: int
    cols: int
    dtype: str  # activation dtype
    chosen: str  # a key of gb_per_s when the candidates were timed
    gb_per_s: dict[str, float]  # each candidate's weight read rate at its graph's batch here (its fastest call)
    spread: dict[str, float]  # each candidate's median call over its fastest, less 1; both {} untimed
    noisy: str | None  # why the timing was not trusted and the known-good candidate kept instead; None


@dataclass(frozen=True)
class DecodeGraph:
    """One compiled graph of decode.pt2 (model name runtime.format.contract.graph_name(batch, tokens)): the
    step for exactly `batch` rows of `tokens` each (1: decode; k + 1: verify drafted tokens), its kernels
    chosen for that shape, checked against eager generate with `batch` rows (a verify graph: its logits
    against the eager model's over the same tokens). The chunk graph (`chunk`) writes `tokens` prompt
    tokens of one row and gives no logits; its gate is the logits of the decode steps after a prompt it
    put in (exporter.parity)."""

    batch: int
    lowerings: tuple[Lowering, ...]
    parity: Parity
    compile_seconds: float  # trace, kernel timing and AOTInductor compile of this graph on the build machine
    tokens: int = 1
    chunk: bool = False


@dataclass(frozen=True)
class DecodeAttention:
    """The build-time choice of the decode step's attention kernel (CPU bundles of SDPA models)."""

    chosen: str  # "sdpa", "flash", "flash-fp32", "grouped" or "native" (exporter.attention)
    us_per_call: dict[str, float]  # each candidate's time per layer call on the build machine; {} untimed
    span: int  # cache indices the candidates attended to when timed (0: untimed)


@dataclass(frozen=True)
class Accuracy:
    """A quantized bundle against the float32 model it came from, on a fixed English text."""

    text_tokens: int  # tokens of the fixed text scored for perplexity
    perplexity: float  # this bundle's eager model
    reference_perplexity: float  # the float32 model
    greedy_tokens: int  # tokens of the float32 model's greedy continuation, teacher-forced
    greedy_agreement: float  # fraction of those positions where this bundle picks the same token


@dataclass(frozen=True)
class Manifest:
    format_version: int
    aotpack_version: str
    torch_version: str
    transformers_version: str
    python_version: str
    model_class: str  # transformers class that rebuilds the eager model, e.g. "LlamaForCausalLM"
    attn_implementation: str  # "sdpa", or "eager" for models whose attention SDPA cannot express
    is_multimodal: bool
    device: str
    cpu_isa: str | None  # what the .so was compiled for (AOTI_CPU_ISA), None on CUDA
    dtype: str
    batch_size: int  # the cache's rows: the largest batch the compiled decode serves
    max_cache_len: int
    vocab_size: int
    cache_layout: tuple[LayerLayout, ...]
    cache_bytes: tuple[int, ...]  # per layer: keys + values for batch_size sequences in dtype
    decode_inputs: tuple[str, ...]  # graph input names in call order; the KV tensors follow
    constants: tuple[Constant, ...]
    weight_aliases: dict[str, str]  # module path -> the stored key holding the same tensor (tied weights)
    quantization: Quantization | None
    graphs: tuple[DecodeGraph, ...]  # by ascending batch, the last stepping all batch_size rows
    decode_attention: DecodeAttention | None  # None: the model's own attention (GPU, eager attention)
    accuracy: Accuracy | None  # quantized bundles only
    files: dict[str, str]  # bundle file name -> sha256 hex
    build_seconds: float
    built_at: str  # ISO 8601, UTC
    parity: Parity  # every graph's gate together
    onnx: OnnxDecode | None = None  # the portable decode, when exported with --onnx (format 4)
    native: NativeKernels | None = None  # the integer kernels (format 7), for quantization.kernels "integer"
    draft_tokens: int = 0  # k of speculative decoding (format 10): its verify graphs take k + 1 tokens a row
    chunk_tokens: int = 0  # C (format 12): the chunk graph prefills C prompt tokens of one row; 0 without

    @property
    def batches(self) -> tuple[int, ...]:
        """The batches decode.pt2 has a decode graph for, ascending."""
        return tuple(g.batch for g in self.graphs if g.tokens == 1 and not g.chunk)

    @property
    def verify_batches(self) -> tuple[int, ...]:
        """The batches decode.pt2 has a verify graph for (k + 1 tokens a row), ascending; () without drafts."""
        return tuple(g.batch for g in self.graphs if g.tokens > 1 and not g.chunk)

    def to_json(self) -> str:
        """JSON with a `digest` of the content: manifest.json holds every other file's hash, so its
        own integrity is checked against this digest (a flipped byte in a number is valid JSON)."""
        body = asdict(self)
        return json.dumps(body | {"digest": _digest(body)}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        raw = _strict_json(text)
        if not isinstance(raw, dict):
            raise ManifestError("manifest.json must hold a JSON object; re-export the bundle")
        raw = dict(raw)
        digest = raw.pop("digest", None)
        version = raw.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
            why = f" (its decode {_REEXPORT[version]})" if isinstance(version, int) and version in _REEXPORT else ""
            raise ManifestError(
                f"bundle format_version {version!r}{why} is not supported by this runtime, which reads "
                f"{sorted(SUPPORTED_VERSIONS)}; re-export the bundle with a matching aotpack"
            )
        if digest != _digest(raw):
            raise ManifestError(
                "manifest.json does not match its digest: it was edited or corrupted; re-export the bundle"
            )
        return _build(cls, _upgraded(raw))


def _strict_json(text: str | bytes):
    """JSON as the manifest allows it: UTF-8, no duplicate keys (json would keep the last silently),
    finite numbers only, no NaN/Infinity; any other input (deep nesting, a 5,000-digit integer) is a
    ManifestError too, never another exception."""

    def no_duplicates(pairs):
        keys = [key for key, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ManifestError(f"manifest.json repeats the key {next(k for k in keys if keys.count(k) > 1)!r}")
        return dict(pairs)

    def finite(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise ManifestError(f"manifest.json holds the non-finite number {token}")
        return value

    def refuse(token: str):
        raise ManifestError(f"manifest.json holds {token}, which is not JSON")

    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, object_pairs_hook=no_duplicates, parse_float=finite, parse_constant=refuse)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too many digits, nesting
        raise ManifestError(
            f"manifest.json is not valid JSON ({type(e).__name__}: {str(e)[:200]}); re-export the bundle"
        ) from None


def _digest(body: dict) -> str:
    return json_digest(body)


def _upgraded(raw: dict) -> dict:
    """An older manifest as this format reads it, one format at a time (its format_version stays what the
    file says)."""
    version = raw.get("format_version")
    if version == 6:
        raw = _from_6(raw)
    if version in (6, 7):
        raw = _from_7(raw)
    if version in (6, 7, 8):
        raw = _from_8(raw)
    if version in (6, 7, 8, 9):
        raw = _from_9(raw)
    if version in (6, 7, 8, 9, 10, 11):
        raw = _from_11(raw)
    if isinstance(version, int) and version <= 15:
        raw = _from_15(raw)
    return raw


def _from_6(raw: dict) -> dict:
    """Format 6's quantized layers were weight-only, dequantized by Inductor's kernels, every one at the
    bundle's method, int4 scales from each group's range."""
    q = raw.get("quantization")
    if isinstance(q, dict):
        q = q | {"kernels": "inductor", "layout": "words", "recipe": "uniform", "int8_paths": []}
        q = q | {"scales": "minmax", "kernel_rates": {}}
    return raw | {"quantization": q, "native": None}


def _from_7(raw: dict) -> dict:
    """Format 7 timed each candidate by its median and recorded no spread: its choices stand as made."""
    graphs = raw.get("graphs")
    if isinstance(graphs, list):
        graphs = [_lowerings_from_7(g) for g in graphs]
    return raw | {"graphs": graphs}


def _from_8(raw: dict) -> dict:
    """Format 8 judged no noise in the kernel-family timing: its choice stands as made."""
    q = raw.get("quantization")
    return raw | {"quantization": q | {"kernel_noise": None}} if isinstance(q, dict) else raw


def _from_9(raw: dict) -> dict:
    """Format 9 had no speculative decoding: no drafts, every graph a one-token decode graph."""
    graphs = raw.get("graphs")
    if isinstance(graphs, list):
        graphs = [g | {"tokens": 1} if isinstance(g, dict) else g for g in graphs]
    return raw | {"graphs": graphs, "draft_tokens": 0}


def _from_11(raw: dict) -> dict:
    """Format 11 had no chunk graph."""
    graphs = raw.get("graphs")
    if isinstance(graphs, list):
        graphs = [g | {"chunk": False} if isinstance(g, dict) else g for g in graphs]
    return raw | {"graphs": graphs, "chunk_tokens": 0}


def _from_15(raw: dict) -> dict:
    """Format 15 held no weight at int5."""
    q = raw.get("quantization")
    return raw | {"quantization": q | {"int5_paths": []}} if isinstance(q, dict) else raw


def _lowerings_from_7(graph):
    if not isinstance(graph, dict) or not isinstance(graph.get("lowerings"), list):
        return graph
    lowerings = [lw | {"spread": {}, "noisy": None} if isinstance(lw, dict) else lw for lw in graph["lowerings"]]
    return graph | {"lowerings": lowerings}


def _build(cls, raw: dict) -> Manifest:
    names = {f.name for f in fields(cls)}
    if set(raw) != names:
        missing, extra = sorted(names - set(raw)), sorted(set(raw) - names)
        raise ManifestError(
            f"manifest fields do not match format {FORMAT_VERSION} (missing {missing}, unexpected {extra})"
        )
    try:
        data = dict(raw)
        data["cache_layout"] = tuple(_record(LayerLayout, layer) for layer in _list(raw["cache_layout"]))
        data["constants"] = tuple(_constant(c) for c in _list(raw["constants"]))
        data["parity"] = _record(Parity, raw["parity"])
        data["quantization"] = _optional(_quantization, raw["quantization"])
        data["graphs"] = tuple(_graph(x) for x in _list(raw["graphs"]))
        data["decode_attention"] = _optional(_decode_attention, raw["decode_attention"])
        data["accuracy"] = _optional(lambda x: _record(Accuracy, x), raw["accuracy"])
        data["onnx"] = _optional(_onnx, raw["onnx"])
        data["native"] = _optional(lambda x: _record(NativeKernels, x), raw["native"])
        data["weight_aliases"] = _str_map(raw["weight_aliases"])
        data["files"] = _str_map(raw["files"])
        for key in ("cache_bytes", "decode_inputs"):
            data[key] = tuple(_list(raw[key]))
        manifest = _record(cls, data)
    except (TypeError, KeyError) as e:
        raise ManifestError(f"manifest.json is malformed ({e}); re-export the bundle") from e
    _check_values(manifest)
    return manifest


def _optional(read, value):
    return None if value is None else read(value)


def _str_map(value) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise TypeError(f"expected an object of strings, got {value!r:.80}")
    return dict(value)


def _quantization(raw) -> Quantization:
    if not isinstance(raw, dict):
        raise TypeError(f"quantization must be a JSON object, got {type(raw).__name__}")
    paths = {key: _list(raw.get(key)) for key in ("linears", "int8_paths", "int5_paths")}
    if not all(isinstance(path, str) for listed in paths.values() for path in listed):
        raise TypeError("quantization linears, int8_paths and int5_paths must list module paths")
    _numbers(raw.get("kernel_rates"), "quantization kernel_rates")
    if not isinstance(raw.get("kernel_noise"), (str, type(None))):
        raise TypeError(f"quantization kernel_noise must be text or null, got {raw.get('kernel_noise')!r:.80}")
    return _record(Quantization, raw | {key: tuple(listed) for key, listed in paths.items()})


def _lowering(raw) -> Lowering:
    if not isinstance(raw, dict):
        raise TypeError(f"a lowering must be a JSON object, got {type(raw).__name__}")
    _numbers(raw.get("gb_per_s"), "lowering gb_per_s")
    _numbers(raw.get("spread"), "lowering spread")
    if raw.get("noisy") is not None and not isinstance(raw.get("noisy"), str):
        raise TypeError("a lowering's noisy must be a string or null")
    return _record(Lowering, raw)


def _graph(raw) -> DecodeGraph:
    if not isinstance(raw, dict):
        raise TypeError(f"a decode graph must be a JSON object, got {type(raw).__name__}")
    lowerings = tuple(_lowering(x) for x in _list(raw.get("lowerings")))
    return _record(DecodeGraph, raw | {"lowerings": lowerings, "parity": _record(Parity, raw.get("parity"))})


def _decode_attention(raw) -> DecodeAttention:
    if not isinstance(raw, dict):
        raise TypeError(f"decode_attention must be a JSON object, got {type(raw).__name__}")
    _numbers(raw.get("us_per_call"), "decode_attention us_per_call")
    return _record(DecodeAttention, raw)


def _numbers(value, what: str) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()
    ):
        raise TypeError(f"{what} must map candidate names to numbers")


def _onnx(raw) -> OnnxDecode:
    if not isinstance(raw, dict):
        raise TypeError(f"onnx must be a JSON object, got {type(raw).__name__}")
    initializers = tuple(_constant(c) for c in _list(raw.get("initializers")))
    return _record(OnnxDecode, raw | {"initializers": initializers, "parity": _record(Parity, raw.get("parity"))})


def _constant(raw) -> Constant:
    if not isinstance(raw, dict):
        raise TypeError(f"a constant must be a JSON object, got {type(raw).__name__}")
    shape = _list(raw.get("shape"))
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise TypeError(f"constant shape {shape!r} must list non-negative integers")
    return _record(Constant, raw | {"shape": tuple(shape)})


def _list(value) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


# The JSON types each annotation admits (bool is excluded where an int is meant).
_SCALARS = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,)}


def _record(cls, data):
    """Build dataclass `cls` from a dict, checking every scalar field's JSON type."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
    obj = cls(**data)
    for f in fields(cls):
        value = getattr(obj, f.name)
        options = [t.strip() for t in str(f.type).split("|")]
        if "None" in options and value is None:
            continue
        allowed = tuple(t for name in options for t in _SCALARS.get(name, ()))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            raise TypeError(f"{cls.__name__}.{f.name} must be {f.type}, got {value!r}")
    return obj


def _check_values(m: Manifest) -> None:
    if m.dtype not in DTYPES:
        raise ManifestError(f"manifest dtype {m.dtype!r} is not one of {DTYPES}")
    if m.device not in DEVICES:
        raise ManifestError(f"manifest device {m.device!r} is not one of {DEVICES}")
    for key in ("batch_size", "max_cache_len", "vocab_size"):
        if getattr(m, key) < 1:
            raise ManifestError(f"manifest {key} must be a positive integer, got {getattr(m, key)!r}")
    if m.attn_implementation not in ATTENTION:
        raise ManifestError(f"manifest attn_implementation {m.attn_implementation!r} is not one of {ATTENTION}")
    if DECODE not in m.files:
        raise ManifestError(f"manifest does not list {DECODE}; re-export the bundle")
    if not m.cache_layout or len(m.cache_bytes) != len(m.cache_layout):
        raise ManifestError("manifest cache_layout and cache_bytes must describe the same, non-empty list of layers")
    for layer, nbytes in zip(m.cache_layout, m.cache_bytes, strict=True):
        _check_layer(layer, nbytes, m.max_cache_len)
        expected = layer.nbytes(m.batch_size, m.dtype)
        if nbytes != expected:
            raise ManifestError(f"manifest cache_bytes entry {nbytes!r} does not match its layer ({expected} bytes)")
    if m.quantization is not None:
        _check_quantization(m.quantization)
    if m.onnx is not None and (m.onnx.file != DECODE_ONNX or DECODE_ONNX not in m.files):
        raise ManifestError(f"manifest onnx entry names {m.onnx.file!r}, not a listed {DECODE_ONNX}; re-export it")
    a = m.decode_attention
    if a is not None and a.us_per_call and a.chosen not in a.us_per_call:
        raise ManifestError(f"manifest decode_attention chose {a.chosen!r}, which it did not time")
    _check_graphs(m)
    _check_native(m)  # after the graphs: their lowerings say whether the kernels are needed


def _check_graphs(m: Manifest) -> None:
    batches = list(m.batches)
    if not batches or batches != sorted(set(batches)) or batches[0] < 1 or batches[-1] != m.batch_size:
        raise ManifestError(
            f"manifest graphs step batches {batches}: they must ascend, without repeats, from at least 1 to "
            f"batch_size {m.batch_size}; re-export the bundle"
        )
    _check_drafts(m)
    _check_chunk(m)
    for lowering in (lw for g in m.graphs for lw in g.lowerings):
        if lowering.gb_per_s and lowering.chosen not in lowering.gb_per_s:
            raise ManifestError(
                f"manifest lowering {lowering.op} {lowering.rows}x{lowering.cols} chose {lowering.chosen!r}, "
                "which it did not measure"
            )


def _check_drafts(m: Manifest) -> None:
    """Verify graphs go with drafts: one per decode graph's batch, k + 1 tokens a row, and rings with k
    slots beyond their window (fewer, and a rejected draft would overwrite a token still in the window)."""
    k = m.draft_tokens
    if not isinstance(k, int) or isinstance(k, bool) or not (k == 0 or 1 <= k <= MAX_DRAFT_TOKENS):
        raise ManifestError(f"manifest draft_tokens {k!r} is not 0 or 1..{MAX_DRAFT_TOKENS}; re-export the bundle")
    verify = [(g.batch, g.tokens) for g in m.graphs if g.tokens != 1 and not g.chunk]
    if verify != [(b, k + 1) for b in (m.batches if k else ())]:
        raise ManifestError(
            f"manifest verify graphs {verify} do not match draft_tokens {k} (one per decode batch {list(m.batches)}, "
            f"{k + 1} tokens a row); re-export the bundle"
        )
    short = [layer for layer in m.cache_layout if layer.window and layer.slots < min(layer.window + k, m.max_cache_len)]
    if short:
        raise ManifestError(f"manifest ring {short[0]} lacks the {k} slots beyond its window that drafts need")


def _check_chunk(m: Manifest) -> None:
    """The chunk graph goes with `chunk_tokens`: one graph of one row and C tokens, and rings with C - 1
    slots beyond their window (the chunk's first query still needs the window before it while its last
    token is written)."""
    c = m.chunk_tokens
    if (
        not isinstance(c, int)
        or isinstance(c, bool)
        or not (c == 0 or 2 <= c <= min(MAX_CHUNK_TOKENS, m.max_cache_len))
    ):
        raise ManifestError(
            f"manifest chunk_tokens {c!r} is not 0 or 2..{min(MAX_CHUNK_TOKENS, m.max_cache_len)}; re-export the bundle"
        )
    chunks = [(g.batch, g.tokens) for g in m.graphs if g.chunk]
    if chunks != ([(1, c)] if c else []):
        raise ManifestError(
            f"manifest chunk graphs {chunks} do not match chunk_tokens {c} (one graph of 1 row and {c} tokens); "
            "re-export the bundle"
        )
    short = [
        layer for layer in m.cache_layout if layer.window and layer.slots < min(layer.window + c - 1, m.max_cache_len)
    ]
    if c and short:
        raise ManifestError(f"manifest ring {short[0]} lacks the {c - 1} slots beyond its window that chunks need")


def _check_quantization(q: Quantization) -> None:
    if q.int5_paths and (q.method != INT4 or q.recipe != "mixed" or q.kernels != INTEGER):
        raise ManifestError("manifest quantization int5_paths belong to a mixed int4 bundle of the integer kernels")
    try:
        for path in (*q.linears, *((q.embedding,) if q.embedding else ())):
            q.spec(path)
    except ValueError as e:
        raise ManifestError(f"manifest quantization is invalid: {e}") from None
    if q.tied is not None and (q.embedding is None or q.tied not in q.linears):
        raise ManifestError(
            "manifest quantization ties an lm_head that is not among its quantized linears and embedding"
        )
    if q.layout != LAYOUTS[q.kernels]:
        raise ManifestError(
            f"manifest quantization layout {q.layout!r} is not the {LAYOUTS[q.kernels]!r} this runtime's "
            f"{q.kernels} kernels read; re-export the bundle with this aotpack"
        )
    if q.recipe not in RECIPES or q.scales not in SCALE_SEARCHES:
        raise ManifestError(f"manifest quantization recipe {q.recipe!r} or scales {q.scales!r} is not known")
    quantized = set(q.linears) | ({q.embedding} if q.embedding else set())
    if not set(q.int8_paths) <= quantized or (q.int8_paths and (q.method == INT8 or q.recipe == "uniform")):
        raise ManifestError("manifest quantization int8_paths must be quantized modules of a mixed int4 bundle")
    if q.int5_paths and (not set(q.int5_paths) <= quantized or set(q.int5_paths) & set(q.int8_paths)):
        raise ManifestError("manifest quantization int5_paths must be quantized modules not among int8_paths")
    if q.tied is not None and q.spec(q.tied) != q.spec(q.embedding):
        raise ManifestError("manifest quantization holds a tied lm_head and its embedding at different methods")


def chosen_lowerings(m: Manifest) -> set[str]:
    """Every lowering some graph of the bundle chose."""
    return {lw.chosen for g in m.graphs for lw in g.lowerings}


def _check_native(m: Manifest) -> None:
    """The integer family, the `dense`, `tiles` and `dpbf16` lowerings and the native decode attention need
    aotpack's kernels, listed as a bundle file; nothing else carries them. `tiles` needs them built with AMX,
    `dpbf16` with a 512-bit path, both in a bf16 bundle."""
    integer = integer_kernels(m.quantization)
    dense = bool(chosen_lowerings(m) & KERNEL_LOWERINGS)
    attention = m.decode_attention is not None and m.decode_attention.chosen == NATIVE_ATTENTION
    if (integer or dense or attention) != (m.native is not None):
        raise ManifestError(
            "manifest native kernels disagree with what calls them (integer kernels, `dense` lowerings and "
            "the native decode attention need `native`, and only they); re-export the bundle"
        )
    if m.native is not None and (m.native.file != KERNELS or KERNELS not in m.files):
        raise ManifestError(f"manifest native entry names {m.native.file!r}, not a listed {KERNELS}; re-export it")
    for name, how in BF16_LOWERINGS.items():
        if name in chosen_lowerings(m) and (m.native.isa not in _BF16_ISAS[name] or m.dtype != "bfloat16"):
            raise ManifestError(
                f"manifest lowering {name!r} runs bf16 {how}, but the bundle is {m.dtype} with kernels for "
                f"{m.native.isa!r}; re-export it"
            )


def _check_layer(layer: LayerLayout, nbytes, max_cache_len: int) -> None:
    if layer.kind not in (FULL, SLIDING):
        raise ManifestError(f"manifest cache layer kind {layer.kind!r} is not {FULL!r} or {SLIDING!r}")
    if min(layer.slots, layer.num_kv_heads, layer.head_dim) < 1 or layer.slots > max_cache_len:
        raise ManifestError(f"manifest cache layer {layer} has sizes outside 1..max_cache_len")
    if (layer.kind == SLIDING) != (layer.window is not None):
        raise ManifestError(f"manifest cache layer {layer}: a window goes with sliding layers only")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
        raise ManifestError(f"manifest cache_bytes entry {nbytes!r} is not a positive integer")
