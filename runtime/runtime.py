"""`load()` and `Runtime`: a bundle ready to generate, with no JIT compile and no network.

Owns: assembling a verified bundle into one eager model (for prefill), the compiled decode that
borrows that model's weight tensors, and the engine whose preallocated KV cache both write.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig

from runtime.backend import AOTI, Backend, open_decode
from runtime.bundle import open_bundle, verify_files, weight_files
from runtime.engine import Engine
from runtime.errors import InvalidInputError
from runtime.generate import Request, make_request
from runtime.handle import Handle, collect
from runtime.manifest import Manifest
from runtime.text import stream_text
from runtime.weights import build_model


def load(
    path,
    num_threads: int | None = None,
    busy_timeout: float = 300.0,
    trusted_keys=None,
    prefill_chunk=None,
    backend: str = AOTI,
    prepack: bool = False,
) -> Runtime:
    """Verify and load a bundle directory. `num_threads` sets torch's (and the decode's) threads;
    a generation waits at most `busy_timeout` seconds for free cache rows (runtime.engine). With
    `trusted_keys` (public-key PEM files) only a bundle signed by one of them loads (runtime.signing).
    `prefill_chunk`: prefill text prompts longer than this a chunk per decode step, so that a long
    prompt delays the other requests' next tokens by one chunk at a time (None: whole prompts).
    `backend`: "aoti", the compiled `.so` (needs the torch and CPU it was built for), or "onnxruntime",
    the bundle's decode.onnx (`export --onnx`; any torch, any CPU). `prepack` (onnxruntime only): let
    ONNX Runtime prepack its weights, faster but a second copy of them."""
    if num_threads is not None:
        torch.set_num_threads(check_threads(num_threads))  # the .so has dynamic threads: this governs it too
    return Runtime(path, busy_timeout, trusted_keys, check_chunk(prefill_chunk), Backend(backend, prepack))


def check_chunk(chunk):
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise InvalidInputError(f"prefill_chunk must be a positive number of tokens or None, got {chunk!r}")
    return chunk


def check_threads(n) -> int:
    """A thread count between 1 and this machine's CPUs: OpenMP crashed with 100,000 and spin-waits
    badly far above the core count."""
    cpus = os.cpu_count() or 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cpus:
        raise InvalidInputError(f"threads {n!r} must be an integer from 1 to {cpus}, this machine's CPU count")
    return n


class Runtime:
    """A loaded bundle. Its engine (runtime.engine) owns the KV cache's rows and runs every request,
    from any thread, batched with the others."""

    def __init__(
        self,
        path,
        busy_timeout: float = 300.0,
        trusted_keys=None,
        prefill_chunk: int | None = None,
        backend: Backend | None = None,
    ):
        backend = backend or Backend()
        self.path, self.manifest = open_bundle(Path(path), True, trusted_keys, backend.name)
        m: Manifest = self.manifest
        self.backend = backend
        self.model = self._build_model()  # the weights are verified before this returns
        self.layout = m.cache_layout
        self.decode = open_decode(backend, self.path, self.model, m)
        self.generation_config = GenerationConfig.from_pretrained(self.path, local_files_only=True)
        self.model.generation_config = self.generation_config  # what HF's option resolution reads
        self.engine = Engine(self, busy_timeout, prefill_chunk)  # runs every request, batched

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

    # What transformers' pipeline("text-generation", model=rt, tokenizer=rt.tokenizer) reads from a model
    # besides generate(): it then calls rt.generate like model.generate.
    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return torch.device(self.manifest.device)

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.manifest.dtype)

    def can_generate(self) -> bool:
        return True

    @property
    def kv(self) -> list[torch.Tensor]:
        """The engine's KV cache, [k0, v0, k1, v1, ...], each (batch_size, kv_heads, slots, head_dim)."""
        return self.engine.kv

    def request(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Request:
        return make_request(self, input_ids, attention_mask, generator, kwargs)

    def submit(
        self, input_ids, attention_mask=None, generator=None, want_logits=False, max_waiting=None, **kwargs
    ) -> Handle:
        """Validate a request and queue it on the engine; returns at once. Iterate the handle for
        (token ids (B,), logits (B, vocab) or None) per step, or `cancel()` it. Any thread may submit:
        requests share the compiled step (continuous batching) and each keeps its own options. With
        `max_waiting`, QueueFullError when that many requests already wait for cache rows."""
        request = self.request(input_ids, attention_mask, generator, **kwargs)
        return self.engine.submit(request, want_logits, max_waiting)

    def iter_steps(self, input_ids, attention_mask=None, generator=None, **kwargs):
        """Yield (next-token ids (B,), raw logits (B, vocab)) per step."""
        yield from self.submit(input_ids, attention_mask, generator, want_logits=True, **kwargs)

    def iter_tokens(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Iterator[torch.Tensor]:
        """Yield next-token ids (B,) as they are produced."""
        yield from self.submit(input_ids, attention_mask, generator, **kwargs).tokens()

    def generate(self, input_ids, attention_mask=None, generator=None, streamer=None, **kwargs):
        """`model.generate`'s drop-in: (B, S + new) ids, prompt first; with `return_dict_in_generate` a
        transformers GenerateDecoderOnlyOutput (sequences, and `scores` / `logits` per step when
        `output_scores` / `output_logits` ask for them). A `streamer` (TextStreamer,
        TextIteratorStreamer, ...) gets the prompt, then each step's tokens, then `end()`, as in HF."""
        if streamer is not None and not all(callable(getattr(streamer, m, None)) for m in ("put", "end")):
            raise InvalidInputError(f"streamer must have put() and end(), as HF streamers do; got {streamer!r:.50}")
        request = self.request(input_ids, attention_mask, generator, **kwargs)
        return collect(self.engine.submit(request, want_logits=bool(request.config.output_logits)), streamer)

    def session(self, system: str | None = None, drop_oldest: bool = False):
        """A multi-turn chat that keeps its KV cache between turns (runtime.session): each `send` prefills
        only the tokens the chat template added since the last turn. It holds one cache row until
        closed. `drop_oldest`: when the conversation would overflow the cache, drop the oldest turns
        instead of raising CacheOverflowError."""
        from runtime.session import Session

        return Session(self, system, drop_oldest)

    def stream(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Iterator[str]:
        """Yield decoded text pieces of a single sequence as they are produced."""
        if input_ids.shape[0] != 1:
            raise InvalidInputError(
                f"stream() takes one sequence, got a batch of {input_ids.shape[0]}; use iter_tokens()"
            )
        yield from stream_text(self.tokenizer, self.iter_tokens(input_ids, attention_mask, generator, **kwargs))
