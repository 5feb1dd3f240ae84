"""aotpack's bf16 GEMM on AMX tiles (the `tiles` lowering: exporter/csrc/dense.cpp, runtime.quant.dense)
against fp64: odd shapes (K past the last 32 columns, N past the last tile of 16 rows, more than 16
activation rows), a row's bits independent of the batch and of strided activations, NaN confined to its
row, and what it refuses. Skipped, naming the missing flags, on a CPU without AMX's bf16 tiles."""

from __future__ import annotations

import pytest
import torch
from helpers import isa_library

from exporter.lowering import CANDIDATES, LINEAR
from runtime.errors import BundleError
from runtime.quant import dense, native

SHAPES = [(1, 640, 7), (3, 33, 1), (5, 100, 17), (8, 96, 64), (16, 64, 48), (40, 64, 13), (2, 7, 4), (17, 70, 40)]


@pytest.fixture(scope="module")
def lib():
    library = isa_library("amx")
    if not library.tiles:
        pytest.skip("Linux did not grant this process AMX's tile state")
    return library


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_tiles_match_fp64(lib, m, k, n):
    torch.manual_seed(m * 1000 + k + n)
    x, w = torch.randn(m, k).bfloat16(), (torch.randn(n, k) / k**0.5).bfloat16()
    y = native.linear_tiles(x, w, lib)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref = x.double() @ w.double().t()  # products of bf16 values are exact in fp32: the sums' and the output's rounding
    assert (y.double() - ref).abs().max() <= 1e-2 * max(1.0, ref.abs().max().item())


def test_a_row_computes_the_same_bits_in_any_batch_and_any_layout(lib):
    """Tiles of 16 weight rows (37 leaves 5 past the last), 16 activation rows a pass (20 make two), a
    K % 32 tail (130): a row alone, first or last of a batch, in the second pass, or read from a strided
    view, has the same bits."""
    torch.manual_seed(0)
    x, w = torch.randn(20, 130).bfloat16(), torch.randn(37, 130).bfloat16()
    alone = native.linear_tiles(x[4:5], w, lib)
    assert torch.equal(native.linear_tiles(x, w, lib)[4:5], alone)
    assert torch.equal(native.linear_tiles(x[4:], w, lib)[:1], alone)
    assert torch.equal(native.linear_tiles(x[:17], w, lib)[16:], native.linear_tiles(x[16:17], w, lib))
    wide = torch.randn(20, 200).bfloat16()
    wide[:, :130] = x
    assert torch.equal(native.linear_tiles(wide[:, :130], w, lib), native.linear_tiles(x, w, lib))


def test_the_tiles_are_what_runs(lib):
    """A subnormal bf16 activation times 1e30: 1e-9 through the FMAs of the dense kernel, 0 on the tiles
    (they read subnormals as zero); the normal row is the same."""
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(16, 64, dtype=torch.bfloat16)
    x[0, 3], x[1, 3], w[:, 3] = 1e-39, 1.0, 1e30
    tiles, fmas = native.linear_tiles(x, w, lib), native.linear_dense(x, w, lib)
    assert (tiles[0] == 0).all() and (fmas[0] > 1e-9).all() and torch.equal(tiles[1], fmas[1])


def test_nan_in_a_row_poisons_that_row_only(lib):
    x, w = torch.randn(3, 64).bfloat16(), torch.randn(37, 64).bfloat16()
    x[1, 10] = float("nan")
    y = native.linear_tiles(x, w, lib)
    assert y[1].isnan().all() and not y[[0, 2]].isnan().any()


def test_it_refuses_what_it_cannot_multiply(lib):
    x, w = torch.randn(2, 64).bfloat16(), torch.randn(16, 64).bfloat16()
    with pytest.raises(ValueError, match="bf16 activations and a bf16"):
        native.linear_tiles(x.float(), w, lib)
    with pytest.raises(ValueError, match=r"bf16 \(N, 64\) weight"):
        native.linear_tiles(x, w.half(), lib)
    assert lib.aotpack_linear_tiles(x.data_ptr(), 0, 2, 64, w.data_ptr(), 1, 16, x.data_ptr()) == 1  # BAD_DTYPE


def test_a_library_without_the_amx_path_refuses_tiles_before_any_tile_instruction():
    other = isa_library("avx512-vnni")
    assert not other.tiles
    with pytest.raises(BundleError, match="cannot run the tiles kernel"):
        native.linear_tiles(torch.randn(1, 64).bfloat16(), torch.randn(16, 64).bfloat16(), other)
    x, w = torch.randn(1, 64).bfloat16(), torch.randn(16, 64).bfloat16()
    y = torch.empty(1, 16, dtype=torch.bfloat16)
    assert other.aotpack_linear_tiles(x.data_ptr(), 1, 1, 64, w.data_ptr(), 1, 16, y.data_ptr()) == 5  # NO_TILES


def test_the_op_and_the_lowering_are_what_the_graphs_call(lib):
    """The op over (B, 1, K) activations, and the `tiles` lowering with a bias, as a decode graph has them."""
    x, w, b = torch.randn(2, 1, 64).bfloat16(), torch.randn(48, 64).bfloat16(), torch.randn(48).bfloat16()
    with native.serving(lib):
        assert torch.equal(dense.TILES_OP(x, w), native.linear_tiles(x, w, lib).view(2, 1, 48))
        lowered = CANDIDATES[LINEAR]["tiles"](x, w, b)
    torch.testing.assert_close(lowered, torch.nn.functional.linear(x, w, b), atol=5e-2, rtol=2e-2)
