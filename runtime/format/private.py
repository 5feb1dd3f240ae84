"""The private folders that hold a loaded bundle's verified copy (runtime.format.reader.open_private).

Owns their life: each is created beside a lock file that its process holds locked for as long as it
keeps the folder (`create`, `remove`), so a folder whose lock nobody holds belongs to a process that
ended without removing it: one killed (SIGKILL, the OOM killer, a container stopped hard) runs no
cleanup, and its copy stayed in the temp folder for good (a float32 Gemma 3 270M bundle is 1.1 GB; a
day of tests and benches here left 32 GB and filled the disk). `create` removes such folders first.
A lock, not a process id: ids are reused, and a temp folder shared between containers sees other
process namespaces' ids; an flock is released by the kernel when its holder ends, wherever it ran.
Linux and macOS (fcntl); elsewhere folders are created and removed without the sweep.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; no sweep
    fcntl = None

PREFIX = "aotpack-bundle-"
LOCK = ".lock"


class PrivateFolders:
    """The folders this process holds, each with its locked file's descriptor."""

    def __init__(self):
        self.held: dict[Path, int] = {}
        self._lock = threading.Lock()  # load() may run in several threads

    def create(self, root: Path | None = None) -> Path:
        """A new folder only this user may enter, in `root` (the temp folder by default), locked for this
        process; after removing the folders of processes that ended without removing theirs."""
        root = Path(root or tempfile.gettempdir())
        sweep(root)
        while True:
            fd, lock = tempfile.mkstemp(prefix=PREFIX, suffix=LOCK, dir=root)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held until remove() closes it, or the process ends
            if not _names(fd, lock):  # a sweep took the lock before us and unlinked it: another name
                os.close(fd)
                continue
            folder = Path(lock[: -len(LOCK)])
            try:
                os.mkdir(folder, 0o700)  # named after its lock, whose name mkstemp made unique
            except FileExistsError:  # a folder without its lock (not ours): another name, and no lock
                _unlink(lock)  # left unlocked beside it, which a sweep would take for a dead process's
                os.close(fd)
                continue
            with self._lock:
                self.held[folder] = fd
            return folder

    def remove(self, folder: Path) -> None:
        """The folder, then its lock; safe to call twice, and at interpreter exit."""
        shutil.rmtree(folder, ignore_errors=True)
        with self._lock:
            fd = self.held.pop(Path(folder), None)
        if fd is not None:
            _unlink(f"{folder}{LOCK}")
            os.close(fd)


def sweep(root: Path) -> list[Path]:
    """Remove the folders in `root` whose lock no process holds; returns them. A lock still held (by a
    live process, here or in another container on the same kernel) is left alone, and so is a folder
    without a lock file (not one of these). A lock taken here before its creator locked it is unlinked
    with its folder (none yet): the creator finds its lock's name gone once it holds it, and starts
    over with another."""
    if fcntl is None:
        return []
    removed = []
    for lock in root.glob(f"{PREFIX}*{LOCK}"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:  # gone meanwhile, or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process is alive
            os.close(fd)
            continue
        folder = Path(str(lock)[: -len(LOCK)])
        shutil.rmtree(folder, ignore_errors=True)
        _unlink(lock)  # while still locked: a process that opens it now gets an unlinked file
        os.close(fd)
        removed.append(folder)
    return removed


def _names(fd: int, path: str) -> bool:
    """Whether `path` still names the file open as `fd` (a sweep may have unlinked it meanwhile)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


FOLDERS = PrivateFolders()
