"""aotpack's decode attention (exporter/csrc/attention.cpp, runtime.quant.attention) against fp64 SDPA, on
each instruction path this machine can run: float32, bfloat16 and float16 queries and caches, grouped query
heads, several tokens a row (a verify or chunk step's causal masks), head sizes that are no multiple of a
vector, one key, keys split across threads and combined, keys split past a range's largest, strided views of
a larger cache, any strides of q, k and v, a mask shared by the batch, rows that see unequal spans of the keys
(and a row that reads only its own: the others on unreadable pages); a row that sees no key, stale NaNs in
masked slots, and operands it refuses, through the Python wrapper and through the C shim a compiled graph
calls. The decode graphs' parity with it is the bundle tier's (tests/bundle/test_native_attention.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from helpers import isa_library
from torch._C import _aoti as aoti

from exporter import attention, kernels
from runtime.quant import attention as op
from runtime.quant import native

PATHS = ("scalar", "avx2", "avx512-vnni")
# (B, KV heads, query heads a KV head, tokens a row, keys, head size)
SHAPES = [
    (1, 1, 4, 1, 97, 256),  # Gemma 3 270M, one row
    (8, 1, 4, 1, 300, 256),  # 8 rows
    (1, 1, 4, 1, 1000, 64),  # one row, keys split across threads
    (3, 2, 2, 1, 5, 16),
    (2, 1, 4, 3, 130, 24),  # a verify step: 3 tokens a row
    (2, 2, 1, 1, 1, 8),  # one key
    (1, 1, 1, 1, 300, 7),  # a head size no vector divides
    (1, 3, 2, 16, 40, 32),  # a chunk step: 16 tokens
    (1, 1, 4, 3, 700, 32),  # a verify step's 3 tokens over keys split across threads
    (8, 2, 4, 1, 2348, 16),  # pairs enough for the threads, more keys than a range holds: split all the same
]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 4e-3}
CLOSE = {"atol": 2e-6, "rtol": 1e-5}  # float32 against fp64


@pytest.fixture(scope="module", params=PATHS)
def lib(request):
    return isa_library(request.param)


def _operands(b, kv, g, t, s, d, qtype, ktype, seed=0):
    """q (B, KV, G*T, D); k, v views of a (B, KV, s + 9, D) cache's first s slots; a causal-like bool mask
    (B, 1, T, S): token j of a row sees keys up to s - t + j, less some random padding (key 0 always)."""
    g_ = torch.Generator().manual_seed(seed)
    q = torch.randn(b, kv, g * t, d, generator=g_).to(qtype)
    cache_k, cache_v = (torch.randn(b, kv, s + 9, d, generator=g_).to(ktype) for _ in range(2))
    mask = torch.rand(b, 1, t, s, generator=g_) > 0.2
    mask &= torch.arange(s)[None, None, None] <= (s - t + torch.arange(t))[None, None, :, None]
    mask[..., 0] = True
    return q, cache_k[:, :, :s], cache_v[:, :, :s], mask


def _reference(q, k, v, mask, scale):
    """fp64 SDPA with query row r of a head being token r % T (runtime.quant.attention's layout)."""
    t = mask.shape[2]
    rows = mask.repeat(1, 1, q.shape[2] // t, 1)  # (B, 1, R, S): row r -> token r % T
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    return scores.masked_fill(~rows, float("-inf")).softmax(-1) @ v.double()  # (B, KV, R, D)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ktype", DTYPES)
@pytest.mark.parametrize("qtype", DTYPES)
def test_decode_attention_matches_fp64(lib, shape, qtype, ktype):
    q, k, v, mask = _operands(*shape, qtype, ktype, seed=sum(shape))
    scale = shape[-1] ** -0.5
    out = native.decode_attention(q, k, v, mask, scale, lib)
    assert out.dtype == qtype and out.shape == q.shape and out.is_contiguous()
    expected = _reference(q, k, v, mask, scale)
    tolerance = max(TOLERANCE[qtype], TOLERANCE[ktype])
    assert (out.double() - expected).abs().max().item() < tolerance


def test_a_mask_shared_by_the_rows_and_a_row_that_sees_nothing(lib):
    q, k, v, mask = _operands(4, 1, 4, 1, 50, 32, torch.float32, torch.float32)
    shared = mask[:1]  # (1, 1, 1, S): every row the same
    torch.testing.assert_close(
        native.decode_attention(q, k, v, shared, 0.2, lib).double(),
        _reference(q, k, v, shared.expand(4, -1, -1, -1), 0.2),
        **CLOSE,
    )
    blind = mask.clone()
    blind[2] = False  # row 2 sees no key: zeros (a softmax over nothing), the others unchanged
    out = native.decode_attention(q, k, v, blind, 0.2, lib)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    torch.testing.assert_close(out[[0, 1, 3]].double(), _reference(q, k, v, mask, 0.2)[[0, 1, 3]], **CLOSE)


def test_a_row_that_sees_nothing_while_the_keys_are_split(lib):
    """One row's keys are split into ranges (fewer (row, head) pairs than threads twice); a row whose
    every range is masked combines to zeros, the other rows as fp64 says."""
    q, k, v, mask = _operands(2, 1, 2, 2, 600, 16, torch.float32, torch.float32, seed=4)
    mask[1, :, 1] = False  # token 1 of row 1: nothing
    out = native.decode_attention(q, k, v, mask, 0.3, lib)  # (2, 1, 4, 16): rows g * 2 + t
    assert torch.equal(out[1, :, 1::2], torch.zeros_like(out[1, :, 1::2]))
    expected = _reference(q, k, v, mask, 0.3)
    torch.testing.assert_close(out[0].double(), expected[0], **CLOSE)
    torch.testing.assert_close(out[1, :, 0::2].double(), expected[1, :, 0::2], **CLOSE)


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("ktype", [torch.float32, torch.bfloat16])
def test_rows_that_see_unequal_spans_of_keys(lib, tokens, ktype):
    """A step's rows see their own spans of its keys: one all of them (more than a range holds), one its
    first 60, one left-padded from slot 900, one nothing, one the first 700 of a cache whose slots before
    them (a shorter prompt's) it does not see either; each as fp64 says. Then a row short enough for one
    range of keys (60) is the same bits beside longer rows as alone (a longer row's split depends on the
    others' keys, so its bits may not be)."""
    q, k, v, mask = _operands(5, 2, 2, tokens, 2300, 16, torch.float32, ktype, seed=11)
    mask[1, ..., 60:] = False
    mask[2, ..., :900] = False
    mask[3] = False
    mask[4, ..., 700:] = False
    mask[4, ..., :5] = False
    out = native.decode_attention(q, k, v, mask, 0.25, lib)
    expected = _reference(q, k, v, mask, 0.25)
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    tolerance = TOLERANCE[ktype]
    assert (out[[0, 1, 2, 4]].double() - expected[[0, 1, 2, 4]]).abs().max().item() < tolerance
    alone = native.decode_attention(q[1:2], k[1:2], v[1:2], mask[1:2], 0.25, lib)
    assert torch.equal(out[1:2], alone)


# Run in a process of its own (a read out of bounds ends it), argv: the library, its ISA. Two rows of a step
# over a span of 128 slots: row 0 sees them all, row 1 slots 8 to 40 only, and its other slots lie on pages
# that cannot be read: the kernel must not touch them (it had read every slot of the span, then masked).
_UNREADABLE = """
import ctypes, mmap, sys
from pathlib import Path
import torch
from runtime.quant import native

S, D, lo, hi = 128, 256, 8, 40  # slots, head size (a KB a slot of fp32), row 1's slots
mprotect = ctypes.CDLL(None).mprotect
mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
g = torch.Generator().manual_seed(0)
caches = []
for _ in range(2):  # k and v (2, 1, S, D), each row's slots after the other's
    memory = mmap.mmap(-1, 2 * S * D * 4)
    cache = torch.frombuffer(memory, dtype=torch.float32).view(2, 1, S, D)
    cache.copy_(torch.randn(2, 1, S, D, generator=g))
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    for first, last in ((S, S + lo), (S + hi, 2 * S)):  # row 1's slots it does not see
        assert mprotect(base + first * D * 4, (last - first) * D * 4, 0) == 0
    caches.append((memory, cache))
k, v = caches[0][1], caches[1][1]
q = torch.randn(2, 1, 4, D, generator=g)
mask = torch.zeros(2, 1, 1, S, dtype=torch.bool)
mask[0] = True
mask[1, ..., lo:hi] = True
out = native.decode_attention(q, k, v, mask, D**-0.5, native.Library(Path(sys.argv[1]), sys.argv[2]))
for row, (a, b) in enumerate(((0, S), (lo, hi))):
    seen_k, seen_v = k[row, :, a:b].double(), v[row, :, a:b].double()
    expected = ((q[row].double() @ seen_k.transpose(-1, -2)) * D**-0.5).softmax(-1) @ seen_v
    assert (out[row].double() - expected).abs().max().item() < 2e-6, row
print("read only what it sees")
"""


def test_a_row_reads_only_the_slots_it_sees(lib):
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _UNREADABLE, lib._lib._name, lib.isa],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],  # the checkout's runtime, as the tests import it
    )
    assert run.returncode == 0 and "read only what it sees" in run.stdout, (run.returncode, run.stderr[-2000:])


