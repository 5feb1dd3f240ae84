"""aotpack's integer kernels (exporter/csrc, runtime.quant.native) against a reference in fp64, on every
instruction path this machine can run (each built on purpose; the others are skipped by name; the AMX
build runs int8 calls of 5 to 32 rows into 1,024 outputs or more on tiles) and this machine's built to take
one weight tile a pass, over odd shapes: K not a multiple of the 32-column block, N = 1, N not a multiple of
the 16-row tile, a batch longer than the kernels' 64-row chunk. Also the tile layouts' round trips and the
activation format itself."""

from __future__ import annotations

import pytest
import torch
from helpers import isa_library

from exporter import kernels
from runtime.format.quant import INT5
from runtime.quant import INT4, INTEGER, QuantSpec, int4_dot, int5_dot, int8_dot, native, scheme, tiles

PATHS = ("scalar", "avx2", "avx-vnni", "avx512-vnni", "amx")  # amx: int8 calls of 5 to 32 rows on tiles (N >= 1024)
# (M, K, N): N = 1, N within one 16-row tile, whole tiles and tiles with lone rows; K with a short last block
SHAPES = [(1, 640, 7), (3, 33, 1), (5, 100, 19), (8, 96, 64), (70, 64, 45), (2, 31, 4), (9, 640, 48), (4, 47, 33)]
# on AMX tiles in the amx build (5 to 32 rows, 1,024 outputs or more): K of 3 blocks and a tail (one pair and
# an odd block), 5 blocks, 6 (pairs in the loop and one after it), 7, and 1.5 (no pair)
SHAPES += [(9, 100, 1029), (6, 160, 1040), (7, 192, 1024), (12, 224, 1037), (5, 48, 1024)]
GROUPED = [(1, 640, 7, 32), (5, 128, 25, 64), (70, 256, 38, 128), (2, 64, 1, 32), (8, 640, 32, 32)]  # + group


@pytest.fixture(scope="module", params=[*PATHS, "one-tile"])
def lib(request):
    """The kernels compiled for one instruction path, loaded without serving the eager op; "one-tile": this
    machine's path built to take one weight tile a pass (exporter.quant_family races it)."""
    if request.param == "one-tile":
        return kernels.build(log=lambda _: None, serve=False, one_tile=True).library
    return isa_library(request.param)


