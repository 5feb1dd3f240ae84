"""The `aotpack` command end to end: export (through the session bundles), run, inspect, verify, and
its errors, each raised before any expensive work."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from exporter.cli import main as aotpack


def test_run_streams_text_and_reports_timings(bundle, capsys):
    assert (
        aotpack(
            [
                "run",
                str(bundle("tiny-llama")),
                "--prompt",
                "Why is the sky blue?",
                "--system",
                "Be brief.",
                "--max-new-tokens",
                "12",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "prefill" in err and "ms/token" in err and "12 tokens" in err
    assert out.endswith("\n") and not err.startswith("\n")  # the reply ends its line; the timings are their own


def test_run_with_sampling_is_reproducible_with_a_seed(bundle, capsys):
    path = bundle("tiny-llama")
    capsys.readouterr()  # the export's own lines, when this test is the one that builds the bundle
    args = [
        "run",
        str(path),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "10",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--seed",
        "3",
    ]
    assert aotpack(args + ["--min-p", "0.05", "--repetition-penalty", "1.2"]) == 0
    first = capsys.readouterr().out
    assert aotpack(args + ["--min-p", "0.05", "--repetition-penalty", "1.2"]) == 0
    assert capsys.readouterr().out == first


def test_run_vlm_with_images(bundle, tmp_path, capsys):
    paths = []
    for i in range(2):
        path = tmp_path / f"img{i}.png"
        Image.fromarray((np.random.RandomState(i).rand(30, 40, 3) * 255).astype("uint8")).save(path)
        paths += ["--image", str(path)]
    assert (
        aotpack(["run", str(bundle("tiny-gemma3-vlm")), *paths, "--prompt", "Compare them", "--max-new-tokens", "6"])
        == 0
    )
    assert "6 tokens" in capsys.readouterr().err


def test_inspect_summarises_the_manifest(bundle, capsys):
    assert aotpack(["inspect", str(bundle("tiny-gemma3"))]) == 0
    out = capsys.readouterr().out
    assert "Gemma3ForCausalLM" in out and "sliding_attention (8 slots)" in out
    assert "KV memory" in out and "a full-length cache would need" in out
    assert "decode.pt2" in out and "parity" in out


def test_verify_accepts_a_good_bundle(bundle, capsys):
    assert aotpack(["verify", str(bundle("tiny-llama"))]) == 0
    assert "OK" in capsys.readouterr().out


def _error(capsys) -> str:
    return capsys.readouterr().err


def test_unknown_preset_or_missing_directory(tmp_path, capsys):
    assert aotpack(["export", "no-such-preset", "--out", str(tmp_path / "x")]) == 2
    assert "'no-such-preset' is neither a directory, a .gguf file, a preset" in _error(capsys)
    assert aotpack(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "y")]) == 2
    assert "does not exist" in _error(capsys)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_model_without_decode_cache_names_the_class(tmp_path, capsys):
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path / "vit"
    )
    assert aotpack(["export", str(tmp_path / "vit"), "--out", str(tmp_path / "out")]) == 2
    assert "ViTConfig" in _error(capsys)
    assert not (tmp_path / "out").exists()


def test_prompt_longer_than_cache_names_both_numbers(bundle, capsys):
    assert (
        aotpack(["run", str(bundle("tiny-llama")), "--prompt", "Why is the sky blue?", "--max-new-tokens", "500"]) == 2
    )
    err = _error(capsys)
    assert "max_new_tokens=500" in err and "max_cache_len is 160" in err


def test_bad_export_options_fail_before_loading(tmp_path, capsys):
    assert aotpack(["export", "tiny-llama", "--out", str(tmp_path / "b"), "--dtype", "int8"]) == 2
    assert "--dtype 'int8'" in _error(capsys)
    assert aotpack(["export", "tiny-llama", "--out", str(tmp_path / "b"), "--max-cache-len", "0"]) == 2
    assert "--max-cache-len" in _error(capsys)


def test_existing_bundle_needs_force(bundle, capsys):
    path = bundle("tiny-llama")
    before = json.loads((path / "manifest.json").read_text())
    assert aotpack(["export", "tiny-llama", "--out", str(path)]) == 2
    assert "--force" in _error(capsys)
    assert json.loads((path / "manifest.json").read_text()) == before


@pytest.mark.parametrize("content", [None, b"not an image at all"])
def test_bad_image_file(bundle, tmp_path, capsys, content):
    path = tmp_path / "img.png"
    if content is not None:
        path.write_bytes(content)
    assert aotpack(["run", str(bundle("tiny-gemma3-vlm")), "--image", str(path), "--prompt", "x"]) == 2
    err = _error(capsys)
    assert str(path) in err and ("does not exist" in err or "not a readable image" in err)


def test_image_for_text_bundle(bundle, tmp_path, capsys):
    path = tmp_path / "img.png"
    Image.new("RGB", (8, 8)).save(path)
    assert aotpack(["run", str(bundle("tiny-llama")), "--image", str(path), "--prompt", "x"]) == 2
    assert "text-only bundle" in _error(capsys)


def test_hub_id_resolves_from_the_local_cache_only(tmp_path, monkeypatch):
    """A hub id is looked up in the local HF cache; aotpack never downloads."""
    import huggingface_hub.constants

    from exporter.source import checkpoint_dir
    from runtime import ExportError

    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    with checkpoint_dir("acme/tiny") as path:
        assert path == snapshot
    with pytest.raises(ExportError, match="never downloads"), checkpoint_dir("acme/not-cached"):
        pass


@pytest.mark.parametrize("threads", ["0", "100000", "4096"])
def test_thread_counts_beyond_the_machine_are_refused(bundle, capsys, threads):
    """OpenMP segfaulted with 100,000 threads; anything above the CPU count is refused before loading."""
    if int(threads) <= (os.cpu_count() or 1) and threads != "0":
        pytest.skip("this machine has that many CPUs")
    args = ["run", str(bundle("tiny-llama")), "--prompt", "Hi", "--threads", threads]
    assert aotpack(args) == 2
    assert f"threads {threads} must be an integer from 1 to" in _error(capsys)


def test_closed_output_pipe_is_one_line_not_a_traceback(bundle):
    """`aotpack inspect BUNDLE | head -1`: the closed pipe ends the command with one line on stderr."""
    done = subprocess.run(
        f"{sys.executable} -m exporter.cli inspect {bundle('tiny-llama')} | head -1",
        shell=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "model" in done.stdout
    assert "Traceback" not in done.stderr


def test_help_and_version_do_not_import_torch():
    """`aotpack --help` and `--version` answer at once: torch and transformers load only for real work."""
    code = (
        "import sys\n"
        "from exporter.cli import main\n"
        "for argv in (['--help'], ['--version'], ['chat', '--help'], ['export', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('LOADED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout
    assert "aotpack 0." in done.stdout and "torch 2.13" in done.stdout  # --version
    assert "(default: 2048)" in done.stdout  # defaults shown in --help


def test_a_failed_export_leaves_no_empty_folders(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "bundle"
    assert aotpack(["export", "no-such-preset", "--out", str(out)]) == 2
    assert "hf download no-such-preset" in _error(capsys)  # a command the installed huggingface_hub has
    assert not (tmp_path / "new").exists()


@pytest.fixture
def sampling_bundle(bundle):
    """tiny-llama exported with generation defaults that sample (as instruction-tuned checkpoints ship,
    or as `--generation` sets them)."""
    return bundle("tiny-llama", "--gemv", "aten", "--generation", "do_sample=true", "--generation", "temperature=0.9")


def test_export_generation_defaults_are_the_bundles_and_inspect_shows_them(sampling_bundle, capsys):
    config = json.loads((sampling_bundle / "generation_config.json").read_text())
    assert (config["do_sample"], config["temperature"]) == (True, 0.9)
    assert aotpack(["inspect", str(sampling_bundle)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("generation "))
    assert line.startswith("generation   do_sample true, temperature 0.9, eos_token_id")  # and the checkpoint's own
    assert line.endswith("(generation_config.json; the caller's options override them)")


def test_run_honours_the_bundles_sampling_defaults_unless_greedy(sampling_bundle, capsys):
    base = ["run", str(sampling_bundle), "--prompt", "Hi", "--max-new-tokens", "8"]
    assert aotpack(base + ["--seed", "1"]) == 0
    err = capsys.readouterr().err
    assert "sampled]" in err and "load " in err and "tokens/s" in err
    assert aotpack(base + ["--greedy"]) == 0
    assert "greedy]" in capsys.readouterr().err
    assert aotpack(base + ["--greedy", "--top-k", "5"]) == 2
    assert "--greedy cannot be combined with --top-k" in _error(capsys)


def test_export_progress_times_each_stage_and_shows_elapsed_time_on_a_terminal():
    import io
    import time as clock

    from exporter.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    lines, screen = [], Tty()
    progress = Progress(lines.append, out=screen)
    with progress.stage("trace", "exporting"):
        pass
    with progress.stage("compile", "compiling with AOTInductor"):
        clock.sleep(1.2)  # long enough for the ticker to redraw the elapsed time
    assert lines == ["exporting", "compiling with AOTInductor"]
    assert list(progress.timings) == ["trace", "compile"] and progress.timings["compile"] >= 1.2
    assert re.fullmatch(r"trace 0\.\d s, compile 1\.\d s", progress.summary())
    assert "compile: 00:01" in screen.getvalue()
    quiet = Progress(lines.append, out=io.StringIO())
    with quiet.stage("load", "loading"):
        pass
    assert quiet.out.getvalue() == "", "no live display when the output is not a terminal"
