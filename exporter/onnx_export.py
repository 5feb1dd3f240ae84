"""`export --onnx`: the decode step as an ONNX graph (decode.onnx) that ONNX Runtime runs.

Owns: the torch.onnx export of the step and what makes the graph fit a bundle. The step is the
compiled one's, except that it returns the keys and values it writes (ONNX keeps no in-place update of
an input: the cache update was silently dropped). The graph is optimized with every weight left as it
is, weight reads become MatMuls over the stored (out, in) layout, and each weight initializer points into
the bundle's model.safetensors (external data: offset and length), so the bundle holds the weights once
on disk and the runtime can lend ONNX Runtime the eager model's tensors (one copy in memory too).
"""

from __future__ import annotations

import json
import logging
import struct
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnx_ir
import onnxruntime
import torch
from onnxscript.optimizer import optimize_ir

from exporter.compile import export_decode
from exporter.constants import constant_sources
from exporter.model import decode_module
from exporter.onnx_graph import fold_weight_transposes, name_axes, strip_debug_info
from runtime.errors import ExportError
from runtime.format.contract import BATCH, INPUT_NAMES, METADATA_KEY, SPAN, DecodeContract
from runtime.format.files import DECODE_ONNX, WEIGHTS
from runtime.format.manifest import Constant, OnnxDecode, Parity


def export_onnx(model, layout, contract: DecodeContract, staging: Path, aliases: dict[str, str]) -> OnnxDecode:
    """Write staging/decode.onnx (after the weights file); returns its manifest entry, whose parity the
    export's gate fills in."""
    step = decode_module(model, layout, returns_written=True)
    exported = export_decode(step, contract)
    inputs, outputs = contract.onnx_names()
    with _quiet_onnx():
        program = torch.onnx.export(
            exported, (), dynamo=True, input_names=inputs, output_names=outputs, optimize=False, verbose=False
        )
    tensors = set(program.model.graph.initializers) & _tensor_names(step)  # the model's, not constants
    _optimize(program.model, tensors)
    weights = _stored_weights(step, model, tensors & set(program.model.graph.initializers), aliases)
    _point_into(program.model, weights, staging / WEIGHTS)
    proto = fold_weight_transposes(onnx_ir.serde.serialize_model(program.model), {w.name for w in weights})
    proto = name_axes(strip_debug_info(proto), {(INPUT_NAMES[0], 0): BATCH, ("pad_mask", 1): SPAN})
    # what the graph was exported for, as the .so carries it: load() refuses a manifest that says otherwise
    onnx.helper.set_model_props(proto, {METADATA_KEY: contract.fingerprint()})
    onnx.save_model(proto, staging / DECODE_ONNX)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return OnnxDecode(DECODE_ONNX, opset, onnxruntime.__version__, weights, Parity(0, 0.0, 0.0, False))


def _tensor_names(step) -> set[str]:
    named = [*step.named_parameters(remove_duplicate=False), *step.named_buffers(remove_duplicate=False)]
    return {name for name, _ in named}


def _stored_weights(step, model, names: set[str], aliases: dict[str, str]) -> tuple[Constant, ...]:
    """Of the step's tensors the optimized graph still holds, those stored in the weights file (not
    non-persistent buffers such as the rotary tables)."""
    sources = constant_sources(step, model, names, aliases)
    return tuple(c for c in sources if c.safetensors_key is not None)


def _optimize(graph_model, weights: set[str]) -> None:
    """onnxscript's optimizer (constant folding, shape inference, dead code), except on a weight: folding
    `Transpose(W)` into a new initializer is a second, transposed copy that the bundle would store and
    ONNX Runtime hold besides the eager model's."""

    def should_fold(node):
        return False if any(v is not None and v.name in weights for v in node.inputs) else None

    optimize_ir(graph_model, should_fold=should_fold)


def _point_into(graph_model, weights: tuple[Constant, ...], safetensors: Path) -> None:
    """Make each weight initializer external data at its bytes inside the safetensors file, once those
    bytes are checked to be the initializer's (the runtime lends ONNX Runtime the eager tensors, so
    only a plain ONNX Runtime session would read them, and the parity gate would not see a wrong offset)."""
    offsets = safetensors_offsets(safetensors)
    stored = np.memmap(safetensors, dtype=np.uint8, mode="r")
    for weight in weights:
        value = graph_model.graph.initializers[weight.name]
        offset, length, dtype = offsets[weight.safetensors_key]
        expected = value.const_value.numpy().reshape(-1).view(np.uint8)
        if dtype != "F32" or not np.array_equal(stored[offset : offset + length], expected):
            raise ExportError(
                f"{weight.safetensors_key} in {WEIGHTS} ({dtype}, {length} bytes) is not the ONNX graph's "
                f"{weight.name} ({value.const_value.dtype}, {expected.size} bytes); --onnx needs a float32 bundle"
            )
        value.const_value = onnx_ir.ExternalTensor(
            WEIGHTS, offset, length, value.const_value.dtype, shape=value.const_value.shape, name=weight.name
        )


def safetensors_offsets(path: Path) -> dict[str, tuple[int, int, str]]:
    """key -> (byte offset in the file, byte length, dtype) for every tensor of a safetensors file: an
    8-byte little-endian header length, the JSON header, then the tensors' bytes."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    start = 8 + size
    return {
        key: (start + entry["data_offsets"][0], entry["data_offsets"][1] - entry["data_offsets"][0], entry["dtype"])
        for key, entry in header.items()
        if key != "__metadata__"
    }


@contextmanager
def _quiet_onnx():
    """torch.onnx logs a warning per missing torchvision operator and prints its stages; the export's
    own progress says what runs."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
