"""One benchmark measurement in a fresh process: `python -m exporter.bench.worker ...` prints one JSON line.

Owns: timing one system (HF eager, HF + torch.compile, aotpack or llama.cpp) from process start, so imports,
loading and compiling all count towards time to first token and first-request latency. Then
`WARM_REQUESTS` warm requests give prefill ms and the steady decode ms/token (medians over them). For
aotpack, the compiled step is then also timed called directly from this thread at the same span: the
engine's own cost is the ratio of the two. With `--contexts`, decode ms/token at each context instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

SYSTEMS = ("hf_eager", "hf_compile", "aotpack", "aotpack_onnx", "aotpack_onnx_prepacked", "llama_cpp")
# aotpack's decode on ONNX Runtime (decode.onnx): over the eager model's weights, or prepacked (a copy)
ONNX_SYSTEMS = ("aotpack_onnx", "aotpack_onnx_prepacked")
AOTPACK_SYSTEMS = {  # each one's load options (runtime.config.LoadConfig fields)
    "aotpack": {},
    "aotpack_onnx": {"backend": "onnxruntime"},
    "aotpack_onnx_prepacked": {"backend": "onnxruntime", "prepack": True},
}
WARMUP_STEPS = 3  # decode steps of each warm request skipped before the steady-state median
WARM_REQUESTS = 3  # more samples per process: the machine is shared and single requests are noisy


class Stamps:
    """A `generate` streamer that records when each new token arrives (the first put is the prompt)."""

    def __init__(self):
        self.times: list[float] = []
        self.tokens: list[int] = []
        self._prompt_seen = False

    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.time())
        self.tokens.append(int(value.reshape(-1)[0]))

    def end(self):
        pass


def _hf_request(model, ids, new_tokens: int, compiled: bool) -> Stamps:
    from transformers import CompileConfig

    from exporter.compat import compile_on_cpu

    stamps = Stamps()
    kwargs = dict(cache_implementation="static")
    if compiled:
        kwargs["compile_config"] = compile_on_cpu(CompileConfig(fullgraph=True))
    else:
        kwargs["disable_compile"] = True
    model.generate(
        input_ids=ids,
        attention_mask=ids.new_ones(ids.shape),
        max_new_tokens=new_tokens,
        do_sample=False,
        streamer=stamps,
        **kwargs,
    )
    return stamps


def _aot_request(rt, ids, new_tokens: int) -> Stamps:
    """The engine's own token times (when each step produced its token): read as they arrive in this
    thread, a fast step's tokens could queue up behind the GIL and seem to come out together."""
    stamps = Stamps()
    handle = rt.submit(input_ids=ids, attention_mask=ids.new_ones(ids.shape), max_new_tokens=new_tokens)  # as HF's
    stamps.tokens = [int(token[0]) for token in handle.tokens()]
    offset = time.time() - time.monotonic()
    stamps.times = [t + offset for t in handle.times]
    return stamps


def _llama_request(llm, ids, new_tokens: int) -> Stamps:
    """Greedy (top-1) through llama.cpp's own token loop, from an empty context each time."""
    stamps = Stamps()
    for token in llm.generate(ids[0].tolist(), temp=0.0, top_k=1, reset=True):
        stamps.times.append(time.time())
        stamps.tokens.append(int(token))
        if len(stamps.tokens) == new_tokens:
            break
    return stamps


def _llama(path: str, args, logits_all: bool = False):
    """llama.cpp at the bundle's n_ctx; `--no-extra-bufts`: on its plain CPU buffers (llama-cpp-python has
    no argument for llama_model_params.use_extra_bufts, so the default parameters are wrapped)."""
    import llama_cpp
    import llama_cpp.llama

    if args.no_extra_bufts:
        defaults = llama_cpp.llama_model_default_params

        def plain():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama.llama_cpp.llama_model_default_params = plain
    return llama_cpp.Llama(
        model_path=path,
        n_ctx=args.n_ctx,
        n_batch=min(args.n_ctx, 512),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=logits_all,
        verbose=False,
    )


def _llama_perplexity(args) -> float:
    """llama.cpp's perplexity of `args.text` (token ids: aotpack's accuracy text as the checkpoint's own
    tokenizer reads it), each position scored from the logits of the one before, as exporter.accuracy
    scores a bundle: the same tokens, so the figures compare."""
    import numpy as np

    ids = args.text
    args.n_ctx = max(args.n_ctx, len(ids))
    llm = _llama(args.path, args, logits_all=True)
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)  # (T - 1, vocab)
    top = logits.max(1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
    return float(np.exp(-log_probs[np.arange(len(ids) - 1), ids[1:]].mean()))


def _load(system: str, path: str, dtype: str, args=None):
    import torch

    if system in AOTPACK_SYSTEMS:
        from runtime import LoadConfig, load

        return load(path, LoadConfig(**AOTPACK_SYSTEMS[system]))
    if system == "llama_cpp":
        return _llama(path, args)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), local_files_only=True).eval()


