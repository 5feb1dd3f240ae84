"""Shared fixtures: tiny preset checkpoints and their bundles, built once per test session
(each fixture is a `functools.cache`d function of the preset name).

An AOTInductor compile costs 20-60 s on 2 cores, so every bundle is exported once (through the CLI,
which the tests thereby cover) and shared. Nothing is downloaded: presets are built locally.

The suite runs on two pytest-xdist workers (pyproject's addopts): a compile keeps one core busy, so two
compile side by side. A checkpoint or bundle is built once for the whole session, by whichever worker
asks first, under a file lock in the session's shared directory; the other worker waits for it and
reuses it. `AOTPACK_TEST_CACHE=DIR` keeps them across sessions (the developer's loop; CI leaves it unset).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from filelock import FileLock  # noqa: E402
from hypothesis import settings  # noqa: E402

from exporter.cli import main as aotpack  # noqa: E402
from exporter.presets import build_preset  # noqa: E402

# The default run is a gate (CI's), so its generated cases are the same every run: a property that fails
# fails for everyone, not on one draw in fifty. `HYPOTHESIS_PROFILE=explore` draws new cases each run,
# for a developer hunting bugs.
settings.register_profile("gate", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

MAX_CACHE_LEN = 160
BATCH = 4
DEFAULT_OPTIONS = ("--gemv", "aten", "--onnx")
# One decode graph per batch bucket costs one compile each: shared bundles have one graph for all 4
# rows unless a test asks for more (tests/bundle/test_buckets.py); the VLM's has two, so its image
# requests run through a batch-1 graph and a batch-4 one.
BUCKETS = {"tiny-gemma3-vlm": "1,4"}


# The files that take longest (each compiles bundles of its own, or runs the bench), started first so
# that neither xdist worker is left running one of them alone at the end. A scheduling hint: any order
# passes.
LONGEST_FIRST = (
    "slow/test_tools.py", "bundle/test_quant.py", "bundle/test_buckets.py", "bundle/test_cli.py",
    "serve/test_ray.py", "bundle/test_onnx.py", "bundle/test_faults.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    """The longest files first. pyproject's `--dist loadfile` keeps each file's tests on one worker: they
    share its bundles, which the other worker would wait for, and one Ray cluster runs at a time. (Not
    `loadgroup`: it marks groups by rewriting an item's private `_nodeid`, which pytest 9.2 no longer
    reads, so each file's tests were spread over both workers, one waiting on the other's compile.)"""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get("/".join(item.path.parts[-2:]), len(rank)))  # stable: files keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _session_root(tmp_path_factory) -> Path:
    """The directory every worker of this session shares (one worker's own base is inside it), or with
    $AOTPACK_TEST_CACHE, a folder there that outlives the session, one per version of the code that
    makes a bundle: a second run of the bundle tests compiles nothing until that code changes."""
    if cache := os.environ.get("AOTPACK_TEST_CACHE"):
        return Path(cache).expanduser() / _builder_version()
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _builder_version() -> str:
    """A hash of torch's version and every source file a bundle's bytes can depend on: the exporter and
    the runtime, less the HTTP server and the commands, which no export runs."""
    root = Path(__file__).resolve().parent.parent
    sources = sorted(p for d in ("exporter", "runtime") for p in (root / d).rglob("*.py"))
    sources += sorted((root / "exporter" / "csrc").iterdir())  # the kernels bundles carry
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sources:
        if path.relative_to(root).parts[1] not in ("serve", "cli"):
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def _built_once(root: Path, key: str, leaf: str, build) -> Path:
    """root/shared/key/leaf, built by build(path) the first time any worker asks; later callers wait on
    the lock and reuse it. A failed build is not marked done (and exports are all-or-nothing), so the
    next caller builds again."""
    out = root / "shared" / key / leaf
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out.parent / "lock"):
        if not (out.parent / "done").exists():
            build(out)
            (out.parent / "done").touch()
    return out


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> directory of the preset's HF checkpoint (built once)."""
    root = _session_root(tmp_path_factory)
    return functools.cache(
        lambda name: _built_once(root, f"ckpt-{name}", "checkpoint", lambda out: build_preset(name, out))
    )


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, checkpoint):
    """bundle(name, *options) -> bundle directory exported by `aotpack export` (once per session and options).

    Without options the decode step keeps ATen's GEMV (`--gemv aten`): a fused-reduction decode graph
    takes about 2.5x longer to compile, so only the bundles that test those kernels pay for them. And it
    carries the ONNX decode too (`--onnx`, seconds beside the compile), which `onnx_runtime` loads.
    Unless the options say `--batch-buckets`, it has the graphs of BUCKETS (one for all rows by default)."""

    root = _session_root(tmp_path_factory)

    def export(name: str, *options: str):
        options = options or DEFAULT_OPTIONS
        if "--batch-buckets" not in options:
            options = (*options, "--batch-buckets", BUCKETS.get(name, str(BATCH)))
        key = f"bundle-{name}-" + hashlib.sha256(" ".join(options).encode()).hexdigest()[:12]

        def build(out: Path):
            args = ["export", str(checkpoint(name)), "--out", str(out), "--max-cache-len", str(MAX_CACHE_LEN)]
            assert aotpack(args + ["--batch-size", str(BATCH), *options]) == 0

        return _built_once(root, key, "bundle", build)

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
    """eager_runtime(name, rows=4, cache=64, drafts=0, chunk=0, **load_options) -> a Runtime over the preset's
    checkpoint with the eager backend: the engine, validation and sessions exactly as a bundle runs them, around the
    very decode step the exporter traces, run by torch (no compile: seconds). Each call builds a new one."""
    from exporter.model import cache_layout, load_model
    from runtime.backends.eager import EagerDecode
    from runtime.config import LoadConfig
    from runtime.format.contract import DecodeContract
    from runtime.runtime import Runtime

    def build(name: str, rows: int = 4, cache: int = 64, drafts: int = 0, chunk: int = 0, **options):
        """`drafts`: k of speculative decoding (the eager step verifies any), its rings k slots wider;
        `chunk`: C of a chunk graph (the eager step without its head runs it), its rings C - 1 wider."""
        path = checkpoint(name)
        model, _ = load_model(path, "float32", "cpu")
        layout = cache_layout(model, cache, drafts, chunk)
        contract = DecodeContract(layout, rows, cache, "float32", "cpu", drafts, chunk)
        config = LoadConfig(backend="eager", **options)
        return Runtime(path, model, EagerDecode(model, contract), contract, config)

    return build


@pytest.fixture(scope="session")
def reference(checkpoint):
    """reference(name) -> the eager HF model loaded from the original checkpoint: one fp32 CPU model per
    name for the whole session, so a test that converts it must convert a copy (`.to` works in place).
    One that did not made the parity tests after it in the same worker fail by chance; now the next
    test to ask for it fails saying so."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    @functools.cache
    def load_reference(name: str):
        path = checkpoint(name)
        multimodal = getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None
        auto = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
        return auto.from_pretrained(path).eval()

    def shared(name: str):
        model = load_reference(name)
        first = next(model.parameters())
        assert first.dtype == torch.float32 and first.device.type == "cpu", (
            f"a test left the shared reference {name!r} in {first.dtype} on {first.device}: convert a copy"
        )
        return model

    return shared
