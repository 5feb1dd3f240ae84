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
# tokens per row: 1 in a decode graph, k + 1 in a verify graph (speculative decoding: a row's next token
# and k drafted ones); static in each graph
TOKENS = "tokens"
METADATA_KEY = "aotpack_decode_contract"  # the .pt2 metadata entry holding `fingerprint()`


def graph_name(batch: int, tokens: int = 1, chunk: bool = False) -> str:
    """The model name, inside decode.pt2, of the graph that steps exactly `batch` rows by `tokens` each
    (`chunk`: the prefill-chunk graph, which writes one row's prompt tokens and gives no logits)."""
    if chunk:
        return f"chunk{tokens}"
    return f"batch{batch}" if tokens == 1 else f"verify{batch}x{tokens}"


def graph_title(batch: int, tokens: int = 1, chunk: bool = False) -> str:
    """The same graph in words, for messages and progress: what it steps."""
    if chunk:
        return f"chunk graph ({tokens} prompt tokens of one row)"
    return f"batch-{batch} decode step" if tokens == 1 else f"batch-{batch} verify step ({tokens} tokens a row)"


@dataclass(frozen=True)
class StepInput:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int | str, ...]  # ints, BATCH, SPAN or TOKENS


# Call order; the KV tensors follow, keys then values per layer, each (batch, kv_heads, slots, head_dim)
# in the bundle dtype. Output: next-token logits (batch, vocab) in float32; a verify graph's are
# (batch, tokens, vocab), the logits after each of its tokens; the chunk graph's, the last token's final
# hidden state (1, hidden) in float32 (the keys and values it writes are what it is for).
STEP_INPUTS = (
    StepInput("input_ids", "int64", (BATCH, TOKENS)),  # the newest token of each row (and its drafts)
    StepInput("position_ids", "int64", (BATCH, TOKENS)),  # their rotary positions (left padding shifts them)
    StepInput("cache_position", "int64", (BATCH,)),  # the absolute cache index each row writes its first to
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
    draft_tokens: int = 0  # k: the bundle's verify graphs take k + 1 tokens per row (0: no speculation)
    chunk_tokens: int = 0  # C: the bundle's chunk graph prefills C prompt tokens of one row (0: none)

    @property
    def verify_tokens(self) -> int | None:
        """Tokens per row of a verify step, k + 1 (None: the bundle has no verify graphs)."""
        return self.draft_tokens + 1 if self.draft_tokens else None

    @classmethod
    def of(cls, manifest) -> DecodeContract:
        """The contract a bundle's manifest describes; its recorded input names must be this runtime's."""
        if tuple(manifest.decode_inputs) != INPUT_NAMES:
            raise BundleError(
                f"bundle decode inputs {list(manifest.decode_inputs)} are not this runtime's {list(INPUT_NAMES)}; "
                "re-export the bundle with this aotpack"
            )
        layout, rows, length = tuple(manifest.cache_layout), manifest.batch_size, manifest.max_cache_len
        return cls(layout, rows, length, manifest.dtype, manifest.device, manifest.draft_tokens, manifest.chunk_tokens)

    def fingerprint(self, batch: int | None = None, tokens: int = 1, chunk: bool = False) -> str:
        """What a graph was compiled for, as one string: recorded in its metadata, compared at load.
        `batch`: the rows a static-batch graph steps (None: a dynamic batch, 1..batch_size); `tokens`: per
        row; `chunk`: the chunk graph. A decode graph of a bundle without drafts or chunk graph hashes as
        format 9's did (TOKENS written as 1)."""
        inputs = [asdict(i) | {"shape": [1 if d == TOKENS else d for d in i.shape]} for i in STEP_INPUTS]
        body = {"inputs": inputs, "kv": [asdict(layer) for layer in self.layout]}
        body |= {"batch_size": self.batch_size, "max_cache_len": self.max_cache_len, "dtype": self.dtype}
        body |= {"draft_tokens": self.draft_tokens} if self.draft_tokens else {}
        body |= {"chunk_tokens": self.chunk_tokens} if self.chunk_tokens else {}
        body |= {"graph_tokens": tokens} if tokens != 1 else {}
        body |= {"graph_kind": "chunk"} if chunk else {}
        return json_digest(body if batch is None else body | {"graph_batch": batch})

    def shape(self, spec: StepInput, batch: int, span: int, tokens: int = 1) -> tuple[int, ...]:
        sizes = {BATCH: batch, SPAN: span, TOKENS: tokens}
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

    def check_package(
        self, metadata: dict, artifact: str = "decode.pt2", batch: int | None = None, tokens: int = 1, chunk=False
    ) -> None:
        """A graph of the `.pt2` (or decode.onnx) was built for exactly this signature (its metadata
        carries the fingerprint); `batch`: the graph's static batch, `tokens` its tokens per row, `chunk`:
        whether it is the chunk graph."""
        if metadata.get(METADATA_KEY) != self.fingerprint(batch, tokens, chunk):
            raise BundleError(
                f"the manifest's cache layout, batch size, max_cache_len or dtype is not what {artifact} was "
                "compiled for; the bundle is inconsistent, re-export it"
            )
