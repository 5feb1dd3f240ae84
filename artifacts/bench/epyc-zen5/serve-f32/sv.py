"""aotpack serve on a bundle: warm 8 prompts (8 tokens), then 8 concurrent 48-token streams; which replies start oddly."""
import subprocess, sys, time, socket
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, ".")  # run from the repository root
from exporter.bench.serving import _ask
port = 8937
proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", sys.argv[1], "--port", str(port), "--threads", "2"], stdout=subprocess.DEVNULL, stderr=open("sv.err", "w"))
url = f"http://127.0.0.1:{port}"
for _ in range(120):
    try:
        socket.create_connection(("127.0.0.1", port), 1).close(); break
    except OSError:
        time.sleep(0.5)
time.sleep(1)
import urllib.request, json
model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
prompts = [f"Tell me a story about the number {i}." for i in range(8)]
mode = sys.argv[2]
try:
    with ThreadPoolExecutor(8) as pool:
        if mode == "story":
            _ask(url, model, "Tell me a story.", 64)
        if mode != "nowarm":
            list(pool.map(lambda p: _ask(url, model, p, 8), prompts))
        texts = [a[3] for a in pool.map(lambda p: _ask(url, model, p, 48), prompts)]
    print(mode, [t[:10] for t in texts], flush=True)
finally:
    proc.terminate(); proc.wait()
