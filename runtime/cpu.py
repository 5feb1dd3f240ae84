"""What this CPU can run, read from /proc/cpuinfo: the check made before any compiled code is loaded.

Owns: the CPU's feature flags and the refusal of a bundle compiled for instructions this CPU lacks (its
decode `.so`, or its integer kernels). A mismatched AOTInductor `.so` only warns, and a missing
instruction kills the process with SIGILL.
Reading the flags costs about 70 us, once a process; Inductor's own probe compiles test programs and imports
torch._dynamo, about 6 s of start-up. Torch-free.
"""

from __future__ import annotations

import functools
from pathlib import Path

from runtime.errors import IncompatibleBundleError

# AOTInductor's ISA names (AOTI_CPU_ISA, lower-cased) -> the CPU flags each needs, as Linux lists
# them in /proc/cpuinfo.
ISA_FLAGS = {
    "avx2": {"avx2", "fma"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "avx512_vnni": {"avx512_vnni"},
    "amx_tile": {"amx_tile", "amx_bf16", "amx_int8"},
    "asimd": {"asimd"},
    "neon": {"asimd"},
}


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags, or None where /proc/cpuinfo does not exist. Read once a process: a read
    costs about 70 us, and the `dpbf16` kernel's eager call asks each time."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    lines = (line.split(":", 1) for line in text.splitlines() if line.startswith(("flags", "Features")))
    return frozenset(flag for _, value in lines for flag in value.split())


def check_cpu_isa(required: str | None) -> None:
    flags = cpu_flags()
    for name in (required or "").lower().split():
        if name not in ISA_FLAGS:
            raise IncompatibleBundleError(
                f"bundle needs CPU ISA {name!r}, which aotpack cannot check; re-export on this machine"
            )
        missing = ISA_FLAGS[name] - flags if flags is not None else set()
        if missing:
            raise IncompatibleBundleError(
                f"bundle's decode was compiled for CPU ISA {required!r}, but this CPU lacks {name!r} "
                f"(flags {sorted(missing)}); re-export on this machine, or export with `--cpu-isa avx2` "
                "for a portable bundle"
            )


# The instruction paths of aotpack's integer kernels (runtime.quant.native) -> the CPU flags each needs:
# x86-64-v3 for every vector path, and the dot-product instruction of the VNNI ones.
KERNEL_ISA_FLAGS = {
    "scalar": set(),
    "avx2": {"avx2", "fma", "f16c", "bmi2"},
    "avx-vnni": {"avx2", "fma", "f16c", "bmi2", "avx_vnni"},
    "avx512-vnni": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
}
# and the AMX tiles: the float kernel's bf16 ones (exporter/csrc/dense.cpp) and int8's (int8.cpp)
KERNEL_ISA_FLAGS["amx"] = KERNEL_ISA_FLAGS["avx512-vnni"] | {"amx_tile", "amx_bf16", "amx_int8"}
# The bf16 `dpbf16` lowering's `vdpbf16ps` (exporter/csrc/dense.cpp): not a path of its own but an
# instruction a 512-bit build compiled with it has, checked before a bundle whose graphs call it loads.
DPBF16_FLAG = "avx512_bf16"


def check_kernels_isa(isa: str) -> None:
    """The bundle's integer kernels were compiled for `isa`; refuse a CPU that cannot run them (they
    would die with SIGILL) before they are loaded."""
    if isa not in KERNEL_ISA_FLAGS:
        raise IncompatibleBundleError(
            f"the bundle's integer kernels were compiled for {isa!r}, which aotpack does not know"
        )
    flags = cpu_flags()
    missing = KERNEL_ISA_FLAGS[isa] - flags if flags is not None else set()
    if missing:
        raise IncompatibleBundleError(
            f"the bundle's integer kernels were compiled for {isa!r}, which this CPU cannot run (it lacks "
            f"{sorted(missing)}); re-export on this machine, or with `--cpu-isa avx2` for any AVX2 x86-64 CPU"
        )
