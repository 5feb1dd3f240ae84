"""How a bundle is loaded: one frozen config for `load()`, the CLI, the server and Ray replicas.

Owns every load option's default and range, checked once, here, before anything is read. Torch-free,
so the CLI checks its flags without importing torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from numbers import Real
from pathlib import Path

from runtime import backends
from runtime.errors import InvalidInputError


def check_threads(n) -> int:
    """A thread count between 1 and this machine's CPUs: OpenMP crashed with 100,000 and spin-waits
    badly far above the core count."""
    cpus = os.cpu_count() or 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cpus:
        raise InvalidInputError(f"threads {n!r} must be an integer from 1 to {cpus}, this machine's CPU count")
    return n


@dataclass(frozen=True)
class LoadConfig:
    num_threads: int | None = None  # torch's threads, and the decode's (the .so has dynamic threads); None: torch's
    busy_timeout: float = 300.0  # seconds a request waits for free cache rows before RuntimeBusyError
    trusted_keys: tuple[Path, ...] | None = None  # public keys (PEM): only a bundle signed by one of them loads
    # Text prompts longer than this are prefilled a chunk per decode step, so a long prompt delays the other
    # requests' next tokens by one chunk at a time (None: whole prompts).
    prefill_chunk: int | None = None
    # With prefill_chunk: each chunk's tokens are chosen so that its prefill takes about this many decode
    # steps' time, as the engine measures them, at most prefill_chunk and at least min(8, prefill_chunk)
    # (runtime.engine.chunking; None: every chunk is prefill_chunk tokens).
    prefill_budget: float | None = None
    # A finished one-row request's cache row keeps its tokens until a request needs the row, and a later
    # prompt that starts the same way prefills only the rest (runtime.engine.prefix)
    prefix_cache: bool = True
    # A bundle exported with --speculate verifies drafted tokens: one-row greedy requests draft by prompt
    # lookup when it pays (runtime.engine.speculation); sampled ones when they ask
    speculation: bool = True
    backend: str = backends.DEFAULT  # runtime.backends: "aoti", "onnxruntime" or "eager"
    prepack: bool = False  # onnxruntime: ONNX Runtime prepacks its weights, a second copy, faster to read

    def __post_init__(self):
        if self.num_threads is not None:
            check_threads(self.num_threads)
        b = self.busy_timeout
        if not isinstance(b, Real) or isinstance(b, bool) or not math.isfinite(b) or b < 0:
            raise InvalidInputError(f"busy_timeout must be a number of seconds >= 0, got {b!r}")
        chunk = self.prefill_chunk
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
            raise InvalidInputError(f"prefill_chunk must be a positive number of tokens or None, got {chunk!r}")
        budget = self.prefill_budget
        if budget is not None:
            if not isinstance(budget, Real) or isinstance(budget, bool) or not math.isfinite(budget) or budget <= 0:
                raise InvalidInputError(f"prefill_budget must be a number of decode steps > 0 or None, got {budget!r}")
            if chunk is None:
                raise InvalidInputError(
                    f"prefill_budget={budget!r} sizes prefill chunks, and prefill_chunk is None (whole prompts); "
                    "set prefill_chunk too, the largest chunk (e.g. 64)"
                )
        for flag in ("prefix_cache", "speculation"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInputError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        entry = backends.entry(self.backend)
        if self.prepack and "prepack" not in entry.options:
            takes = [e.name for e in backends.REGISTRY if "prepack" in e.options]
            raise InvalidInputError(
                f"prepacking applies to the {', '.join(takes)} backend only; add --backend {takes[0]}"
            )
        if self.trusted_keys is not None:
            if isinstance(self.trusted_keys, (str, Path)):
                raise InvalidInputError("trusted_keys takes a list of public-key files, not one path")
            object.__setattr__(self, "trusted_keys", tuple(Path(k) for k in self.trusted_keys))

    @classmethod
    def of(cls, config: LoadConfig | None = None, **options) -> LoadConfig:
        """`config` with `options` replaced (keyword arguments of `load()`), each checked."""
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(options) - known):
            raise InvalidInputError(f"unknown load options {unknown}; load() takes {sorted(known)}")
        return replace(config, **options) if config is not None else cls(**options)
