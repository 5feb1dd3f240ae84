"""aotpack's bf16 GEMMs with bf16 dot-product instructions, each against fp64: `tiles` (AMX's
`tdpbf16ps`) and `dpbf16` (AVX512-BF16's `vdpbf16ps`), both in exporter/csrc/dense.cpp, ops in
runtime.quant.dense. Odd shapes (K past the last 32 columns, N past the last tile, more activation rows
than a pass takes), a row's bits independent of the batch and of strided activations, subnormals read as
zero (what tells that the instruction ran), NaN confined to its row, and what each refuses. Each kernel
is skipped, naming what is missing, on a CPU without its instructions; the refusals of a build without
either path run everywhere."""

from __future__ import annotations

import pytest
import torch
from helpers import isa_library

from exporter import kernels
from exporter.lowering import CANDIDATES, LINEAR
from runtime.cpu import DPBF16_FLAG, cpu_flags
from runtime.errors import BundleError, IncompatibleBundleError
from runtime.quant import dense, native

SHAPES = [
    (1, 640, 7),
    (3, 33, 1),
    (5, 100, 17),
    (8, 96, 64),
    (9, 64, 48),
    (16, 64, 48),
    (40, 64, 13),
    (17, 70, 40),
    (2, 7, 4),
]
KERNELS = {  # name -> (eager call, C function, op)
    "tiles": (native.linear_tiles, "aotpack_linear_tiles", dense.TILES_OP),
    "dpbf16": (native.linear_dpbf16, "aotpack_linear_dpbf16", dense.DPBF16_OP),
}


def _library(name: str):
    if name == "tiles":
        library = isa_library("amx")
        if not library.tiles:
            pytest.skip("Linux did not grant this process AMX's tile state")
        return library
    if DPBF16_FLAG not in (cpu_flags() or set()):
        pytest.skip(f"the dpbf16 kernel needs CPU flag {DPBF16_FLAG!r}, which this machine lacks")
    library = kernels.build("native", log=lambda _: None, serve=False).library  # the export's own build
    assert library.dpbf16
    return library


@pytest.fixture(scope="module", params=sorted(KERNELS))
def kernel(request):
    """(name, library, eager call) for each kernel this machine runs."""
    return request.param, _library(request.param), KERNELS[request.param][0]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_each_matches_fp64(kernel, m, k, n):
    _, lib, linear = kernel
    torch.manual_seed(m * 1000 + k + n)
    x, w = torch.randn(m, k).bfloat16(), (torch.randn(n, k) / k**0.5).bfloat16()
    y = linear(x, w, lib)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref = x.double() @ w.double().t()  # products of bf16 values are exact in fp32: the sums' and the output's rounding
    assert (y.double() - ref).abs().max() <= 1e-2 * max(1.0, ref.abs().max().item())


def test_a_row_computes_the_same_bits_in_any_batch_and_any_layout(kernel):
    """37 weight rows leave some past the last tile (16 rows) or micro-tile (3), 20 activation rows take
    two or three passes (16 or 8 a pass) and more than 16 adjacent weight rows, 130 columns a K % 32 tail:
    a row alone, first or last of a batch, in a later pass, or read from a strided view, has the same bits."""
    _, lib, linear = kernel
    torch.manual_seed(0)
    x, w = torch.randn(20, 130).bfloat16(), torch.randn(37, 130).bfloat16()
    alone = linear(x[4:5], w, lib)
    assert torch.equal(linear(x, w, lib)[4:5], alone)
    assert torch.equal(linear(x[4:], w, lib)[:1], alone)
    assert torch.equal(linear(x[:17], w, lib)[16:], linear(x[16:17], w, lib))
    wide = torch.randn(20, 200).bfloat16()
    wide[:, :130] = x
    assert torch.equal(linear(wide[:, :130], w, lib), linear(x, w, lib))


