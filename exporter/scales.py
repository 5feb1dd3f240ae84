"""Choosing int4 scales and mins that fit each group of weights better than its range does.

Owns the search llama.cpp runs for its K-quants (`make_qkx2_quants` in ggml-quants.c), vectorised over
every group of a weight at once: for each of 21 candidate scales around the range's (15 levels stretched
by -1.0 .. +1.0 level), round the group onto those levels, then solve the weighted least-squares fit of
`q * scale + min` to the weights for that rounding, and keep the fit with the smallest error. The weights
of the error are llama.cpp's for Q4_K without calibration data: `rms(group) + |w|`, which favours the
large weights a matrix product is most sensitive to. No calibration text is needed.

The chosen scale and min are rounded to bf16 (what a bundle stores) and the integers recomputed against
the rounded values, so the packed weight is exactly the fit's.
"""

from __future__ import annotations

import torch

from runtime.quant.int4 import SCALE_DTYPE, integers

LEVELS = 15  # the largest int4 value
STEPS = torch.linspace(-1.0, 1.0, 21)  # candidate stretches of the level count, as llama.cpp (rmin -1, rdelta 0.1)
_CHUNK_GROUPS = 1 << 16  # groups searched at once: bounds the search's memory to ~100 MB


def search(spec, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float (rows, cols) weight -> (integers (rows, cols) in 0..15, scales, mins (rows, groups) bf16)."""
    w = weight.detach().float().cpu()
    rows, cols = w.shape
    groups = w.reshape(-1, spec.group_size)  # (rows * groups, gs)
    scales, mins = torch.empty(len(groups)), torch.empty(len(groups))
    for start in range(0, len(groups), _CHUNK_GROUPS):
        chunk = groups[start : start + _CHUNK_GROUPS]
        scales[start : start + len(chunk)], mins[start : start + len(chunk)] = _fit(chunk)
    shape = (rows, cols // spec.group_size)
    scales, mins = scales.view(shape).to(SCALE_DTYPE), mins.view(shape).to(SCALE_DTYPE)
    return integers(spec, w, scales, mins), scales, mins


def _fit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (G, gs) -> the best (scale, min) of each group, fp32 (G,) each."""
    low, high = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    span = (high - low).clamp(min=torch.finfo(torch.float32).tiny)
    weight = x.pow(2).mean(1, keepdim=True).sqrt() + x.abs()  # (G, gs): rms(group) + |x|
    best_scale, best_min = (span / LEVELS).squeeze(1), low.squeeze(1)
    best_error = _error(x, weight, _levels(x, low, LEVELS / span), best_scale, best_min)
    for stretch in STEPS:
        q = _levels(x, low, (LEVELS + stretch) / span)  # (G, gs)
        scale, minimum = _least_squares(x, weight, q)
        error = _error(x, weight, q, scale, minimum)
        better = (error < best_error) & (scale > 0)
        best_scale, best_min = torch.where(better, scale, best_scale), torch.where(better, minimum, best_min)
        best_error = torch.where(better, error, best_error)
    return best_scale, best_min


def _levels(x, low, inverse_scale) -> torch.Tensor:
    return torch.round((x - low) * inverse_scale).clamp(0, LEVELS)


def _least_squares(x, weight, q) -> tuple[torch.Tensor, torch.Tensor]:
    """The (scale, min) minimising sum weight * (q * scale + min - x)^2 per group, for fixed levels q."""
    sw, sq, sqq = weight.sum(1), (weight * q).sum(1), (weight * q * q).sum(1)
    sx, sqx = (weight * x).sum(1), (weight * q * x).sum(1)
    det = sw * sqq - sq * sq
    safe = torch.where(det > 0, det, torch.ones_like(det))
    scale = torch.where(det > 0, (sw * sqx - sx * sq) / safe, torch.zeros_like(det))
    minimum = torch.where(det > 0, (sqq * sx - sq * sqx) / safe, sx / sw)
    return scale, minimum


def _error(x, weight, q, scale, minimum) -> torch.Tensor:
    return (weight * (q * scale[:, None] + minimum[:, None] - x).pow(2)).sum(1)
