"""The export request, validated once at the edge into a frozen config.

Owns: what `aotpack export` may be asked for, and the checks that refuse a bad request before any
model is loaded or compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.errors import ExportError
from runtime.manifest import DEVICES, DTYPES

CPU_ISAS = ("native", "avx2")


@dataclass(frozen=True)
class ExportConfig:
    model: str  # checkpoint directory, hub id in the local cache, or preset name
    out: Path
    max_cache_len: int = 2048
    batch_size: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    force: bool = False
    cpu_isa: str = "native"  # "avx2": a portable bundle that runs on any AVX2 x86-64 CPU
    parity_steps: int = 8

    def __post_init__(self):
        for key in ("max_cache_len", "batch_size", "parity_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ExportError(f"--{key.replace('_', '-')} must be a positive integer, got {value!r}")
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
        out = Path(self.out)
        object.__setattr__(self, "out", out)
        if out.exists() and not self.force:
            raise ExportError(f"{out} already exists; pass --force to replace it (it is kept until the new bundle is complete)")
        if out.exists() and not out.is_dir():
            raise ExportError(f"{out} exists and is not a directory; choose another --out")
