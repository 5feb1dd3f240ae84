"""The decode step's signature: one definition that the exporter traces and the runtime checks.

Owns: the compiled step's inputs in call order (name, dtype, shape rule), its output, which dimension is
dynamic, and the checks made before every call (AOTInductor checks nothing: a wrong shape corrupts the
heap). The exporter builds its example inputs and dynamic shapes here; `CompiledDecode` checks and calls
through `DecodeContract`; the manifest records the signature, and the same description is compiled into
the `.pt2`'s metadata, so `load()` refuses a manifest that describes other buffers than the `.so` expects.

To change the decode signature, change `STEP_INPUTS` (and `DecodeStep.forward` in the exporter, which
takes the same inputs in the same order) and bump the manifest's format version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch

from runtime.cache import LayerLayout, allocate
from runtime.errors import BundleError, InvalidInputError

BATCH = "batch"  # dynamic, 1..batch_size
CACHE_LEN = "max_cache_len"
METADATA_KEY = "aotpack_decode_contract"  # the .pt2 metadata entry holding `fingerprint()`


@dataclass(frozen=True)
class StepInput:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int | str, ...]  # ints, BATCH or CACHE_LEN


# Call order; the KV tensors follow, keys then values per layer, each (batch, kv_heads, slots, head_dim)
# in the bundle dtype. Output: next-token logits (batch, vocab) in float32.
STEP_INPUTS = (
    StepInput("input_ids", "int64", (BATCH, 1)),  # the newest token of each row
    StepInput("position_ids", "int64", (BATCH, 1)),  # its rotary position (left padding shifts it)
    StepInput("cache_position", "int64", (BATCH,)),  # the absolute cache index each row writes it to
    StepInput("pad_mask", "bool", (BATCH, CACHE_LEN)),  # True where an absolute index holds a real token
)
INPUT_NAMES = tuple(i.name for i in STEP_INPUTS)


@dataclass(frozen=True)
class DecodeContract:
    """The signature of one bundle's compiled step: STEP_INPUTS made concrete by its cache layout."""

    layout: tuple[LayerLayout, ...]
    batch_size: int
    max_cache_len: int
    dtype: str
    device: str

    @classmethod
    def of(cls, manifest) -> DecodeContract:
        """The contract a bundle's manifest describes; its recorded input names must be this runtime's."""
        if tuple(manifest.decode_inputs) != INPUT_NAMES:
            raise BundleError(
                f"bundle decode inputs {list(manifest.decode_inputs)} are not this runtime's {list(INPUT_NAMES)}; "
                "re-export the bundle with this aotpack"
            )
        return cls(
            tuple(manifest.cache_layout), manifest.batch_size, manifest.max_cache_len, manifest.dtype, manifest.device
        )

    def fingerprint(self) -> str:
        """What the `.so` was compiled for, as one string: recorded in its metadata, compared at load."""
        body = {"inputs": [asdict(i) for i in STEP_INPUTS], "kv": [asdict(layer) for layer in self.layout]}
        body |= {"batch_size": self.batch_size, "max_cache_len": self.max_cache_len, "dtype": self.dtype}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def _shape(self, spec: StepInput, batch: int) -> tuple[int, ...]:
        sizes = {BATCH: batch, CACHE_LEN: self.max_cache_len}
        return tuple(sizes.get(d, d) for d in spec.shape)

    def kv_names(self, prefix: str = "") -> list[str]:
        """The KV tensors' names in the ONNX step, in call order: key0, value0, key1, ... (`prefix`
        "new_" names its outputs, the keys and values it wrote)."""
        return [f"{prefix}{kind}{i}" for i in range(len(self.layout)) for kind in ("key", "value")]

    def onnx_names(self) -> tuple[list[str], list[str]]:
        """(input names, output names) of the ONNX step: STEP_INPUTS and the cache; the logits and
        the keys and values written, each (batch, kv_heads, 1, head_dim)."""
        return [*INPUT_NAMES, *self.kv_names()], ["logits", *self.kv_names("new_")]

    def kv_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, layer.num_kv_heads, layer.slots, layer.head_dim) for layer in self.layout for _ in range(2)]

    def example_inputs(self) -> tuple:
        """Inputs to trace with, at the largest batch: a traced batch of 1 would specialise the dimension."""
        fixed = [
            torch.zeros(self._shape(s, self.batch_size), dtype=getattr(torch, s.dtype), device=self.device)
            for s in STEP_INPUTS
        ]
        fixed[INPUT_NAMES.index("cache_position")] += torch.arange(1, self.batch_size + 1)  # rows stand apart
        fixed[INPUT_NAMES.index("pad_mask")] |= True
        return (*fixed, *allocate(self.layout, self.batch_size, getattr(torch, self.dtype), self.device))

    def dynamic_shapes(self):
        """The batch is dynamic (1..B) so one `.so` serves smaller batches; with B == 1 it stays static,
        because export specialises a dimension traced at size 1 anyway."""
        if self.batch_size == 1:
            return None
        batch = torch.export.Dim(BATCH, min=1, max=self.batch_size)
        fixed = tuple({0: batch} if s.shape[0] == BATCH else None for s in STEP_INPUTS)
        return (*fixed, tuple({0: batch} for _ in range(2 * len(self.layout))))

    def check(self, inputs: list) -> None:
        """Refuse anything the compiled step would misread: count, type, shape, dtype, device, layout,
        and a cache position outside the cache."""
        if len(inputs) != len(STEP_INPUTS) + 2 * len(self.layout):
            raise InvalidInputError(
                f"the compiled decode takes {len(STEP_INPUTS)} inputs and {2 * len(self.layout)} KV tensors, "
                f"got {len(inputs)}"
            )
        first = inputs[0]
        batch = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else 0
        if not 1 <= batch <= self.batch_size:
            raise InvalidInputError(
                f"batch {batch} is outside this bundle's 1..{self.batch_size}; re-export with --batch-size {batch}"
            )
        for spec, tensor in zip(STEP_INPUTS, inputs, strict=False):
            _expect(spec.name, tensor, self._shape(spec, batch), getattr(torch, spec.dtype), self.device)
        cache_dtype = getattr(torch, self.dtype)
        for i, (shape, tensor) in enumerate(zip(self.kv_shapes(batch), inputs[len(STEP_INPUTS) :], strict=True)):
            _expect(f"layer {i // 2} {('keys', 'values')[i % 2]}", tensor, shape, cache_dtype, self.device)
        positions = inputs[INPUT_NAMES.index("cache_position")]
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= self.max_cache_len:
            bad = low if low < 0 else high
            raise InvalidInputError(f"cache_position {bad} is outside the cache's 0..{self.max_cache_len - 1}")

    def check_package(self, metadata: dict, artifact: str = "decode.pt2") -> None:
        """The `.pt2` (or decode.onnx) was built for exactly this signature (its metadata carries the
        fingerprint)."""
        if metadata.get(METADATA_KEY) != self.fingerprint():
            raise BundleError(
                f"the manifest's cache layout, batch size, max_cache_len or dtype is not what {artifact} was "
                "compiled for; the bundle is inconsistent, re-export it"
            )


def _expect(name: str, t, shape, dtype: torch.dtype, device: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise InvalidInputError(f"{name} has shape {tuple(t.shape)}, the compiled decode needs {tuple(shape)}")
    if t.dtype != dtype:
        raise InvalidInputError(f"{name} has dtype {t.dtype}, the compiled decode needs {dtype}")
    if t.device.type != device:
        raise InvalidInputError(f"{name} is on {t.device}, the compiled decode runs on {device}")
    if not t.is_contiguous():
        raise InvalidInputError(f"{name} is not contiguous; call .contiguous() first")
