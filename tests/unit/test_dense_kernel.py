"""aotpack's dense GEMM (exporter/csrc/dense.cpp, runtime.quant.dense) against fp64, on each instruction
path this machine can run: fp32, bf16 and fp16 weights and activations, odd shapes (K not a multiple of 8,
N not a multiple of the 3-row tile, N = 1, M not a multiple of the micro-tile's 4 rows (8 or 16 on AVX-512), 40
rows as a verify graph at batch 8), strided activations, a row's bits independent of the batch and of the
vector path, and operands it refuses."""

from __future__ import annotations

import pytest
import torch
from helpers import isa_library

from exporter import kernels
from runtime.quant import dense, native

PATHS = ("scalar", "avx2", "avx512-vnni")  # AVX-512: 8 activation rows a micro-tile
SHAPES = [(1, 640, 7), (3, 33, 1), (5, 100, 9), (8, 96, 64), (40, 64, 13), (2, 7, 4), (13, 70, 5)]  # (M, K, N)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(scope="module", params=PATHS)
def lib(request):
    return isa_library(request.param)


def _reference(x, w):
    return x.double() @ w.double().t()  # (M, N)


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
@pytest.mark.parametrize("wtype", DTYPES)
@pytest.mark.parametrize("xtype", DTYPES)
def test_dense_kernel_matches_fp64(lib, m, k, n, wtype, xtype):
    torch.manual_seed(m * 1000 + k + n)
    x, w = torch.randn(m, k).to(xtype), (torch.randn(n, k) / k**0.5).to(wtype)
    y = native.linear_dense(x, w, lib)
    assert y.dtype == xtype and y.shape == (m, n)
    ref = _reference(x, w)
    # fp32 sums of products of exactly represented values: only the sum's rounding, then the output's
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[xtype]
    assert (y.double() - ref).abs().max() <= tolerance * max(1.0, ref.abs().max().item())


def test_a_row_computes_the_same_bits_in_any_batch_and_any_layout(lib):
    """A row alone, first or last of an odd batch, or read from a strided view: the same bits. A call of
    up to 16 rows takes its micro-tiles' weight rows from runs read side by side, a larger one adjacent
    rows (20 here): the outputs cannot tell."""
    torch.manual_seed(0)
    x, w = torch.randn(20, 130), torch.randn(37, 130)
    alone = native.linear_dense(x[4:5], w, lib)
    assert torch.equal(native.linear_dense(x, w, lib)[4:5], alone)
    assert torch.equal(native.linear_dense(x[4:], w, lib)[:1], alone)
    wide = torch.randn(20, 200)
    wide[:, :130] = x
    assert torch.equal(native.linear_dense(wide[:, :130], w, lib), native.linear_dense(x, w, lib))


@pytest.mark.parametrize("wtype", DTYPES)
def test_the_vector_paths_compute_the_same_bits(lib, wtype):
    """Each output sums in one order on the vector paths (8-lane FMAs, hsum, the tail), whatever rows a
    micro-tile takes (4 on AVX2, 8 on AVX-512, two to a 512-bit vector there: odd counts leave a half
    idle). The plain C++ path rounds each product before adding it (no FMA), so its bits differ from
    theirs (within the fp64 test's tolerance)."""
    if lib.isa == "scalar":
        pytest.skip("the plain C++ path has no FMA: its bits differ from the vector paths'")
    reference = kernels.build(isa_override="avx2", log=lambda _: None, serve=False).library
    torch.manual_seed(1)
    x, w = torch.randn(40, 101), torch.randn(23, 101).to(wtype)
    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 16, 19, 40):
        assert torch.equal(native.linear_dense(x[:rows], w, lib), native.linear_dense(x[:rows], w, reference))


def test_nan_in_a_row_poisons_that_row_only(lib):
    x, w = torch.randn(3, 64), torch.randn(5, 64)
    x[1, 10] = float("nan")
    y = native.linear_dense(x, w, lib)
    assert y[1].isnan().all() and not y[[0, 2]].isnan().any()


def test_the_op_is_what_the_graphs_call_and_refuses_bad_operands():
    kernels.build(log=lambda _: None)  # serves the eager op
    x, w = torch.randn(2, 1, 48), torch.randn(24, 48)
    y = dense.OP(x, w)
    assert y.shape == (2, 1, 24)
    torch.testing.assert_close(y, x @ w.t(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"float \(N, 48\) weight"):
        native.linear_dense(x, torch.randn(24, 47))
    with pytest.raises(ValueError, match="float32/bfloat16/float16"):
        native.linear_dense(x.double(), w)