def peak_rss_mib() -> float:
    """This process's peak resident set. Linux keeps ru_maxrss across exec (it would report the parent's
    peak), so read VmHWM, which starts afresh with the new program."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    if args.text:
        return {"system": args.system, "dtype": args.variant, "perplexity": _llama_perplexity(args)}
    model = _load(args.system, args.path, args.dtype, args)
    if args.contexts:
        return _per_context(args, model)
    ids = torch.tensor([args.prompt], dtype=torch.long)
    requests = [_timed_request(args, model, ids) for _ in range(1 + WARM_REQUESTS)]  # the first is cold
    for _, stamps in requests:
        _check_length(stamps, args.new_tokens)
    (_, cold), warm = requests[0], requests[1:]
    figures = {
        "system": args.system,
        "dtype": args.variant,
        "time_to_first_token_s": cold.times[0] - args.spawned_at,
        "first_request_s": cold.times[-1] - args.spawned_at,
        "prefill_ms": statistics.median(s.times[0] - start for start, s in warm) * 1e3,
        "decode_ms_per_token": _decode_ms([s for _, s in warm]),
        "peak_rss_mib": peak_rss_mib(),
        "tokens": warm[0][1].tokens,
        "tokens_stable": all(s.tokens == cold.tokens for _, s in warm),
    }
    if args.system in AOTPACK_SYSTEMS:
        figures["step_direct_ms"] = direct_step_ms(model, len(args.prompt) + args.new_tokens // 2)
    return figures


def _decode_ms(stamps: list[Stamps]) -> float:
    """The median gap between two tokens, the first WARMUP_STEPS of each request left out."""
    steps = [b - a for s in stamps for a, b in list(zip(s.times, s.times[1:], strict=False))[WARMUP_STEPS:]]
    return statistics.median(steps) * 1e3


def direct_step_ms(rt, position: int, steps: int = 20, batch: int = 1) -> float:
    """The decode step called directly from this thread over `batch` rows (a graph's batch), each
    standing at `position` (the span a request there attends to): what the engine's per-token time is
    compared with, and each batch bucket's cost."""
    import torch

    from runtime.model.positions import RowPositions

    rows = RowPositions(batch, rt.contract.max_cache_len, rt.contract.device)
    rows.place(slice(0, batch), torch.ones(batch, position + 1, dtype=torch.long), position)
    rows.advance(torch.ones(batch, dtype=torch.bool))
    position, index, mask = rows.inputs(batch)
    step = rt.decode.bind(torch.full((batch, 1), 17), position, index, [t[:batch] for t in rt.kv])
    times = []
    with torch.inference_mode():
        for _ in range(steps + WARMUP_STEPS):
            start = time.perf_counter()
            step(mask)
            times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP_STEPS:]) * 1e3


def _per_context(args, model) -> dict:
    """Decode ms/token at each context: a prompt of that many tokens (the start of --prompt), one request
    each after one warm-up request at the shortest."""
    import torch

    prompts = {c: torch.tensor([args.prompt[:c]], dtype=torch.long) for c in args.contexts}
    _timed_request(args, model, prompts[args.contexts[0]])
    per = {}
    for context, ids in prompts.items():
        start, stamps = _timed_request(args, model, ids)
        _check_length(stamps, args.new_tokens)
        per[str(context)] = {"prefill_ms": (stamps.times[0] - start) * 1e3, "decode_ms_per_token": _decode_ms([stamps])}
        if args.system in AOTPACK_SYSTEMS:
            per[str(context)]["step_direct_ms"] = direct_step_ms(model, context + args.new_tokens // 2)
    return {"system": args.system, "dtype": args.variant, "contexts": per, "peak_rss_mib": peak_rss_mib()}


def _check_length(stamps: Stamps, new_tokens: int) -> None:
    """Greedy with no logits processor is the workload; `min_new_tokens` would force the length but
    adds HF's MinNewTokensLengthLogitsProcessor (about 5 ms a step over a 262k vocabulary here) to every
    system. So the prompt must simply not meet eos, and a run that does is refused, not reported."""
    if len(stamps.tokens) != new_tokens:
        raise SystemExit(
            f"the model met eos after {len(stamps.tokens)} of {new_tokens} tokens, so the systems would decode "
            "different lengths; choose another --prompt-len or --new-tokens"
        )


def _timed_request(args, model, ids) -> tuple[float, Stamps]:
    """(start time, stamps) of one request; hf_compile compiles during its first."""
    import torch

    start = time.time()
    with torch.inference_mode():
        if args.system in AOTPACK_SYSTEMS:
            return start, _aot_request(model, ids, args.new_tokens)
        if args.system == "llama_cpp":
            return start, _llama_request(model, ids, args.new_tokens)
        return start, _hf_request(model, ids, args.new_tokens, args.system == "hf_compile")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--path", required=True, help="checkpoint directory (hf_*) or bundle directory (aotpack)")
    p.add_argument("--dtype", required=True)
    p.add_argument("--variant", required=True, help="the benchmark variant: a dtype, or int8/int4")
    p.add_argument("--prompt", type=lambda s: [int(t) for t in s.split(",")], required=True)
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--n-ctx", type=int, required=True, help="llama.cpp's context size: the bundle's max_cache_len")
    p.add_argument(
        "--contexts", type=lambda s: [int(t) for t in s.split(",")], default=None, help="decode at each context"
    )
    p.add_argument(
        "--no-extra-bufts", action="store_true", help="llama_cpp: no AMX or repacked weight buffers (they can crash)"
    )
    p.add_argument(
        "--text", type=lambda s: [int(t) for t in s.split(",")], default=None, help="llama_cpp: perplexity of these ids"
    )
    p.add_argument("--spawned-at", type=float, required=True, help="time.time() when the parent started this process")
    print(json.dumps(measure(p.parse_args(argv))), flush=True)


if __name__ == "__main__":
    sys.exit(main())
