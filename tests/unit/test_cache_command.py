"""`aotpack cache`: the float32 checkpoints dequantized from GGUF files (each a full float32 copy: 517 MiB
for SmolLM2-135M) and the integer kernels built (exporter.kernels), listed with their sizes and removed
with --clear."""

from __future__ import annotations

from exporter.cli import main as aotpack


def test_cache_lists_what_it_keeps_and_clear_removes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AOTPACK_CACHE", str(tmp_path))
    kept = tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f"
    kept.mkdir(parents=True)
    (kept / "model.safetensors").write_bytes(b"\0" * 3 * 2**20)
    built = tmp_path / "kernels" / "0123456789abcdef"
    built.mkdir(parents=True)
    (built / "libaotpack-kernels-0123456789abcdef.so").write_bytes(b"\0" * 2**19)
    assert aotpack(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"3.0 MiB  {kept}" in out and "1 dequantized checkpoint(s), 3.0 MiB, in" in out and kept.is_dir()
    assert f"0.5 MiB  {built}" in out and "1 integer kernel build(s), 0.5 MiB, in" in out
    assert aotpack(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert (
        "1 dequantized checkpoint(s), 3.0 MiB, removed" in out and "1 integer kernel build(s), 0.5 MiB, removed" in out
    )
    assert not kept.exists() and not built.exists()
    assert aotpack(["cache"]) == 0
    assert "0 dequantized checkpoint(s)" in capsys.readouterr().out
