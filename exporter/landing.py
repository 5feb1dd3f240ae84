"""Landing a bundle: built in a staging directory beside the target, moved into place whole, or not at all.

Owns: the staging directory's life (made fresh, removed on any exit, and stale ones of dead exports
cleaned up), SIGINT/SIGTERM handling during the build, file modes, and the final swap. On Linux the swap
is one `renameat2(RENAME_EXCHANGE)`, so the target path never stops existing; elsewhere (or on a file
system without it) it is two renames with a short window in which the target is absent, and a crash in
that window leaves the previous bundle at `.NAME.old-PID` beside it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from runtime.errors import ExportError

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


@contextmanager
def staging_dir(out: Path):
    """A fresh, empty directory beside `out`, removed on exit whatever happens; so are the parent
    folders made for it, if the export failed (no empty `artifacts/` left behind)."""
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]  # deepest first
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create {out.parent} ({e.strerror}); choose another --out") from None
    _remove_stale(out)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()  # the folder can exist and pass os.access, yet refuse (a read-only mount, EPERM)
    except OSError as e:
        raise ExportError(f"cannot write in {out.parent} ({e.strerror}); choose another --out") from None
    try:
        yield staging
    except KeyboardInterrupt:  # SIGINT or SIGTERM (signals_abort)
        _stop_compilers()
        raise
    finally:
        _remove_tree(staging)
        for folder in made:
            try:
                folder.rmdir()  # only if empty: a bundle that landed keeps its folder
            except OSError:
                break


def _remove_tree(path: Path, attempts: int = 40) -> None:
    """rmtree, and again while the tree is still there: an interrupt kills the C++ compiler, but not the
    linker it started, which can still write the graph's .so into the tree while it is removed (CI: an
    export stopped by SIGTERM mid-compile left its staging folder, non-empty when rmtree got to it)."""
    for _ in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        time.sleep(0.05)


# Programs an export runs that can write into its staging folder: an interrupt of the export does not stop
# them (Python's subprocess waits 0.25 s for a child after SIGINT, then leaves it running). CI once saw a
# SIGINT mid-compile leave the folder behind after _remove_tree's retries; such a writer is the likely
# cause (inferred, not observed).
_COMPILERS = frozenset(
    ("cc1plus", "cc1", "as", "collect2", "ld", "ld.bfd", "ld.gold", "ld.lld")
    + ("g++", "gcc", "c++", "cc", "clang", "clang++")
)


def _stop_compilers(wait: float = 5.0) -> None:
    """SIGKILL the compilers and linkers among this process's descendants, and wait (at most `wait` s)
    until they are gone. Linux (/proc); elsewhere nothing."""
    stats = _process_stats()
    children: dict[int, list[int]] = {}
    for pid, (_, _, parent) in stats.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [os.getpid()]
    while todo:
        found = children.get(todo.pop(), [])
        tree += found
        todo += found
    doomed = [pid for pid in tree if stats[pid][0] in _COMPILERS]
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while doomed and time.monotonic() < deadline:
        now = _process_stats()
        doomed = [pid for pid in doomed if pid in now and now[pid][1] != "Z"]  # a zombie writes nothing
        time.sleep(0.02)


def _process_stats() -> dict[int, tuple[str, str, int]]:
    """Every process's (name, state, parent pid) from /proc; {} where there is none."""
    stats = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = path.read_text()
        except OSError:  # gone meanwhile
            continue
        name, rest = text[text.find("(") + 1 : text.rfind(")")], text[text.rfind(")") + 2 :].split()
        stats[int(path.parent.name)] = (name, rest[0], int(rest[1]))
    return stats


def _remove_stale(out: Path) -> None:
    """Staging and swap leftovers of exports whose process is gone (a SIGKILL leaves them behind)."""
    for kind in ("partial", "old"):
        for path in out.parent.glob(f".{out.name}.{kind}-*"):
            pid = path.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


@contextmanager
def signals_abort():
    """SIGINT and SIGTERM abort the export. The handler raises at once, but CPython drops an exception
    raised while a finalizer (`__del__`) runs, and libraries catch broadly, so the signal is also
    recorded, and `received` is checked before the bundle lands."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield received
        return

    def handler(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def readable_by_all(directory: Path) -> None:
    """Files as the umask allows (some writers create 0600 files): anyone who may read the bundle can."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def land(staging: Path, out: Path) -> None:
    """Move the complete bundle in `staging` to `out`, replacing what is there."""
    if out.exists() and _exchange(staging, out):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the previous bundle
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(ctypes.get_errno(), f"exchanging {a} and {b}: {os.strerror(ctypes.get_errno())}")
