"""`aotpack bench --speculate K`: prompt-lookup speculative decoding against plain decoding, one stream.

Owns: the tasks (made from text this package ships: a passage of the accuracy text to repeat with an
edit, a function of its own source to rewrite without its docstring, and free text), their measurement
on one bundle with verify graphs (exported here with `--speculate K`, or given with `--model BUNDLE`),
drafting on and off (`prompt_lookup_num_tokens=0`) interleaved round by round in one process, and
speculation.json / speculation.md with a verdict per target of the issue:
- input-grounded tasks: decode tokens/s with drafts >= 1.8x without, greedy tokens identical;
- free text: >= 0.95x;
- with --streams N, N requests at once (the tasks in turn): aggregate tokens/s with drafts >= without.
Decode tokens/s counts the tokens after the first over the time from the first to the last, so the
prefill, the same in both, stays out. This is a benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import inspect
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from exporter.accuracy import TEXT
from exporter.bench.build import export_variant, header
from exporter.bench.config import BenchConfig
from exporter.bench.report import verdict_of
from exporter.source import checkpoint_dir
from runtime.format.files import MANIFEST

GROUNDED, FREE = "input-grounded", "free text"
TARGETS = {GROUNDED: (">=", 1.8), FREE: (">=", 0.95)}
# --streams: how long the clients of each mode and round keep asking (a reply is a few seconds)
STEADY_SECONDS = 30.0


def tasks() -> dict[str, tuple[str, str]]:
    """name -> (kind, user message)."""
    from runtime.engine import sampling

    passage = " ".join(TEXT.split())[:700]
    source = inspect.getsource(sampling.probabilities)
    return {
        "repeat a passage with an edit": (
            GROUNDED,
            f"Repeat the following text word for word, but write 'lake' wherever it says 'river':\n\n{passage}",
        ),
        "rewrite a function": (
            GROUNDED,
            f"Rewrite this Python function without its docstring, changing nothing else:\n\n```python\n{source}```",
        ),
        "free text": (FREE, "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    }


def bench_speculation(config: BenchConfig, log=print) -> dict:
    variant = config.variants[0]
    with tempfile.TemporaryDirectory(prefix="aotpack-spec-") as tmp:
        bundle, build_s = _bundle(config, Path(tmp), variant, log)
        measured = measure(bundle, config, log)
    results = header(config) | {
        "build_s": build_s,
        "variant": variant,
        "measured": measured,
    }
    write_report(results, config.out)
    return results


def _bundle(config: BenchConfig, tmp: Path, variant: str, log) -> tuple[Path, float | None]:
    """--model BUNDLE as it is (it must have verify graphs), else a bundle exported with --speculate K."""
    given = Path(config.model)
    if (given / MANIFEST).is_file():
        return given, None
    bundle, rows = tmp / "bundle", config.streams or 1
    log(f"[{variant}] exporting {config.model} with --speculate {config.speculate}, cache {config.max_cache_len}")
    with checkpoint_dir(config.model) as checkpoint:
        extra = ("--speculate", str(config.speculate), "--batch-buckets", str(rows))
        build_s = export_variant(checkpoint, bundle, variant, config.max_cache_len, config.gemv, rows, extra=extra)
        return bundle, build_s


def measure(bundle: Path, config: BenchConfig, log) -> dict:
    """Each task's runs with drafts and without, `config.rounds` rounds interleaved, greedy."""
    from runtime import load

    rt = load(bundle, num_threads=config.threads)
    if not rt.engine.draft_tokens:
        raise ValueError(f"{bundle} has no verify graphs: export it with --speculate K")
    out = {"draft_tokens": rt.engine.draft_tokens, "tasks": {}}
    prompts = {name: _prompt(rt, message) for name, (_, message) in tasks().items()}
    if config.streams:
        out["streams"] = _streams(rt, list(prompts.values()), config, log)
        return out
    for name, (kind, _) in tasks().items():
        ids = prompts[name]
        _once(rt, ids, 8, None)  # warm both graphs' code paths
        runs = {"plain": [], "drafted": []}
        for r in range(config.rounds):
            for mode, drafts in _turns(r):
                runs[mode].append(_once(rt, ids, config.new_tokens, drafts))
        out["tasks"][name] = _summary(kind, ids.shape[1], runs)
        log(f"{name}: {out['tasks'][name]['ratio']:.2f}x, acceptance {out['tasks'][name]['acceptance']:.0%}")
    return out


def _turns(round_: int) -> tuple[tuple[str, int | None], ...]:
    """(mode, prompt_lookup_num_tokens) in the order round `round_` runs them: alternating, so neither
    mode always goes first (0: no drafts; None: the bundle's)."""
    turns = (("plain", 0), ("drafted", None))
    return turns if round_ % 2 == 0 else turns[::-1]


