"""`load()` and `Runtime`: a bundle ready to generate, with no JIT compile and no network.

Owns: assembling a verified bundle into one eager model (for prefill), the compiled decode that
borrows that model's weight tensors, and one preallocated KV cache that both write.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig

from runtime.bundle import decode_path, open_bundle, verify_files, weight_files
from runtime.cache import allocate
from runtime.decode import CompiledDecode
from runtime.errors import InvalidInputError, RuntimeBusyError
from runtime.generate import Request, iter_steps, make_request
from runtime.manifest import DECODE, Manifest
from runtime.text import stream_text
from runtime.weights import build_model


def load(path, num_threads: int | None = None, busy_timeout: float = 300.0, trusted_keys=None) -> Runtime:
    """Verify and load a bundle directory. `num_threads` sets torch's (and the compiled decode's) threads;
    a generation waits at most `busy_timeout` seconds for the runtime's KV cache (see Runtime). With
    `trusted_keys` (public-key PEM files) only a bundle signed by one of them loads (runtime.signing)."""
    if num_threads is not None:
        torch.set_num_threads(check_threads(num_threads))  # the .so has dynamic threads: this governs it too
    return Runtime(path, busy_timeout, trusted_keys)


def check_threads(n) -> int:
    """A thread count between 1 and this machine's CPUs: OpenMP crashed with 100,000 and spin-waits
    badly far above the core count."""
    cpus = os.cpu_count() or 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cpus:
        raise InvalidInputError(f"threads {n!r} must be an integer from 1 to {cpus}, this machine's CPU count")
    return n


class Runtime:
    """A loaded bundle. One KV cache: calls from several threads are serialised by a lock."""

    def __init__(self, path, busy_timeout: float = 300.0, trusted_keys=None):
        self.path, self.manifest = open_bundle(Path(path), defer_weights=True, trusted_keys=trusted_keys)
        m: Manifest = self.manifest
        self.model = self._build_model()  # the weights are verified before this returns
        self.layout = m.cache_layout
        self.decode = CompiledDecode(decode_path(self.path), self.model, m, sha256=m.files[DECODE])
        self.kv = allocate(self.layout, m.batch_size, getattr(torch, m.dtype), m.device)
        self.generation_config = GenerationConfig.from_pretrained(self.path, local_files_only=True)
        self.busy_timeout = busy_timeout  # seconds a generation waits for the cache before RuntimeBusyError
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding the cache

    def _build_model(self):
        """Build the eager model while a second thread hashes its weight files (hashlib releases the
        GIL), so verifying a large bundle costs little extra start-up time."""
        m = self.manifest
        with ThreadPoolExecutor(max_workers=1) as pool:
            hashed = pool.submit(verify_files, self.path, m, weight_files(m))
            try:
                model = build_model(self.path, m)
            except Exception:
                hashed.result()  # a missing or corrupt weight file explains the failure better
                raise
            hashed.result()
        return model

    # The tokenizer and processor load on first use: parsing a 262k-token vocabulary costs 3-4 s of
    # start-up, which a caller that passes token ids (a service with its own tokenizer) never needs.
    @cached_property
    def tokenizer(self):
        return AutoTokenizer.from_pretrained(self.path, local_files_only=True)

    @cached_property
    def processor(self):
        if not self.manifest.is_multimodal:
            return self.tokenizer
        from transformers import AutoProcessor  # image-processing imports cost ~1 s: only VLMs pay them

        return AutoProcessor.from_pretrained(self.path, local_files_only=True)

    def request(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Request:
        return make_request(self, input_ids, attention_mask, generator, kwargs)

    @torch.inference_mode()  # on a generator, torch enters and leaves the mode around each step
    def iter_steps(self, input_ids, attention_mask=None, generator=None, **kwargs):
        """Yield (next-token ids (B,), raw logits (B, vocab)) per step. Holds the runtime's cache until exhausted."""
        request = self.request(input_ids, attention_mask, generator, **kwargs)
        with self._session():
            kv = [t[: input_ids.shape[0]] for t in self.kv]  # the first B rows: still contiguous
            for t in kv:  # nothing an earlier request left (a NaN is poison even where masked) may reach this one
                t.zero_()
            yield from iter_steps(self, request, kv)

    @contextmanager
    def _session(self):
        """The runtime owns one KV cache: other threads wait their turn; the same thread re-entering
        (a second generation while the first is unfinished) would deadlock, so it is refused."""
        if self._owner == threading.get_ident():
            raise RuntimeBusyError(
                "this runtime is already generating in this thread; exhaust or close() the first generator, "
                "or load() a second runtime for concurrent sessions"
            )
        if not self._lock.acquire(timeout=self.busy_timeout):
            raise RuntimeBusyError(
                f"this runtime's KV cache has been held by another generation for {self.busy_timeout:g} s (an "
                "unfinished generator? exhaust or close() it); load() a second runtime for concurrent sessions"
            )
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._lock.release()

    def iter_tokens(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Iterator[torch.Tensor]:
        """Yield next-token ids (B,) as they are produced."""
        for token, _ in self.iter_steps(input_ids, attention_mask, generator, **kwargs):
            yield token

    @torch.inference_mode()
    def generate(self, input_ids, attention_mask=None, generator=None, **kwargs) -> torch.Tensor:
        """Like `model.generate`: returns (B, S + new) ids, prompt first."""
        new = list(self.iter_tokens(input_ids, attention_mask, generator, **kwargs))
        return torch.cat([input_ids, torch.stack(new, dim=1)], dim=1)

    def stream(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Iterator[str]:
        """Yield decoded text pieces of a single sequence as they are produced."""
        if input_ids.shape[0] != 1:
            raise InvalidInputError(
                f"stream() takes one sequence, got a batch of {input_ids.shape[0]}; use iter_tokens()"
            )
        yield from stream_text(self.tokenizer, self.iter_tokens(input_ids, attention_mask, generator, **kwargs))
