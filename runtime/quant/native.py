"""aotpack's integer kernels in this process: the C interface of the bundle's `kernels.so`.

Owns: loading the library a bundle carries (after checking that this CPU has the instructions it was
compiled for: a missing one would kill the process with SIGILL), checking its interface version, and the
eager calls the prefill makes through it (ctypes, which releases the GIL). The decode graphs call the
same functions through their C shims (`aoti_torch_cpu_dot_linear_int8`, `..._int4`, `..._int5`, and their
`..._cat` forms over several weights), linked by the library's soname, so it is loaded here before any
graph.

The library is compiled by the exporter (exporter.kernels) from exporter/csrc; the runtime never
compiles anything. Every library loaded in a process serves the eager op: their integer kernels compute
the same bits whichever instruction path each was compiled for (exporter/csrc/lanes.h).
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from pathlib import Path

import torch

from runtime.cpu import DPBF16_FLAG, check_kernels_isa, cpu_flags
from runtime.errors import BundleError, IncompatibleBundleError

ABI = 1  # exporter/csrc/quant_common.h's ABI: the signatures below
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_P, _I, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_SIGNATURES = {
    "aotpack_kernels_abi": ([], _I32),
    "aotpack_kernels_isa": ([], ctypes.c_char_p),
    "aotpack_linear_int8": ([_P, _I32, _I, _I, _P, _P, _I, _P], _I32),
    "aotpack_linear_int4": ([_P, _I32, _I, _I, _P, _P, _P, _I, _I, _P], _I32),
    "aotpack_quantize_activations": ([_P, _I32, _I, _I, _P, _P, _P], _I32),
}
# Functions added after interface 1, without changing its signatures: a library built before them lacks
# them, and only bundles that call them (their manifest says so) need them.
_ADDED = {
    "aotpack_linear_dense": ([_P, _I32, _I, _I, _P, _I32, _I, _P], _I32),
    "aotpack_linear_tiles": ([_P, _I32, _I, _I, _P, _I32, _I, _P], _I32),
    "aotpack_tiles_ready": ([], _I32),
    "aotpack_linear_dpbf16": ([_P, _I32, _I, _I, _P, _I32, _I, _P], _I32),
    "aotpack_dpbf16_ready": ([], _I32),
    "aotpack_int8_tiles": ([_I, _I], _I32),
    "aotpack_linear_int5": ([_P, _I32, _I, _I, _P, _P, _P, _I, _I, _P], _I32),
    "aotpack_linear_int8_parts": ([_P, _I32, _I, _I, _I, _P, _P, _P, _P], _I32),
    "aotpack_linear_int4_parts": ([_P, _I32, _I, _I, _I, _P, _P, _P, _I, _P, _P], _I32),
    "aotpack_linear_int5_parts": ([_P, _I32, _I, _I, _I, _P, _P, _P, _I, _P, _P], _I32),
    "aotpack_decode_attention": (
        [_P, _I32, _P, _P, _P, _I32, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, ctypes.c_float, _P],
        _I32,
    ),
}


class Library:
    """One loaded kernels.so. `isa`: what the manifest says it was compiled for, checked against this CPU
    before loading; None for a library built on this host (the exporter's), which reports its own."""

    def __init__(self, path: Path, isa: str | None = None):
        if isa is not None:
            check_kernels_isa(isa)
        try:
            self._lib = ctypes.CDLL(str(path))  # RTLD_LOCAL: each graph reaches its own by soname
        except OSError as e:
            raise BundleError(f"{path.name} could not be loaded ({e}); re-export the bundle") from None
        for name, (args, result) in (_SIGNATURES | _ADDED).items():
            if name in _SIGNATURES or hasattr(self._lib, name):
                function = getattr(self._lib, name)
                function.argtypes, function.restype = args, result
        abi, built = self._lib.aotpack_kernels_abi(), self._lib.aotpack_kernels_isa().decode()
        if abi != ABI or built != (isa or built):
            raise IncompatibleBundleError(
                f"{path.name} has interface {abi} for {built!r}; this runtime calls interface {ABI} and the "
                f"manifest says {isa!r}; re-export the bundle with this aotpack"
            )
        self.isa = built

    @property
    def tiles(self) -> bool:
        """Whether the `tiles` lowering runs here: the library has the AMX path and Linux granted this
        process the tiles' state (without it, a tile instruction kills the process)."""
        return hasattr(self._lib, "aotpack_tiles_ready") and bool(self._lib.aotpack_tiles_ready())

    @property
    def dpbf16(self) -> bool:
        """Whether the `dpbf16` lowering runs here: the library has the AVX512-BF16 path and this CPU the
        instruction (a library built for another CPU's AVX-512 passes the ISA check without it)."""
        ready = hasattr(self._lib, "aotpack_dpbf16_ready") and bool(self._lib.aotpack_dpbf16_ready())
        return ready and DPBF16_FLAG in (cpu_flags() or set())

    def int8_tiles(self, rows: int, outputs: int) -> bool:
        """Whether an int8 call of `rows` activation rows into `outputs` runs on AMX tiles here (the same
        bits as the library's vector path, which runs it otherwise)."""
        return hasattr(self._lib, "aotpack_int8_tiles") and bool(self._lib.aotpack_int8_tiles(rows, outputs))

    def __getattr__(self, name):
        return getattr(self._lib, name)


_loaded: list[Library] = []


def load(path: Path, isa: str, tiles: bool = False, dpbf16: bool = False) -> Library:
    """Load a bundle's kernels.so (before the graphs that link against it); it serves the eager op if
    none serves it yet. `tiles`, `dpbf16`: the bundle's graphs call that lowering, which must run here."""
    library = Library(path, isa)
    if tiles and not library.tiles:
        raise IncompatibleBundleError(
            "the bundle's decode graphs multiply bf16 weights on AMX tiles, which this process may not use "
            "(Linux refused the tiles' state: a kernel before 5.16, or AMX switched off); re-export the "
            "bundle on this machine, which then chooses another kernel, or with --gemv dense"
        )
    if dpbf16 and not library.dpbf16:
        raise IncompatibleBundleError(
            f"the bundle's decode graphs multiply bf16 weights with AVX512-BF16's vdpbf16ps, and this CPU lacks "
            f"{DPBF16_FLAG!r}; re-export the bundle on this machine, which then chooses another kernel, or with "
            "--gemv dense"
        )
    return register(library)


def register(library: Library) -> Library:
    _loaded.append(library)
    return library


@contextmanager
def serving(library: Library):
    """The eager op runs on `library` inside the block (the exporter times builds against each other)."""
    _loaded.insert(0, library)
    try:
        yield library
    finally:
        _loaded.pop(0)


def library() -> Library:
    if not _loaded:
        raise BundleError(
            "aotpack's integer kernels are not loaded in this process: load() a bundle that carries them "
            "(kernels.so), or build them with exporter.kernels.build() before using an integer-quantized model"
        )
    return _loaded[0]


def _operands(x: torch.Tensor, tensors) -> tuple[torch.Tensor, int, int, int]:
    """x (..., K) as a contiguous (M, K) matrix, with its dtype code."""
    if x.dtype not in DTYPE_CODES or x.device.type != "cpu" or any(t.device.type != "cpu" for t in tensors):
        raise ValueError(
            f"aotpack's integer kernels take CPU float32/bfloat16/float16 activations, got {x.dtype} on {x.device}"
        )
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return x2, DTYPE_CODES[x.dtype], x2.shape[0], x2.shape[1]


def _checked(status: int, what: str) -> None:
    if status != 0:
        raise ValueError(f"aotpack's {what} kernel refused its operands (status {status})")


# Each grouped scheme's operands, in its C function's order: (name, dtype, columns an element holds; None:
# one element a group), every one N rows.
_GROUPED = {
    "int4": (("codes", torch.uint8, 2), ("scales", torch.bfloat16, None), ("mins", torch.bfloat16, None)),
    "int5": (("codes", torch.uint8, 2), ("highs", torch.uint8, 8), ("scales", torch.float16, None)),
}
MAX_PARTS = 8  # exporter/csrc/quant_common.h: weights one call multiplies the same activations by


def linear_int8(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, lib: Library | None = None):
    """x (..., K) @ (weights (N, K) * scales (N,)).T, the weights as int8_dot stores them (uint8, plus 128,
    tiled), activations quantized per block of 32; through `lib` (default: the process's first loaded
    library)."""
    x2, code, m, k = _operands(x, (codes, scales))
    _check_int8(k, codes, scales)
    y = torch.empty(m, codes.shape[0], dtype=x.dtype)
    codes, scales = codes.contiguous(), scales.contiguous()  # held until the call returns
    status = (lib or library()).aotpack_linear_int8(
        x2.data_ptr(), code, m, k, codes.data_ptr(), scales.data_ptr(), codes.shape[0], y.data_ptr()
    )
    _checked(status, "int8")
    return y.view(*x.shape[:-1], codes.shape[0])


def _check_int8(k: int, codes: torch.Tensor, scales: torch.Tensor) -> None:
    shaped = codes.dim() == 2 and codes.shape[1] == k and scales.numel() == codes.shape[0]
    if not shaped or codes.dtype != torch.uint8 or scales.dtype != torch.float32:
        raise ValueError(
            f"aotpack's int8 kernel takes uint8 (N, {k}) codes and N float32 scales, got {codes.dtype} "
            f"{tuple(codes.shape)} and {scales.dtype} {tuple(scales.shape)}"
        )


def linear_int4(x, codes, scales, mins, group_size: int, lib: Library | None = None) -> torch.Tensor:
    """x (..., K) @ (nibbles * scale + min per group).T, activations quantized per block of 32."""
    return _grouped_product("int4", x, (codes, scales, mins), group_size, lib)


def linear_int5(x, codes, highs, scales, group_size: int, lib: Library | None = None) -> torch.Tensor:
    """x (..., K) @ ((q - 16) * scale per group).T, q from nibbles and fifth bits, activations quantized per
    block of 32."""
    return _grouped_product("int5", x, (codes, highs, scales), group_size, lib)


def _grouped_product(what: str, x: torch.Tensor, tensors, group_size: int, lib: Library | None) -> torch.Tensor:
    """x (..., K) @ W.T through aotpack_linear_<what> (int4's and int5's signature), W given by `tensors`
    (_GROUPED[what]'s operands), checked against x's K and the group size before the kernel reads them: a
    short one would be read out of bounds."""
    x2, code, m, k = _operands(x, tensors)
    _check_grouped(what, k, tensors, group_size)
    lib = lib or library()
    if not hasattr(lib._lib, f"aotpack_linear_{what}"):
        raise BundleError(f"this bundle's kernels.so predates the {what} kernel; re-export the bundle")
    n = tensors[0].shape[0]
    y = torch.empty(m, n, dtype=x.dtype)
    tensors = [t.contiguous() for t in tensors]  # held until the call returns
    status = getattr(lib, f"aotpack_linear_{what}")(
        x2.data_ptr(), code, m, k, *(t.data_ptr() for t in tensors), group_size, n, y.data_ptr()
    )
    _checked(status, what)
    return y.view(*x.shape[:-1], n)


def _check_grouped(what: str, k: int, tensors, group_size: int) -> None:
    operands = _GROUPED[what]
    n = tensors[0].shape[0] if tensors[0].dim() == 2 else -1
    grouped = group_size >= 32 and k % group_size == 0
    if not grouped or any(
        t.dtype != dtype or t.shape != (n, k // (fields or group_size))
        for t, (_, dtype, fields) in zip(tensors, operands, strict=True)
    ):
        wanted = ", ".join(
            f"{str(d).removeprefix('torch.')} {name} (N, {k} / {f or 'group'})" for name, d, f in operands
        )
        got = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors)
        raise ValueError(f"aotpack's {what} kernel takes {wanted}, got {got} and group {group_size}")


def linear_cat(what: str, x: torch.Tensor, parts, group_size: int | None = None, lib: Library | None = None):
    """x (..., K) times each of several weights of scheme `what` ("int8", "int4", "int5"), their outputs
    side by side (..., N_1 + N_2 + ...), in one call of aotpack_linear_<what>_parts: one OpenMP team, the
    activations quantized once. `parts`: one list per operand of the scheme's single call (int8: codes,
    scales; the others _GROUPED's), a tensor per weight; `group_size` for the grouped schemes. Each output
    column has the bits the single call gives it."""
    run, y = prepared_cat(what, x, parts, group_size, lib)
    _checked(run(), what)
    return y.view(*x.shape[:-1], y.shape[1])


def prepared_cat(what: str, x: torch.Tensor, parts, group_size: int | None = None, lib: Library | None = None):
    """linear_cat's call, checked and made ready: (run, y), where run() computes y (M, N_1 + N_2 + ...) from
    x and the weights (contiguous copies of any that were not, made now) and returns the kernel's status;
    the exporter times the kernels' builds with such calls, which cost the interpreter about as little as
    the decode graph's C shims cost it."""
    count = len(parts[0])
    if not 1 <= count <= MAX_PARTS or any(len(tensors) != count for tensors in parts):
        raise ValueError(f"aotpack's {what} kernel takes 1 to {MAX_PARTS} weights a call, each with all its operands")
    if (group_size is None) != (what == "int8"):  # the C function's arguments follow: a wrong count misreads
        takes = "no" if what == "int8" else "a"
        raise ValueError(f"aotpack's {what} kernel takes {takes} group size, got {group_size}")
    x2, code, m, k = _operands(x, [t for tensors in parts for t in tensors])
    for weight in zip(*parts, strict=True):
        if what == "int8":
            _check_int8(k, *weight)
        else:
            _check_grouped(what, k, weight, group_size)
    lib = lib or library()
    function = getattr(lib._lib, f"aotpack_linear_{what}_parts", None)
    if function is None:
        raise BundleError(f"this bundle's kernels.so predates {what} calls of several weights; re-export the bundle")
    held = [[t.contiguous() for t in tensors] for tensors in parts]  # held as long as run is
    pointers = [(ctypes.c_void_p * count)(*(t.data_ptr() for t in tensors)) for tensors in held]
    rows = [t.shape[0] for t in held[0]]
    y = torch.empty(m, sum(rows), dtype=x.dtype)
    extras = () if group_size is None else (group_size,)
    args = (x2.data_ptr(), code, m, k, count, *pointers, *extras, (ctypes.c_int64 * count)(*rows), y.data_ptr())

    def run(operands=(x2, held, y)) -> int:  # the operands and the output live as long as run does
        return function(*args)

    return run, y


def linear_dense(x: torch.Tensor, w: torch.Tensor, lib: Library | None = None) -> torch.Tensor:
    """x (..., K) @ w (N, K).T in fp32 sums, w fp32, bf16 or fp16 as stored; output in x's dtype."""
    x2, code, m, k = _operands(x, (w,))
    if w.dtype not in DTYPE_CODES or w.dim() != 2 or w.shape[1] != k:
        raise ValueError(f"aotpack's dense kernel takes a float (N, {k}) weight, got {w.dtype} {tuple(w.shape)}")
    lib = lib or library()
    if not hasattr(lib._lib, "aotpack_linear_dense"):
        raise BundleError("this bundle's kernels.so predates the dense kernel; re-export the bundle")
    return _float_product(lib.aotpack_linear_dense, "dense", x, x2, code, w)


def linear_tiles(x: torch.Tensor, w: torch.Tensor, lib: Library | None = None) -> torch.Tensor:
    """x (..., K) @ w (N, K).T, both bf16, on AMX tiles; output bf16."""
    return _bf16_product("tiles", "it needs AMX, granted", x, w, lib)


def linear_dpbf16(x: torch.Tensor, w: torch.Tensor, lib: Library | None = None) -> torch.Tensor:
    """x (..., K) @ w (N, K).T, both bf16, with AVX512-BF16's vdpbf16ps; output bf16."""
    return _bf16_product("dpbf16", f"it needs a build with AVX512-BF16, on a CPU with {DPBF16_FLAG!r}", x, w, lib)


def _bf16_product(what: str, needs: str, x: torch.Tensor, w: torch.Tensor, lib: Library | None) -> torch.Tensor:
    """x @ w.T through the bf16 kernel `what` ("tiles" or "dpbf16": Library's property and the C function
    aotpack_linear_<what>): the operands checked, then whether `lib` runs it (`needs`: what it takes)."""
    x2, code, _, k = _operands(x, (w,))
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or w.dim() != 2 or w.shape[1] != k:
        raise ValueError(
            f"aotpack's {what} kernel takes bf16 activations and a bf16 (N, {k}) weight, got {x.dtype} and "
            f"{w.dtype} {tuple(w.shape)}"
        )
    lib = lib or library()
    if not getattr(lib, what):
        raise BundleError(f"aotpack's kernels here ({lib.isa}) cannot run the {what} kernel: {needs}")
    return _float_product(getattr(lib, f"aotpack_linear_{what}"), what, x, x2, code, w)


def _float_product(function, what: str, x, x2, code: int, w) -> torch.Tensor:
    """`function` (aotpack_linear_dense's signature) over x2 (M, K), x's rows, and a float weight w."""
    y = torch.empty(x2.shape[0], w.shape[0], dtype=x.dtype)
    wc = w.contiguous()  # held until the call returns
    status = function(x2.data_ptr(), code, *x2.shape, wc.data_ptr(), DTYPE_CODES[w.dtype], w.shape[0], y.data_ptr())
    _checked(status, what)
    return y.view(*x.shape[:-1], w.shape[0])


def check_attention_operands(q, k, v, mask, devices: tuple[str, ...]) -> None:
    """ValueError unless q (B, KV, R, D), k and v (B, KV, S, D) in one float dtype and a bool mask
    (B or 1, 1, T, S) with T dividing R, all on one of `devices` (the kernel reads CPU memory; the export's
    fake tensors are on "meta"), are what the kernel takes."""
    shapes_ok = q.dim() == 4 and k.dim() == 4 and mask.dim() == 4
    b, kv, r, d = q.shape if shapes_ok else (0, 0, 0, 0)
    t, s = (mask.shape[2], k.shape[2]) if shapes_ok else (0, 0)
    if (
        not shapes_ok or q.dtype not in DTYPE_CODES or k.dtype not in DTYPE_CODES or v.dtype != k.dtype
        or mask.dtype != torch.bool or k.shape != (b, kv, s, d) or v.shape != k.shape or mask.shape[0] not in (1, b)
        or mask.shape[1] != 1 or mask.shape[3] != s or t < 1 or r % t
        or any(x.device.type not in devices for x in (q, k, v, mask))
    ):  # fmt: skip
        raise ValueError(
            f"aotpack's decode attention takes {' or '.join(devices)} tensors q (B, KV, R, D), k and v (B, KV, S, D) "
            f"and a bool mask (B, 1, T, S) with T dividing R, got q {tuple(q.shape)} {q.dtype} on {q.device}, "
            f"k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)}, mask {tuple(mask.shape)} {mask.dtype}"
        )


def decode_attention(q, k, v, mask, scale: float, lib: Library | None = None) -> torch.Tensor:
    """softmax(scale * q k^T where `mask`) v: q, k and v (B, KV, R or S, D) (any strides; k and v in one
    float dtype), mask (B or 1, 1, T, S) bool, query row r of a head being token r % T of its row; sums in
    fp32, output (B, KV, R, D) contiguous in q's dtype (zeros for a row that sees no key)."""
    check_attention_operands(q, k, v, mask, devices=("cpu",))
    b, kv, r, d = q.shape
    t, s = mask.shape[2], k.shape[2]
    lib = lib or library()
    if not hasattr(lib._lib, "aotpack_decode_attention"):
        raise BundleError("this bundle's kernels.so predates the decode attention kernel; re-export the bundle")
    out = torch.empty(b, kv, r, d, dtype=q.dtype)
    q_strides = (ctypes.c_int64 * 4)(*q.stride())
    strides = [(ctypes.c_int64 * 4)(*x) for x in (k.stride(), v.stride())]
    mask_strides = (ctypes.c_int64 * 3)(mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2), mask.stride(3))
    status = lib.aotpack_decode_attention(
        q.data_ptr(), DTYPE_CODES[q.dtype], q_strides, k.data_ptr(), v.data_ptr(), DTYPE_CODES[k.dtype], *strides,
        mask.data_ptr(), mask_strides, b, kv, r, t, s, d, scale, out.data_ptr(),
    )  # fmt: skip
    _checked(status, "decode attention")
    return out


def quantize_activations(x: torch.Tensor, lib: Library | None = None):
    """x (M, K) -> (q (M, blocks*32) int8, steps (M, blocks) fp32, block sums (M, blocks) int32): the
    activation format the kernels multiply, for tests and references."""
    x2, code, m, k = _operands(x, ())
    blocks = -(-k // 32)
    q = torch.empty(m, blocks * 32, dtype=torch.int8)
    d, s = torch.empty(m, blocks), torch.empty(m, blocks, dtype=torch.int32)
    quantize = (lib or library()).aotpack_quantize_activations
    _checked(quantize(x2.data_ptr(), code, m, k, q.data_ptr(), d.data_ptr(), s.data_ptr()), "activation")
    return q, d, s
