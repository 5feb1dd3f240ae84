"""Rewrites of the exported ONNX decode graph, at the level of its protobuf.

Owns: reading weights in their stored layout. torch's `linear` exports as `MatMul(x, Transpose(W))`;
ONNX Runtime would fold the transpose at session start into a transposed copy of W that it owns, a
second copy of every weight beside the eager model's. `FusedMatMul(x, W, transB=1)` (an ONNX Runtime
operator, com.microsoft, in every build with the CPU and CUDA providers) reads W as stored, and
`Gemm` has `transB` of its own.
"""

from __future__ import annotations

import onnx
from onnx import helper

MICROSOFT = "com.microsoft"


def fold_weight_transposes(model: onnx.ModelProto, weights: set[str]) -> onnx.ModelProto:
    """Drop each `Transpose(W, perm=[1, 0])` of a weight whose every consumer is a MatMul or Gemm
    reading it as B, and let those consumers read W transposed themselves."""
    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    dropped = set()
    for node in graph.node:
        users = consumers.get(node.output[0], []) if node.op_type == "Transpose" else []
        if users and node.input[0] in weights and _is_2d_swap(node) and all(_reads_as_b(u, node) for u in users):
            for user in users:
                _transpose_b(user, node.input[0])
            dropped.add(node.output[0])
    kept = [n for n in graph.node if not (n.op_type == "Transpose" and n.output[0] in dropped)]
    del graph.node[:]
    graph.node.extend(kept)
    if any(n.domain == MICROSOFT for n in graph.node) and not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    return model


def strip_debug_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop what torch.onnx attaches to every node and value for debugging: the Python stack and the FX
    node it came from (paths of the build machine, and most of the file's bytes: 1.3 of 1.5 MB)."""
    for item in [*model.graph.node, *model.graph.value_info, *model.graph.input, *model.graph.output]:
        del item.metadata_props[:]
    for tensor in model.graph.initializer:
        del tensor.metadata_props[:]
    return model


def name_axes(model: onnx.ModelProto, axes: dict[tuple[str, int], str]) -> onnx.ModelProto:
    """Call each dynamic axis by its contract name (torch.export names them like `s33`), for whoever reads
    the graph's signature: `axes` maps (input name, dimension) to the name, e.g. the batch (every input
    and output has it first) and the attended span (the pad mask's width). A static axis is left alone."""
    inputs = {value.name: value for value in model.graph.input}
    renames = {}
    for (name, dim), new in axes.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) > dim and dims[dim].dim_param:
            renames[dims[dim].dim_param] = new
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]
    return model


def _is_2d_swap(node: onnx.NodeProto) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return perm == [1, 0]


def _reads_as_b(user: onnx.NodeProto, transpose: onnx.NodeProto) -> bool:
    return (
        user.op_type in ("MatMul", "Gemm")
        and len(user.input) > 1
        and user.input[1] == transpose.output[0]
        and (user.input[0] != transpose.output[0])
    )


def _transpose_b(user: onnx.NodeProto, weight: str) -> None:
    user.input[1] = weight
    if user.op_type == "Gemm":
        flag = next((a for a in user.attribute if a.name == "transB"), None)
        if flag is None:
            user.attribute.append(helper.make_attribute("transB", 1))
        else:
            flag.i = 1 - flag.i
        return
    user.op_type, user.domain = "FusedMatMul", MICROSOFT  # MatMul's semantics, B read transposed
    user.attribute.append(helper.make_attribute("transB", 1))
