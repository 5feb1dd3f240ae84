"""An export's stages as the person waiting sees them: a line when each begins, a live elapsed-time bar
while it runs (on a terminal), and each stage's time at the end.

Owns: stage timing and display only. The display is tqdm's (a transformers dependency already); a
stage can be silent for a minute (AOTInductor's C++ compile), so a ticker thread refreshes the bar.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager


class Progress:
    def __init__(self, log, live: bool | None = None, out=None):
        self.log = log
        self.out = out or sys.stderr
        self.live = self.out.isatty() if live is None else live
        self.timings: dict[str, float] = {}  # stage -> seconds, in the order they ran

    @contextmanager
    def stage(self, name: str, message: str):
        """Time the block as stage `name`, announcing it with `message`."""
        self.log(message)
        start = time.perf_counter()
        stop = threading.Event()
        ticker = self._show(name, stop) if self.live else None
        try:
            yield
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    def _show(self, name: str, stop: threading.Event) -> threading.Thread:
        from tqdm import tqdm

        def tick():
            with tqdm(desc=f"  {name}", bar_format="{desc}: {elapsed}", file=self.out, leave=False) as bar:
                while not stop.wait(0.5):
                    bar.refresh()

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        return thread

    def summary(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.timings.items())
