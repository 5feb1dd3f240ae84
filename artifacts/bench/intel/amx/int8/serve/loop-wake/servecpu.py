import os, subprocess, sys, time, urllib.request, glob
from exporter.bench.structured import load
bundle, port = sys.argv[1], int(sys.argv[2])
proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", bundle, "--port", str(port), "--threads", "2"],
                        stdout=subprocess.DEVNULL, stderr=open("/work/exp/s52/serve.err", "w"), env=os.environ | {"OMP_NUM_THREADS": "2"})
url = f"http://127.0.0.1:{port}"
def cpu():
    f = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
    out = {("all", "process"): (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")}
    for d in glob.glob(f"/proc/{proc.pid}/task/*"):
        try:
            s = open(d + "/stat").read(); name = open(d + "/comm").read().strip()
            f = s.rsplit(")", 1)[1].split()
            out[(d.rsplit("/", 1)[1], name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except OSError: pass
    return out
try:
    for _ in range(120):
        try: urllib.request.urlopen(url + "/ready", timeout=2); break
        except Exception: time.sleep(1)
    load(url, os.path.basename(bundle), 8, 16, {})
    for n in (1, 8):
        a = cpu(); t = time.perf_counter()
        r = load(url, os.path.basename(bundle), n, 128, {})
        w = time.perf_counter() - t; b = cpu()
        print(f"{n} clients: {r['tokens_per_s']:.1f} tok/s, ITL p50 {r['itl_p50_ms']:.2f}, wall {w:.2f}s, chunks {r['chunks']}")
        d = sorted(((b[k] - a.get(k, 0), k) for k in b), reverse=True)
        for v, k in d[:8]:
            if v > 0.01: print(f"   {k[1]:20s} {v:.2f} s  ({v / r['chunks'] * 1e3:.2f} ms/token)")
finally:
    proc.terminate(); proc.wait()
