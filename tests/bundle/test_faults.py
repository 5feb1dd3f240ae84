"""Fault injection: a bundle either runs correctly or is refused with a specific error, and the
process survives. Every case asserts the exception type and its message."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import rewrite_manifest

from runtime import (
    BundleError,
    CacheOverflowError,
    IncompatibleBundleError,
    IntegrityError,
    InvalidInputError,
    ManifestError,
    load,
)
from runtime.format.files import MANIFEST
from runtime.format.manifest import SUPPORTED_VERSIONS, _digest
from runtime.format.reader import open_bundle

BASE = "tiny-llama"
READS = ", ".join(map(str, sorted(SUPPORTED_VERSIONS)))  # as the refusal lists the versions it reads


@pytest.fixture
def copy(bundle, tmp_path):
    """A private copy of the tiny-llama bundle to damage."""
    dest = tmp_path / "bundle"
    shutil.copytree(bundle(BASE), dest)
    return dest


def _files(bundle) -> list[str]:
    return sorted(json.loads((bundle(BASE) / MANIFEST).read_text())["files"]) + [MANIFEST]


@pytest.mark.parametrize("index", range(9))
def test_one_flipped_byte_in_each_file(bundle, copy, index):
    names = _files(bundle)
    if index >= len(names):
        pytest.skip("fewer files")
    path = copy / names[index]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    error = ManifestError if names[index] == MANIFEST else IntegrityError
    with pytest.raises(error, match="altered or corrupted|digest|not valid JSON"):
        open_bundle(copy)


def test_bundle_has_the_files_the_cases_cover(bundle):
    assert len(_files(bundle)) <= 9


@pytest.mark.parametrize("index", range(9))
def test_each_file_deleted(bundle, copy, index):
    names = _files(bundle)
    if index >= len(names):
        pytest.skip("fewer files")
    (copy / names[index]).unlink()
    with pytest.raises(BundleError, match="missing"):
        load(copy)


def test_truncated_pt2(copy):
    path = copy / "decode.pt2"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(IntegrityError, match="'decode.pt2' has sha256"):
        load(copy)


def test_unknown_format_version_names_both(copy):
    rewrite_manifest(copy, format_version=99)
    with pytest.raises(ManifestError, match=rf"format_version 99 .* reads \[{READS}\]"):
        load(copy)


def test_a_format_2_bundle_is_refused_with_re_export(copy):
    """Format 2's decode step took one cache position for the whole batch: it cannot serve independent rows."""
    rewrite_manifest(copy, format_version=2)
    with pytest.raises(ManifestError, match=rf"format_version 2 .* reads \[{READS}\]; re-export"):
        load(copy)


@pytest.mark.parametrize("version", [3, 4])
def test_a_format_3_or_4_bundle_is_refused_with_re_export(copy, version):
    """Their decode step attends to the whole cache every step (a pad mask as wide as the cache); format
    5's takes the span in use, so the runtime cannot drive an older `.so` and says why."""
    raw = json.loads((copy / MANIFEST).read_text())
    del raw["digest"]
    raw["format_version"] = version
    (copy / MANIFEST).write_text(json.dumps(raw | {"digest": _digest(raw)}))
    with pytest.raises(ManifestError, match=rf"format_version {version} \(its decode attends to the whole cache"):
        load(copy)


def test_wrong_hash(copy):
    raw = json.loads((copy / MANIFEST).read_text())
    rewrite_manifest(copy, files=raw["files"] | {"config.json": "0" * 64})
    with pytest.raises(IntegrityError, match="'config.json' has sha256 .* manifest says 0000"):
        load(copy)


@pytest.mark.parametrize("name", ["../outside.json", "/etc/passwd", "sub/../config.json", ".."])
def test_path_escaping_the_bundle(copy, name):
    raw = json.loads((copy / MANIFEST).read_text())
    rewrite_manifest(copy, files=raw["files"] | {name: "0" * 64})
    with pytest.raises(IntegrityError, match="not a plain file name inside the bundle"):
        load(copy)


def test_symlink_out_of_the_bundle(copy, tmp_path):
    outside = tmp_path / "elsewhere.json"
    shutil.copy(copy / "config.json", outside)
    (copy / "config.json").unlink()
    (copy / "config.json").symlink_to(outside)
    with pytest.raises(IntegrityError, match="'config.json' is a symlink"):
        load(copy)


def test_unlisted_executable_content(copy):
    (copy / "extra.so").write_bytes(b"\x7fELF")
    with pytest.raises(IntegrityError, match="'extra.so' .* is not listed in the manifest"):
        load(copy)


def test_other_torch_version(copy):
    rewrite_manifest(copy, torch_version="2.99.0+cu999")
    with pytest.raises(IncompatibleBundleError, match=r"torch 2\.99\.0\+cu999, this process has torch 2\.13\.0"):
        load(copy)


