"""CUDA: the same export and runtime path on a GPU. Skipped (not failed) where no CUDA device exists;
see the README for whether it has been run."""

from __future__ import annotations

import pytest
from helpers import assert_parity, chat

from exporter.cli import main as aotpack
from runtime import load

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_cuda_bundle_matches_hf_on_cuda(name, checkpoint, reference, tmp_path):
    out = tmp_path / "cuda-bundle"
    assert (
        aotpack(["export", str(checkpoint(name)), "--out", str(out), "--device", "cuda", "--max-cache-len", "160"]) == 0
    )
    rt = load(out)
    assert rt.manifest.device == "cuda" and rt.manifest.cpu_isa is None
    model = reference(name).to("cuda")
    try:
        inputs = {
            k: v.to("cuda")
            for k, v in chat(rt.tokenizer, [[{"role": "user", "content": "Why is the sky blue?"}]]).items()
        }
        assert_parity(rt, model, inputs, new_tokens=40)
    finally:
        model.to("cpu")
