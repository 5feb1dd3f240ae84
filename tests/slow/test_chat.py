"""`aotpack chat`, driven through a pseudo-terminal as a person would: two turns, /reset, Ctrl-C, Ctrl-D."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time

import pytest

pytestmark = pytest.mark.slow


class Terminal:
    """A process on a pseudo-terminal: keys in, screen text out."""

    def __init__(self, argv: list[str]):
        env = os.environ | {"PYTHONUNBUFFERED": "1", "TERM": "dumb", "HOME": os.environ.get("HOME", "/tmp")}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal, so Ctrl-C sends it SIGINT
            # as a shell gives its foreground job: a test run started in the background (`cmd &`)
            # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, *argv], env)
        self.screen = ""

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def read_until(self, pattern: str, timeout: float = 120.0) -> str:
        """Text from the last match on, up to and including the next match of `pattern`."""
        start, deadline = len(self.screen), time.monotonic() + timeout
        while not re.search(pattern, self.screen[start:]):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout} s; the screen ends:\n{self.screen[-2000:]}")
            if not self._drain():
                break
        return self.screen[start:]

    def _drain(self) -> bool:
        """Read what the child wrote within 0.2 s; False once it has exited."""
        if select.select([self.fd], [], [], 0.2)[0]:
            try:
                self.screen += os.read(self.fd, 4096).decode(errors="replace")
            except OSError:  # the child exited
                return False
        return True

    def close(self) -> None:
        """Kill the child if it is still running (a failed test leaves it waiting for input), reap it."""
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)

    def exit_status(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self._drain()
        os.kill(self.pid, 9)
        raise AssertionError("the chat did not exit")


@pytest.fixture
def terminal():
    """terminal(argv) -> a Terminal, closed at the end of the test whatever happened."""
    opened = []
    yield lambda argv: opened.append(Terminal(argv)) or opened[-1]
    for term in opened:
        term.close()


PROMPT = r"\n> $"
TIMINGS = r"\[(stopped, )?(\d+) tokens from the cache, (\d+) prefilled, .*tokens/s\]"


def test_two_turns_reset_and_ctrl_d(bundle, terminal):
    term = terminal(["-m", "runtime", "chat", str(bundle("tiny-llama")), "--max-new-tokens", "12", "--greedy"])
    term.read_until(PROMPT)
    term.type("Why is the sky blue?\r")
    first = re.search(TIMINGS, term.read_until(PROMPT))
    assert first and first.group(2) == "0"
    term.type("And the sea?\r")
    second = re.search(TIMINGS, term.read_until(PROMPT))
    assert second and int(second.group(2)) > 0, "turn 2 reuses the cache"
    term.type("/reset\r")
    assert "(conversation cleared)" in term.read_until(PROMPT)
    term.type("Hello?\r")
    third = re.search(TIMINGS, term.read_until(PROMPT))
    assert third and third.group(2) == "0", "after /reset nothing comes from the cache"
    term.type("\x04")  # Ctrl-D
    assert term.exit_status() == 0
    assert "Traceback" not in term.screen


def test_ctrl_c_stops_the_reply_not_the_program(bundle, terminal):
    """Ctrl-C once the reply has begun: the reply stops, the conversation keeps what was shown, and the
    chat goes on to the next turn. A bundle with a long cache, so that the reply (1500 tokens, seconds
    even for a tiny model) is certainly still running when the key arrives."""
    long = bundle("tiny-llama", "--gemv", "aten", "--max-cache-len", "2048")
    argv = ["-m", "runtime", "chat", str(long), "--max-new-tokens", "1500", "--threads", "1"]
    term = terminal(argv + ["--greedy"])
    term.read_until(PROMPT)
    term.type("Go on.\r")
    term.read_until(r"Go on\.\r?\n.")  # the echo, then the reply's first text (printed token by token)
    term.type("\x03")  # Ctrl-C
    stopped = re.search(TIMINGS, term.read_until(PROMPT))
    assert stopped and stopped.group(1) == "stopped, ", stopped
    assert int(re.search(r"(\d+) tokens at", stopped.group(0)).group(1)) < 1500
    term.type("Again.\r")
    after = re.search(TIMINGS, term.read_until(PROMPT))
    assert after and after.group(1) is None and int(after.group(2)) > 0, "the stopped turn is in the cache"
    term.type("/exit\r")
    assert term.exit_status() == 0
    assert "Traceback" not in term.screen


def test_an_instruct_bundle_without_sampling_defaults_samples_with_the_documented_ones(bundle, terminal):
    """tiny-llama's generation_config says do_sample=False and nothing more, as SmolLM2-Instruct's does:
    without flags the chat samples with llama.cpp's defaults and says so, instead of decoding greedily
    (which makes a small instruct model repeat itself); a text-only bundle advertises no /image."""
    term = terminal(["-m", "runtime", "chat", str(bundle("tiny-llama")), "--max-new-tokens", "8"])
    opening = term.read_until(PROMPT)
    assert "decoding: sampling with temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, llama.cpp's defaults" in opening
    assert "/image" not in opening
    term.type("Hi\r")
    assert re.search(TIMINGS, term.read_until(PROMPT))
    term.type("\x04")
    assert term.exit_status() == 0
    assert "Traceback" not in term.screen
