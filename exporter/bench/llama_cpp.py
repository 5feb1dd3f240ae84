"""llama.cpp as the benchmark's CPU reference: the same checkpoint, converted to GGUF at the precision
of each aotpack variant.

Owns: the conversion. Float variants go through llama.cpp's own `convert_hf_to_gguf.py` (f32, bf16),
int8 to Q8_0 likewise, and int4 to Q4_K_M through llama.cpp's quantizer (`llama_model_quantize`) from
the f32 file, as `llama-quantize` does. llama.cpp is an optional extra: nothing else in aotpack needs it.
Build it with `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python` (about 15 minutes on 2 cores);
its sdist holds the converter at `vendor/llama.cpp/convert_hf_to_gguf.py`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from exporter.bench import BenchError

OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0"}
GGUF_TYPE = {"float32": "f32", "bfloat16": "bf16", "int8": "Q8_0", "int4": "Q4_K_M"}


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def _convert(checkpoint: Path, outtype: str, converter: Path, out: Path) -> Path:
    if out.is_file():
        return out
    env = os.environ | {"PYTHONPATH": str(Path(converter).parent / "gguf-py")}  # the converter's own gguf-py
    done = subprocess.run(
        [sys.executable, str(converter), str(checkpoint), "--outtype", outtype, "--outfile", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise BenchError(f"llama.cpp's converter failed for {outtype}:\n{done.stderr[-2000:]}")
    return out


def _quantize_q4_k_m(source: Path, out: Path) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise BenchError(f"llama.cpp could not quantize {source} to Q4_K_M")
    return out


def gguf_for(checkpoint: Path, variant: str, converter: Path, dest: Path) -> Path:
    """The GGUF file llama.cpp runs for `variant` (made once per benchmark in `dest`)."""
    dest.mkdir(parents=True, exist_ok=True)
    if variant == "int4":
        return _quantize_q4_k_m(
            _convert(checkpoint, "f32", converter, dest / "model-f32.gguf"), dest / "model-q4_k_m.gguf"
        )
    return _convert(checkpoint, OUTTYPE[variant], converter, dest / f"model-{OUTTYPE[variant]}.gguf")
