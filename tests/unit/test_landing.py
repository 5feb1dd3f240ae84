"""exporter.landing's clean-up after an interrupted export: the compilers and linkers the export started, which
outlive the interrupt and write into its staging folder, are stopped before the folder is removed; other
processes are left alone. (The whole path, an export signalled mid-compile, is tests/bundle/test_faults.py's.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from exporter import landing

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _named(pid: int) -> str | None:
    found = landing._process_stats().get(pid)
    return None if found is None or found[1] == "Z" else found[0]


def test_an_interrupt_stops_the_compilers_the_export_started_and_nothing_else(tmp_path):
    os.symlink("/bin/sleep", tmp_path / "cc1plus")  # a compiler by name, started by a child: a grandchild
    script = f"{tmp_path / 'cc1plus'} 60 & echo $!; wait"
    shell = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        compiler = int(shell.stdout.readline())
        deadline = time.monotonic() + 10
        while _named(compiler) != "cc1plus" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _named(compiler) == "cc1plus"
        with pytest.raises(KeyboardInterrupt), landing.staging_dir(tmp_path / "out") as staging:
            (staging / "decode.pt2").write_bytes(b"half")
            raise KeyboardInterrupt
        assert _named(compiler) is None
        assert bystander.poll() is None and _named(bystander.pid) == "sleep"
        assert not list(tmp_path.glob(".out.partial-*"))
    finally:
        for proc in (shell, bystander):
            proc.kill()
            proc.wait()