def test_cpu_lacking_the_isa(copy, monkeypatch):
    """An AVX2-only CPU is handed a bundle compiled for AVX-512 (the manifest says what the .so needs)."""
    import runtime.cpu

    rewrite_manifest(copy, cpu_isa="AVX512 AVX512_VNNI")
    monkeypatch.setattr(runtime.cpu, "cpu_flags", lambda: {"avx", "avx2", "fma", "sse4_2"})
    with pytest.raises(IncompatibleBundleError, match=r"lacks 'avx512' .*avx512bw.*--cpu-isa avx2"):
        load(copy)


def test_unknown_isa_is_refused(copy):
    rewrite_manifest(copy, cpu_isa="AVX10_2")
    with pytest.raises(IncompatibleBundleError, match="CPU ISA 'avx10_2', which aotpack cannot check"):
        load(copy)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this case needs a machine without CUDA")
def test_cuda_bundle_without_cuda(copy):
    rewrite_manifest(copy, device="cuda", cpu_isa=None)
    with pytest.raises(IncompatibleBundleError, match="compiled for device 'cuda' but no CUDA device"):
        load(copy)


def test_inconsistent_manifest_is_refused(copy):
    rewrite_manifest(copy, cache_bytes=[1])
    with pytest.raises(ManifestError, match="cache_layout and cache_bytes"):
        load(copy)


# ---- invalid inputs: each refused before any call into compiled code -----------------------------


@pytest.fixture(scope="module")
def rt(runtime):
    return runtime(BASE)


IDS = torch.tensor([[5, 6, 7, 8]])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), InvalidInputError, "the prompt is empty"),
        (dict(input_ids=torch.tensor([[5, 99999]])), InvalidInputError, "token id 99999 is outside the vocabulary"),
        (dict(input_ids=torch.tensor([[-1, 5]])), InvalidInputError, "token id -1 is outside the vocabulary"),
        (dict(input_ids=IDS.repeat(5, 1)), InvalidInputError, "batch size 5 is larger than this bundle's 4"),
        (
            dict(input_ids=IDS, max_new_tokens=157),
            CacheOverflowError,
            "4 tokens plus max_new_tokens=157 .* max_cache_len is 160",
        ),
        (dict(input_ids=IDS.int()), InvalidInputError, "dtype torch.int32; token ids must be torch.long"),
        (dict(input_ids=IDS.to("meta")), InvalidInputError, "is on meta, the bundle runs on cpu"),
        (dict(input_ids=IDS, attention_mask=torch.ones(1, 3)), InvalidInputError, "attention_mask has shape"),
        (dict(input_ids=IDS, attention_mask=torch.tensor([[1, 1, 1, 0]])), InvalidInputError, "right-padded"),
        (dict(input_ids=IDS, attention_mask=torch.tensor([[0, 2, 1, 1]])), InvalidInputError, "only 0 and 1"),
        (dict(input_ids=IDS, attention_mask=torch.ones(1, 4)), InvalidInputError, "only 0 and 1 \\(integer or bool\\)"),
        (dict(input_ids=IDS, max_new_tokens=0), InvalidInputError, "max_new_tokens must be a positive integer, got 0"),
        (
            dict(input_ids=IDS, max_new_tokens=-3),
            InvalidInputError,
            "max_new_tokens must be a positive integer, got -3",
        ),
        (
            dict(input_ids=IDS, max_new_tokens=None, max_length=4),
            InvalidInputError,
            "max_length=4 counts the prompt, which already has 4",
        ),
        (
            dict(input_ids=IDS, max_new_tokens=None, max_length="8"),
            InvalidInputError,
            "max_length must be a positive integer, got '8'",
        ),
        (
            dict(input_ids=IDS, max_new_tokens=None, max_length=200),
            CacheOverflowError,
            "plus max_new_tokens=196 needs 200 cache slots",
        ),
        (
            dict(input_ids=IDS, do_sample=True, temperature=0.0),
            InvalidInputError,
            "temperature=0.0 with do_sample=True",
        ),
        (
            dict(input_ids=IDS, do_sample=True, temperature=-1.0),
            InvalidInputError,
            "temperature=-1.0 with do_sample=True",
        ),
        (dict(input_ids=IDS, num_beams=4), InvalidInputError, "num_beams=4: aotpack decodes greedily or by sampling"),
        (dict(input_ids=IDS[0]), InvalidInputError, "input_ids must be a 2D"),
    ],
)
def test_invalid_generate_inputs(rt, kwargs, error, message):
    kwargs.setdefault("max_new_tokens", 4)
    with pytest.raises(error, match=message):
        rt.generate(**kwargs)
    assert rt.generate(input_ids=IDS, max_new_tokens=2).shape == (1, 6)  # the runtime still works


def test_bool_attention_mask_is_accepted(rt):
    mask = torch.tensor([[False, True, True, True]])
    expected = rt.generate(input_ids=IDS, attention_mask=mask.long(), max_new_tokens=6)
    assert torch.equal(rt.generate(input_ids=IDS, attention_mask=mask, max_new_tokens=6), expected)