def _prompt(rt, message: str):
    return rt.tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]


def _streams(rt, prompts: list, config: BenchConfig, log) -> dict:
    """`config.streams` requests at once, the tasks in turn: aggregate tokens/s, drafts on and off."""
    n = config.streams
    runs = {"plain": [], "drafted": []}
    for r in range(config.rounds):
        for mode, drafts in _turns(r):
            start = time.perf_counter()
            with rt.engine.together():
                handles = [rt.submit(prompts[i % len(prompts)], max_new_tokens=config.new_tokens, do_sample=False,
                                     prompt_lookup_num_tokens=drafts) for i in range(n)]  # fmt: skip
            tokens = [[int(t[0]) for t, _ in h] for h in handles]
            runs[mode].append({"tokens": tokens, "tps": sum(map(len, tokens)) / (time.perf_counter() - start)})
    plain, drafted = (statistics.median(r["tps"] for r in runs[m]) for m in ("plain", "drafted"))
    identical = all(r["tokens"] == runs["plain"][0]["tokens"] for r in runs["plain"] + runs["drafted"])
    log(f"{n} streams: {drafted / plain:.2f}x aggregate tokens/s")
    out = {"streams": n, "plain_tps": plain, "drafted_tps": drafted, "ratio": drafted / plain, "identical": identical}
    out["clients"] = _steady(rt, prompts, config, log, runs["plain"][0]["tokens"])
    return out


def _steady(rt, prompts: list, config: BenchConfig, log, reference: list) -> dict:
    """`config.streams` clients, each asking for its task again as soon as its last reply ends, for
    STEADY_SECONDS per mode and round: the tokens/s a service delivers. A batch of requests started
    together measures something else: its time is its slowest request's, and a verify step that speeds
    the copying requests slows the free-text ones beside them, which then finish last."""
    runs = {"plain": [], "drafted": []}
    for r in range(config.rounds):
        for mode, drafts in _turns(r):
            runs[mode].append(_clients(rt, prompts, config, drafts))
    plain, drafted = (statistics.median(r["tps"] for r in runs[m]) for m in ("plain", "drafted"))
    # reference: each client's tokens in the batch above (client i asks what request i asked)
    identical = all(tokens == reference[i] for run in runs["plain"] + runs["drafted"] for i, tokens in run["replies"])
    requests = {m: sum(len(run["replies"]) for run in runs[m]) for m in runs}
    for run in runs["drafted"]:
        log(f"  drafted: {run['steps']} steps, {run['verify_steps']} verify, {run['accepted']}/{run['drafted']} taken")
    log(f"{config.streams} clients, {STEADY_SECONDS:.0f} s each: {drafted / plain:.2f}x tokens/s")
    return {"seconds": STEADY_SECONDS, "plain_tps": plain, "drafted_tps": drafted, "ratio": drafted / plain,
            "identical": identical, "requests": requests}  # fmt: skip


def _counters(engine, since: dict[str, int] | None = None) -> dict[str, int]:
    """The engine's step and draft counters now, or their growth `since` an earlier reading."""
    now = {name: getattr(engine, name) for name in ("steps", "verify_steps", "drafted", "accepted")}
    return now if since is None else {name: now[name] - since[name] for name in now}


