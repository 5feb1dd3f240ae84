"""`load()` and `Runtime`: a bundle ready to generate, with no JIT compile and no network.

Owns: assembling a verified bundle into one eager model (for prefill), the compiled decode that
borrows that model's weight tensors, and one preallocated KV cache that both write.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer, GenerationConfig

from runtime.bundle import decode_path, open_bundle, verify_files, weight_files
from runtime.cache import allocate
from runtime.decode import CompiledDecode
from runtime.errors import BundleError, ImageInputError, InvalidInputError, RuntimeBusyError
from runtime.generate import Request, check_images, iter_steps, merge_config, validate
from runtime.manifest import Manifest
from runtime.text import stream_text

# Prefill inputs a processor may return besides input_ids / attention_mask.
MULTIMODAL_INPUTS = ("pixel_values", "token_type_ids")


def load(path, num_threads: int | None = None) -> Runtime:
    """Verify and load a bundle directory. `num_threads` sets torch's (and the compiled decode's) threads."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)  # the .so was built with dynamic threads, so this governs it too
    return Runtime(path)


def _model_class(name: str):
    cls = getattr(transformers, name, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise BundleError(f"bundle model class {name!r} is not a transformers model class in transformers {transformers.__version__}")
    return cls


class Runtime:
    """A loaded bundle. One KV cache: calls from several threads are serialised by a lock."""

    def __init__(self, path):
        self.path, self.manifest = open_bundle(Path(path), defer_weights=True)
        m: Manifest = self.manifest
        self.model = self._build_model()  # the weights are verified before this returns
        self.layout = m.cache_layout
        self.decode = CompiledDecode(decode_path(self.path), self.model, m)
        self.kv = allocate(self.layout, m.batch_size, getattr(torch, m.dtype), m.device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        self.processor = self._processor() if m.is_multimodal else self.tokenizer
        self.generation_config = GenerationConfig.from_pretrained(self.path, local_files_only=True)
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding the cache

    def _build_model(self):
        """Build the eager model while a second thread hashes its weight files (hashlib releases the
        GIL), so verifying a large bundle costs little extra start-up time."""
        m = self.manifest
        with ThreadPoolExecutor(max_workers=1) as pool:
            hashed = pool.submit(verify_files, self.path, m, weight_files(m))
            try:
                model = _model_class(m.model_class).from_pretrained(
                    self.path, dtype=getattr(torch, m.dtype), local_files_only=True, attn_implementation="sdpa"
                )
            except Exception:
                hashed.result()  # a missing or corrupt weight file explains the failure better
                raise
            hashed.result()
        return model.to(m.device).eval()

    def _processor(self):
        from transformers import AutoProcessor  # image-processing imports cost ~1 s: only VLMs pay them

        return AutoProcessor.from_pretrained(self.path, local_files_only=True)

    def request(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Request:
        model_inputs = {k: v for k in MULTIMODAL_INPUTS if (v := kwargs.pop(k, None)) is not None}
        if not self.manifest.is_multimodal:
            if "pixel_values" in model_inputs:
                raise ImageInputError(f"pixel_values given to a text-only bundle ({self.manifest.model_class}); send text only")
            model_inputs = {}  # e.g. all-zero token_type_ids from a tokenizer: meaningless to a decoder LM
        config = merge_config(self.generation_config, kwargs)
        attention_mask = validate(self, input_ids, attention_mask, config)
        if self.manifest.is_multimodal:
            check_images(self.model.config, input_ids, model_inputs)
        # HF's own resolution of eos/pad (pad falls back to the first eos); the logits processors read it too.
        self.model._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=input_ids.device)
        eos = config._eos_token_tensor
        eos_ids = tuple(eos.tolist()) if eos is not None else ()
        pad = int(config._pad_token_tensor) if config._pad_token_tensor is not None else 0
        return Request(input_ids, attention_mask, model_inputs, config, eos_ids, pad, generator)

    @torch.inference_mode()  # on a generator, torch enters and leaves the mode around each step
    def iter_steps(self, input_ids, attention_mask=None, generator=None, **kwargs):
        """Yield (next-token ids (B,), raw logits (B, vocab)) per step. Holds the runtime's cache until exhausted."""
        request = self.request(input_ids, attention_mask, generator, **kwargs)
        with self._session():
            kv = [t[: input_ids.shape[0]] for t in self.kv]  # the first B rows: still contiguous
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
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

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
            raise InvalidInputError(f"stream() takes one sequence, got a batch of {input_ids.shape[0]}; use iter_tokens()")
        yield from stream_text(self.tokenizer, self.iter_tokens(input_ids, attention_mask, generator, **kwargs))
