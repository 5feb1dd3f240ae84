"""Building aotpack's kernels (exporter/csrc: the integer family's, the dense float GEMM and the decode
attention) for the bundle's target.

Owns: compiling the C++ sources into one shared library with the compiler Inductor uses, for the same
target as the decode graphs (`-march=native`, or x86-64-v3 for a portable `--cpu-isa avx2` bundle), and
naming it by a build id (a hash of the sources, flags and compiler), which is also its soname: the decode
graphs record that name as a dependency, and the runtime loads the bundle's copy before them
(runtime.quant.native). The instruction path follows from the target: 512-bit VNNI `dpbusd` where it has
AVX512-VNNI, 256-bit where it has AVX-VNNI, else AVX2's `maddubs`, else plain C++; every path computes
the same bits (exporter/csrc/lanes.h); a CPU with AMX also gets its tiles (bf16's `tiles` lowering,
and int8 calls of 5 to 32 rows, with the same bits as the VNNI path), and a 512-bit build for a CPU with
AVX512-BF16 its `vdpbf16ps` (bf16's `dpbf16` lowering).

Builds are kept in a cache by build id (`aotpack cache` lists and clears it), so exporting a second
bundle does not compile them again.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch.utils import cpp_extension

from exporter.compat import cpp_compiler
from exporter.gguf import cache_dir
from runtime.errors import ExportError
from runtime.format.files import KERNELS
from runtime.format.manifest import NativeKernels
from runtime.quant import native

SOURCES = Path(__file__).parent / "csrc"
_UNITS = ("quant_common.cpp", "int8.cpp", "int4.cpp", "int5.cpp", "dense.cpp", "attention.cpp")
# No -ffast-math: the kernels' float sums must round the same way in every tile, and GCC's default
# contraction of a * b + c into an FMA is switched off for the same reason (the vector code's FMAs are
# explicit intrinsics).
_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-Wall")


@dataclass(frozen=True)
class Built:
    path: Path  # the library, named by its soname (the decode graphs' link step finds it there)
    record: NativeKernels  # the manifest's entry once it is in the bundle as KERNELS
    library: native.Library  # loaded in this process


def target_flags(cpu_isa: str, isa_override: str | None = None) -> tuple[str, ...]:
    """The -march flags of a bundle target: the host's CPU ("native") or any AVX2 x86-64 CPU ("avx2").
    `isa_override` ("scalar", "avx2", "avx-vnni", "avx512-vnni", "amx") builds one instruction path on purpose
    (tests build each path this machine can run)."""
    if isa_override is not None:
        return {
            "scalar": ("-march=x86-64",),
            "avx2": ("-march=x86-64-v3",),
            "avx-vnni": ("-march=x86-64-v3", "-mavxvnni"),
            "avx512-vnni": ("-march=x86-64-v4", "-mavx512vnni"),
            "amx": ("-march=x86-64-v4", "-mavx512vnni", "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
        }[isa_override]
    if platform.machine() in ("aarch64", "arm64"):
        return ("-mcpu=native",)
    return ("-march=native",) if cpu_isa == "native" else ("-march=x86-64-v3",)


def _build_id(compiler: str, flags: tuple[str, ...]) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    h = hashlib.sha256(repr((version, flags, native.ABI)).encode())
    for source in sorted(SOURCES.iterdir()):
        h.update(source.name.encode() + source.read_bytes())
    return h.hexdigest()[:16]


def _cache_dir() -> Path:
    return cache_dir() / "kernels"


# The integer kernels' other pass shape (exporter/csrc/lanes.h, tiles_a_pass): one weight tile a pass.
ONE_TILE = "-DAOTPACK_ONE_TILE"


def build(
    cpu_isa: str = "native", isa_override: str | None = None, log=print, serve: bool = True, one_tile: bool = False
) -> Built:
    """The library for `cpu_isa`, compiled (or taken from the cache) and loaded into this process; with
    `serve`, the eager op runs on it (if no library serves it yet), as the exporter's parity gate needs.
    `one_tile`: the integer kernels take one weight tile a pass (same bits; exporter.quant_family times
    both builds)."""
    compiler, variant = cpp_compiler(), (ONE_TILE,) if one_tile else ()
    flags = (*_FLAGS, *variant, *target_flags(cpu_isa, isa_override))
    build_id = _build_id(compiler, flags)
    soname = f"libaotpack-kernels-{build_id}.so"
    path = _cache_dir() / build_id / soname
    if not path.is_file():
        _compile(compiler, flags, soname, path, log)
    version = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    library = native.Library(path)  # compiled for this host (or a path the caller knows it runs)
    built_as = " ".join((Path(compiler).name, version, flags[-1], *variant))
    record = NativeKernels(KERNELS, soname, library.isa, native.ABI, built_as)
    if serve:
        native.register(library)
    return Built(path, record, library)


def _compile(compiler: str, flags: tuple[str, ...], soname: str, path: Path, log) -> None:
    log(f"compiling aotpack's integer kernels ({' '.join(flags[-1:])})")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()]
    sources = [str(SOURCES / unit) for unit in _UNITS]
    with tempfile.TemporaryDirectory(prefix="aotpack-kernels-") as tmp:
        out = Path(tmp) / soname
        command = [compiler, *flags, *includes, *sources, "-o", str(out), f"-Wl,-soname,{soname}", *libs]
        done = subprocess.run([*command, "-ltorch_cpu", "-lc10"], capture_output=True, text=True)
        if done.returncode != 0:
            raise ExportError(f"aotpack's integer kernels did not compile:\n{done.stderr[-3000:]}")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        shutil.copyfile(out, partial)
        os.replace(partial, path)  # whole or absent, even with two exports at once


@contextmanager
def linkable(built: Built | None):
    """While compiling a decode graph that calls the kernels: the linker finds them by soname (the
    library's file is named so). The variable is restored afterwards."""
    if built is None:
        yield
        return
    previous = os.environ.get("LIBRARY_PATH")
    os.environ["LIBRARY_PATH"] = os.pathsep.join(filter(None, (str(built.path.parent), previous)))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("LIBRARY_PATH", None)
        else:
            os.environ["LIBRARY_PATH"] = previous
