"""The seed case: Gemma3ForConditionalGeneration, image + text, token-identical to HF generate.

The runtime's prefill runs the full VLM eagerly (vision tower, image merge, token_type_ids and the
bidirectional image mask) and the compiled text-only decode continues. N = 30 new tokens is over 3x
the preset's sliding window of 8.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import (
    GREEDY,
    SAMPLED,
    assert_each_matches_lone_generate,
    assert_parity,
    chat,
    graphs_stepped,
    staggered,
    submitter,
)
from PIL import Image

from runtime import ImageInputError
from runtime.inputs import conversation, template_messages, user_message

VLM = "tiny-gemma3-vlm"
NEW_TOKENS = 30


def image(seed: int, size=(40, 50)) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(*size, 3) * 255).astype("uint8"))


SYSTEM = {"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]}
CASES = {
    # (a) the seed's exact messages: a system text and a user text, no image
    "text_only": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Why is the sky blue?"}]}],
    # (b) one image
    "one_image": [
        {
            "role": "user",
            "content": [{"type": "image", "image": image(1)}, {"type": "text", "text": "Describe the image."}],
        }
    ],
    # (c) two images in one turn
    "two_images": [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": image(2)},
                {"type": "image", "image": image(3, (64, 20))},
                {"type": "text", "text": "What is in this picture?"},
            ],
        }
    ],
    # (d) a second user turn after an image turn
    "second_turn": [
        {
            "role": "user",
            "content": [{"type": "image", "image": image(4)}, {"type": "text", "text": "Describe the image."}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "A cat is standing on the snow."}]},
        {"role": "user", "content": [{"type": "text", "text": "What colour is the sky?"}]},
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_vlm_matches_hf_generate(case, runtime, reference):
    rt = runtime(VLM)
    window = next(layer.window for layer in rt.manifest.cache_layout if layer.window)
    assert NEW_TOKENS >= 3 * window
    inputs = chat(rt, [CASES[case]])
    if case != "text_only":
        assert inputs["pixel_values"].shape[0] == (2 if case == "two_images" else 1)
    with graphs_stepped(rt) as stepped:
        assert_parity(rt, reference(VLM), inputs, NEW_TOKENS, logit_steps=8)
    assert set(stepped) == {1}  # the bundle's batch-1 graph


def test_vlm_batch_with_images_left_padded(runtime, reference):
    """Two rows step the bundle's batch-4 graph, beside two idle rows."""
    rt = runtime(VLM)
    assert rt.manifest.batches == (1, 4)
    inputs = chat(rt, [CASES["one_image"], CASES["second_turn"]])
    assert (inputs["attention_mask"] == 0).any()
    with graphs_stepped(rt) as stepped:
        assert_parity(rt, reference(VLM), inputs, NEW_TOKENS, logit_steps=8)
    assert set(stepped) == {4}


def test_concurrent_image_requests_each_match_a_lone_generate(runtime, reference):
    """Continuous batching with images: each request's eager prefill (vision tower included) writes only
    its own rows while the others decode; one request samples with its own seed."""
    rt = runtime(VLM)
    plan = [(chat(rt, [CASES[c]]), GREEDY, None) for c in ("one_image", "text_only", "two_images")]
    plan.append((chat(rt, [CASES["second_turn"]]), SAMPLED, 11))
    assert_each_matches_lone_generate(reference(VLM), plan, staggered(submitter(rt), plan))


def test_decode_holds_no_vision_weights_and_shares_the_rest(runtime):
    rt = runtime(VLM)
    paths = [c.module_path for c in rt.manifest.constants]
    assert not [p for p in paths if "vision" in p or "multi_modal_projector" in p]
    assert any(p.endswith("lm_head.weight") for p in paths)
    vision = [n for n, _ in rt.model.named_parameters() if "vision_tower" in n]
    assert vision, "the eager model (prefill) still has its vision tower"
    # The compiled decode was handed the eager tensors themselves: one copy of every weight.
    from runtime.backends.checks import lend_constants

    lent = lend_constants(rt.model, rt.manifest.constants, rt.manifest.device)
    params = {p.data_ptr() for p in rt.model.parameters()}
    buffers = {b.data_ptr() for b in rt.model.buffers()}  # e.g. rotary inv_freq, when it is a constant
    assert all(t.data_ptr() in params | buffers for t in lent.values())


def test_processor_is_the_bundles(runtime):
    rt = runtime(VLM)
    assert type(rt.processor).__name__ == "Gemma3Processor"
    assert type(rt.processor.image_processor).__name__ == "Gemma3ImageProcessorPil"
    assert rt.processor.chat_template


def test_more_images_than_slots_is_refused(runtime):
    rt = runtime(VLM)
    inputs = chat(rt, [CASES["one_image"]])
    two = torch.cat([inputs["pixel_values"]] * 2)
    with pytest.raises(ImageInputError, match="2 image\\(s\\) given but the prompt has 1 image slot"):
        rt.generate(**(inputs | {"pixel_values": two}), max_new_tokens=4)


def test_images_for_a_text_bundle_are_refused(runtime):
    rt = runtime("tiny-llama")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ImageInputError, match="text-only bundle"):
        rt.generate(input_ids=ids, pixel_values=torch.zeros(1, 3, 32, 32), max_new_tokens=2)


def test_cli_messages_match_the_seed_layout():
    msgs = template_messages(conversation("sys", [user_message("hi", ["IMG"])]), multimodal=True)
    assert msgs[0] == {"role": "system", "content": [{"type": "text", "text": "sys"}]}
    assert msgs[1]["content"] == [{"type": "image", "image": "IMG"}, {"type": "text", "text": "hi"}]
