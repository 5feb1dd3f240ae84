"""Built-in presets: random-weight checkpoints (config, weights, tokenizer, chat template) made offline.

Owns: the tiny models the demo and the tests use, and `gemma3-270m-arch` for benchmarks. Nothing is
downloaded: the tokenizer is a byte-level BPE trained here on an embedded text, and the weights are
drawn from a fixed seed, so a preset is the same checkpoint on every machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

from runtime.errors import ExportError

CORPUS = """
Why is the sky blue? Sunlight reaches the atmosphere and is scattered in all directions by the gases
and particles in the air. Blue light is scattered more than the other colours because it travels as
shorter, smaller waves. This is why we see a blue sky most of the time. At sunset the light passes
through more air, the blue is scattered away, and the sky turns red, orange and yellow.
You are a helpful assistant. Describe the image. What is in this picture? A cat is standing on the
snow next to a small wooden house. Two dogs run across a green field under a bright sun.
The quick brown fox jumps over the lazy dog. Compilers turn programs into machine code ahead of time,
so that nothing has to be compiled when the program starts. Models generate one token at a time.
""".strip()

LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen 2.5's and 3's layout, tools included (condensed from their template): the tools' JSON signatures
# in the system turn, a call as <tool_call>{"name": ..., "arguments": {...}}</tool_call> in the
# assistant's turn, and tool results as <tool_response> in a user turn. transformers' own response
# template for model_type qwen3 parses the calls back.
QWEN_TEMPLATE = (
    "{% set nl = '\\n' %}"  # HF renders with trim_blocks: a newline right after a tag is dropped
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}"
    "{{ nl }}\n# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ nl }}{{ tool | tojson }}{% endfor %}{{ nl }}</tools>\n\nFor each function call, "
    "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>{{ nl }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' or (m['role'] == 'assistant' and not m.get('tool_calls')) %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{{ nl }}"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant{% if m['content'] %}{{ nl }}{{ m['content'] }}{% endif %}"
    "{% for call in m['tool_calls'] %}{% set call = call['function'] if call['function'] is defined else call %}"
    '{{ nl }}<tool_call>\n{"name": "{{ call["name"] }}", "arguments": {{ call["arguments"] | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>{{ nl }}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ nl }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ nl }}{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)
# Gemma 3's layout: the system text opens the first user turn; content is a string or a list of
# {"type": "text"|"image"} items, and each image becomes the <start_of_image> placeholder.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.system = (m['content'] if m['content'] is string else m['content'][0]['text']) + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if loop.index0 <= 1 %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<start_of_image>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# family -> (special tokens, chat template, eos token, pad token, bos token)
TOKENIZERS = {
    "llama": (
        ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<pad>"],
        LLAMA_TEMPLATE,
        "<|eot_id|>",
        "<pad>",
        "<|begin_of_text|>",
    ),
    "chatml": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], CHATML_TEMPLATE, "<|im_end|>", "<|endoftext|>", None),
    "qwen": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN_TEMPLATE, "<|im_end|>", "<|endoftext|>", None),
    "gemma": (
        [
            "<pad>",
            "<bos>",
            "<eos>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ],
        GEMMA_TEMPLATE,
        "<end_of_turn>",
        "<pad>",
        "<bos>",
    ),
}


def build_tokenizer(family: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on CORPUS, with the family's special tokens and chat template."""
    specials, template, eos, pad, bos = TOKENIZERS[family]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([CORPUS], trainer=trainer)
    extra = {}
    if family == "gemma":
        extra["extra_special_tokens"] = {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        }
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=eos, pad_token=pad, bos_token=bos, padding_side="left", **extra
    )
    tok.chat_template = template
    return tok


def _text_kwargs(tok, **overrides) -> dict:
    """Shared tiny-decoder settings. Untied, wide-initialised weights keep greedy output varied,
    which is what makes a parity test meaningful (random tied models repeat one token)."""
    kwargs = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return kwargs | overrides


def _tiny_llama(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**_text_kwargs(tok)))


def _tiny_qwen3(tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**_text_kwargs(tok, head_dim=16)))


def _tiny_mistral(tok):
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**_text_kwargs(tok, sliding_window=8)))


def _tiny_gemma2(tok):
    """Gemma 2: logit soft-capping in attention and on the output, which SDPA cannot express, so it
    runs (and is exported) with eager attention; alternating sliding (window 8) and global layers."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        **_text_kwargs(
            tok,
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        )
    )
    return Gemma2ForCausalLM(config)


def _gemma3_text_config(tok, **overrides):
    from transformers import Gemma3TextConfig

    layer_types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    kwargs = _text_kwargs(
        tok,
        num_hidden_layers=6,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=layer_types,
        query_pre_attn_scalar=16,
    )
    return Gemma3TextConfig(**(kwargs | overrides))


def _tiny_gemma3(tok):
    from transformers import Gemma3ForCausalLM

    return Gemma3ForCausalLM(_gemma3_text_config(tok))


def _gemma3_270m_arch(tok):
    """The google/gemma-3-270m architecture (18 layers, 5 sliding : 1 global) with random weights."""
    from transformers import Gemma3ForCausalLM

    config = _gemma3_text_config(
        tok,
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        sliding_window=512,
        query_pre_attn_scalar=256,
        tie_word_embeddings=True,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        max_position_embeddings=32768,
        initializer_range=0.02,
    )
    return Gemma3ForCausalLM(config)


def _tiny_gemma3_vlm(tok):
    """Gemma3ForConditionalGeneration with a 1-layer SigLIP tower: 32x32 images, 8x8 patches (a 4x4
    grid) pooled to 4 soft tokens per image."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = Gemma3Config(
        text_config=_gemma3_text_config(tok).to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    return Gemma3ForConditionalGeneration(config)


def _gemma3_processor(tok):
    """Gemma3's processor on the PIL image backend: the default backend needs torchvision, which does
    not import beside this torch build."""
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    return Gemma3Processor(image_processor=images, tokenizer=tok, chat_template=GEMMA_TEMPLATE, image_seq_length=4)


PRESETS: dict[str, tuple[str, Callable]] = {
    "tiny-llama": ("llama", _tiny_llama),
    "tiny-qwen3": ("qwen", _tiny_qwen3),
    "tiny-mistral": ("chatml", _tiny_mistral),
    "tiny-gemma2": ("gemma", _tiny_gemma2),
    "tiny-gemma3": ("gemma", _tiny_gemma3),
    "tiny-gemma3-vlm": ("gemma", _tiny_gemma3_vlm),
    "gemma3-270m-arch": ("gemma", _gemma3_270m_arch),
}


def build_preset(name: str, dest: Path, seed: int = 0) -> Path:
    """Write preset `name` as an HF checkpoint directory at `dest`; returns `dest`."""
    if name not in PRESETS:
        raise ExportError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    family, make_model = PRESETS[name]
    tok = build_tokenizer(family, vocab_size=384)
    torch.manual_seed(seed)
    model = make_model(tok).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=False
    )
    dest = Path(dest)
    model.save_pretrained(dest)
    (_gemma3_processor(tok) if name == "tiny-gemma3-vlm" else tok).save_pretrained(dest)
    return dest
