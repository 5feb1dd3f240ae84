"""What a generate() call asks for, validated before any model work.

Owns: request validation (shapes, ids, masks, images, options) against a loaded model and its cache,
the merged generation config, and the transformers logits processors and stopping criteria built for
it; the result is the engine's `Request` (runtime.engine.request). Running requests is the engine's;
turning ids into text is runtime.text's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import GenerationConfig
from transformers.generation import LogitsProcessorList, StoppingCriteriaList

from runtime import compat
from runtime.engine.request import Request
from runtime.errors import CacheOverflowError, ImageInputError, InvalidInputError
from runtime.format.contract import DecodeContract
from runtime.generation.options import check_generator, check_options, check_stop_strings
from runtime.model.images import holds_image, image_token_id, is_multimodal

# Prefill inputs a processor may return besides input_ids / attention_mask.
MULTIMODAL_INPUTS = ("pixel_values", "token_type_ids")

# GenerationConfig fields a call may set, as keywords or in a `generation_config=`; each maps onto
# transformers' own logits processors and stopping criteria.
GENERATE_KWARGS = (
    "max_new_tokens",
    "max_length",
    "min_new_tokens",
    "max_time",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "sequence_bias",  # [[token ids, bias], ...]: HF's SequenceBiasLogitsProcessor (serve's logit_bias)
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
    "stop_strings",  # with the bundle's tokenizer (or `tokenizer=`), through HF's StopStringCriteria
    "num_return_sequences",
    # drafts a step by prompt lookup (at most the bundle's --speculate; 0: none), and the n-gram they match
    "prompt_lookup_num_tokens",
    "max_matching_ngram_size",
    "return_dict_in_generate",
    "output_scores",
    "output_logits",
    "use_cache",
    "num_beams",  # refused unless 1, by name
    "output_attentions",  # refused unless False
    "output_hidden_states",
)
# What generate() takes besides those: HF's own objects, used as HF uses them.
OBJECT_KWARGS = ("generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "tokenizer")


class Validator:
    """Validates generate() calls for one loaded model and cache: `model` (its config and HF's
    generation machinery; its `generation_config` holds the bundle's defaults), `contract` (batch,
    cache length, device), the vocabulary the decode step's logits span, and `tokenizer`, a function
    returning the tokenizer (loaded only when stop strings need it)."""

    def __init__(self, model, contract: DecodeContract, vocab_size: int, tokenizer: Callable[[], object]):
        self.model, self.contract, self.vocab_size, self._tokenizer = model, contract, vocab_size, tokenizer
        self.multimodal = is_multimodal(model.config)

    def request(self, input_ids, attention_mask=None, generator=None, **kwargs) -> Request:
        """Validate one generate() call before any model work, and resolve its options, eos and pad ids
        exactly as `generate` would."""
        model_inputs = {k: v for k in MULTIMODAL_INPUTS if (v := kwargs.pop(k, None)) is not None}
        objects = {k: kwargs.pop(k, None) for k in OBJECT_KWARGS}
        if not self.multimodal:
            if "pixel_values" in model_inputs:
                raise ImageInputError(
                    f"pixel_values given to a text-only bundle ({type(self.model).__name__}); send text only"
                )
            model_inputs = {}  # e.g. all-zero token_type_ids from a tokenizer: meaningless to a decoder LM
        check_generator(generator, self.contract.device)
        base = objects["generation_config"]
        config = self.merge_config(base, kwargs)
        # HF's length rule needs to know whether anyone set max_length before the defaults filled it in
        defaults = (c.max_length for c in (base, self.model.generation_config) if c is not None)
        lengths = (kwargs.get("max_length"), *defaults)
        length_set = any(length is not None for length in lengths)
        input_ids, attention_mask, model_inputs = self._expand(config, input_ids, attention_mask, model_inputs)
        attention_mask = self.validate(input_ids, attention_mask, config, length_set)
        if self.multimodal:
            check_images(self.model.config, input_ids, model_inputs)
        eos_ids, pad = self._special_tokens(config, input_ids.device)
        processors, stopping = self._criteria(config, attention_mask, objects)
        ends_in_image = holds_image(self.model.config, input_ids[:, -1])
        copies = 1 if model_inputs else (config.num_return_sequences or 1)  # with images each row is prefilled
        return Request(
            input_ids,
            attention_mask,
            model_inputs,
            config,
            eos_ids,
            pad,
            generator,
            processors,
            stopping,
            ends_in_image,
            copies,
        )

    def _criteria(self, config, attention_mask, objects: dict) -> tuple[LogitsProcessorList, StoppingCriteriaList]:
        """transformers' processors and stopping criteria, built now so that an option they refuse fails
        before any model work. The tokenizer (3 s to parse for a 262k vocabulary) loads only for stop strings."""
        processors = _custom(objects["logits_processor"], LogitsProcessorList, "logits_processor")
        criteria = _custom(objects["stopping_criteria"], StoppingCriteriaList, "stopping_criteria")
        tokenizer = objects["tokenizer"] or (self._tokenizer() if config.stop_strings else None)
        fn = objects["prefix_allowed_tokens_fn"]
        if fn is not None and not callable(fn):
            raise InvalidInputError(f"prefix_allowed_tokens_fn must be callable, got {type(fn).__name__}")
        try:
            processors = compat.logits_processors(self.model, config, attention_mask, processors, fn)
            stopping = compat.stopping_criteria(self.model, config, criteria, tokenizer)
        except (ValueError, TypeError) as e:
            raise InvalidInputError(f"invalid generation options: {e}") from None
        return processors, stopping

    def _expand(self, config, input_ids, attention_mask, model_inputs):
        """num_return_sequences: each prompt row repeated in place, as generate does (sampling only)."""
        times = config.num_return_sequences or 1
        if times == 1 or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            return input_ids, attention_mask, model_inputs
        extra = model_inputs | ({"attention_mask": attention_mask} if attention_mask is not None else {})
        input_ids, extra = compat.expand_inputs(self.model, times, input_ids, **extra)
        return input_ids, extra.pop("attention_mask", None), extra

    def _special_tokens(self, config: GenerationConfig, device) -> tuple[tuple[int, ...], int]:
        """eos ids and pad id as `generate` resolves them, each inside the vocabulary: a pad id past it
        would be fed to the compiled step (AOTInductor does not check) and abort the process."""
        try:
            eos_ids, pad = compat.special_tokens(self.model, config, device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InvalidInputError(f"eos_token_id / pad_token_id must be token ids of this bundle ({e})") from None
        vocab = self.vocab_size
        for name, ids in (("eos_token_id", eos_ids), ("pad_token_id", (pad,))):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidInputError(
                    f"{name} {bad[0]} is outside the vocabulary 0..{vocab - 1}; pass this bundle's token ids"
                )
        return eos_ids, pad

    def merge_config(self, base: GenerationConfig | None, overrides: dict) -> GenerationConfig:
        """The call's generation config as `generate` resolves it (runtime.compat.generation_config). Every
        value is checked first (runtime.generation.options), the keywords' and the `generation_config=`'s
        alike, so transformers never sees one it would misread; what the compiled decode cannot do is refused."""
        unknown = sorted(set(overrides) - set(GENERATE_KWARGS))
        if unknown:
            supported = sorted(GENERATE_KWARGS + OBJECT_KWARGS)
            raise InvalidInputError(f"unsupported generate() arguments {unknown}; supported: {supported}")
        if base is not None and not isinstance(base, GenerationConfig):
            raise InvalidInputError(
                f"generation_config must be a transformers.GenerationConfig, got {type(base).__name__}"
            )
        overrides = check_options(overrides, self.vocab_size)
        if base is not None:
            check_options({k: getattr(base, k, None) for k in GENERATE_KWARGS}, self.vocab_size)
        try:
            given = {k: v for k, v in overrides.items() if v is not None}
            config = compat.generation_config(self.model, base, given)
            config.validate()
        except (ValueError, TypeError) as e:  # transformers' own option checks, for combinations
            raise InvalidInputError(f"invalid generation options: {e}") from None
        config.stop_strings = check_stop_strings(config.stop_strings) or None
        _check_capabilities(config)
        return config

    def validate(self, input_ids, attention_mask, config: GenerationConfig, length_set: bool = True) -> torch.Tensor:
        """Check a request against the bundle; returns the attention mask (without one, the one generate
        infers). Sets the config's lengths as `generate` does; `length_set`: max_length came from the call
        or a config."""
        m = self.contract
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise InvalidInputError(
                "input_ids must be a 2D (batch, seq) tensor, e.g. from tokenizer(..., return_tensors='pt')"
            )
        if input_ids.dtype != torch.long:
            raise InvalidInputError(f"input_ids has dtype {input_ids.dtype}; token ids must be torch.long")
        if input_ids.device.type != m.device:
            raise InvalidInputError(
                f"input_ids is on {input_ids.device}, the bundle runs on {m.device}; move it with .to('{m.device}')"
            )
        batch, seq = input_ids.shape
        if seq == 0 or batch == 0:
            raise InvalidInputError(
                f"the prompt is empty (input_ids shape {tuple(input_ids.shape)}); give at least one token"
            )
        if not 1 <= batch <= m.batch_size:
            raise InvalidInputError(
                f"batch size {batch} is larger than this bundle's {m.batch_size}; re-export with --batch-size {batch}"
            )
        low, high, vocab = int(input_ids.min()), int(input_ids.max()), self.vocab_size
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise InvalidInputError(
                f"token id {bad} is outside the vocabulary 0..{vocab - 1}; was it tokenized for another model?"
            )
        if attention_mask is None:
            _, pad = self._special_tokens(config, input_ids.device)  # the ids the inference reads, checked first
            attention_mask = _inferred_mask(self.model, config, input_ids, pad)
        attention_mask = _check_mask(input_ids, attention_mask)
        config.max_new_tokens = new_token_budget(config, seq, self.model.config.get_text_config(), length_set)
        _check_options(config, seq, m.max_cache_len)
        config.max_length = seq + config.max_new_tokens  # as generate sets them: the stopping criteria read these
        if config.min_new_tokens is not None:
            config.min_length = seq + config.min_new_tokens
        return attention_mask


def _custom(value, kind, name: str):
    """A caller's processors or criteria: HF's list type, or a plain list of them."""
    if value is None or isinstance(value, kind):
        return value
    if isinstance(value, (list, tuple)) and all(callable(v) for v in value):
        return kind(value)
    raise InvalidInputError(f"{name} must be a {kind.__name__} (or a list of callables), got {type(value).__name__}")


def _check_capabilities(config: GenerationConfig) -> None:
    """What HF's generate does but the compiled decode step cannot, refused by name."""
    if config.num_beams not in (None, 1):
        raise InvalidInputError(
            f"num_beams={config.num_beams}: aotpack decodes greedily or by sampling (no beam search); set num_beams=1"
        )
    for name in ("output_attentions", "output_hidden_states"):
        if getattr(config, name, False):
            raise InvalidInputError(f"{name}=True: the compiled decode step returns logits only; leave it False")
    if config.use_cache is False:
        raise InvalidInputError("use_cache=False: aotpack always decodes from its KV cache; leave use_cache on")