def test_no_rows(lib):
    q, k, v, mask = _operands(0, 1, 4, 1, 20, 16, torch.float32, torch.float32)
    assert native.decode_attention(q, k, v, mask, 0.3, lib).shape == (0, 1, 4, 16)


def test_a_nan_in_a_key_a_row_sees_makes_that_row_nan_on_every_path(lib):
    """As SDPA: corrupt inputs show as NaN (each path's exp and max keep NaN), only in the rows that see them."""
    q, k, v, mask = _operands(3, 1, 4, 1, 300, 32, torch.float32, torch.float32, seed=2)
    k = k.clone()
    k[1, 0, 0] = float("nan")  # key 0: every row sees it
    out = native.decode_attention(q, k, v, mask, 0.2, lib)
    assert out[1].isnan().all() and not out[[0, 2]].isnan().any()


def test_stale_nans_in_masked_slots_are_never_read(lib):
    """A slot no row attends to may hold anything (a cancelled request's, a failed one's): masked, its key
    and value must not reach the output, where 0 * NaN would poison it."""
    q, k, v, mask = _operands(2, 1, 4, 1, 200, 64, torch.float32, torch.float32)
    k, v = k.clone(), v.clone()
    hidden = ~mask[:, 0, 0]  # (B, S)
    k[hidden.nonzero(as_tuple=True)[0], :, hidden.nonzero(as_tuple=True)[1]] = float("nan")
    v[hidden.nonzero(as_tuple=True)[0], :, hidden.nonzero(as_tuple=True)[1]] = float("nan")
    out = native.decode_attention(q, k, v, mask, 0.125, lib)
    assert not out.isnan().any()
    k0, v0 = torch.nan_to_num(k), torch.nan_to_num(v)
    torch.testing.assert_close(out.double(), _reference(q, k0, v0, mask, 0.125), **CLOSE)