def test_the_instruction_is_what_runs(kernel):
    """A subnormal bf16 activation times 1e30: 1e-9 through the FMAs of the dense kernel, 0 through the
    bf16 dot products (they read subnormals as zero); the normal row is the same."""
    _, lib, linear = kernel
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(16, 64, dtype=torch.bfloat16)
    x[0, 3], x[1, 3], w[:, 3] = 1e-39, 1.0, 1e30
    dots, fmas = linear(x, w, lib), native.linear_dense(x, w, lib)
    assert (dots[0] == 0).all() and (fmas[0] > 1e-9).all() and torch.equal(dots[1], fmas[1])


def test_nan_in_a_row_poisons_that_row_only(kernel):
    _, lib, linear = kernel
    x, w = torch.randn(3, 64).bfloat16(), torch.randn(37, 64).bfloat16()
    x[1, 10] = float("nan")
    y = linear(x, w, lib)
    assert y[1].isnan().all() and not y[[0, 2]].isnan().any()


def test_each_refuses_what_it_cannot_multiply(kernel):
    name, lib, linear = kernel
    x, w = torch.randn(2, 64).bfloat16(), torch.randn(16, 64).bfloat16()
    with pytest.raises(ValueError, match="bf16 activations and a bf16"):
        linear(x.float(), w, lib)
    with pytest.raises(ValueError, match=r"bf16 \(N, 64\) weight"):
        linear(x, w.half(), lib)
    c_function = getattr(lib, KERNELS[name][1])
    assert c_function(x.data_ptr(), 0, 2, 64, w.data_ptr(), 1, 16, x.data_ptr()) == 1  # BAD_DTYPE


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_library_without_the_path_refuses_before_any_instruction(name):
    other = isa_library("avx2")
    assert not other.tiles and not other.dpbf16
    linear, c_name, _ = KERNELS[name]
    with pytest.raises(BundleError, match=f"cannot run the {name} kernel"):
        linear(torch.randn(1, 64).bfloat16(), torch.randn(16, 64).bfloat16(), other)
    x, w = torch.randn(1, 64).bfloat16(), torch.randn(16, 64).bfloat16()
    y = torch.empty(1, 16, dtype=torch.bfloat16)
    assert getattr(other, c_name)(x.data_ptr(), 1, 1, 64, w.data_ptr(), 1, 16, y.data_ptr()) == 5  # NO_TILES


def test_a_cpu_without_avx512_bf16_is_refused_before_any_call(monkeypatch, tmp_path):
    """A library built with the dpbf16 path on a CPU that lacks avx512_bf16 (a bundle exported on a Zen 4
    and loaded on an AVX-512 Xeon without it): `dpbf16` is off, and load() refuses a bundle that calls it."""
    lib = _library("dpbf16")
    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2"})
    assert not lib.dpbf16
    with pytest.raises(BundleError, match="cannot run the dpbf16 kernel"):
        native.linear_dpbf16(torch.randn(1, 64).bfloat16(), torch.randn(16, 64).bfloat16(), lib)
    monkeypatch.setattr(native, "Library", lambda path, isa: lib)
    with pytest.raises(IncompatibleBundleError, match="this CPU lacks 'avx512_bf16'"):
        native.load(tmp_path / "kernels.so", lib.isa, dpbf16=True)


def test_the_op_and_the_lowering_are_what_the_graphs_call(kernel):
    """The op over (B, 1, K) activations, and the lowering with a bias, as a decode graph has them."""
    name, lib, linear = kernel
    x, w, b = torch.randn(2, 1, 64).bfloat16(), torch.randn(48, 64).bfloat16(), torch.randn(48).bfloat16()
    with native.serving(lib):
        assert torch.equal(KERNELS[name][2](x, w), linear(x, w, lib).view(2, 1, 48))
        lowered = CANDIDATES[LINEAR][name](x, w, b)
    torch.testing.assert_close(lowered, torch.nn.functional.linear(x, w, b), atol=5e-2, rtol=2e-2)
