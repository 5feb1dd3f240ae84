"""aotpack serve (the int8 8-row bundle) against llama-server --parallel 8 on Q8_0 of the same checkpoint:
1 and 8 concurrent streaming clients, 64 tokens each, interleaved rounds."""
import dataclasses, json, sys
from pathlib import Path
from exporter.bench.config import BenchConfig
from exporter.bench.serving import _command, aotpack_command, llama_server_command, measure_server, _free_port
from exporter.bench.llama_cpp import gguf_for
from exporter.source import checkpoint_dir
LL = Path("/work/exp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp")
bundle, variant, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cfg = BenchConfig(model="gemma3-270m", dtypes=(), quantize=(variant,) if variant in ("int8", "int4") else (), streams=8,
                  serve=True, llama_server=LL / "build/bin/llama-server", llama_cpp_converter=LL / "convert_hf_to_gguf.py",
                  out=Path("/work/exp/serve-out"), threads=2) if variant in ("int8", "int4") else BenchConfig(
                  model="gemma3-270m", dtypes=(variant,), streams=8, serve=True, llama_server=LL / "build/bin/llama-server",
                  llama_cpp_converter=LL / "convert_hf_to_gguf.py", out=Path("/work/exp/serve-out"), threads=2)
ctx = checkpoint_dir("gemma3-270m"); ck = Path(ctx.__enter__())
gguf = gguf_for(ck, variant, cfg.llama_cpp_converter, cfg.out / "gguf")
results = []
for r in range(rounds):
    for clients in (8, 1):
        c = __import__("types").SimpleNamespace(streams=clients, new_tokens=cfg.new_tokens, threads=cfg.threads)
        hf = ("transformers serve --continuous-batching",) if variant in ("float32", "bfloat16") and clients == 8 and r == 0 else ()
        for name in ("aotpack serve", "llama-server", *hf):
            port = _free_port()
            if name == "aotpack serve":
                cmd, model = aotpack_command(bundle, port, 2), bundle.name
            elif name == "llama-server":
                cmd, model = llama_server_command(cfg, gguf, port), gguf.name
            else:
                cmd, model = _command(name, ck, port, cfg, variant), str(ck)
            res = measure_server(name, cmd, port, c, model=model)
            res.pop("texts"); res["round"] = r
            results.append(res)
            print(json.dumps(res), flush=True)
json.dump(results, open(f"/work/exp/serve-{variant}.json", "w"), indent=1)
