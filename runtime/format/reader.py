"""Reading and checking a bundle directory before anything in it is executed.

Owns: path safety, the listing (nothing unlisted), sha256 verification, the signature check, the
private verified copy that loading reads from (`open_private`), and asking the chosen decode backend
(runtime.backends) whether the bundle has what it needs and whether this process can run it.
AOTInductor checks none of these itself: a mismatched `.so` only warns, and a missing weight
segfaults, so every check here runs before anything is loaded. Torch-free; a backend's own
compatibility check may import torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from runtime.errors import BundleError, IntegrityError
from runtime.format.files import MANIFEST, SIGNATURE, copy_hashed, sha256
from runtime.format.manifest import Manifest
from runtime.format.private import FOLDERS


def read_manifest(bundle: Path) -> Manifest:
    return Manifest.from_json(_manifest_bytes(Path(bundle)))


def _manifest_bytes(bundle: Path) -> bytes:
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
        return path.read_bytes()
    except OSError as e:
        raise BundleError(f"{path} cannot be read ({e.strerror}); check its permissions") from None


def bundle_file(bundle: Path, name: str) -> Path:
    """Resolve a manifest file name, refusing anything that could point outside the bundle."""
    if not name or Path(name).is_absolute() or Path(name).name != name or name in (".", ".."):
        raise IntegrityError(f"manifest file name {name!r} is not a plain file name inside the bundle")
    path = bundle / name
    if path.is_symlink():
        raise IntegrityError(f"bundle file {name!r} is a symlink; bundles hold plain files only")
    return path


def _check_digest(name: str, actual: str, manifest: Manifest) -> None:
    if actual != manifest.files[name]:
        raise IntegrityError(
            f"bundle file {name!r} has sha256 {actual[:16]}…, manifest says {manifest.files[name][:16]}…: "
            "the file was altered or corrupted; re-export the bundle"
        )


def verify_files(bundle: Path, manifest: Manifest, names=None) -> None:
    """Check the sha256 of the listed files `names` (default: all of them)."""
    bundle = Path(bundle)
    for name in sorted(manifest.files if names is None else names):
        path = bundle_file(bundle, name)
        if not path.is_file():
            raise IntegrityError(f"bundle file {name!r} is missing from {bundle}; re-export the bundle")
        try:
            actual = sha256(path)
        except OSError as e:
            raise BundleError(f"bundle file {name!r} cannot be read ({e.strerror}); check its permissions") from None
        _check_digest(name, actual, manifest)


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


def open_bundle(path, backend=None, trusted_keys=None) -> tuple[Path, Manifest]:
    """Read and check a bundle in place for the decode `backend` (runtime.backends; None: integrity
    only); returns (dir, manifest). With `trusted_keys` (public-key files) the bundle must carry a
    signature that verifies with one of them. For `aotpack verify` and `inspect`: what loads a bundle
    uses `open_private`, since files checked in place may change before they are read."""
    bundle = Path(path)
    manifest = read_manifest(bundle)
    if backend is not None:
        backend.check_bundle(manifest, bundle)
    check_listing(bundle, manifest)
    if trusted_keys is not None:
        _verify_signature(bundle, trusted_keys)
    verify_files(bundle, manifest)
    if backend is not None:
        backend.check_compatible(manifest)
    return bundle, manifest


def open_private(path, backend=None, trusted_keys=None) -> tuple[Path, Manifest]:
    """A bundle, checked, as a private copy to load from instead of the folder; returns (copy, manifest).

    The manifest's bytes, the signature and every listed file are copied into a new folder that only
    this user may enter (mode 0700), each file hashed as it is written, and the signature is checked
    over the copy. So what is loaded (the manifest, weights, compiled code, tokenizer and template) is
    exactly what was verified, and nothing done to the bundle folder afterwards reaches this process:
    a file swapped between a check and its use, bytes zeroed under memory-mapped weights, a truncation
    (which made reading mapped weights raise SIGBUS). The checks that need no copy run first. The
    caller removes the copy when done with it (runtime.format.private.FOLDERS.remove; `load()` ties it
    to the Runtime's lifetime), and a copy whose process was killed is removed by the next `load()`."""
    bundle = Path(path)
    data = _manifest_bytes(bundle)
    manifest = Manifest.from_json(data)
    if backend is not None:
        backend.check_bundle(manifest, bundle)
    check_listing(bundle, manifest)
    private = FOLDERS.create()
    try:
        (private / MANIFEST).write_bytes(data)
        _copy_listed(bundle, manifest, private)
        if trusted_keys is not None:
            _verify_signature(private, trusted_keys)
        if backend is not None:
            backend.check_compatible(manifest)
    except BaseException:
        FOLDERS.remove(private)
        raise
    return private, manifest


def _copy_listed(bundle: Path, manifest: Manifest, private: Path) -> None:
    for name in sorted(manifest.files):
        source = bundle_file(bundle, name)
        if not source.is_file():
            raise IntegrityError(f"bundle file {name!r} is missing from {bundle}; re-export the bundle")
        try:
            actual = copy_hashed(source, private / name)
        except OSError as e:
            raise BundleError(
                f"bundle file {name!r} could not be copied to the private folder {private} ({e.strerror}: "
                f"{e.filename}); check the file's permissions, or free space where TMPDIR points"
            ) from None
        _check_digest(name, actual, manifest)
    signature = bundle / SIGNATURE
    if signature.is_symlink():
        raise IntegrityError(f"{signature} is a symlink; a bundle's signature is a plain file inside it")
    if signature.is_file():
        shutil.copyfile(signature, private / SIGNATURE)


def _verify_signature(bundle: Path, trusted_keys) -> None:
    from runtime.format.signing import verify  # model-signing is an optional extra

    verify(bundle, trusted_keys)
