"""Sibling layers in one kernel call: a decode graph's calls of aotpack's integer kernels that read the same
activations (a layer's q, k and v projections; its gate and up projections) become one call of their
scheme's cat op, whose output columns are then sliced apart as views.

Owns that rewrite of an exported graph, before AOTInductor compiles it. Each call of the integer kernels
starts and ends an OpenMP team and quantizes its activations; a batch-1 step of a 30-layer model makes
211 of them, each a few microseconds besides its weights. SmolLM2-135M's int8 linears in C on an AMD EPYC
Zen 4 (2 threads): 5.2 ms a step as 211 calls, 4.6 ms as 121 (artifacts/bench/epyc-zen4/fused/).

The cat op computes every output column with the bits the single call gives it (exporter/csrc/lanes.h,
Part), so the graph's numbers, and their parity with the eager prefill (which calls the layers one by
one), do not change.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from exporter.compat import fake_mode
from runtime.quant import SCHEMES
from runtime.quant.native import MAX_PARTS

_SLICE = torch.ops.aten.slice.Tensor


def fuse_siblings(exported) -> int:
    """Rewrite `exported`'s graph in place: every group of a scheme's calls on one activation tensor (and
    one group size) becomes one cat call, up to MAX_PARTS weights a call. Returns the calls saved."""
    graph = exported.graph_module.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    saved = 0
    for scheme in (s for s in SCHEMES.values() if s.cat_op is not None):
        for nodes in _siblings(graph, scheme).values():
            for start in range(0, len(nodes), MAX_PARTS):
                chunk = nodes[start : start + MAX_PARTS]
                if len(chunk) > 1 and _fusable(chunk, order):
                    _fuse(graph, scheme, chunk)
                    saved += len(chunk) - 1
    if saved:
        graph.lint()
        exported.graph_module.recompile()
    return saved


def _siblings(graph, scheme) -> dict[tuple, list]:
    """The scheme's op calls in graph order, by (activation node, the op's extra arguments)."""
    groups = defaultdict(list)
    for node in graph.nodes:
        if node.op == "call_function" and node.target == scheme.op and not node.kwargs:
            groups[(node.args[0], tuple(node.args[1 + len(scheme.tensors) :]))].append(node)
    return groups


def _fusable(nodes: list, order: dict) -> bool:
    """Whether one call placed before the first of `nodes` can stand for them all: every weight they read
    is defined by then (an exported graph's weights are placeholders, before every call), and none of them
    is an output of the graph (its signature names the node)."""
    first = order[nodes[0]]
    weights = [arg for node in nodes for arg in node.args[1:] if isinstance(arg, torch.fx.Node)]
    outputs = any(user.op == "output" for node in nodes for user in node.users)
    return all(order[weight] < first for weight in weights) and not outputs


def _fuse(graph, scheme, nodes: list) -> None:
    """One cat call in place of `nodes` (same activations, in graph order; _fusable), before the first of
    them, each one's users reading its slice."""
    x, extras = nodes[0].args[0], nodes[0].args[1 + len(scheme.tensors) :]
    operands = [[node.args[1 + i] for node in nodes] for i in range(len(scheme.tensors))]
    values = [node.meta["val"] for node in nodes]  # (..., N_p) each
    dim = values[0].dim() - 1
    with fake_mode(values):
        fused_value = torch.cat(values, dim)  # (..., sum of N_p)
    with graph.inserting_before(nodes[0]):
        fused = graph.call_function(scheme.cat_op, (x, *operands, *extras))
        fused.meta["val"] = fused_value
        start = 0
        for node, value in zip(nodes, values, strict=True):
            end = start + value.shape[-1]
            part = graph.call_function(_SLICE, (fused, dim, start, end))
            with fake_mode(values):
                part.meta["val"] = _SLICE(fused_value, dim, start, end)
            node.replace_all_uses_with(part)
            start = end
    for node in nodes:  # after the insertions, which go before the first of them
        graph.erase_node(node)
