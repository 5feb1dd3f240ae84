"""Which engine runs a bundle's decode step: the AOTInductor `.so` or the ONNX graph on ONNX Runtime.

Owns: the backend names, what each needs of a bundle and of this process (checked before any weight
is loaded), and building the chosen decode. Both take the same inputs and write the same cache, so
everything above the decode (prefill, engine, sampling) is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.errors import BundleError, InvalidInputError
from runtime.manifest import DECODE, DECODE_ONNX, Manifest

AOTI = "aoti"
ONNXRUNTIME = "onnxruntime"
BACKENDS = (AOTI, ONNXRUNTIME)


def check_backend(backend) -> str:
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend {backend!r} is not one of {BACKENDS}")
    return backend


@dataclass(frozen=True)
class Backend:
    """The decode backend a command loads a bundle with (`--backend`, `--prepack`)."""

    name: str = AOTI
    prepack: bool = False  # onnxruntime: ONNX Runtime prepacks its weights, a second copy, faster to read

    def __post_init__(self):
        check_backend(self.name)
        if self.prepack and self.name != ONNXRUNTIME:
            raise InvalidInputError(
                f"prepacking applies to the {ONNXRUNTIME} backend only; add --backend {ONNXRUNTIME}"
            )

    def options(self) -> dict:
        """load()'s keyword arguments."""
        return {"backend": self.name, "prepack": self.prepack}


def check_has_backend(manifest: Manifest, backend: str, bundle: Path) -> None:
    """The bundle carries the chosen decode: an ONNX one only when exported with --onnx."""
    if backend == ONNXRUNTIME and manifest.onnx is None:
        raise BundleError(
            f"{bundle} has no ONNX decode; re-export it with `aotpack export ... --onnx`, or load it with "
            f"backend={AOTI!r}"
        )


def open_decode(backend: Backend, bundle: Path, model, manifest: Manifest):
    """The decode step of a verified bundle over `model`'s weight tensors (no second copy, unless the
    backend prepacks)."""
    if backend.name == ONNXRUNTIME:
        from runtime.onnx_decode import OnnxRuntimeDecode

        return OnnxRuntimeDecode(bundle / DECODE_ONNX, model, manifest, manifest.files[DECODE_ONNX], backend.prepack)
    from runtime.decode import CompiledDecode

    return CompiledDecode(bundle / DECODE, model, manifest, sha256=manifest.files[DECODE])
