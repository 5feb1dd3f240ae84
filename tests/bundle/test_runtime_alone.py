"""The runtime without the exporter: a service that ships only `runtime/` loads, generates and checks
bundles (the import rules themselves are tests/unit/test_layers.py's)."""

from __future__ import annotations

import subprocess
import sys


def test_runtime_never_imports_the_exporter(bundle):
    """Importing every runtime module, loading a bundle and generating leave `exporter` unimported."""
    code = (
        "import sys, pkgutil, importlib, torch, runtime\n"
        "for m in pkgutil.iter_modules(runtime.__path__):\n"
        "    if m.name != '__main__': importlib.import_module(f'runtime.{m.name}')\n"
        f"rt = runtime.load({str(bundle('tiny-llama'))!r})\n"
        "rt.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2)\n"
        "bad = sorted(m for m in sys.modules if m == 'exporter' or m.startswith('exporter.'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_runtime_commands_work_without_the_exporter(bundle):
    """`python -m runtime verify|inspect` with the exporter package made unimportable."""
    path = str(bundle("tiny-llama"))
    for command in ("verify", "inspect"):
        code = (
            "import sys; sys.modules['exporter'] = None\n"
            f"from runtime.cli import main; sys.exit(main([{command!r}, {path!r}]))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("OK" if command == "verify" else "LlamaForCausalLM") in done.stdout