def test_non_contiguous_prompt_is_copied_not_misread(rt):
    wide = torch.tensor([[5, 0, 6, 0, 7, 0, 8, 0]])[:, ::2]
    assert not wide.is_contiguous()
    assert torch.equal(rt.generate(input_ids=wide, max_new_tokens=6), rt.generate(input_ids=IDS, max_new_tokens=6))


@pytest.mark.parametrize("fault", ["non_contiguous", "dtype", "shape", "position"])
def test_compiled_decode_validates_its_inputs(rt, fault):
    b = rt.manifest.batches[0]  # a batch the bundle has a graph for
    kv = [t[:b] for t in rt.kv]
    L = rt.manifest.max_cache_len
    args = dict(
        input_ids=torch.full((b, 1), 5),
        position_ids=torch.full((b, 1), 3),
        cache_position=torch.full((b,), 3),
        pad_mask=torch.ones(b, L, dtype=torch.bool),
    )
    if fault == "non_contiguous":
        args["pad_mask"] = torch.ones(b, 2 * L, dtype=torch.bool)[:, ::2]
        message = "pad_mask is not contiguous"
    elif fault == "dtype":
        args["position_ids"] = args["position_ids"].int()
        message = "position_ids has dtype torch.int32"
    elif fault == "shape":
        kv = [kv[0][:, :, :-1]] + kv[1:]
        message = "layer 0 keys has shape"
    else:
        args["cache_position"] = torch.full((b,), L)
        message = f"cache_position {L} is outside"
    with pytest.raises(InvalidInputError, match=message):
        rt.decode(**args, kv=kv)


# ---- concurrency ---------------------------------------------------------------------------------


def test_two_runtimes_in_two_threads(bundle, rt):
    prompts = [IDS, torch.tensor([[9, 10, 11, 12, 13, 14]])]
    expected = [rt.generate(input_ids=p, max_new_tokens=24) for p in prompts]
    runtimes = [load(bundle(BASE)), load(bundle(BASE))]
    results = [None, None]

    def work(i):
        for _ in range(3):
            results[i] = runtimes[i].generate(input_ids=prompts[i], max_new_tokens=24)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all(torch.equal(r, e) for r, e in zip(results, expected, strict=True))


def test_one_runtime_shared_by_threads_is_serialised(rt):
    prompts = [IDS, torch.tensor([[9, 10, 11, 12, 13, 14]])]
    expected = [rt.generate(input_ids=p, max_new_tokens=24) for p in prompts]
    results = {}

    def work(i):
        results[i] = [rt.generate(input_ids=prompts[i], max_new_tokens=24) for _ in range(3)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all(torch.equal(r, expected[i]) for i in range(2) for r in results[i])


def test_a_second_generation_in_the_same_thread_runs_beside_the_first(rt):
    """It used to be refused (one cache, one lock); now both are requests of the same engine."""
    expected = rt.generate(input_ids=IDS, max_new_tokens=8)
    first = rt.iter_tokens(input_ids=IDS, max_new_tokens=8)
    head = next(first)
    second = rt.generate(input_ids=IDS, max_new_tokens=8)
    assert torch.equal(second, expected)
    assert torch.equal(torch.cat([IDS, torch.stack([head, *first], 1)], 1), expected)


# ---- atomic export ---------------------------------------------------------------------------------


def _interrupt_export(out: Path, extra: list[str], sig, scratch: Path) -> int:
    """Start `aotpack export` in a subprocess and signal it as soon as it starts compiling. A fresh
    Inductor cache makes the compile real (tens of seconds), so the signal lands inside it."""
    cmd = [
        sys.executable,
        "-m",
        "exporter.cli",
        "export",
        "tiny-llama",
        "--out",
        str(out),
        "--max-cache-len",
        "64",
        *extra,
    ]
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor-cache")}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2], env=env)
    try:
        for line in proc.stderr:
            if "compiling with AOTInductor" in line:
                time.sleep(0.5)
                proc.send_signal(sig)
                break
        proc.stderr.read()
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:  # a failed test must not leave an export running
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_export_leaves_the_target_as_it_was(copy, sig, tmp_path_factory):
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    assert _interrupt_export(copy, ["--force"], sig, tmp_path_factory.mktemp("scratch")) != 0
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    assert sorted(p.name for p in copy.parent.iterdir()) == ["bundle"]  # no staging directory left


@pytest.mark.slow
def test_interrupted_fresh_export_leaves_nothing(tmp_path, tmp_path_factory):
    out = tmp_path / "new"
    assert _interrupt_export(out, [], signal.SIGINT, tmp_path_factory.mktemp("scratch")) != 0
    assert list(tmp_path.iterdir()) == []


def test_no_pickle_in_a_bundle(bundle):
    for path in bundle(BASE).iterdir():
        assert path.suffix not in (".pkl", ".pickle", ".bin", ".pt", ".pth")
    import zipfile

    with zipfile.ZipFile(bundle(BASE) / "decode.pt2") as z:
        assert not [n for n in z.namelist() if n.endswith((".pkl", "data.pkl"))]
