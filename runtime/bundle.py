"""Reading and checking a bundle directory before anything in it is executed.

Owns: path safety, sha256 verification, and the compatibility checks between the bundle and this
process (torch build, device, CPU ISA). AOTInductor checks none of these itself: a mismatched `.so`
only warns, and a missing weight segfaults, so every check here runs before the `.so` is loaded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from runtime.backend import AOTI, ONNXRUNTIME, check_backend, check_has_backend
from runtime.errors import BundleError, IncompatibleBundleError, IntegrityError
from runtime.manifest import MANIFEST, Manifest
from runtime.signing import SIGNATURE


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(bundle: Path) -> Manifest:
    bundle = Path(bundle)
    path = bundle / MANIFEST
    try:  # an unreadable folder fails in lstat (is_symlink), an unreadable file in read_bytes
        if not bundle.is_dir():
            raise BundleError(
                f"bundle directory {str(bundle)!r} does not exist; run `aotpack export MODEL --out {bundle}`"
            )
        if path.is_symlink():
            raise IntegrityError(f"{path} is a symlink; a bundle's manifest is a plain file inside it")
        if not path.is_file():
            raise BundleError(f"{path} is missing: {bundle} is not a complete aotpack bundle; re-export it")
        data = path.read_bytes()
    except OSError as e:
        raise BundleError(f"{path} cannot be read ({e.strerror}); check its permissions") from None
    return Manifest.from_json(data)


def bundle_file(bundle: Path, name: str) -> Path:
    """Resolve a manifest file name, refusing anything that could point outside the bundle."""
    if not name or Path(name).is_absolute() or Path(name).name != name or name in (".", ".."):
        raise IntegrityError(f"manifest file name {name!r} is not a plain file name inside the bundle")
    path = bundle / name
    if path.is_symlink():
        raise IntegrityError(f"bundle file {name!r} is a symlink; bundles hold plain files only")
    return path


def verify_files(bundle: Path, manifest: Manifest, names=None) -> None:
    """Check the sha256 of the listed files `names` (default: all of them)."""
    bundle = Path(bundle)
    for name in sorted(manifest.files if names is None else names):
        path = bundle_file(bundle, name)
        if not path.is_file():
            raise IntegrityError(f"bundle file {name!r} is missing from {bundle}; re-export the bundle")
        try:
            actual, digest = sha256(path), manifest.files[name]
        except OSError as e:
            raise BundleError(f"bundle file {name!r} cannot be read ({e.strerror}); check its permissions") from None
        if actual != digest:
            raise IntegrityError(
                f"bundle file {name!r} has sha256 {actual[:16]}…, manifest says {digest[:16]}…: "
                "the file was altered or corrupted; re-export the bundle"
            )


def check_listing(bundle: Path, manifest: Manifest) -> None:
    """Every name is a plain file inside the bundle, and nothing unlisted sits in it: transformers reads
    optional files it finds (a dropped-in chat_template.json or special_tokens_map.json changed behaviour
    while every hash still matched), so an unlisted file of any kind is refused."""
    for name in manifest.files:
        bundle_file(bundle, name)
    listed = set(manifest.files) | {MANIFEST, SIGNATURE}
    for path in Path(bundle).iterdir():
        if path.name not in listed:
            raise IntegrityError(f"{path.name!r} in {bundle} is not listed in the manifest; remove it or re-export")


def weight_files(manifest: Manifest) -> list[str]:
    """The large safetensors files. A format that executes nothing when parsed, so they may be
    hashed while the model is being built from them (see Runtime), never after the .so runs."""
    return [name for name in manifest.files if name.endswith(".safetensors")]


def check_compatible(manifest: Manifest, backend: str = AOTI) -> None:
    """Refuse a bundle whose decode cannot run correctly in this process. The ONNX decode runs on any
    torch and CPU (ONNX Runtime's own kernels); only the compiled `.so` is tied to both."""
    if backend == ONNXRUNTIME:
        return
    if manifest.torch_version != torch.__version__:
        raise IncompatibleBundleError(
            f"bundle was compiled with torch {manifest.torch_version}, this process has torch {torch.__version__}; "
            f"install torch=={manifest.torch_version} or re-export the bundle with this torch"
        )
    if manifest.device == "cuda" and not torch.cuda.is_available():
        raise IncompatibleBundleError(
            "bundle was compiled for device 'cuda' but no CUDA device is available here; "
            "run it on a GPU machine or re-export with --device cpu"
        )
    if manifest.device == "cpu":
        _check_cpu_isa(manifest.cpu_isa)


# AOTInductor's ISA names (AOTI_CPU_ISA, lower-cased) -> the CPU flags each needs, as Linux lists
# them in /proc/cpuinfo. Reading the flags costs microseconds; Inductor's own probe compiles test
# programs and imports torch._dynamo, about 6 s of start-up.
ISA_FLAGS = {
    "avx2": {"avx2", "fma"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "avx512_vnni": {"avx512_vnni"},
    "amx_tile": {"amx_tile", "amx_bf16", "amx_int8"},
    "asimd": {"asimd"},
    "neon": {"asimd"},
}


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags, or None where /proc/cpuinfo does not exist."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    lines = (line.split(":", 1) for line in text.splitlines() if line.startswith(("flags", "Features")))
    return {flag for _, value in lines for flag in value.split()}


def _check_cpu_isa(required: str | None) -> None:
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


def open_bundle(path, defer_weights: bool = False, trusted_keys=None, backend: str = AOTI) -> tuple[Path, Manifest]:
    """Read, check and compatibility-check a bundle for the decode `backend`; returns (dir, manifest).
    With `defer_weights` the caller verifies `weight_files(manifest)` itself before the bundle is used.
    With `trusted_keys` (public-key files) the bundle must carry a signature that verifies with one of them."""
    bundle = Path(path)
    manifest = read_manifest(bundle)
    check_has_backend(manifest, check_backend(backend), bundle)
    check_listing(bundle, manifest)
    if trusted_keys is not None:
        from runtime.signing import verify  # model-signing is an optional extra

        verify(bundle, trusted_keys)
    deferred = set(weight_files(manifest)) if defer_weights else set()
    verify_files(bundle, manifest, [name for name in manifest.files if name not in deferred])
    check_compatible(manifest, backend)
    return bundle, manifest
