"""Signed bundles: hashes catch corruption, signatures catch someone who rewrote files and hashes."""

from __future__ import annotations

import json
import shutil

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from helpers import rewrite_manifest

from exporter.cli import main as aotpack
from runtime import IntegrityError, load
from runtime.format.files import MANIFEST, SIGNATURE, sha256
from runtime.format.reader import open_bundle
from runtime.format.signing import sign

BASE = "tiny-llama"


def _keypair(directory, name):
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


@pytest.fixture
def keys(tmp_path):
    return {name: _keypair(tmp_path, name) for name in ("owner", "stranger")}


@pytest.fixture
def signed(bundle, tmp_path, keys):
    dest = tmp_path / "signed"
    shutil.copytree(bundle(BASE), dest)
    sign(dest, keys["owner"][0])
    return dest


def test_signed_bundle_loads_with_its_owners_key(signed, keys):
    rt = load(signed, trusted_keys=[keys["stranger"][1], keys["owner"][1]])
    assert (signed / SIGNATURE).is_file() and rt.manifest.files


def test_wrong_key_is_refused(signed, keys):
    with pytest.raises(IntegrityError, match="does not verify with any trusted key"):
        open_bundle(signed, trusted_keys=[keys["stranger"][1]])


def test_unsigned_bundle_is_refused_when_keys_are_required(bundle, keys):
    with pytest.raises(IntegrityError, match="is not signed"):
        open_bundle(bundle(BASE), trusted_keys=[keys["owner"][1]])


def test_replaced_file_with_recomputed_hashes_passes_hashes_but_not_the_signature(signed, keys):
    """The attack hashes cannot stop: replace a file, recompute its hash and the manifest digest."""
    (signed / "tokenizer_config.json").write_text("{}")
    raw = json.loads((signed / MANIFEST).read_text())
    rewrite_manifest(signed, files=raw["files"] | {"tokenizer_config.json": sha256(signed / "tokenizer_config.json")})
    open_bundle(signed)  # every hash and the digest agree
    with pytest.raises(IntegrityError, match="does not verify"):
        open_bundle(signed, trusted_keys=[keys["owner"][1]])


def test_verify_command_checks_the_signature(signed, keys, capsys):
    stranger, owner = str(keys["stranger"][1]), str(keys["owner"][1])
    assert aotpack(["verify", str(signed), "--key", stranger, "--key", owner]) == 0
    out = capsys.readouterr().out
    assert f"signature verified with trusted key {owner!r}" in out and stranger not in out
    assert aotpack(["verify", str(signed), "--key", str(keys["stranger"][1])]) == 2
    assert "does not verify" in capsys.readouterr().err


@pytest.mark.slow
def test_export_signs_the_bundle(checkpoint, tmp_path, keys):
    out = tmp_path / "b"
    args = ["export", str(checkpoint(BASE)), "--out", str(out), "--max-cache-len", "64", "--gemv", "aten"]
    assert aotpack([*args, "--sign-key", str(keys["owner"][0])]) == 0
    load(out, trusted_keys=[keys["owner"][1]])
    assert aotpack(["export", BASE, "--out", str(tmp_path / "c"), "--sign-key", str(tmp_path / "missing.pem")]) == 2


def test_run_takes_the_trusted_keys_as_verify_does(signed, bundle, keys, capsys):
    """`run --key` (as `chat` and `serve`, the same load options) loads only a bundle the key signed."""
    base = ["run", "--prompt", "Hi", "--max-new-tokens", "2", "--key", str(keys["owner"][1])]
    assert aotpack([base[0], str(signed), *base[1:]]) == 0
    capsys.readouterr()
    assert aotpack([base[0], str(bundle(BASE)), *base[1:]]) == 2
    assert "is not signed" in capsys.readouterr().err
    assert aotpack([base[0], str(signed), *base[1:-1], str(keys["stranger"][1])]) == 2
    assert "does not verify" in capsys.readouterr().err
