"""Shared fixtures: tiny preset checkpoints and their bundles, built once per test session
(each fixture is a `functools.cache`d function of the preset name).

An AOTInductor compile costs 20-60 s on 2 cores, so every bundle is exported once (through the CLI,
which the tests thereby cover) and shared. Nothing is downloaded: presets are built locally.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from exporter.cli import main as aotpack  # noqa: E402
from exporter.presets import build_preset  # noqa: E402

MAX_CACHE_LEN = 160
BATCH = 4
DEFAULT_OPTIONS = ("--gemv", "aten", "--onnx")
# One decode graph per batch bucket costs one compile each: shared bundles have one graph for all 4
# rows unless a test asks for more (tests/bundle/test_buckets.py); the VLM's has two, so its image
# requests run through a batch-1 graph and a batch-4 one.
BUCKETS = {"tiny-gemma3-vlm": "1,4"}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> directory of the preset's HF checkpoint (built once)."""
    return functools.cache(lambda name: build_preset(name, tmp_path_factory.mktemp(f"ckpt-{name}")))


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, checkpoint):
    """bundle(name, *options) -> bundle directory exported by `aotpack export` (once per session and options).

    Without options the decode step keeps ATen's GEMV (`--gemv aten`): a fused-reduction decode graph
    takes about 2.5x longer to compile, so only the bundles that test those kernels pay for them. And it
    carries the ONNX decode too (`--onnx`, seconds beside the compile), which `onnx_runtime` loads.
    Unless the options say `--batch-buckets`, it has the graphs of BUCKETS (one for all rows by default)."""

    def export(name: str, *options: str):
        out = tmp_path_factory.mktemp(f"bundle-{name}") / "bundle"
        args = ["export", str(checkpoint(name)), "--out", str(out), "--max-cache-len", str(MAX_CACHE_LEN)]
        options = options or DEFAULT_OPTIONS
        if "--batch-buckets" not in options:
            options = (*options, "--batch-buckets", BUCKETS.get(name, str(BATCH)))
        assert aotpack(args + ["--batch-size", str(BATCH), *options]) == 0
        return out

    return functools.cache(export)


@pytest.fixture(scope="session")
def runtime(bundle):
    """runtime(name, *options) -> a loaded Runtime of bundle(name, *options), shared."""
    from runtime import load

    return functools.cache(lambda name, *options: load(bundle(name, *options)))


@pytest.fixture(scope="session")
def onnx_runtime(bundle):
    """onnx_runtime(name) -> bundle(name) loaded with the onnxruntime backend (its decode.onnx), shared."""
    from runtime import load

    return functools.cache(lambda name: load(bundle(name), backend="onnxruntime"))


@pytest.fixture(scope="session")
def eager_runtime(checkpoint):
    """eager_runtime(name, rows=4, cache=64, **load_options) -> a Runtime over the preset's checkpoint with
    the eager backend: the engine, validation and sessions exactly as a bundle runs them, around the
    very decode step the exporter traces, run by torch (no compile: seconds). Each call builds a new one."""
    from exporter.model import cache_layout, load_model
    from runtime.backends.eager import EagerDecode
    from runtime.config import LoadConfig
    from runtime.format.contract import DecodeContract
    from runtime.runtime import Runtime

    def build(name: str, rows: int = 4, cache: int = 64, **options):
        path = checkpoint(name)
        model, _ = load_model(path, "float32", "cpu")
        contract = DecodeContract(cache_layout(model, cache), rows, cache, "float32", "cpu")
        config = LoadConfig(backend="eager", **options)
        return Runtime(path, model, EagerDecode(model, contract), contract, config)

    return build


@pytest.fixture(scope="session")
def reference(checkpoint):
    """reference(name) -> the eager HF model loaded from the original checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    def load_reference(name: str):
        path = checkpoint(name)
        multimodal = getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None
        auto = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
        return auto.from_pretrained(path).eval()

    return functools.cache(load_reference)
