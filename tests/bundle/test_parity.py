"""Parity: the runtime's greedy output is token-identical to HF eager `generate`, logits within 1e-4.

Every text family the README claims, batched with left padding, and for sliding-window families far
past the window (tiny presets use a window of 8; 48 new tokens is 6 windows). Gemma 2 runs with eager
attention (soft-capping has no SDPA form), so it also covers the decode graph's additive float masks.
"""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import (
    GREEDY,
    SAMPLED,
    aot_generate,
    assert_each_matches_lone_generate,
    assert_parity,
    chat,
    staggered,
    submitter,
)

TEXT_FAMILIES = ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-mistral", "tiny-gemma2"]
CONVERSATIONS = [
    [{"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Describe the image."}],
]


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_chat_batch_left_padded_matches_hf(name, runtime, reference):
    rt = runtime(name)
    inputs = chat(rt.tokenizer, CONVERSATIONS)
    assert (inputs["attention_mask"] == 0).any(), "the batch must exercise left padding"
    assert_parity(rt, reference(name), inputs, new_tokens=48)


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_single_prompt_matches_hf(name, runtime, reference):
    rt = runtime(name)
    inputs = chat(rt.tokenizer, CONVERSATIONS[:1])
    assert_parity(rt, reference(name), inputs, new_tokens=40)


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-mistral", "tiny-gemma2"])
@pytest.mark.parametrize("prompt_len", [5, 8, 13])  # shorter than, equal to and longer than the window of 8
def test_sliding_window_prompts_around_the_window(name, prompt_len, runtime, reference):
    rt = runtime(name)
    window = next(layer.window for layer in rt.manifest.cache_layout if layer.window)
    assert window == 8
    ids = torch.arange(3, 3 + prompt_len)[None]  # (1, S)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    assert_parity(rt, reference(name), inputs, new_tokens=5 * window + 8)


def test_generate_stops_on_eos_like_hf(runtime, reference):
    """Without forcing, a row that hits eos is padded, and generation stops once every row finished."""
    rt, model = runtime("tiny-gemma3"), reference("tiny-gemma3")
    inputs = chat(rt.tokenizer, CONVERSATIONS)
    seq = inputs["input_ids"].shape[1]
    free = rt.generate(**inputs, max_new_tokens=8)
    eos = [int(free[0, seq + 2]), int(free[1, seq + 5])]  # each row meets one of these by step 6
    ref = model.generate(**inputs, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    ours = rt.generate(**inputs, max_new_tokens=30, eos_token_id=eos)
    assert torch.equal(ours, ref)
    assert ours.shape[1] <= seq + 6


@pytest.mark.parametrize("length", [{}, {"max_length": 7}], ids=["hf-default", "max_length"])
def test_length_without_max_new_tokens_follows_hf(length, runtime, reference):
    """No max_new_tokens: HF's default (20 tokens after the prompt) or a max_length counting the prompt.
    min_new_tokens pins the count so that an early eos cannot hide a wrong budget."""
    rt, model = runtime("tiny-llama"), reference("tiny-llama")
    inputs = chat(rt.tokenizer, CONVERSATIONS[:1])
    seq = inputs["input_ids"].shape[1]
    length = {"max_length": seq + length["max_length"]} if length else {}
    expected_new = length["max_length"] - seq if length else 20
    ref = model.generate(**inputs, do_sample=False, min_new_tokens=expected_new, **length)
    ours = rt.generate(**inputs, min_new_tokens=expected_new, **length)
    assert ref.shape[1] == seq + expected_new
    assert torch.equal(ours, ref)


def test_seeded_sampling_matches_hf(runtime, reference):
    """Sampling uses transformers' warpers and an explicit generator: same seed, same tokens as HF."""
    rt, model = runtime("tiny-llama"), reference("tiny-llama")
    inputs = chat(rt.tokenizer, CONVERSATIONS[:1])
    options = dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=24, min_new_tokens=24)
    torch.manual_seed(1234)
    ref = model.generate(**inputs, **options)
    ours = rt.generate(**inputs, generator=torch.Generator().manual_seed(1234), **options)
    assert torch.equal(ours, ref)
    again = rt.generate(**inputs, generator=torch.Generator().manual_seed(1234), **options)
    assert torch.equal(again, ours)


def test_smaller_batch_than_bundle(runtime, reference):
    """A bundle exported for batch 4 serves batch 1 through the same dynamic-batch .so."""
    rt = runtime("tiny-qwen3")
    assert rt.manifest.batch_size == 4
    ids, _ = aot_generate(rt, chat(rt.tokenizer, CONVERSATIONS[1:]), 16)
    assert ids.shape[0] == 1


def test_stream_yields_the_generated_text(runtime):
    rt = runtime("tiny-llama")
    inputs = chat(rt.tokenizer, CONVERSATIONS[:1])
    ids = rt.generate(**inputs, max_new_tokens=20, min_new_tokens=20)
    text = "".join(rt.stream(**inputs, max_new_tokens=20, min_new_tokens=20))
    expected = rt.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text == expected


