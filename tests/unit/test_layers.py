"""The layers keep to their rules, checked on the code itself: the runtime never imports the exporter,
the bundle-format layer (and the CLI's argument parsing, the scheduler, the load config) never imports
torch, no module outside the two compat modules touches a private torch or transformers symbol, and
`inspect` and `verify` work where torch is not installed.

The static checks read every import statement (ast); the dynamic ones run Python with torch and
transformers made unimportable.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from exporter import compat as exporter_compat
from runtime import compat

ROOT = Path(__file__).parents[2]
SHIPPED = ("runtime", "exporter", "examples")  # tests may poke at internals; shipped code may not
COMPAT = {ROOT / "runtime" / "compat.py", ROOT / "exporter" / "compat.py"}
TORCH_FREE = [  # modules that must import (and run) without torch or transformers
    "runtime",
    "runtime.errors",
    "runtime.config",
    "runtime.cpu",
    "runtime.backends",
    "runtime.cli",
    "runtime.engine.scheduler",
    "runtime.engine.status",
    *sorted(f"runtime.format.{p.stem}" for p in (ROOT / "runtime" / "format").glob("*.py") if p.stem != "__init__"),
]
BLOCK = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(ROOT)!r})
"""


def _imports(path: Path) -> list[str]:
    """Every module an `import` or `from ... import` in the file names (relative imports resolved)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _files(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def test_the_runtime_never_imports_the_exporter():
    bad = [
        (str(p.relative_to(ROOT)), m) for p in _files("runtime") for m in _imports(p) if m.split(".")[0] == "exporter"
    ]
    assert not bad, bad


def test_the_format_layer_imports_nothing_but_itself_and_the_standard_library():
    allowed = ("runtime.format", "runtime.errors", "runtime.version", "model_signing")
    third_party = {"torch", "transformers", "numpy", "safetensors", "onnx", "onnxruntime", "tokenizers", "PIL"}
    bad = [
        (p.name, m)
        for p in _files("runtime/format")
        for m in _imports(p)
        if m.split(".")[0] in third_party or (m.startswith("runtime") and not m.startswith(allowed))
    ]
    assert not bad, bad


def test_torch_free_modules_import_without_torch():
    code = BLOCK + "".join(f"import {m}\n" for m in TORCH_FREE) + "assert 'torch' not in sys.modules\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def _private_names() -> set[str]:
    entries = compat.PRIVATE_SYMBOLS + exporter_compat.PRIVATE_SYMBOLS
    return {name for _, name, _ in entries if name.startswith("_")} | set(compat.SET_BY_TRANSFORMERS)


def _dotted_chains(source: str):
    """(line, chain) for every dotted name in the code, comments and strings left out: `a.b._c` ->
    ["a", "b", "_c"]."""
    chain, line, expect_name = [], 0, True
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and expect_name:
            chain, line = [*chain, tok.string], line or tok.start[0]
            expect_name = False
        elif tok.type == tokenize.OP and tok.string == "." and not expect_name:
            expect_name = True
        else:
            if len(chain) > 1:
                yield line, chain
            chain, line = ([tok.string], tok.start[0]) if tok.type == tokenize.NAME else ([], 0)
            expect_name = tok.type != tokenize.NAME


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")  # dunders (__version__) are public


def test_no_module_outside_the_compat_modules_touches_a_private_symbol():
    """`torch._x`, `transformers.…._x`, or any private attribute the compat modules list (`._attn_implementation`,
    `._eos_token_tensor`, ...) appears only in runtime/compat.py and exporter/compat.py."""
    private = _private_names()
    bad = []
    for path in [p for package in SHIPPED for p in _files(package) if p not in COMPAT]:
        for line, chain in _dotted_chains(path.read_text()):
            into_library = chain[0] in ("torch", "transformers") and any(_private(part) for part in chain[1:])
            if into_library or any(part in private for part in chain[1:]):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {'.'.join(chain)}")
    assert not bad, "\n".join(bad)


def test_the_private_symbol_check_finds_what_it_looks_for():
    """The checker itself: these are caught, comments and strings are not."""
    source = 'import torch\nx = torch._inductor.foo\ny = m.config._attn_implementation\n# torch._C\ns = "torch._C"\n'
    found = [".".join(c) for _, c in _dotted_chains(source)]
    assert "torch._inductor.foo" in found and "m.config._attn_implementation" in found
    assert "torch._C" not in found


@pytest.fixture
def fake_bundle(tmp_path) -> Path:
    """A bundle directory whose manifest and hashes are whole (its files hold no real model)."""
    from runtime.format.files import DECODE, MANIFEST, WEIGHTS, sha256
    from runtime.format.layout import FULL, LayerLayout
    from runtime.format.manifest import FORMAT_VERSION, DecodeGraph, Manifest, Parity

    for name in (DECODE, WEIGHTS, "config.json"):
        (tmp_path / name).write_bytes(name.encode())
    layer = LayerLayout(FULL, 16, None, 1, 8)
    manifest = Manifest(
        format_version=FORMAT_VERSION, aotpack_version="0", torch_version="2.13.0+cpu", transformers_version="5.24.0",
        python_version="3.11", model_class="LlamaForCausalLM", attn_implementation="sdpa", is_multimodal=False,
        device="cpu", cpu_isa=None, dtype="float32", batch_size=1, max_cache_len=16, vocab_size=32,
        cache_layout=(layer,), cache_bytes=(layer.nbytes(1, "float32"),), decode_inputs=("input_ids",),
        constants=(), weight_aliases={}, quantization=None,
        graphs=(DecodeGraph(1, (), Parity(1, 0.0, 1e-4, True), 1.0),), decode_attention=None, accuracy=None,
        files={p.name: sha256(p) for p in tmp_path.iterdir()}, build_seconds=1.0, built_at="now",
        parity=Parity(1, 0.0, 1e-4, True),
    )  # fmt: skip
    (tmp_path / MANIFEST).write_text(manifest.to_json())
    json.loads((tmp_path / MANIFEST).read_text())
    return tmp_path


def _without_torch(*argv: str) -> subprocess.CompletedProcess:
    code = BLOCK + f"from runtime.cli import main\nsys.exit(main({list(argv)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_inspect_and_verify_run_without_torch(fake_bundle):
    done = _without_torch("inspect", str(fake_bundle))
    assert done.returncode == 0 and "LlamaForCausalLM" in done.stdout, done.stderr[-2000:]
    done = _without_torch("verify", str(fake_bundle))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 files verified" in done.stdout and "not checked: torch is not installed" in done.stdout
    (fake_bundle / "config.json").write_text("{}")  # the hashes are still checked
    done = _without_torch("verify", str(fake_bundle))
    assert done.returncode == 2 and "config.json" in done.stderr