def _activations_reference(x: torch.Tensor):
    """The activation format by its definition: per block of 32, step amax / 127, values round(x * 127 /
    amax) to nearest even, zero past K."""
    m, k = x.shape
    blocks = -(-k // 32)
    padded = torch.zeros(m, blocks * 32)
    padded[:, :k] = x.float()
    grouped = padded.view(m, blocks, 32)
    amax = grouped.abs().amax(-1)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    q = torch.round((grouped * inverse[..., None]).clamp(-127, 127)).to(torch.int8)
    return q.view(m, -1), amax / 127, q.int().sum(-1)


def _int8_reference(x, q_w, scales, lib):
    q, d, _ = native.quantize_activations(x, lib)
    m, k = x.shape
    w = torch.zeros(q_w.shape[0], q.shape[1], dtype=torch.float64)
    w[:, :k] = q_w.double()
    products = torch.einsum("mbi,nbi->mnb", q.double().view(m, -1, 32), w.view(len(w), -1, 32))
    return (products * d.double()[:, None]).sum(-1) * scales.double()


def _int4_reference(x, q_w, scales, mins, group, lib):
    q, d, s = native.quantize_activations(x, lib)
    m, k = x.shape
    products = torch.einsum("mbi,nbi->mnb", q.double().view(m, -1, 32), q_w.double().view(len(q_w), -1, 32))
    sc, mn = (t.double().repeat_interleave(group // 32, 1) for t in (scales, mins))
    return (products * d.double()[:, None] * sc).sum(-1) + ((d * s).double()[:, None] * mn).sum(-1)


def _int5_reference(x, q_w, scales, group, lib):
    q, d, _ = native.quantize_activations(x, lib)
    m, k = x.shape
    w = (q_w.double() - 16).view(len(q_w), -1, 32)
    products = torch.einsum("mbi,nbi->mnb", q.double().view(m, -1, 32), w)
    return (products * d.double()[:, None] * scales.double().repeat_interleave(group // 32, 1)).sum(-1)


def _int5(n: int, k: int, group: int, g: torch.Generator):
    """Random int5 integers (n, k) and fp16 scales of both signs (n, k / group), and their packed operands."""
    q = torch.randint(0, 32, (n, k), generator=g)
    scales = torch.randn(n, k // group, generator=g).half()
    return q, scales, (*int5_dot.arrange(q), tiles.tile_rows(scales))


def _tiled_bf16(shape: tuple[int, int], count: int, g: torch.Generator) -> list[torch.Tensor]:
    """`count` random bf16 tensors of `shape` in [0, 1), rows tiled: int4's scales and mins."""
    return [tiles.tile_rows(torch.rand(*shape, generator=g).bfloat16()) for _ in range(count)]


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    scale = expected.abs().max().item()
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    assert got.dtype == dtype
    assert (got.double() - expected).abs().max().item() <= tolerance * scale + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_activations_are_quantized_as_defined(lib, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 100, generator=g) * torch.logspace(-3, 3, 6)[:, None]).to(dtype)
    x[2, 40:50] = 0  # a block that is mostly zero, and one row's last block partly
    q, d, s = native.quantize_activations(x, lib)
    rq, rd, rs = _activations_reference(x)
    assert torch.equal(q, rq) and torch.equal(s, rs)
    torch.testing.assert_close(d, rd, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_int8_kernel_matches_fp64(lib, m, k, n, dtype):
    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k, generator=g).to(dtype)
    q_w = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    scales = torch.rand(n, generator=g) + 0.01
    got = native.linear_int8(x, int8_dot.arrange(q_w), scales, lib)
    _close(got, _int8_reference(x, q_w, scales, lib), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n", "group"), GROUPED)
def test_int4_kernel_matches_fp64(lib, m, k, n, group, dtype):
    g = torch.Generator().manual_seed(m * k + n + group)
    x = torch.randn(m, k, generator=g).to(dtype)
    q_w = torch.randint(0, 16, (n, k), generator=g)
    scales = (torch.rand(n, k // group, generator=g) + 0.01).bfloat16()
    mins = torch.randn(n, k // group, generator=g).bfloat16()
    got = native.linear_int4(x, int4_dot.arrange(q_w), tiles.tile_rows(scales), tiles.tile_rows(mins), group, lib)
    _close(got, _int4_reference(x, q_w, scales, mins, group, lib), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n", "group"), GROUPED)
def test_int5_kernel_matches_fp64(lib, m, k, n, group, dtype):
    g = torch.Generator().manual_seed(m * k + n + group + 5)
    x = torch.randn(m, k, generator=g).to(dtype)
    q_w, scales, packed = _int5(n, k, group, g)
    got = native.linear_int5(x, *packed, group, lib)
    _close(got, _int5_reference(x, q_w, scales, group, lib), dtype)


def test_a_row_computes_the_same_bits_in_any_batch(lib):
    """Prefill (many rows) and decode (one) run one kernel: a row's output cannot depend on its batch, nor on
    how the kernel groups rows and tiles into passes (71 tiles and 5 lone rows: passes of 8, 4, 2 and 1
    tiles at one thread and at two, 35 and 36 a thread; 67 rows: a chunk of 64, then groups of 4, 2 and 1;
    calls of up to 16 rows: int8 in groups of 8 on AVX-512; AMX: 7 to 16 rows, one or two chunks of 8),
    nor on the threads sharing the tiles, nor on whether each thread quantized every row (up to 21 rows of
    3 blocks: lanes.h, OWN_BLOCKS) or a share of them (67 rows)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(67, 96, generator=g)
    n = 71 * 16 + 5  # 1,141 outputs: the amx build takes calls of 5 to 32 rows on tiles
    codes, scales = int8_dot.arrange(torch.randint(-127, 128, (n, 96), generator=g).to(torch.int8)), torch.rand(n)
    q4 = int4_dot.arrange(torch.randint(0, 16, (n, 96), generator=g))
    s4, m4 = tiles.tile_rows(torch.rand(n, 3).bfloat16()), tiles.tile_rows(torch.randn(n, 3).bfloat16())
    batch8, batch4 = native.linear_int8(x, codes, scales, lib), native.linear_int4(x, q4, s4, m4, 32, lib)
    q5 = _int5(n, 96, 32, g)[2]
    batch5 = native.linear_int5(x, *q5, 32, lib)
    threads = torch.get_num_threads()
    try:
        for count in (threads, 1):
            torch.set_num_threads(count)
            for i, rows in ((0, 1), (33, 1), (66, 1), (1, 2), (10, 3), (20, 7), (30, 8), (40, 11), (50, 16)):
                part = slice(i, i + rows)
                assert torch.equal(native.linear_int8(x[part], codes, scales, lib), batch8[part])
                assert torch.equal(native.linear_int4(x[part], q4, s4, m4, 32, lib), batch4[part])
                assert torch.equal(native.linear_int5(x[part], *q5, 32, lib), batch5[part])
    finally:
        torch.set_num_threads(threads)


def test_the_amx_build_runs_int8_calls_of_5_to_32_rows_on_tiles():
    """What makes the AMX library's runs above test the tiles: they take the calls of 5 to 32 rows into 1,024
    outputs or more (the shapes' 6 and 9 rows, the paths test's 11, the batch test's 7 to 16) where Linux
    grants the tiles' state."""
    lib = isa_library("amx")
    if not lib.tiles:
        pytest.skip("Linux did not grant this process the AMX tiles' state")
    assert [rows for rows in (1, 4, 5, 8, 16, 32, 33, 67) if lib.int8_tiles(rows, 1024)] == [5, 8, 16, 32]
    assert not lib.int8_tiles(8, 1023) and not isa_library("avx512-vnni").int8_tiles(8, 1024)


@pytest.mark.parametrize("rows", [3, 7])
def test_nan_or_inf_in_a_row_poisons_that_row_only(lib, rows):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(rows, 64, generator=g)
    x[0, 5], x[1, 40] = float("nan"), float("inf")
    codes, scales = int8_dot.arrange(torch.randint(-127, 128, (21, 64), generator=g).to(torch.int8)), torch.rand(21)
    y = native.linear_int8(x, codes, scales, lib)
    assert y[:2].isnan().all() and y[2:].isfinite().all()


@pytest.mark.parametrize(
    ("n", "k"), [(9, 64), (8, 33), (3, 32), (13, 100), (1, 5), (4, 96), (16, 64), (37, 100), (48, 33)]
)
def test_tiled_layouts_read_back_every_row(n, k):
    """Rows come back from the tiled layouts (whole tiles and lone rows), as the embedding lookup reads them."""
    g = torch.Generator().manual_seed(n * k)
    ids = torch.randint(0, n, (17,), generator=g)
    q8 = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    assert torch.equal(int8_dot.rows(int8_dot.arrange(q8), ids), q8[ids])
    if k % 32 == 0:
        q4 = torch.randint(0, 16, (n, k), generator=g)
        assert torch.equal(int4_dot.rows(int4_dot.arrange(q4), ids).long(), q4[ids])
        q5 = torch.randint(0, 32, (n, k), generator=g)
        assert torch.equal(int5_dot.rows(*int5_dot.arrange(q5), ids).long(), q5[ids])


def test_a_tile_holds_its_16_rows_in_the_lanes_of_each_group_of_4_columns():
    """int8: a tile's first 64 bytes are columns 0..3 of rows 0..15 (plus 128), the next 64 columns 4..7;
    int4: each 64 bytes hold two groups of 4 columns of the 16 rows, in the low and high nibbles."""
    q = torch.arange(16 * 32).view(16, 32)
    codes = int8_dot.arrange((q % 255 - 127).to(torch.int8)).view(-1)
    assert codes[:64].view(16, 4).tolist() == (q[:, :4] % 255 + 1).tolist()
    assert codes[64:128].view(16, 4).tolist() == (q[:, 4:8] % 255 + 1).tolist()
    nibbles = int4_dot.arrange(q % 16).view(-1)
    assert nibbles[:64].view(16, 4).tolist() == ((q[:, :4] % 16) | ((q[:, 4:8] % 16) << 4)).tolist()
    assert nibbles[64:128].view(16, 4).tolist() == ((q[:, 8:12] % 16) | ((q[:, 12:16] % 16) << 4)).tolist()


def test_int5_fifth_bits_follow_each_code_vector_as_a_64_bit_mask():
    """int5: the low nibbles are int4's codes; each block's 64 bytes of fifth bits hold, for each 64-byte code
    load, 64 bits for its low nibbles' vector then 64 for its high nibbles', bit i the fifth bit of the
    vector's byte i (lane i / 4, column i % 4 of the group); a lone row's bits are in column order."""
    g = torch.Generator().manual_seed(11)
    q = torch.randint(0, 32, (17, 64), generator=g)
    codes, highs = int5_dot.arrange(q)
    assert torch.equal(codes, int4_dot.arrange(q % 16))
    bits = torch.tensor(highs[:16].reshape(-1).tolist(), dtype=torch.uint8)  # the tile's 2 blocks * 64 bytes
    masks = bits.view(-1, 8).numpy().view("<u8").reshape(-1).tolist()  # 16 masks of 64 bits
    for mask_index, mask in enumerate(masks):
        block, p, half = mask_index // 8, mask_index % 8 // 2, mask_index % 2
        for i in range(64):
            column = 32 * block + 8 * p + 4 * half + i % 4
            assert (mask >> i) & 1 == int(q[i // 4, column]) >> 4
    lone = sum(int(byte) << (8 * j) for j, byte in enumerate(highs[16].tolist()))
    assert [(lone >> c) & 1 for c in range(64)] == (q[16] >> 4).tolist()


def test_int5_grid_is_q5_0s_and_keeps_a_weight_on_that_grid_exactly():
    """llama.cpp's quantize_row_q5_0: the group's value of largest magnitude (its sign kept) maps to q = 0,
    the scale stored in fp16; a weight already on such a grid (as the PyPI GGUF's Q5_0 tensors are) comes
    back bit for bit, and an all-zero group is zero."""
    g = torch.Generator().manual_seed(12)
    signs = torch.tensor([1.0, -1.0]).repeat(12).view(6, 4)
    steps = (torch.rand(6, 4, generator=g) * 0.02 + 0.001).half().float() * signs  # exact in fp16
    q = torch.randint(0, 32, (6, 4, 32), generator=g)
    q[..., 7] = 0  # -16 steps: the group's largest magnitude
    weight = ((q - 16) * steps[..., None]).view(6, 128)
    weight[5, :32] = 0
    spec = QuantSpec(INT5, 32, INTEGER)
    packed = scheme(spec).pack(spec, weight)
    assert torch.equal(scheme(spec).dequantize(spec, *packed), weight)
    ids = torch.tensor([5, 0, 3])
    assert torch.equal(scheme(spec).gather(spec, packed, ids), weight[ids])
    w = torch.randn(3, 64, generator=g)
    integers, scales = int5_dot.grid(spec, w)
    extreme = w.view(3, 2, 32).gather(-1, w.view(3, 2, 32).abs().argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.equal(scales, (extreme / -16).half()) and integers.min() >= 0 and integers.max() <= 31


@pytest.mark.parametrize(
    ("k", "group", "dtype"), [(160, 32, torch.float32), (100, None, torch.bfloat16), (256, 64, torch.float16)]
)
def test_every_instruction_path_computes_the_same_bits(lib, k, group, dtype):
    """A block's integer sums are exact and each lane rounds the same float steps on every path: a bundle's
    numbers do not depend on which path its kernels.so was compiled for (K = 100: int8's short last block)."""
    reference = kernels.build(isa_override="scalar", log=lambda _: None, serve=False).library
    g = torch.Generator().manual_seed(k)
    x = torch.randn(11, k, generator=g).to(dtype)
    n = 65 * 16 + 5  # tiles in passes of each size a path uses, and lone rows (1,045: AMX takes 11 rows)
    codes = int8_dot.arrange(torch.randint(-127, 128, (n, k), generator=g).to(torch.int8))
    scales = torch.rand(n)
    assert torch.equal(native.linear_int8(x, codes, scales, lib), native.linear_int8(x, codes, scales, reference))
    if group:
        q4 = int4_dot.arrange(torch.randint(0, 16, (n, k), generator=g))
        s4, m4 = (tiles.tile_rows(torch.rand(n, k // group).bfloat16()) for _ in range(2))
        expected = native.linear_int4(x, q4, s4, m4, group, reference)
        assert torch.equal(native.linear_int4(x, q4, s4, m4, group, lib), expected)
        q5 = _int5(n, k, group, g)[2]
        assert torch.equal(native.linear_int5(x, *q5, group, lib), native.linear_int5(x, *q5, group, reference))


def test_a_lone_row_computes_what_a_tile_lane_does(lib):
    """Rows past the last whole tile run plain C++: row 16 of 17 (lone) and the same row in a second tile of
    16 (rows 16..31 of 32) must give the same bits."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 100, generator=g)
    q = torch.randint(-127, 128, (17, 100), generator=g).to(torch.int8)
    q32, scales = torch.cat([q, q[:15]]), torch.rand(32)
    lone = native.linear_int8(x, int8_dot.arrange(q), scales[:17], lib)[:, 16]
    assert torch.equal(lone, native.linear_int8(x, int8_dot.arrange(q32), scales, lib)[:, 16])
    q4 = torch.randint(0, 16, (17, 128), generator=g)
    s4, m4 = torch.rand(32, 4).bfloat16(), torch.randn(32, 4).bfloat16()
    x4 = torch.randn(5, 128, generator=g)
    lone = native.linear_int4(x4, int4_dot.arrange(q4), tiles.tile_rows(s4[:17]), tiles.tile_rows(m4[:17]), 32, lib)
    whole = native.linear_int4(
        x4, int4_dot.arrange(torch.cat([q4, q4[:15]])), tiles.tile_rows(s4), tiles.tile_rows(m4), 32, lib
    )
    assert torch.equal(lone[:, 16], whole[:, 16])
    q5 = torch.randint(0, 32, (17, 128), generator=g)
    s5 = torch.randn(32, 4, generator=g).half()
    lone = native.linear_int5(x4, *int5_dot.arrange(q5), tiles.tile_rows(s5[:17]), 32, lib)
    whole = native.linear_int5(x4, *int5_dot.arrange(torch.cat([q5, q5[:15]])), tiles.tile_rows(s5), 32, lib)
    assert torch.equal(lone[:, 16], whole[:, 16])


def test_int5_operands_of_the_wrong_shape_are_refused_before_the_kernel_reads_them():
    x = torch.randn(2, 64)
    codes, highs = int5_dot.arrange(torch.randint(0, 32, (16, 64)))
    scales = tiles.tile_rows(torch.rand(16, 2).half())
    for bad in ((codes, highs[:, :4], scales, 32), (codes, highs, scales[:8], 32), (codes, highs, scales.float(), 32),
                (codes, highs, scales, 64), (codes, highs, scales, 0)):  # fmt: skip
        with pytest.raises(ValueError, match="int5 kernel takes uint8 codes"):
            native.linear_int5(x, *bad)


def test_int4_operands_of_the_wrong_shape_are_refused_before_the_kernel_reads_them():
    x = torch.randn(2, 64)
    codes = int4_dot.arrange(torch.randint(0, 16, (16, 64)))
    s = tiles.tile_rows(torch.rand(16, 2).bfloat16())  # scales and mins alike
    for bad in ((codes[:, :16], s, s, 32), (codes, s[:8], s, 32), (codes, s, s[:, :1], 32), (codes, s.half(), s, 32),
                (codes, s, s, 64), (codes, s, s, 0)):  # fmt: skip
        with pytest.raises(ValueError, match="int4 kernel takes uint8 codes"):
            native.linear_int4(x, *bad)


def test_int8_codes_outside_the_symmetric_grid_are_refused():
    with pytest.raises(ValueError, match="-127..127, got -128"):
        int8_dot.arrange(torch.tensor([[-128, 5]], dtype=torch.int8))


def test_an_integer_quantized_weight_dequantizes_to_its_grid():
    """What the eager embedding lookup and the accuracy report read: the stored integers times the scales."""
    weight = torch.randn(9, 64, generator=torch.Generator().manual_seed(7))
    spec = QuantSpec(INT4, 32, INTEGER)
    packed = scheme(spec).pack(spec, weight)
    q, scales, mins = scheme(spec).grid(spec, weight)
    expected = (q.view(9, 2, 32) * scales.float()[..., None] + mins.float()[..., None]).view(9, 64)
    torch.testing.assert_close(scheme(spec).dequantize(spec, *packed), expected)
    ids = torch.tensor([8, 0, 4])
    torch.testing.assert_close(scheme(spec).gather(spec, packed, ids), expected[ids])


# (M, parts' N): whole tiles, parts with lone rows and of fewer rows than a tile, and in the amx build a
# part of 1,024 outputs or more on tiles (5 to 32 rows) beside parts on the VNNI path
CAT = [(1, (48, 16, 16)), (3, (19, 1, 37)), (9, (1029, 48, 5)), (70, (32, 21)), (2, (16,) * 8)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "rows"), CAT)
def test_several_weights_in_one_call_compute_each_ones_bits(lib, m, rows, dtype):
    """The cat call (the decode graphs' sibling layers: exporter.siblings) gives every output column the bits
    of that weight's own call, the weights' outputs side by side, at any batch and in every scheme."""
    g = torch.Generator().manual_seed(m + len(rows))
    k = 96
    x = torch.randn(m, k, generator=g).to(dtype)
    int8 = [
        (int8_dot.arrange(torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)), torch.rand(n)) for n in rows
    ]
    int4 = [
        (int4_dot.arrange(torch.randint(0, 16, (n, k), generator=g)), *_tiled_bf16((n, k // 32), 2, g)) for n in rows
    ]
    int5 = [_int5(n, k, 32, g)[2] for n in rows]
    for what, weights, single, group in (
        ("int8", int8, native.linear_int8, ()),
        ("int4", int4, native.linear_int4, (32,)),
        ("int5", int5, native.linear_int5, (32,)),
    ):
        separate = torch.cat([single(x, *weight, *group, lib) for weight in weights], -1)
        assert torch.equal(native.linear_cat(what, x, list(zip(*weights, strict=True)), *group, lib=lib), separate), (
            what
        )


def test_a_cat_call_refuses_what_its_single_calls_would():
    """Too many weights, operand lists of different lengths, a weight whose width is not x's, or a group size
    where the scheme takes none (and none where it takes one) are refused before the kernel reads anything."""
    x = torch.randn(2, 64)
    codes, scales = int8_dot.arrange(torch.randint(-127, 128, (16, 64)).to(torch.int8)), torch.rand(16)
    with pytest.raises(ValueError, match="1 to 8 weights"):
        native.linear_cat("int8", x, ([codes] * 9, [scales] * 9))
    with pytest.raises(ValueError, match="1 to 8 weights"):
        native.linear_cat("int8", x, ([codes] * 2, [scales]))
    narrow = int8_dot.arrange(torch.randint(-127, 128, (16, 32)).to(torch.int8))
    with pytest.raises(ValueError, match=r"takes uint8 \(N, 64\) codes"):
        native.linear_cat("int8", x, ([codes, narrow], [scales, scales]))
    with pytest.raises(ValueError, match="int8 kernel takes no group size, got 32"):
        native.linear_cat("int8", x, ([codes], [scales]), 32)
    q5 = _int5(16, 64, 32, torch.Generator().manual_seed(1))[2]
    with pytest.raises(ValueError, match="int5 kernel takes"):
        native.linear_cat("int5", x, ([q5[0]], [q5[1]], [q5[2][:8]]), 32)
    with pytest.raises(ValueError, match="int5 kernel takes a group size, got None"):
        native.linear_cat("int5", x, ([q5[0]], [q5[1]], [q5[2]]))