def _clients(rt, prompts: list, config: BenchConfig, drafts: int | None) -> dict:
    """One window: tokens delivered before its end per second, and (client, tokens) of each reply."""
    before, start = _counters(rt.engine), time.monotonic()  # the clock of handle.times
    deadline, replies, lock = start + STEADY_SECONDS, [], threading.Lock()

    def client(i: int) -> None:
        while time.monotonic() < deadline:
            handle = rt.submit(prompts[i % len(prompts)], max_new_tokens=config.new_tokens, do_sample=False,
                               prompt_lookup_num_tokens=drafts)  # fmt: skip
            tokens = [int(t[0]) for t, _ in handle]
            with lock:
                replies.append((i, tokens, handle.times))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(config.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    delivered = sum(start <= t <= deadline for _, _, times in replies for t in times)
    replied = [(i, tokens) for i, tokens, _ in replies]
    return {"tps": delivered / STEADY_SECONDS, "replies": replied, **_counters(rt.engine, before)}


def _once(rt, ids, new_tokens: int, drafts: int | None) -> dict:
    before = _counters(rt.engine)
    handle = rt.submit(ids, max_new_tokens=new_tokens, do_sample=False, prompt_lookup_num_tokens=drafts)
    tokens = [int(t[0]) for t, _ in handle]
    times = handle.times
    grown = _counters(rt.engine, before)
    tps = (len(tokens) - 1) / (times[-1] - times[0]) if len(tokens) > 1 else 0.0
    return {"tokens": tokens, "decode_tps": tps, **{k: grown[k] for k in ("drafted", "accepted", "verify_steps")}}


def _summary(kind: str, prompt: int, runs: dict) -> dict:
    plain, drafted = runs["plain"], runs["drafted"]
    plain_tps = statistics.median(r["decode_tps"] for r in plain)
    drafted_tps = statistics.median(r["decode_tps"] for r in drafted)
    proposed = sum(r["drafted"] for r in drafted)
    return {
        "kind": kind,
        "prompt_tokens": prompt,
        "new_tokens": len(plain[0]["tokens"]),
        "plain_tps": plain_tps,
        "drafted_tps": drafted_tps,
        "ratio": drafted_tps / plain_tps,
        "identical": all(r["tokens"] == plain[0]["tokens"] for r in plain + drafted),
        "acceptance": sum(r["accepted"] for r in drafted) / proposed if proposed else 0.0,
        "tokens_per_verify": _per_verify(drafted),
        "rounds": len(plain),
    }


def _per_verify(runs: list[dict]) -> float:
    steps = sum(r["verify_steps"] for r in runs)
    return (steps + sum(r["accepted"] for r in runs)) / steps if steps else 0.0


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "speculation.json").write_text(json.dumps(results, indent=2))
    (out / "speculation.md").write_text(markdown(results))


def markdown(results: dict) -> str:
    m, measured = results["machine"], results["measured"]
    lines = [
        f"# Prompt-lookup speculative decoding: {results['config']['model']} ({results['variant']}), "
        f"k = {measured['draft_tokens']}",
        "",
        f"{m['cpu']} ({', '.join(m['isa'])}), {results['config']['threads']} threads; batch 1, greedy, drafts on "
        f"and off interleaved over {results['config']['rounds']} rounds in one process (medians).",
        "",
        "| task | kind | prompt | new tokens | plain tok/s | drafted tok/s | ratio | acceptance | tokens per verify | identical |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, t in measured["tasks"].items():
        lines.append(
            f"| {name} | {t['kind']} | {t['prompt_tokens']} | {t['new_tokens']} | {t['plain_tps']:.1f} | "
            f"{t['drafted_tps']:.1f} | {t['ratio']:.2f}× | {t['acceptance']:.0%} | {t['tokens_per_verify']:.2f} | "
            f"{'yes' if t['identical'] else '**no**'} |"
        )
    if streams := measured.get("streams"):
        lines += [
            "",
            f"{streams['streams']} streams at once (the tasks in turn), aggregate tokens/s: plain "
            f"{streams['plain_tps']:.1f}, drafted {streams['drafted_tps']:.1f} ({streams['ratio']:.2f}×), tokens "
            f"identical: {'yes' if streams['identical'] else '**no**'}.",
        ]
        if clients := streams.get("clients"):
            lines += [
                "",
                f"{streams['streams']} clients, each asking for its task again as soon as its reply ends, "
                f"{clients['seconds']:.0f} s per mode and round (tokens delivered within the window): plain "
                f"{clients['plain_tps']:.1f}, drafted {clients['drafted_tps']:.1f} ({clients['ratio']:.2f}×), "
                f"{clients['requests']['plain']} and {clients['requests']['drafted']} replies, each identical to "
                f"its client's first: {'yes' if clients['identical'] else '**no**'}.",
            ]
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    for kind, (op, bound) in TARGETS.items():
        ratios = [t["ratio"] for t in measured["tasks"].values() if t["kind"] == kind]
        worst = min(ratios) if ratios else None
        shown = f"{worst:.2f}× (the lowest)" if worst is not None else "not measured"
        verdict = verdict_of(worst, (op, bound)) if worst is not None else "not measured"
        lines.append(f"| {kind}: drafted/plain decode tokens/s {op} {bound}× | {shown} | {verdict} |")
    if streams:
        lines += _streams_verdicts(streams)
    return "\n".join(lines) + "\n"


def _streams_verdicts(streams: dict) -> list[str]:
    n, rows = streams["streams"], [("requests started together", streams["ratio"])]
    if clients := streams.get("clients"):
        rows.append((f"clients asking again as each reply ends, {clients['seconds']:.0f} s", clients["ratio"]))
    return [
        f"| {n} streams, {how}: tokens/s drafted/plain >= 1× | {ratio:.2f}× | {verdict_of(ratio, ('>=', 1.0))} |"
        for how, ratio in rows
    ]
