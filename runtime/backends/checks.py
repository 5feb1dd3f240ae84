"""What every backend checks before native code sees a tensor: the step's inputs against the
contract, and the eager weights it lends against what the step was compiled for.

AOTInductor validates nothing (a wrong shape corrupts the heap, a wrong dtype is misread), and ONNX
Runtime checks shapes but not a cache position outside the cache; so each call is checked here first.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.errors import BundleError, InvalidInputError
from runtime.format.contract import INPUT_NAMES, STEP_INPUTS, DecodeContract

PAD_MASK, CACHE_POSITION = INPUT_NAMES.index("pad_mask"), INPUT_NAMES.index("cache_position")


def check_step_inputs(
    contract: DecodeContract,
    inputs: list,
    batches: tuple[int, ...] | None = None,
    verify: tuple[int, ...] | None = None,
    chunk: bool = False,
) -> int:
    """Refuse anything the compiled step would misread: count, type, shape, dtype, device, layout, a
    cache position outside the cache, tokens per row no graph takes (1, or a verify graph's k + 1).
    `batches`, `verify`: the only batches the step has a decode graph, a verify graph for (None: any of
    1..batch_size); `chunk`: a call of the chunk graph (one row, the contract's chunk tokens). Returns
    the tokens per row."""
    tokens = check_held_inputs(contract, inputs, batches, verify, chunk)
    check_span_inputs(contract, inputs[PAD_MASK], inputs[CACHE_POSITION], tokens)
    return tokens


def check_held_inputs(
    contract: DecodeContract,
    inputs: list,
    batches: tuple[int, ...] | None = None,
    verify: tuple[int, ...] | None = None,
    chunk: bool = False,
) -> int:
    """check_step_inputs but for the pad mask (inputs[PAD_MASK] may be None) and the cache positions'
    values: what a step bound to tensors its caller updates in place keeps (their shapes, dtypes and
    layout cannot change), so a bound step checks it once (runtime.backends.aoti.CompiledDecode.bind)."""
    if len(inputs) != len(STEP_INPUTS) + 2 * len(contract.layout):
        raise InvalidInputError(
            f"the compiled decode takes {len(STEP_INPUTS)} inputs and {2 * len(contract.layout)} KV tensors, "
            f"got {len(inputs)}"
        )
    first = inputs[0]
    batch = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else 0
    if not 1 <= batch <= contract.batch_size:
        raise InvalidInputError(
            f"batch {batch} is outside this bundle's 1..{contract.batch_size}; re-export with --batch-size {batch}"
        )
    tokens = _tokens(contract, first, chunk)
    if chunk and batch != 1:
        raise InvalidInputError(f"the chunk graph writes one row's prompt tokens; got {batch} rows")
    batches = None if chunk else batches if tokens == 1 else verify
    if batches == ():
        raise InvalidInputError(f"this backend has no verify step: input_ids must take 1 token a row, not {tokens}")
    if batches is not None and batch not in batches:
        cover = next(b for b in batches if b >= batch)
        raise InvalidInputError(
            f"batch {batch} has no compiled graph (this bundle's are for {list(batches)} rows): step {cover} rows "
            f"(pad with idle rows, as the engine does), or re-export with --batch-buckets including {batch}"
        )
    for spec, tensor in zip(STEP_INPUTS, inputs, strict=False):
        if spec.name != "pad_mask":
            _expect(
                spec.name, tensor, contract.shape(spec, batch, 0, tokens), getattr(torch, spec.dtype), contract.device
            )
    cache_dtype = getattr(torch, contract.dtype)
    for i, (shape, tensor) in enumerate(zip(contract.kv_shapes(batch), inputs[len(STEP_INPUTS) :], strict=True)):
        _expect(f"layer {i // 2} {('keys', 'values')[i % 2]}", tensor, shape, cache_dtype, contract.device)
    return tokens


def check_span_inputs(contract: DecodeContract, pad_mask, positions: torch.Tensor, tokens: int) -> None:
    """The pad mask (its width is the attended span) and every row's cache position inside that span,
    for a step whose other inputs check_held_inputs has passed (`positions`: the cache_position it holds)."""
    span = _span(contract, pad_mask)
    _expect(
        "pad_mask",
        pad_mask,
        contract.shape(STEP_INPUTS[PAD_MASK], positions.shape[0], span),
        torch.bool,
        contract.device,
    )
    low, high = torch.aminmax(positions)
    low, high = int(low), int(high)
    if low < 0 or high + tokens - 1 >= span:
        bad = low if low < 0 else high
        last = "" if tokens == 1 else f" (with its {tokens - 1} drafts after it, up to {high + tokens - 1})"
        raise InvalidInputError(
            f"cache_position {bad}{last} is outside the attended span 0..{span - 1} (the pad mask's width, at most "
            f"the cache's {contract.max_cache_len})"
        )


def _tokens(contract: DecodeContract, input_ids, chunk: bool) -> int:
    """Tokens per row: 1, or the verify graphs' k + 1 where the bundle has them; the chunk graph's C."""
    tokens = input_ids.shape[1] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 else 0
    if chunk and tokens != contract.chunk_tokens:
        raise InvalidInputError(
            f"input_ids has {tokens} tokens; this bundle's chunk graph takes {contract.chunk_tokens} "
            "(pad a shorter piece; without a chunk graph, export with --chunk-graph C)"
        )
    allowed = (1, contract.verify_tokens) if contract.verify_tokens else (1,)
    if not chunk and tokens not in allowed:
        raise InvalidInputError(
            f"input_ids has {tokens} tokens per row; this bundle's steps take {' or '.join(map(str, allowed))} "
            "(a verify step: the next token and the bundle's --speculate drafts)"
        )
    return tokens


def _span(contract: DecodeContract, pad_mask) -> int:
    """The attended span, the pad mask's width: 1..max_cache_len."""
    width = pad_mask.shape[1] if isinstance(pad_mask, torch.Tensor) and pad_mask.dim() == 2 else 0
    if not 1 <= width <= contract.max_cache_len:
        shape = tuple(getattr(pad_mask, "shape", ()))
        raise InvalidInputError(
            f"pad_mask has shape {shape}: its width, the attended span, must be 1..{contract.max_cache_len}"
        )
    return width


def _expect(name: str, t, shape, dtype: torch.dtype, device: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise InvalidInputError(f"{name} has shape {tuple(t.shape)}, the compiled decode needs {tuple(shape)}")
    if t.dtype != dtype:
        raise InvalidInputError(f"{name} has dtype {t.dtype}, the compiled decode needs {dtype}")
    if t.device.type != device:
        raise InvalidInputError(f"{name} is on {t.device}, the compiled decode runs on {device}")
    if not t.is_contiguous():
        raise InvalidInputError(f"{name} is not contiguous; call .contiguous() first")


def lend_constants(model: nn.Module, constants, device: str) -> dict[str, torch.Tensor]:
    """Map each compiled constant (runtime.format.manifest.Constant) to the eager model's own tensor,
    refusing any that differs in dtype, shape or device from what the decode was compiled for (it would
    misread it)."""
    tensors = {}
    for const in constants:
        tensor = _eager_tensor(model, const)
        expected = (getattr(torch, const.dtype), tuple(const.shape), device)
        found = (tensor.dtype, tuple(tensor.shape), tensor.device.type)
        if found != expected:
            raise BundleError(
                f"weight {const.module_path!r} is {found}, the compiled decode needs {expected}; "
                "the bundle's config or weights do not match its decode, re-export it"
            )
        tensors[const.name] = tensor.data
    return tensors


def _eager_tensor(model: nn.Module, const) -> torch.Tensor:
    for getter in (model.get_parameter, model.get_buffer):
        try:
            return getter(const.module_path)
        except AttributeError:
            continue
    raise BundleError(
        f"compiled constant {const.name!r} expects eager tensor {const.module_path!r}, which "
        f"{type(model).__name__} does not have; the bundle does not match its config, re-export it"
    )
