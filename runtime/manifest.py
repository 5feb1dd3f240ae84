"""The bundle contract: file names and the versioned, frozen manifest.

Owns: what a bundle is. The exporter writes bundles only through this module and the runtime reads
them only through it, so both sides agree on one definition. Metadata is JSON, never pickle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from runtime.cache import LayerLayout
from runtime.errors import ManifestError

AOTPACK_VERSION = "0.1.0"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

MANIFEST = "manifest.json"
DECODE = "decode.pt2"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Constant:
    """One compiled-decode constant and where its tensor comes from at load time."""

    name: str  # the name AOTInductor gives it (get_constant_fqns)
    module_path: str  # parameter or buffer path in the eager model that lends its storage
    safetensors_key: str | None  # key of the stored tensor; None for non-persistent buffers (rotary inv_freq)


@dataclass(frozen=True)
class Parity:
    """Export-time check: eager HF generate against eager prefill + compiled decode."""

    steps: int
    max_abs_logit_diff: float
    tolerance: float
    tokens_match: bool


@dataclass(frozen=True)
class Manifest:
    format_version: int
    aotpack_version: str
    torch_version: str
    transformers_version: str
    python_version: str
    model_class: str  # transformers class that rebuilds the eager model, e.g. "LlamaForCausalLM"
    is_multimodal: bool
    device: str
    cpu_isa: str | None  # what the .so was compiled for (AOTI_CPU_ISA), None on CUDA
    dtype: str
    batch_size: int  # the largest batch the compiled decode serves
    max_cache_len: int
    vocab_size: int
    cache_layout: tuple[LayerLayout, ...]
    decode_inputs: tuple[str, ...]  # graph input names in call order; the KV tensors follow
    constants: tuple[Constant, ...]
    files: dict[str, str]  # bundle file name -> sha256 hex
    build_seconds: float
    built_at: str  # ISO 8601, UTC
    parity: Parity

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"manifest.json is not valid JSON ({e}); re-export the bundle") from e
        if not isinstance(raw, dict):
            raise ManifestError("manifest.json must hold a JSON object; re-export the bundle")
        version = raw.get("format_version")
        if version not in SUPPORTED_VERSIONS:
            raise ManifestError(
                f"bundle format_version {version!r} is not supported by this runtime, which reads "
                f"{sorted(SUPPORTED_VERSIONS)}; re-export the bundle with a matching aotpack"
            )
        return _build(cls, raw)


def _build(cls, raw: dict) -> Manifest:
    names = {f.name for f in fields(cls)}
    if set(raw) != names:
        missing, extra = sorted(names - set(raw)), sorted(set(raw) - names)
        raise ManifestError(f"manifest fields do not match format 1 (missing {missing}, unexpected {extra})")
    try:
        data = dict(raw)
        data["cache_layout"] = tuple(LayerLayout(**layer) for layer in raw["cache_layout"])
        data["constants"] = tuple(Constant(**c) for c in raw["constants"])
        data["decode_inputs"] = tuple(raw["decode_inputs"])
        data["parity"] = Parity(**raw["parity"])
        manifest = cls(**data)
    except (TypeError, KeyError) as e:
        raise ManifestError(f"manifest.json is malformed ({e}); re-export the bundle") from e
    _check_values(manifest)
    return manifest


def _check_values(m: Manifest) -> None:
    if m.dtype not in DTYPES:
        raise ManifestError(f"manifest dtype {m.dtype!r} is not one of {DTYPES}")
    if m.device not in DEVICES:
        raise ManifestError(f"manifest device {m.device!r} is not one of {DEVICES}")
    for key, value in (("batch_size", m.batch_size), ("max_cache_len", m.max_cache_len), ("vocab_size", m.vocab_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ManifestError(f"manifest {key} must be a positive integer, got {value!r}")
    if not isinstance(m.files, dict) or not all(isinstance(v, str) for v in m.files.values()):
        raise ManifestError("manifest files must map file names to sha256 strings")
    if DECODE not in m.files:
        raise ManifestError(f"manifest does not list {DECODE}; re-export the bundle")
