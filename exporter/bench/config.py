"""`aotpack bench`'s options, checked once at the edge, and what each variant runs.

Owns: which variants (dtypes, quantizations) and systems a run measures, and which mode it is
(exporter.bench.modes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exporter.bench import BenchError
from exporter.bench.llama_cpp import llama_cpp_available
from exporter.bench.worker import ONNX_SYSTEMS, SYSTEMS
from runtime.format.quant import METHODS

HF_SYSTEMS = ("hf_eager", "hf_compile")

HF_COMPILE_NOTE = (
    "HF generate with cache_implementation='static' and a CompileConfig(fullgraph=True) whose "
    "_compile_all_devices=True forces torch.compile on CPU (generate compiles only on GPUs otherwise)"
)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "gemma3-270m-arch"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    quantize: tuple[str, ...] = ()  # extra variants: weight-only int8/int4 bundles with float32 activations
    llama_cpp_converter: Path | None = None  # llama.cpp's convert_hf_to_gguf.py (in the llama-cpp-python sdist)
    llama_server: Path | None = None  # with serve: llama.cpp's llama-server binary, run with --parallel N
    gemv: str = "tune"  # passed to `aotpack export --gemv`
    prompt_len: int = 32
    new_tokens: int = 64
    # The bundle's cache (`aotpack export --max-cache-len`) and llama.cpp's n_ctx: what a service exports,
    # not just the prompt plus the new tokens (a step's cost used to grow with the cache, not the context).
    max_cache_len: int = 2048
    contexts: tuple[int, ...] = ()  # context sweep (exporter.bench.contexts): decode at each of these contexts
    vs_caches: tuple[int, ...] = ()  # ...and the same sweep on bundles of these sizes too, at the contexts that fit
    threads: int = os.cpu_count() or 1
    out: Path = Path("artifacts/bench")
    systems: tuple[str, ...] = SYSTEMS
    rounds: int = 1
    streams: int | None = None  # continuous-batching mode (exporter.bench.concurrency): N concurrent streams
    long_prompt: int = 512  # ...and the prompt admitted while N - 1 of them decode
    prefill_chunk: int = 32  # ...prefilled whole, then in chunks of this many tokens
    prefill_budget: float = 1.0  # ...then in chunks of this many decode steps' time (at most prefill_chunk tokens)
    chunk_graph: int = 16  # --streams and --serve bundles: `export --chunk-graph C` (0: chunks run eagerly)
    serve: bool = False  # `aotpack serve` against `transformers serve` (exporter.bench.serving), N = streams
    ray: bool = False  # with serve: alone and on Ray Serve with 1 and 2 replicas (exporter.bench.scaleout)
    structured: bool = False  # with serve: JSON-schema-constrained against free streams (exporter.bench.structured)
    prefix_cache: bool = False  # with serve: time to first token under a shared system prompt (exporter.bench.prefix)
    onnx: bool = False  # the float32 bundle also decodes on ONNX Runtime (its decode.onnx), as two more systems
    speculate: int = 0  # K: prompt-lookup speculative decoding against plain, one stream (exporter.bench.speculation)

    def __post_init__(self):
        if self.prompt_len < 1 or self.new_tokens <= 4:
            raise BenchError(
                f"--prompt-len must be >= 1 and --new-tokens > 4, got {self.prompt_len}, {self.new_tokens}"
            )
        if self.rounds < 1:
            raise BenchError(f"--rounds must be >= 1, got {self.rounds}")
        if self.chunk_graph < 0:
            raise BenchError(f"--chunk-graph must be 0 (none) or a token count, got {self.chunk_graph}")
        if self.prefill_chunk < 1 or not self.prefill_budget > 0:
            raise BenchError(
                f"--prefill-chunk must be >= 1 and --prefill-budget > 0, got {self.prefill_chunk} and "
                f"{self.prefill_budget}"
            )
        longest = max(self.contexts or [self.prompt_len]) + self.new_tokens  # --contexts replace the prompt
        if longest > self.max_cache_len:
            raise BenchError(
                f"a context of {longest - self.new_tokens} tokens plus {self.new_tokens} new ones needs a cache of "
                f"{longest}; raise --max-cache-len (got {self.max_cache_len})"
            )
        if self.contexts and (self.streams is not None or sorted(set(self.contexts)) != list(self.contexts)):
            raise BenchError(f"--contexts takes increasing token counts, without --streams; got {list(self.contexts)}")
        if self.vs_caches and (not self.contexts or min(self.vs_caches) < self.contexts[0] + self.new_tokens):
            raise BenchError("--vs-cache goes with --contexts, and must hold the shortest context plus the new tokens")
        if self.serve and self.streams is None:
            raise BenchError("--serve needs --streams N: the number of concurrent clients")
        if self.ray and not self.serve:
            raise BenchError("--ray compares servers: add --serve and --streams N")
        if self.structured and (not self.serve or self.ray):
            raise BenchError("--structured times constrained streams on a server: add --serve --streams N, no --ray")
        if self.prefix_cache and (not self.serve or self.ray or self.structured):
            raise BenchError("--prefix-cache times one server's first tokens: add --serve --streams N, no --ray")
        if self.streams is not None and (self.streams < 2 or len(self.variants) != 1):
            raise BenchError(
                f"--streams needs N >= 2 and exactly one variant (one --dtype or --quantize), got "
                f"{self.streams} and {list(self.variants)}"
            )
        if unknown := set(self.systems) - set(SYSTEMS):
            raise BenchError(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
        if unknown := set(self.quantize) - set(METHODS):
            raise BenchError(f"unknown --quantize {sorted(unknown)}; choose from {METHODS}")
        if self.onnx and ("float32" not in self.dtypes or self.streams is not None):
            raise BenchError(
                "--onnx benchmarks the float32 bundle at batch 1: keep float32 among --dtype, no --streams"
            )
        if self.llama_cpp_converter is not None and not Path(self.llama_cpp_converter).is_file():
            raise BenchError(
                f"--llama-cpp-converter {self.llama_cpp_converter} is not a file; it is "
                "vendor/llama.cpp/convert_hf_to_gguf.py in the llama-cpp-python sdist"
            )

        if self.speculate and (self.serve or self.contexts or len(self.variants) != 1):
            raise BenchError("--speculate K times one variant in one process: no --serve or --contexts")
        self._check_llama_server()

    def _check_llama_server(self) -> None:
        if self.llama_server is None:
            return
        if not self.serve:
            raise BenchError("--llama-server is a server to compare: add --serve and --streams N")
        if self.llama_cpp_converter is None:
            raise BenchError("--llama-server runs a GGUF of the same weights: add --llama-cpp-converter")
        if not os.access(self.llama_server, os.X_OK) or not Path(self.llama_server).is_file():
            raise BenchError(
                f"--llama-server {self.llama_server} is not an executable file; build it with `cmake --build "
                "BUILD --target llama-server` in the llama-cpp-python sdist's vendor/llama.cpp"
            )

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.dtypes) + tuple(self.quantize)

    def systems_for(self, variant: str) -> tuple[str, ...]:
        onnx = self.onnx and variant == "float32"  # ONNX Runtime decodes float32 bundles only
        systems = [
            s
            for s in self.systems
            if s != "llama_cpp" and (variant in self.dtypes or s not in HF_SYSTEMS) and (onnx or s not in ONNX_SYSTEMS)
        ]
        if "llama_cpp" in self.systems and self.llama_cpp_converter is not None and llama_cpp_available():
            systems.append("llama_cpp")
        return tuple(systems)


def variant_dtype(variant: str) -> str:
    """The bundle dtype of a variant: quantized variants keep float32 activations, KV cache and norms."""
    return "float32" if variant in METHODS else variant