def test_any_strides_of_q_k_and_v(lib):
    """Inductor lays a custom op's inputs out as it likes (a decode graph handed q with the batch innermost),
    and a cache view may have its head size strided: the kernel reads every layout."""
    q, k, v, mask = _operands(3, 2, 2, 1, 40, 24, torch.float32, torch.float32, seed=9)
    odd_q = q.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)  # (B, KV, R, D), batch innermost
    odd_k, odd_v = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (k, v))  # D strided by S
    assert odd_q.stride(0) == 1 and odd_k.stride(3) != 1
    expected = native.decode_attention(q, k, v, mask, 0.2, lib)
    assert torch.equal(native.decode_attention(odd_q, odd_k, odd_v, mask, 0.2, lib), expected)
    assert torch.equal(native.decode_attention(q, k.bfloat16(), v.bfloat16(), mask, 0.2, lib),
                       native.decode_attention(q, odd_k.bfloat16(), v.bfloat16(), mask, 0.2, lib))  # fmt: skip


def test_a_strided_mask_of_several_tokens(lib):
    q, k, v, mask = _operands(2, 2, 2, 3, 50, 16, torch.float32, torch.float32, seed=6)
    odd = mask.transpose(2, 3).contiguous().transpose(2, 3)  # (B, 1, T, S), S strided by T
    assert odd.stride(3) == 3
    assert torch.equal(
        native.decode_attention(q, k, v, odd, 0.2, lib), native.decode_attention(q, k, v, mask, 0.2, lib)
    )


def test_the_op_refuses_operands_it_cannot_take():
    kernels.build(log=lambda _: None)  # serves the eager op
    q, k, v, mask = _operands(2, 1, 4, 1, 16, 8, torch.float32, torch.float32)
    assert op.OP(q, k, v, mask, 0.3).shape == q.shape
    with pytest.raises(ValueError, match="bool mask"):
        native.decode_attention(q, k, v, mask.float(), 0.3)
    with pytest.raises(ValueError, match="bool mask"):
        native.decode_attention(q, k, v.half(), mask, 0.3)
    with pytest.raises(ValueError, match="bool mask"):
        native.decode_attention(q[:, :, :3], k, v, mask.expand(-1, -1, 2, -1), 0.3)  # T = 2 does not divide R = 3
    with pytest.raises(ValueError, match="bool mask"):
        native.decode_attention(q, k, v, mask[:, :, :0], 0.3)  # no token a row
    with pytest.raises(ValueError, match="cpu tensors"):  # the kernel would read another device's pointers
        native.decode_attention(q.to("meta"), k, v, mask, 0.3)
    with torch._subclasses.FakeTensorMode() as mode:  # as the export traces: refused there, before any compile
        fake = [mode.from_tensor(x) for x in (q, k, v, mask)]
        assert op.OP(*fake, 0.3).shape == q.shape
        with pytest.raises(ValueError, match="bool mask"):
            op.OP(fake[0], fake[1], fake[2], fake[3].float(), 0.3)


