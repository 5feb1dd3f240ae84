"""`aotpack cache`: the float32 checkpoints dequantized from GGUF files, listed with their sizes and
removed with --clear (each is a full float32 copy: 517 MiB for SmolLM2-135M)."""

from __future__ import annotations

from exporter.cli import main as aotpack


def test_cache_lists_the_dequantized_checkpoints_and_clear_removes_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AOTPACK_CACHE", str(tmp_path))
    kept = tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f"
    kept.mkdir(parents=True)
    (kept / "model.safetensors").write_bytes(b"\0" * 3 * 2**20)
    assert aotpack(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"3 MiB  {kept}" in out and "1 dequantized checkpoint(s), 3 MiB, in" in out and kept.is_dir()
    assert aotpack(["cache", "--clear"]) == 0
    assert "1 dequantized checkpoint(s), 3 MiB, removed" in capsys.readouterr().out and not kept.exists()
    assert aotpack(["cache"]) == 0
    assert "0 dequantized checkpoint(s)" in capsys.readouterr().out
