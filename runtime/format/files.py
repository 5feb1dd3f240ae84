"""The bundle's file names, and the one sha256 every hash of a bundle file goes through."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from runtime.errors import IntegrityError

MANIFEST = "manifest.json"
DECODE = "decode.pt2"  # the AOTInductor package (runtime.backends.aoti)
DECODE_ONNX = "decode.onnx"  # the portable decode (runtime.backends.onnxruntime), with `export --onnx`
KERNELS = "kernels.so"  # aotpack's kernels (runtime.quant.native): integer-quantized bundles, `dense` lowerings
WEIGHTS = "model.safetensors"
SIGNATURE = "signature.sig"  # inside the bundle; covers every other file, the manifest included
GENERATION = "generation_config.json"  # transformers' GenerationConfig: the bundle's generation defaults
# The defaults a bundle's generation config may carry from `export --generation` (how to sample, how
# long to go), and what `inspect` shows of it.
GENERATION_DEFAULTS = (
    "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
    "repetition_penalty", "no_repeat_ngram_size", "max_new_tokens", "min_new_tokens", "eos_token_id",
)  # fmt: skip


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256(path: Path) -> str:
    """A file's sha256, read in blocks (hashlib releases the GIL: a thread can hash while another works)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def copy_hashed(source: Path, destination: Path) -> str:
    """Copy a file, hashing the very bytes written; returns their sha256. What the copy holds is then
    exactly what was checked, whatever happens to the source afterwards."""
    h = hashlib.sha256()
    with open(source, "rb") as src, open(destination, "xb") as dst:
        for block in iter(lambda: src.read(1 << 22), b""):
            h.update(block)
            dst.write(block)
    return h.hexdigest()


def json_digest(body) -> str:
    """The sha256 of a JSON value in canonical form (sorted keys): the manifest's own digest, and the
    decode signature's fingerprint."""
    return sha256_bytes(json.dumps(body, sort_keys=True).encode())


def read_verified(path: Path, sha256_hex: str | None) -> bytes:
    """The file's bytes, checked against `sha256_hex` (the manifest's entry): what is then loaded is
    exactly what was verified, even if the bundle's file is replaced meanwhile."""
    data = path.read_bytes()
    if sha256_hex is not None and sha256_bytes(data) != sha256_hex:
        raise IntegrityError(f"{path.name} changed after it was verified; re-verify or re-export the bundle")
    return data