def test_gemma2_is_exported_with_eager_attention(runtime):
    """Gemma 2 refuses SDPA (logit soft-capping); the export falls back to eager attention and records it."""
    assert runtime("tiny-gemma2").manifest.attn_implementation == "eager"
    assert runtime("tiny-llama").manifest.attn_implementation == "sdpa"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_concurrent_requests_each_match_a_lone_generate(name, runtime, reference):
    """Continuous batching through the compiled step: six requests with prompts of 4 to 40 tokens,
    greedy and seeded sampling, join one after another while the others decode (four rows, so two
    wait); each equals HF generate of that request alone. Gemma3's window is 8: all decode past it."""
    rt = runtime(name)
    torch.manual_seed(3)
    prompts = [{"input_ids": torch.randint(3, 300, (1, n))} for n in (9, 23, 4, 40, 15, 7)]
    plan = [(p, SAMPLED if i % 2 else GREEDY, 50 + i if i % 2 else None) for i, p in enumerate(prompts)]
    assert_each_matches_lone_generate(reference(name), plan, staggered(submitter(rt), plan))
    assert rt.engine.peak_running >= 2


def test_threads_sharing_one_runtime_each_get_their_own_answer(runtime):
    rt = runtime("tiny-gemma3")
    prompts = [torch.tensor([[5 + i, 9, 30 + i, 41, 7]]) for i in range(6)]
    expected = [rt.generate(p, max_new_tokens=20) for p in prompts]
    results = [None] * len(prompts)

    def work(i):
        results[i] = rt.generate(prompts[i], max_new_tokens=20)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert all(torch.equal(r, e) for r, e in zip(results, expected, strict=True))


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])
def test_the_compiled_step_over_any_span_equals_it_over_the_whole_cache(name, runtime):
    """The `.so` traced with a dynamic span: at spans of 1, inside and past the window of 8, and the
    whole cache, rows at different positions (rings that wrapped and that did not), the logits and the
    cache it writes are those of a step over every slot."""
    from runtime.model.positions import RowPositions

    rt = runtime(name)
    L, rows = rt.contract.max_cache_len, 4  # the bundle's one graph steps 4 rows
    for positions in ([0, 0, 0, 0], [2, 5, 4, 1], [7, 30, 12, 3], [L - 1, 40, 90, 9]):
        span = max(positions) + 1
        where = RowPositions(rows, L, "cpu")
        for i, fed in enumerate(positions):
            where.place(slice(i, i + 1), torch.ones(1, fed + 1, dtype=torch.long), fed)
        where.advance(torch.ones(rows, dtype=torch.bool))
        position, index, pad = where.inputs(rows)
        assert pad.shape[1] == span
        torch.manual_seed(span)
        kv = [torch.randn_like(t[:rows]) for t in rt.kv]
        whole_kv, span_kv = [t.clone() for t in kv], [t.clone() for t in kv]
        tokens = torch.tensor([[5], [9], [11], [13]])
        whole = rt.decode(tokens, position, index, where.pad_mask[:rows].contiguous(), whole_kv)
        narrow = rt.decode(tokens, position, index, pad, span_kv)
        torch.testing.assert_close(narrow, whole, atol=1e-4, rtol=1e-4)
        for a, b in zip(whole_kv, span_kv, strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_a_bound_step_is_the_checked_step_checked_once_and_its_span_each_call(runtime):
    """Decode.bind (what the engine steps through): the same logits and cache writes, bit for bit, as the
    step called with every input; what the caller's tensors are is checked at bind (the kv of another
    batch, a batch without a graph), and each call's pad mask and the cache positions the caller has
    written since, before native code runs. The step holds views of its own: reshaping the caller's
    tensor objects afterwards changes nothing it reads."""
    from runtime.errors import InvalidInputError
    from runtime.model.positions import RowPositions

    rt, rows = runtime("tiny-llama"), 4
    where = RowPositions(rows, rt.contract.max_cache_len, "cpu")
    for i, fed in enumerate([3, 9, 0, 5]):
        where.place(slice(i, i + 1), torch.ones(1, fed + 1, dtype=torch.long), fed)
    where.advance(torch.ones(rows, dtype=torch.bool))
    torch.manual_seed(0)
    kv = [torch.randn_like(t[:rows]) for t in rt.kv]
    tokens, position, index = torch.tensor([[5], [9], [11], [13]]), where.position, where.index
    bound_kv, called_kv = [t.clone() for t in kv], [t.clone() for t in kv]
    step = rt.decode.bind(tokens, position, index, bound_kv)
    assert torch.equal(step(where.mask(rows)), rt.decode(tokens, position, index, where.mask(rows), called_kv))
    assert all(torch.equal(a, b) for a, b in zip(bound_kv, called_kv, strict=True))
    with pytest.raises(InvalidInputError, match=r"layer 0 keys has shape \(2, .*needs \(4, "):
        rt.decode.bind(tokens, position, index, [t[:2] for t in kv])
    with pytest.raises(InvalidInputError, match="batch 3 has no compiled graph"):
        rt.decode.bind(tokens[:3], position[:3], index[:3], [t[:3] for t in kv])
    with pytest.raises(InvalidInputError, match="cache_position 9 is outside the attended span 0..8"):
        step(where.pad_mask[:, :9].contiguous())
    with pytest.raises(InvalidInputError, match="pad_mask has dtype torch.int64"):
        step(where.mask(rows).long())
    index[1] = rt.contract.max_cache_len  # written in place, as the engine writes it: read at the next call
    with pytest.raises(InvalidInputError, match=f"cache_position {rt.contract.max_cache_len} is outside"):
        step(torch.ones(rows, rt.contract.max_cache_len, dtype=torch.bool))
    index[1], kept = 10, bound_kv[0].clone()
    bound_kv[0].resize_(1)  # the caller's tensor object: the step's own view still has its shape
    step(where.mask(rows))
    assert bound_kv[0].untyped_storage().nbytes() >= kept.numel() * kept.element_size()
