"""The export request, validated once at the edge into a frozen config.

Owns: what `aotpack export` may be asked for, and the checks that refuse a bad request before any
model is loaded or compiled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exporter import generation
from exporter.names import ATTENTION_KERNELS, GEMV_POLICIES
from runtime.cpu import DPBF16_FLAG, KERNEL_ISA_FLAGS, cpu_flags
from runtime.errors import ExportError
from runtime.format.files import MANIFEST
from runtime.format.manifest import (
    AMX_ISA,
    BF16_LOWERINGS,
    DENSE,
    DEVICES,
    DPBF16,
    DTYPES,
    MAX_CHUNK_TOKENS,
    MAX_DRAFT_TOKENS,
    RECIPES,
    SCALE_SEARCHES,
    TILES,
)
from runtime.format.quant import GROUP_SIZES, INDUCTOR, INT4, INTEGER, METHODS, QuantSpec

CPU_ISAS = ("native", "avx2")
# --gemv's bf16 GEMMs: how each multiplies, what its kernels are built for, what it needs, and its CPU flags
_BF16_GEMMS = {
    TILES: ("on AMX tiles", "AMX", "AMX's bf16 tiles", KERNEL_ISA_FLAGS[AMX_ISA]),
    DPBF16: ("with vdpbf16ps", "AVX512-BF16", "AVX512-BF16", {DPBF16_FLAG}),
}
MAX_CACHE_LEN = 1 << 20  # tokens: more than any model here attends to; a typo of 10**12 fails here, not in malloc
MAX_BATCH = 1024
QUANT_KERNELS = ("auto", INTEGER, INDUCTOR)  # auto: time both families here and keep the faster


@dataclass(frozen=True)
class ExportConfig:
    model: str  # checkpoint directory, hub id in the local cache, or preset name
    out: Path
    max_cache_len: int = 2048
    batch_size: int = 1
    # The batches decode.pt2 has a graph for (each compiled with its own kernels): the engine steps the
    # smallest that covers the rows in use. None: 1, 2, 4, ... below batch_size, and batch_size.
    batch_buckets: tuple[int, ...] | None = None
    dtype: str = "float32"
    device: str = "cpu"
    force: bool = False
    cpu_isa: str = "native"  # "avx2": a portable bundle that runs on any AVX2 x86-64 CPU
    quantize: str | None = None  # "int8" or "int4": weight-only quantization of the text decoder
    group_size: int | None = None  # int4 columns per scale (default 32)
    quant_kernels: str = "auto"  # the family computing quantized layers (runtime.format.quant)
    recipe: str = "mixed"  # int4: which modules get more bits (int8, int5), as Q4_K_M chooses (exporter.quantize)
    scale_search: str = "mse"  # int4: scales and mins fitted per group (exporter.scales), or each group's range
    accuracy: bool = True  # score a reduced-precision bundle against its float32 model
    gemv: str = "tune"  # "tune": time each weight shape's kernels here; "aten"/"reduce"/"dense": one, untimed
    # the decode step's attention kernel (exporter.attention): "auto" times the candidates here; or one, untimed
    decode_attention: str = "auto"
    sign_key: Path | None = None  # elliptic-curve private key (PEM): sign the bundle (runtime.format.signing)
    onnx: bool = False  # also write decode.onnx, the same step for ONNX Runtime (runtime.backends.onnxruntime)
    generation: tuple[tuple[str, object], ...] = ()  # defaults over the checkpoint's (exporter.generation)
    chat_template: str | None = None  # Jinja text over the checkpoint's (exporter.templates)
    response_template: str | None = None  # transformers' response-template JSON: how the model writes calls
    parity_steps: int = 8
    # k: compile a verify graph beside each decode graph taking a row's next token and k drafted ones
    # (speculative decoding by prompt lookup, runtime.engine.speculation); 0: none
    speculate: int = 0
    # C: compile a graph that writes C prompt tokens of one row into the cache, through which one-row
    # text prompts go in instead of the eager model (runtime.engine.runner); 0: none
    chunk_graph: int = 0

    def __post_init__(self):
        for key, limit in (("max_cache_len", MAX_CACHE_LEN), ("batch_size", MAX_BATCH), ("parity_steps", 1024)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
                raise ExportError(f"--{key.replace('_', '-')} must be an integer from 1 to {limit}, got {value!r}")
        self._check_buckets()
        self._check_speculate()
        self._check_chunk_graph()
        if self.max_cache_len < 2:
            raise ExportError(f"--max-cache-len {self.max_cache_len} leaves no room to decode; use at least 2")
        if self.dtype not in DTYPES:
            raise ExportError(f"--dtype {self.dtype!r} is not supported; choose one of {DTYPES}")
        if self.device not in DEVICES:
            raise ExportError(f"--device {self.device!r} is not supported; choose one of {DEVICES}")
        if self.cpu_isa not in CPU_ISAS:
            raise ExportError(f"--cpu-isa {self.cpu_isa!r} is not supported; choose one of {CPU_ISAS}")
        if self.device == "cuda" and self.cpu_isa != "native":
            raise ExportError("--cpu-isa applies to CPU bundles only; drop it for --device cuda")
        self._check_quantization()
        self._check_onnx()
        object.__setattr__(self, "generation", generation.checked(self.generation))
        longest = dict(self.generation).get("max_new_tokens")
        if isinstance(longest, int) and longest >= self.max_cache_len:
            raise ExportError(
                f"--generation max_new_tokens={longest} does not fit --max-cache-len {self.max_cache_len} with any "
                "prompt; lower it or raise the cache"
            )
        if self.decode_attention not in ATTENTION_KERNELS:
            raise ExportError(
                f"--decode-attention {self.decode_attention!r} is not supported; choose one of {ATTENTION_KERNELS}"
            )
        if self.decode_attention != "auto" and self.device != "cpu":
            raise ExportError(
                f"--decode-attention {self.decode_attention} picks a CPU kernel; --device {self.device} bundles keep "
                "the model's own attention: drop the option"
            )
        if self.gemv not in GEMV_POLICIES:
            raise ExportError(f"--gemv {self.gemv!r} is not supported; choose one of {GEMV_POLICIES}")
        if self.gemv in (DENSE, *BF16_LOWERINGS) and (self.device != "cpu" or self.quantize):
            raise ExportError(
                f"--gemv {self.gemv} runs aotpack's CPU GEMM over float weights; use --gemv tune (or aten) for "
                f"--device {self.device}{' or --quantize' if self.quantize else ''}"
            )
        if self.gemv in BF16_LOWERINGS:
            self._check_bf16_gemm()
        object.__setattr__(self, "out", Path(self.out))
        self._check_out()
        if self.sign_key is not None and not Path(self.sign_key).is_file():
            raise ExportError(f"--sign-key {self.sign_key} does not exist; give an elliptic-curve private key (PEM)")

    def _check_bf16_gemm(self) -> None:
        """--gemv tiles or dpbf16: a bf16 bundle, with kernels built for this CPU, which has the instructions
        (whether Linux grants AMX's tiles is known once the kernels are built)."""
        how, target, needs, flags = _BF16_GEMMS[self.gemv]
        if self.dtype != "bfloat16":
            raise ExportError(f"--gemv {self.gemv} multiplies bf16 {how}; add --dtype bfloat16 (got {self.dtype})")
        if self.cpu_isa != "native":
            raise ExportError(
                f"--gemv {self.gemv} needs kernels built for this CPU's {target}; drop --cpu-isa {self.cpu_isa}"
            )
        missing = flags - (cpu_flags() or set())
        if missing:
            raise ExportError(
                f"--gemv {self.gemv} needs {needs}, and this CPU lacks {sorted(missing)}; use --gemv tune or dense"
            )

    def _check_out(self) -> None:
        """--out must be creatable, and --force replaces only an aotpack bundle (or an empty folder):
        a user's directory of other files is never deleted."""
        out = self.out
        if out.absolute() == Path(out.absolute().anchor):
            raise ExportError(f"--out {out} is the filesystem's root; give a new directory for the bundle")
        parent = next((p for p in out.absolute().parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ExportError(f"--out {out}: {parent} is not a writable directory; choose another --out")
        if not out.exists() and not out.is_symlink():
            return
        if not self.force:
            raise ExportError(
                f"{out} already exists; pass --force to replace it (it is kept until the new bundle is complete)"
            )
        if out.is_symlink() or not out.is_dir():
            raise ExportError(f"{out} exists and is not a directory; choose another --out")
        if any(out.iterdir()) and not (out / MANIFEST).is_file():
            raise ExportError(f"{out} is not an aotpack bundle (no {MANIFEST}); --force replaces bundles only")

    def _check_buckets(self) -> None:
        buckets = self.batch_buckets
        if buckets is None:
            return
        if not buckets or not all(isinstance(b, int) and not isinstance(b, bool) for b in buckets):
            raise ExportError(f"--batch-buckets must list integers, got {buckets!r}")
        wrong = [b for b in buckets if not 1 <= b <= self.batch_size]
        if wrong:
            raise ExportError(
                f"--batch-buckets {wrong[0]} is outside 1..--batch-size {self.batch_size}; list batches up to it"
            )
        if self.batch_size not in buckets:
            raise ExportError(
                f"--batch-buckets {','.join(map(str, buckets))} lacks --batch-size {self.batch_size}: every "
                "bundle has a graph for all its rows; add it"
            )
        object.__setattr__(self, "batch_buckets", tuple(sorted(set(buckets))))

    @property
    def buckets(self) -> tuple[int, ...]:
        """The graphs' batches, ascending: as given, or the powers of two below batch_size and batch_size."""
        if self.batch_buckets is not None:
            return self.batch_buckets
        return (*(1 << i for i in range(self.batch_size.bit_length()) if 1 << i < self.batch_size), self.batch_size)

    def _check_quantization(self) -> None:
        if self.quantize is not None and self.quantize not in METHODS:
            raise ExportError(f"--quantize {self.quantize!r} is not supported; choose one of {METHODS}")
        if self.group_size is not None and self.quantize != INT4:
            raise ExportError(
                f"--group-size applies to --quantize int4 only (int8 keeps one scale per row); got {self.quantize}"
            )
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise ExportError(f"--group-size {self.group_size!r} is not supported; choose one of {GROUP_SIZES}")
        for key, allowed in (("quant_kernels", QUANT_KERNELS), ("recipe", RECIPES), ("scale_search", SCALE_SEARCHES)):
            value = getattr(self, key)
            if value not in allowed:
                raise ExportError(f"--{key.replace('_', '-')} {value!r} is not supported; choose one of {allowed}")
        if self.quant_kernels == INTEGER and self.device != "cpu":
            raise ExportError(
                "--quant-kernels integer runs aotpack's CPU kernels; use --quant-kernels inductor for "
                f"--device {self.device}"
            )

    def _check_speculate(self) -> None:
        k = self.speculate
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_DRAFT_TOKENS:
            raise ExportError(f"--speculate must be an integer from 0 (none) to {MAX_DRAFT_TOKENS} drafts, got {k!r}")
        if k and k + 2 > self.max_cache_len:
            raise ExportError(
                f"--speculate {k} needs room for {k + 1} tokens past the prompt; raise --max-cache-len above {k + 1}"
            )

    def _check_chunk_graph(self) -> None:
        c, most = self.chunk_graph, min(MAX_CHUNK_TOKENS, self.max_cache_len)
        if not isinstance(c, int) or isinstance(c, bool) or not (c == 0 or 2 <= c <= most):
            raise ExportError(
                f"--chunk-graph must be 0 (none) or a token count from 2 to {most} (at most the cache's length "
                f"and {MAX_CHUNK_TOKENS}), got {c!r}"
            )

    def _check_onnx(self) -> None:
        """The ONNX decode is float32 on the CPU: ONNX Runtime's CPU provider has no bfloat16 MatMul, and
        the quantized decode reads its weights through aotpack's own kernels, which ONNX has no form of."""
        if not self.onnx:
            return
        if self.quantize is not None:
            raise ExportError(f"--onnx exports float32 decodes only; drop --quantize {self.quantize} or --onnx")
        if self.dtype != "float32":
            raise ExportError(f"--onnx exports float32 decodes only; use --dtype float32 (got {self.dtype})")
        if self.device != "cpu":
            raise ExportError(f"--onnx exports for ONNX Runtime's CPU provider; use --device cpu (got {self.device})")

    def quant_spec(self, kernels: str) -> QuantSpec | None:
        """The bundle's quantization with the kernel family `kernels` (decided at export when "auto")."""
        if self.quantize is None:
            return None
        return QuantSpec(self.quantize, (self.group_size or 32) if self.quantize == INT4 else None, kernels)

    @property
    def measures_accuracy(self) -> bool:
        """Reduced precision (quantized, or a 16-bit dtype) is scored against the float32 model."""
        return self.accuracy and (self.quantize is not None or self.dtype != "float32")
