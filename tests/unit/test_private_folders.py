"""The private copies' folders (runtime.format.private): created locked, removed with their lock, and the
folders of processes that were killed (no cleanup ran) removed by the next create, while those of live
processes, and folders that are not ours, stay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from runtime.format import private
from runtime.format.private import LOCK, PREFIX, PrivateFolders, sweep

pytestmark = pytest.mark.skipif(private.fcntl is None, reason="no flock on this platform: no sweep")


def _holder(root, stay: bool) -> tuple[subprocess.Popen, str]:
    """A process that creates a folder in `root` and then waits (`stay`) or kills itself with SIGKILL."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        from runtime.format.private import FOLDERS
        print(FOLDERS.create({str(root)!r}), flush=True)
        sys.stdin.readline() if {stay} else os.kill(os.getpid(), signal.SIGKILL)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def test_a_folder_is_private_locked_and_goes_with_its_lock(tmp_path):
    folders = PrivateFolders()
    folder = folders.create(tmp_path)
    assert folder.name.startswith(PREFIX) and folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
    assert os.path.exists(f"{folder}{LOCK}") and sweep(tmp_path) == []  # held by this process
    folders.remove(folder)
    folders.remove(folder)  # twice: nothing left to do
    assert list(tmp_path.iterdir()) == []


def test_a_killed_processs_folder_is_swept_and_a_live_ones_is_not(tmp_path):
    (tmp_path / f"{PREFIX}not-ours").mkdir()  # no lock file: left alone
    live, kept = _holder(tmp_path, stay=True)
    dead, gone = _holder(tmp_path, stay=False)
    assert dead.wait(timeout=60) == -signal.SIGKILL
    assert os.path.isdir(gone) and os.path.isdir(kept)
    folders = PrivateFolders()
    mine = folders.create(tmp_path)  # sweeps first
    assert not os.path.exists(gone) and not os.path.exists(f"{gone}{LOCK}")
    assert os.path.isdir(kept) and (tmp_path / f"{PREFIX}not-ours").is_dir()
    live.stdin.write("\n")
    live.stdin.close()
    assert live.wait(timeout=60) == 0  # it ended normally without removing its folder (nor did atexit)
    assert [str(f) for f in sweep(tmp_path)] == [kept]
    folders.remove(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{PREFIX}not-ours"]
