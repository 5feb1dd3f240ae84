"""Signed bundles: who made a bundle, on top of the hashes that say it is intact.

Owns: signing a bundle directory and verifying it against trusted public keys, with OpenSSF's
`model-signing` (key-based elliptic-curve signatures work offline; `pip install 'aotpack[sign]'`).

What each protects: the sha256 hashes in the manifest (and the manifest's own digest) catch accidental
corruption, but anyone who can write the bundle can replace a file and recompute every hash. A
signature over every file can only be made with the private key, so a bundle that verifies against a
trusted public key is the one its owner exported. Verification happens before anything is loaded, and
the `.so` is then loaded from a private copy of the very bytes that were verified (runtime.backends.aoti).
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import BundleError, IntegrityError
from runtime.format.files import SIGNATURE


def _model_signing():
    try:
        import model_signing
    except ImportError as e:
        raise BundleError(f"signed bundles need the model-signing package ({e}); pip install 'aotpack[sign]'") from None
    return model_signing


def _hashing(ms):
    return ms.hashing.Config().set_ignored_paths(paths=[SIGNATURE])


def sign(bundle: Path, private_key: Path) -> None:
    """Write `SIGNATURE` into `bundle`, signed with an elliptic-curve private key (PEM)."""
    ms = _model_signing()
    private_key = Path(private_key)
    if not private_key.is_file():
        what = "is a directory, not a private-key file" if private_key.is_dir() else "does not exist"
        raise BundleError(f"signing key {str(private_key)!r} {what}")
    try:
        config = ms.signing.Config().use_elliptic_key_signer(private_key=private_key).set_hashing_config(_hashing(ms))
        config.sign(bundle, bundle / SIGNATURE)
    except ValueError as e:  # not a PEM private key, an unsupported curve
        raise BundleError(f"cannot sign with {private_key}: {e}") from None


def verify(bundle: Path, trusted_keys) -> Path:
    """Refuse `bundle` unless its signature verifies with one of `trusted_keys` (public-key PEM files);
    returns the key that verified it."""
    ms = _model_signing()
    keys = [Path(k) for k in trusted_keys]
    if not keys:
        raise BundleError("trusted_keys is empty: give at least one public key, or none to skip signatures")
    if not (Path(bundle) / SIGNATURE).is_file():
        raise IntegrityError(f"{bundle} is not signed, and signed bundles are required (trusted keys were given)")
    reasons = []
    for key in keys:
        if not key.is_file():
            what = "is a directory, not a public-key file" if key.is_dir() else "does not exist"
            raise BundleError(f"trusted key {str(key)!r} {what}; give the PEM file of a public key")
        try:
            ms.verifying.Config().use_elliptic_key_verifier(public_key=key).set_hashing_config(_hashing(ms)).verify(
                bundle, Path(bundle) / SIGNATURE
            )
            return key
        except Exception as e:  # noqa: BLE001 - any failure to verify means: not verified by this key
            reasons.append(f"{key.name}: {type(e).__name__}: {str(e)[:200]}")
    raise IntegrityError(f"{bundle}'s signature does not verify with any trusted key ({'; '.join(reasons)})")