def test_the_native_candidate_computes_what_grouped_does():
    """exporter.attention.native takes transformers' attention call (query heads, boolean SDPA mask) and
    gives what the grouped flash candidate gives; an additive mask goes through grouped itself."""
    kernels.build(log=lambda _: None)
    g = torch.Generator().manual_seed(3)
    query = torch.randn(2, 4, 3, 16, generator=g)  # (B, H, T, D): 2 KV heads of 2 query heads
    key, value = torch.randn(2, 2, 30, 16, generator=g), torch.randn(2, 2, 30, 16, generator=g)
    mask = torch.rand(2, 1, 3, 30, generator=g) > 0.3
    mask[..., 0] = True
    ours, _ = attention.native(None, query, key, value, mask, scaling=0.25)
    theirs, _ = attention.grouped(None, query, key, value, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (2, 3, 4, 16)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    unmasked = attention.grouped(None, query, key, value, None, scaling=0.25)[0]
    assert torch.equal(attention.native(None, query, key, value, None, scaling=0.25)[0], unmasked)  # grouped's
    additive = attention._additive(mask, torch.float32)
    assert torch.equal(
        attention.native(None, query, key, value, additive, scaling=0.25)[0],
        attention.grouped(None, query, key, value, additive, scaling=0.25)[0],
    )


def _shim(lib, q, k, v, mask, scale: float = 0.3):
    """aoti_torch_cpu_decode_attention called as a compiled graph calls it, with handles to these tensors
    (torch's own, as its AOTInductor runner makes them): (its status, the output it made or None)."""
    fn = lib._lib.aoti_torch_cpu_decode_attention
    fn.restype, fn.argtypes = ctypes.c_int32, [ctypes.c_void_p] * 4 + [ctypes.c_double, ctypes.POINTER(ctypes.c_void_p)]
    capsules = [aoti.unsafe_alloc_void_ptr_from_tensor(t) for t in (q, k, v, mask)]
    made = ctypes.c_void_p()
    try:
        status = fn(*(_CAPSULE_POINTER(c, None) for c in capsules), scale, ctypes.byref(made))
    finally:
        for capsule in capsules:  # taken back, so freed
            aoti.alloc_tensor_by_stealing_from_void_ptr(capsule)
    return status, aoti.alloc_tensor_by_stealing_from_void_ptr(_NEW_CAPSULE(made, None, None)) if status == 0 else None


_CAPSULE_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_CAPSULE_POINTER.restype, _CAPSULE_POINTER.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_NEW_CAPSULE = ctypes.pythonapi.PyCapsule_New
_NEW_CAPSULE.restype, _NEW_CAPSULE.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def test_the_c_shim_refuses_what_it_cannot_take_and_computes_the_rest(lib):
    """AOTInductor checks nothing it passes a custom op's shim: each operand the kernel cannot take is a
    failure status (the graph then raises), never a read out of bounds."""
    q, k, v, mask = _operands(2, 1, 4, 1, 16, 8, torch.float32, torch.float32)
    status, out = _shim(lib, q, k, v, mask)
    assert status == 0 and torch.equal(out, native.decode_attention(q, k, v, mask, 0.3, lib))
    bad = {
        "q of 3 dimensions": (q[0], k, v, mask),
        "an integer q": (q.int(), k, v, mask),
        "a float mask": (q, k, v, mask.float()),
        "v's dtype not k's": (q, k, v.half(), mask),
        "v's shape not k's": (q, k, v[:, :, :8], mask),
        "k of other rows": (q, k[:1], v[:1], mask),
        "k of another head size": (q, k[..., :4], v[..., :4], mask),
        "a mask over other keys": (q, k, v, mask[..., :8]),
        "tokens that do not divide the rows": (q[:, :, :3], k, v, mask.expand(-1, -1, 2, -1)),
        "an integer cache": (q, k.int(), v.int(), mask),
    }
    for what, operands in bad.items():
        assert _shim(lib, *operands) == (1, None), what
