"""`aotpack serve` over one bundle: 1 then 8 concurrent greedy streaming clients of 128 tokens, their
tokens/s and inter-token p50, and the CPU seconds the server process and its busiest threads took.

Usage: python servecpu.py BUNDLE PORT (from the checkout whose code is measured).
"""

import glob
import os
import subprocess
import sys
import time
import urllib.request

from exporter.bench.structured import load

bundle, port = sys.argv[1], int(sys.argv[2])
command = [sys.executable, "-m", "runtime", "serve", bundle, "--port", str(port), "--threads", "2"]
env = os.environ | {"OMP_NUM_THREADS": "2"}
proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
url, tick = f"http://127.0.0.1:{port}", os.sysconf("SC_CLK_TCK")


def seconds(stat: str) -> float:
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick


def cpu() -> dict:
    out = {("all", "process"): seconds(open(f"/proc/{proc.pid}/stat").read())}
    for task in glob.glob(f"/proc/{proc.pid}/task/*"):
        try:
            out[(task.rsplit("/", 1)[1], open(task + "/comm").read().strip())] = seconds(open(task + "/stat").read())
        except OSError:
            pass  # the thread ended meanwhile
    return out


def ready() -> None:
    for _ in range(120):
        try:
            urllib.request.urlopen(url + "/ready", timeout=2)
            return
        except OSError:
            time.sleep(1)


try:
    ready()
    load(url, os.path.basename(bundle), 8, 16, {})
    for clients in (1, 8):
        before, start = cpu(), time.perf_counter()
        r = load(url, os.path.basename(bundle), clients, 128, {})
        wall, after = time.perf_counter() - start, cpu()
        print(f"{clients} clients: {r['tokens_per_s']:.1f} tok/s, ITL p50 {r['itl_p50_ms']:.2f}, wall {wall:.2f}s")
        for used, key in sorted(((after[k] - before.get(k, 0), k) for k in after), reverse=True)[:8]:
            if used > 0.01:
                print(f"   {key[1]:20s} {used:.2f} s  ({used / r['chunks'] * 1e3:.2f} ms/token)")
finally:
    proc.terminate()
    proc.wait()
