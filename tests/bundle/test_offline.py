"""A bundle is self-contained: it loads and generates with no network and no original checkpoint."""

from __future__ import annotations

import socket

import pytest
import torch
from helpers import chat

from runtime import load


def _no_network(*args, **kwargs):
    raise OSError("network access attempted in an offline test")


def test_bundle_runs_offline_without_its_checkpoint(bundle, checkpoint, reference, tmp_path, monkeypatch):
    name = "tiny-qwen3"
    path = bundle(name)
    model = reference(name)
    tokenizer = load(path).tokenizer
    inputs = chat(tokenizer, [[{"role": "user", "content": "Why is the sky blue?"}]])
    expected = model.generate(**inputs, max_new_tokens=20, min_new_tokens=20, do_sample=False)

    source = checkpoint(name)
    hidden = source.with_name(source.name + "-hidden")
    source.rename(hidden)  # the original checkpoint directory is gone
    try:
        monkeypatch.setattr(socket.socket, "connect", _no_network)
        monkeypatch.setattr(socket, "getaddrinfo", _no_network)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))  # no hub cache either
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline by construction, not by flag
        rt = load(path)
        out = rt.generate(**inputs, max_new_tokens=20, min_new_tokens=20)
        assert "tokenizer" not in vars(rt)  # token ids in, ids out: the tokenizer was never parsed
        text = rt.tokenizer.decode(out[0])  # loaded on first use, offline too
    finally:
        hidden.rename(source)
    assert torch.equal(out, expected)
    assert text == tokenizer.decode(expected[0])


def test_network_guard_is_real():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        with pytest.raises(OSError, match="network access attempted"):
            socket.socket().connect(("127.0.0.1", 9))
