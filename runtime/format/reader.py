"""Reading and checking a bundle directory before anything in it is executed.

Owns: path safety, the listing (nothing unlisted), sha256 verification, the signature check, and
asking the chosen decode backend (runtime.backends) whether the bundle has what it needs and whether
this process can run it. AOTInductor checks none of these itself: a mismatched `.so` only warns, and a
missing weight segfaults, so every check here runs before anything is loaded. Torch-free; a backend's
own compatibility check may import torch.
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import BundleError, IntegrityError
from runtime.format.files import MANIFEST, SIGNATURE, sha256
from runtime.format.manifest import Manifest


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


def open_bundle(path, backend=None, trusted_keys=None, defer_weights: bool = False) -> tuple[Path, Manifest]:
    """Read and check a bundle for the decode `backend` (runtime.backends; None: integrity only);
    returns (dir, manifest). With `trusted_keys` (public-key files) the bundle must carry a signature
    that verifies with one of them. With `defer_weights` the caller verifies `weight_files(manifest)`
    itself before the bundle is used."""
    bundle = Path(path)
    manifest = read_manifest(bundle)
    if backend is not None:
        backend.check_bundle(manifest, bundle)
    check_listing(bundle, manifest)
    if trusted_keys is not None:
        from runtime.format.signing import verify  # model-signing is an optional extra

        verify(bundle, trusted_keys)
    deferred = set(weight_files(manifest)) if defer_weights else set()
    verify_files(bundle, manifest, [name for name in manifest.files if name not in deferred])
    if backend is not None:
        backend.check_compatible(manifest)
    return bundle, manifest