def new_token_budget(config: GenerationConfig, seq: int, text_config, length_set: bool) -> int:
    """HF generate's length rule: `max_new_tokens` wins; else `max_length` counts the prompt, when the
    bundle's generation config or the call sets it; else HF's default length (config.max_length, 20)
    is counted after the prompt, capped by the model's position limit."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    if length_set:
        if config.max_length <= seq:
            raise InvalidInputError(
                f"max_length={config.max_length} counts the prompt, which already has {seq} tokens; "
                "raise max_length or pass max_new_tokens"
            )
        return config.max_length - seq
    total = seq + config.max_length
    limit = getattr(text_config, "max_position_embeddings", None)
    return (min(total, limit) if limit else total) - seq


def _inferred_mask(model, config: GenerationConfig, input_ids, pad: int) -> torch.Tensor:
    """As `generate` does without an attention_mask: tokens equal to the pad id are padding (when it is
    no eos id). A row that would end in padding is refused here, by what it holds."""
    mask = compat.inferred_attention_mask(model, config, input_ids)  # (B, S)
    if (mask[:, -1] == 0).any():
        row = int((mask[:, -1] == 0).nonzero()[0])
        raise InvalidInputError(
            f"row {row} of input_ids ends in the pad token id {pad}, and without an attention_mask generate takes "
            "pad tokens for padding (as HF does), which leaves the row right-padded; pass attention_mask "
            "explicitly (ones where the tokens are real)"
        )
    return mask


def _check_mask(input_ids, attention_mask) -> torch.Tensor:
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(getattr(attention_mask, "shape", ()))
        raise InvalidInputError(
            f"attention_mask has shape {shape}, input_ids has {tuple(input_ids.shape)}; they must match"
        )
    if attention_mask.device != input_ids.device:
        raise InvalidInputError(f"attention_mask is on {attention_mask.device}, input_ids on {input_ids.device}")
    if (
        attention_mask.is_floating_point()
        or attention_mask.is_complex()
        or not ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        raise InvalidInputError("attention_mask must hold only 0 and 1 (integer or bool)")
    if (attention_mask[:, -1] == 0).any():
        raise InvalidInputError(
            "the batch is right-padded; decoding needs left padding (tokenizer.padding_side = 'left')"
        )
    if (attention_mask.sum(-1) == 0).any():
        raise InvalidInputError("a row of the batch has no real token (attention_mask all 0); remove it")
    return attention_mask.long()


def _check_options(config: GenerationConfig, seq: int, max_cache_len: int) -> None:
    new = config.max_new_tokens
    if not isinstance(new, int) or isinstance(new, bool) or new < 1:
        raise InvalidInputError(f"max_new_tokens must be a positive integer, got {new!r}")
    if seq + new > max_cache_len:
        raise CacheOverflowError(
            f"prompt of {seq} tokens plus max_new_tokens={new} needs {seq + new} cache slots, but the bundle's "
            f"max_cache_len is {max_cache_len}; shorten the request or re-export with --max-cache-len {seq + new}"
        )
    if config.do_sample and (config.temperature is not None and config.temperature <= 0):
        raise InvalidInputError(
            f"temperature={config.temperature} with do_sample=True; use a temperature > 0, or do_sample=False"
        )


def check_images(model_config, input_ids: torch.Tensor, model_inputs: dict) -> None:
    """Images must fill exactly the prompt's image slots; checked before the vision tower runs."""
    pixels = model_inputs.get("pixel_values")
    token_id = image_token_id(model_config)
    per_image = getattr(model_config, "mm_tokens_per_image", None)
    if token_id is None or per_image is None:
        return
    if pixels is not None:
        _check_pixels(model_config, pixels)
    slots = int((input_ids == token_id).sum()) // per_image
    images = 0 if pixels is None else pixels.shape[0]
    if images != slots:
        raise ImageInputError(
            f"{images} image(s) given but the prompt has {slots} image slot(s); put one image item per image in the "
            "chat messages and build inputs with processor.apply_chat_template(..., return_dict=True)"
        )
    types = model_inputs.get("token_type_ids")
    if types is not None and tuple(types.shape) != tuple(input_ids.shape):
        raise ImageInputError(f"token_type_ids has shape {tuple(types.shape)}, input_ids has {tuple(input_ids.shape)}")


def _check_pixels(model_config, pixels) -> None:
    """A float (images, channels, size, size) tensor of finite values: one NaN would reach the cache and,
    masked or not, turn attention into NaN."""
    vision = getattr(model_config, "vision_config", None)
    size, channels = getattr(vision, "image_size", None), getattr(vision, "num_channels", 3)
    if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
        kind = pixels.dtype if isinstance(pixels, torch.Tensor) else type(pixels).__name__
        raise ImageInputError(f"pixel_values must be a float tensor from the bundle's processor, got {kind}")
    if pixels.dim() != 4 or pixels.shape[1] != channels or (size and tuple(pixels.shape[2:]) != (size, size)):
        expected = f"(images, {channels}, {size}, {size})"
        raise ImageInputError(f"pixel_values has shape {tuple(pixels.shape)}, the vision tower takes {expected}")
    if not torch.isfinite(pixels).all():
        raise ImageInputError("pixel_values holds NaN or infinite values; pass images through the bundle's processor")
