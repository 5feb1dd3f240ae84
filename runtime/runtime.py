"""`load()` and `Runtime`: a bundle ready to generate, with no JIT compile and no network.

Owns: assembling a verified bundle into one eager model (for prefill), the decode backend that borrows
that model's weight tensors (runtime.backends), and the engine whose preallocated KV cache both write;
and the generate-style API over the engine. `Runtime` takes its parts ready-made, so a test (or a
debugging session) can assemble one around any eager model and the eager backend.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import replace
from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig

from runtime import backends, compat
from runtime.config import LoadConfig
from runtime.engine.engine import Engine
from runtime.engine.handle import Handle
from runtime.engine.openmp import release_team
from runtime.engine.request import Request
from runtime.engine.sampling import checked_sampler
from runtime.errors import InvalidInputError
from runtime.format.contract import DecodeContract
from runtime.format.private import FOLDERS
from runtime.format.reader import open_private
from runtime.generation.outputs import collect
from runtime.generation.validate import Validator
from runtime.model.weights import build_model
from runtime.text import stream_text


def load(path, config: LoadConfig | None = None, **options) -> Runtime:
    """Verify and load a bundle directory. `config` (runtime.config.LoadConfig), or its fields as
    keyword arguments: `num_threads`, `busy_timeout`, `trusted_keys`, `prefill_chunk`, `prefill_budget`,
    `backend` ("aoti": the compiled `.so`; "onnxruntime": decode.onnx; "eager": no compiled code), `prepack`.

    Everything is read from a private copy of the bundle, hashed (and with `trusted_keys`, its
    signature checked) as it was copied (runtime.format.reader.open_private); the copy goes with the
    Runtime."""
    config = LoadConfig.of(config, **options)
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)  # the .so has dynamic threads: this governs it too
    backend = backends.backend(config.backend)
    private, manifest = open_private(Path(path), backend, config.trusted_keys)
    try:
        model = build_model(private, manifest)
        decode = backend.open(private, model, manifest, config)
        rt = Runtime(private, model, decode, DecodeContract.of(manifest), config, manifest, source=Path(path))
    except BaseException:
        FOLDERS.remove(private)
        raise
    weakref.finalize(rt, FOLDERS.remove, private)  # at the Runtime's end, or at exit
    # Loading ran parallel ops on this thread, which now owns an idle OpenMP team; a server's main thread
    # never submits (which would free it), and a second team makes every decode barrier sleep
    # (runtime.engine.openmp).
    release_team()
    return rt


class Runtime:
    """A loaded bundle. Its engine (runtime.engine) owns the KV cache's rows and runs every request,
    from any thread, batched with the others."""

    def __init__(self, path, model, decode, contract: DecodeContract, config: LoadConfig, manifest=None, source=None):
        """`path`: the bundle's private copy (or, assembled by hand, a checkpoint directory) with the
        tokenizer and generation config; `model`: the eager model; `decode`: a backend's step over its
        weights; `manifest`: the bundle's, None when assembled by hand; `source`: the folder it was
        loaded from (default: `path`)."""
        self.path, self.model, self.decode, self.contract = Path(path), model, decode, contract
        self.source = Path(source) if source is not None else self.path
        self.load_config, self.manifest = config, manifest
        self.generation_config = GenerationConfig.from_pretrained(self.path, local_files_only=True)
        self.model.generation_config = self.generation_config  # what HF's option resolution reads
        vocab = manifest.vocab_size if manifest is not None else model.config.get_text_config().vocab_size
        self.validator = Validator(model, contract, vocab, lambda: self.tokenizer)
        self.engine = Engine(
            model, decode, contract, config.busy_timeout, config.prefill_chunk, config.prefix_cache, config.speculation,
            config.prefill_budget,
        )  # fmt: skip
        compat.quiet_pipeline_class_check(type(self).__name__)  # pipeline(model=rt) works; it needn't say otherwise

    # The tokenizer and processor load on first use: parsing a 262k-token vocabulary costs 3-4 s of
    # start-up, which a caller that passes token ids (a service with its own tokenizer) never needs.
    @cached_property
    def tokenizer(self):
        return AutoTokenizer.from_pretrained(self.path, local_files_only=True)

    @cached_property
    def grammar_tokenizer(self):
        """llguidance's view of the tokenizer, for structured output (built on first use: 8 s at 262k)."""
        from runtime.generation.grammar import grammar_tokenizer

        eos = self.generation_config.eos_token_id
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return grammar_tokenizer(self.tokenizer, self.validator.vocab_size, eos_ids)

    def constrain(self, kind: str, spec):
        """A logits processor that holds one generate call's output to a format: `kind` json_schema (a
        schema, or True for any JSON object), regex, choice (a list of strings) or lark (a grammar), e.g.
        `rt.generate(**inputs, logits_processor=[rt.constrain("json_schema", schema)])`. Needs llguidance
        (`pip install 'aotpack[grammar]'`); a format it cannot compile raises InvalidInputError."""
        from runtime.generation.grammar import GrammarProcessor, grammar_of

        grammar = grammar_of(kind, spec)  # checks llguidance is there before the tokenizer is built
        return GrammarProcessor(self.grammar_tokenizer, grammar)

    @cached_property
    def processor(self):
        if not self.is_multimodal:
            return self.tokenizer
        from transformers import AutoProcessor  # image-processing imports cost ~1 s: only VLMs pay them

        return AutoProcessor.from_pretrained(self.path, local_files_only=True)

    @property
    def is_multimodal(self) -> bool:
        return self.validator.multimodal

    @property
    def model_class(self) -> str:
        return type(self.model).__name__

    # What transformers' pipeline("text-generation", model=rt, tokenizer=rt.tokenizer) reads from a model
    # besides generate(): it then calls rt.generate like model.generate.
    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return torch.device(self.contract.device)

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.contract.dtype)

    def can_generate(self) -> bool:
        return True

    @property
    def layout(self):
        """The cache's layout per decoder layer (runtime.format.layout)."""
        return self.contract.layout

    @property
    def kv(self) -> list[torch.Tensor]:
        """The engine's KV cache, [k0, v0, k1, v1, ...], each (batch_size, kv_heads, slots, head_dim)."""
        return self.engine.kv

    def request(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Request:
        """Validate a generate() call (runtime.generation.validate) without running it."""
        return self.validator.request(input_ids, attention_mask, generator, **kwargs)

    def submit(
        self,
        input_ids,
        attention_mask=None,
        generator=None,
        want_logits=False,
        max_waiting=None,
        sampler="hf",
        **kwargs,
    ) -> Handle:
        """Validate a request and queue it on the engine; returns at once. Iterate the handle for
        (token ids (B,), logits (B, vocab) or None) per step, or `cancel()` it. Any thread may submit:
        requests share the compiled step (continuous batching) and each keeps its own options. With
        `max_waiting`, QueueFullError when that many requests already wait for cache rows. `sampler`:
        "hf" draws what `generate` draws (a seed reproduces HF's samples), "top-k" draws among the top-k
        warper's survivors, the same distribution without a vocabulary-wide sort and draw per token
        (runtime.engine.sampling)."""
        sampler = checked_sampler(sampler)
        request = replace(self.request(input_ids, attention_mask, generator, **kwargs), sampler=sampler)
        return self.engine.submit(request, want_logits, max_waiting)

    def iter_steps(self, input_ids, attention_mask=None, generator=None, **kwargs):
        """Yield (next-token ids (B,), raw logits (B, vocab)) per step."""
        yield from self.submit(input_ids, attention_mask, generator, want_logits=True, **kwargs)

    def iter_tokens(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Iterator[torch.Tensor]:
        """Yield next-token ids (B,) as they are produced."""
        yield from self.submit(input_ids, attention_mask, generator, **kwargs).tokens()

    def generate(self, input_ids, attention_mask=None, generator=None, streamer=None, **kwargs):
        """`model.generate`'s drop-in: (B, S + new) ids, prompt first; with `return_dict_in_generate` a
        transformers GenerateDecoderOnlyOutput (sequences, `scores` / `logits` per step when
        `output_scores` / `output_logits` ask for them, and `finish_reasons` per sequence). A `streamer`
        (TextStreamer, TextIteratorStreamer, ...) gets the prompt, then each step's tokens, then `end()`,
        as in HF."""
        if streamer is not None and not all(callable(getattr(streamer, m, None)) for m in ("put", "end")):
            raise InvalidInputError(f"streamer must have put() and end(), as HF streamers do; got {streamer!r:.50}")
        request = self.request(input_ids, attention_mask, generator, **kwargs)
        return collect(self.engine.submit(request, want_logits=bool(request.config.output_logits)), streamer)

    def session(self, system: str | None = None, drop_oldest: bool = False, parse_special: bool = False, sampler="hf"):
        """A multi-turn chat that keeps its KV cache between turns (runtime.session): each `send` prefills
        only the tokens the chat template added since the last turn. It holds one cache row until
        closed. `drop_oldest`: when the conversation would overflow the cache, drop the oldest turns
        instead of raising CacheOverflowError. `parse_special`: control-token strings in messages act as
        control tokens (by default they stay text: runtime.inputs.chat_inputs). `sampler`: as `submit`'s."""
        from runtime.session import Session

        return Session(self, system, drop_oldest, parse_special, sampler)

    def stream(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Iterator[str]:
        """Yield decoded text pieces of a single sequence as they are produced."""
        if input_ids.shape[0] != 1:
            raise InvalidInputError(
                f"stream() takes one sequence, got a batch of {input_ids.shape[0]}; use iter_tokens()"
            )
        yield from stream_text(self.tokenizer, self.iter_tokens(input_ids, attention_mask, generator, **kwargs))
