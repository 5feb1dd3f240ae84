"""The decode step's signature: one definition that the exporter traces and every backend checks.

Owns: the step's inputs in call order (name, dtype, shape rule), its output, which dimension is dynamic,
and the fingerprint of all that which is compiled into the `.pt2` (and decode.onnx), so `load()`
refuses a manifest that describes other buffers than the compiled step expects. Torch-free: the
checks made before every call are runtime.backends.checks', the example inputs and dynamic shapes
the exporter traces with are exporter.compile's, both read from here.

To change the decode signature, change `STEP_INPUTS` (and `DecodeStep.forward` in runtime.model.step,
which takes the same inputs in the same order) and bump the manifest's format version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from runtime.errors import BundleError
from runtime.format.files import json_digest
from runtime.format.layout import LayerLayout

BATCH = "batch"  # the rows stepped: static in each AOTInductor graph (its batch), dynamic in decode.onnx
SPAN = "span"  # dynamic, 1..max_cache_len: the cache indices the step attends to, [0, span)
METADATA_KEY = "aotpack_decode_contract"  # the .pt2 metadata entry holding `fingerprint()`


def graph_name(batch: int) -> str:
    """The model name, inside decode.pt2, of the graph that steps exactly `batch` rows."""
    return f"batch{batch}"


@dataclass(frozen=True)
class StepInput:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int | str, ...]  # ints, BATCH or SPAN


# Call order; the KV tensors follow, keys then values per layer, each (batch, kv_heads, slots, head_dim)
# in the bundle dtype. Output: next-token logits (batch, vocab) in float32.
STEP_INPUTS = (
    StepInput("input_ids", "int64", (BATCH, 1)),  # the newest token of each row
    StepInput("position_ids", "int64", (BATCH, 1)),  # its rotary position (left padding shifts it)
    StepInput("cache_position", "int64", (BATCH,)),  # the absolute cache index each row writes it to
    # True where an absolute index holds a real token, for the indices [0, span) the step attends to:
    # its width sets the span (above every row's cache_position), so a step's attention costs what the
    # context in use costs, not what the whole cache would.
    StepInput("pad_mask", "bool", (BATCH, SPAN)),
)
INPUT_NAMES = tuple(i.name for i in STEP_INPUTS)


@dataclass(frozen=True)
class DecodeContract:
    """The signature of one bundle's compiled step: STEP_INPUTS made concrete by its cache layout. It is
    also what the engine sizes its KV cache by: `batch_size` rows of `layout` in `dtype` on `device`."""

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

    def fingerprint(self, batch: int | None = None) -> str:
        """What a graph was compiled for, as one string: recorded in its metadata, compared at load.
        `batch`: the rows a static-batch graph steps (None: a dynamic batch, 1..batch_size)."""
        body = {"inputs": [asdict(i) for i in STEP_INPUTS], "kv": [asdict(layer) for layer in self.layout]}
        body |= {"batch_size": self.batch_size, "max_cache_len": self.max_cache_len, "dtype": self.dtype}
        return json_digest(body if batch is None else body | {"graph_batch": batch})

    def shape(self, spec: StepInput, batch: int, span: int) -> tuple[int, ...]:
        sizes = {BATCH: batch, SPAN: span}
        return tuple(sizes.get(d, d) for d in spec.shape)

    def kv_shapes(self, batch: int) -> list[tuple[int, ...]]:
        """Each KV tensor's shape at `batch` rows, in call order (keys then values per layer)."""
        return [layer.shape(batch) for layer in self.layout for _ in range(2)]

    def kv_names(self, prefix: str = "") -> list[str]:
        """The KV tensors' names in the ONNX step, in call order: key0, value0, key1, ... (`prefix`
        "new_" names its outputs, the keys and values it wrote)."""
        return [f"{prefix}{kind}{i}" for i in range(len(self.layout)) for kind in ("key", "value")]

    def onnx_names(self) -> tuple[list[str], list[str]]:
        """(input names, output names) of the ONNX step: STEP_INPUTS and the cache; the logits and
        the keys and values written, each (batch, kv_heads, 1, head_dim)."""
        return [*INPUT_NAMES, *self.kv_names()], ["logits", *self.kv_names("new_")]

    def check_package(self, metadata: dict, artifact: str = "decode.pt2", batch: int | None = None) -> None:
        """A graph of the `.pt2` (or decode.onnx) was built for exactly this signature (its metadata
        carries the fingerprint); `batch`: the graph's static batch."""
        if metadata.get(METADATA_KEY) != self.fingerprint(batch):
            raise BundleError(
                f"the manifest's cache layout, batch size, max_cache_len or dtype is not what {artifact} was "
                "compiled for; the bundle is inconsistent, re-export it"
            )
