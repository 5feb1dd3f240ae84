"""exporter.siblings: a decode graph's integer-kernel calls on the same activations become one cat call per
scheme and group size, sliced back apart, and the graph computes the same bits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exporter import kernels
from exporter.siblings import fuse_siblings
from runtime.quant import int5_dot, int8_dot, tiles


class _Layer(nn.Module):
    """q, k, v at int8 on the normed input (one cat call), o on the attention's output (its own activations:
    no sibling), gate and up at int5 (one cat call), down at int5 with another group size (none)."""

    def __init__(self, g: torch.Generator):
        super().__init__()
        int8 = {"q": 48, "k": 16, "v": 16, "o": 32}
        for name, rows in int8.items():
            self.register_buffer(
                f"{name}_codes", int8_dot.arrange(torch.randint(-127, 128, (rows, 32), generator=g).to(torch.int8))
            )
            self.register_buffer(f"{name}_scales", torch.rand(rows, generator=g))
        for name, (rows, cols, group) in {"gate": (40, 32, 32), "up": (40, 32, 32), "down": (32, 64, 64)}.items():
            codes, highs = int5_dot.arrange(torch.randint(0, 32, (rows, cols), generator=g))
            scales = tiles.tile_rows(torch.rand(rows, cols // group, generator=g).half())
            for part, tensor in (("codes", codes), ("highs", highs), ("scales", scales)):
                self.register_buffer(f"{name}_{part}", tensor)

    def int8(self, x, name):
        return torch.ops.aotpack.dot_linear_int8(x, getattr(self, f"{name}_codes"), getattr(self, f"{name}_scales"))

    def int5(self, x, name, group):
        operands = (getattr(self, f"{name}_{part}") for part in ("codes", "highs", "scales"))
        return torch.ops.aotpack.dot_linear_int5(x, *operands, group)

    def forward(self, x):  # (B, 1, 32)
        h = x * 2
        q, k, v = self.int8(h, "q"), self.int8(h, "k"), self.int8(h, "v")
        h = self.int8(q[..., :32] + k.repeat(1, 1, 2) * v.repeat(1, 1, 2), "o")
        up = torch.nn.functional.silu(self.int5(h, "gate", 32)) * self.int5(h, "up", 32)
        return torch.cat([self.int5(up[..., :32].repeat(1, 1, 2), "down", 64), q], -1)


@pytest.mark.parametrize("batch", [1, 3])
def test_sibling_calls_become_one_cat_call_with_the_same_bits(batch):
    kernels.build(log=lambda _: None)  # serves the eager ops
    layer = _Layer(torch.Generator().manual_seed(batch))
    x = torch.randn(batch, 1, 32)
    exported = torch.export.export(layer, (x,))
    expected = exported.module()(x)
    assert fuse_siblings(exported) == 3  # q, k, v: two calls fewer; gate, up: one
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    ops = torch.ops.aotpack
    assert targets.count(ops.dot_linear_int8_cat.default) == 1 and targets.count(ops.dot_linear_int8.default) == 1
    assert targets.count(ops.dot_linear_int5_cat.default) == 1 and targets.count(ops.dot_linear_int5.default) == 1
    assert torch.equal(exported.module()(x), expected)
    assert fuse_siblings(exported) == 0  # nothing left to fuse


class _Apart(nn.Module):
    """Two int8 calls on different activations: no siblings."""

    def __init__(self, layer: _Layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer.int8(x, "o") + self.layer.int8(x * 2, "q")[..., :32]


def test_a_graph_without_siblings_is_left_as_it_is():
    exported = torch.export.export(_Apart(_Layer(torch.Generator().manual_seed(0))), (torch.randn(1, 1, 32),))
    before = str(exported.graph)
    assert fuse_siblings(exported) == 0 and str(exported.graph) == before


class _Outputs(nn.Module):
    """Sibling calls whose outputs are the graph's own: left apart (the export's signature names them)."""

    def __init__(self, layer: _Layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer.int8(x, "q"), self.layer.int8(x, "k")


def test_sibling_calls_that_are_graph_outputs_are_left_apart():
    exported = torch.export.export(_Outputs(_Layer(torch.Generator().manual_seed(1))), (torch.randn(1, 1, 32),))
    assert fuse_siblings(exported) == 0
