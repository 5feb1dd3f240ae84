"""The decode backends, by name: what runs the single-token step between the engine's prefills.

Owns the registry. Each backend is a module with a `BACKEND` (runtime.backends.base.Backend) that
declares the bundle files it reads, checks that this process can run it, and opens the step over the
eager model's weights. The registry itself is torch-free (names, one-line summaries, the load options a
backend takes), so the CLI lists and checks backends without importing torch; a backend's module is
imported when it is first asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from runtime.errors import InvalidInputError


@dataclass(frozen=True)
class Entry:
    name: str
    module: str  # defines BACKEND
    summary: str  # for --help
    options: tuple[str, ...] = ()  # the backend-specific load options it takes (runtime.config.LoadConfig)


REGISTRY = (
    Entry(
        "aoti", "runtime.backends.aoti", "the compiled .so (decode.pt2); needs the torch build and CPU it was built for"
    ),
    Entry(
        "onnxruntime",
        "runtime.backends.onnxruntime",
        "the bundle's decode.onnx on ONNX Runtime (export --onnx); any torch, any CPU",
        options=("prepack",),
    ),
    Entry(
        "eager", "runtime.backends.eager", "the decode step run eagerly by torch: no compiled code (debugging, tests)"
    ),
)
DEFAULT = "aoti"


def names() -> tuple[str, ...]:
    return tuple(e.name for e in REGISTRY)


def entry(name) -> Entry:
    found = next((e for e in REGISTRY if e.name == name), None)
    if found is None:
        raise InvalidInputError(f"backend {name!r} is not one of {names()}")
    return found


def backend(name):
    """The backend called `name` (its module imported now)."""
    return importlib.import_module(entry(name).module).BACKEND
