"""Comparison helpers shared by the parity tests."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from runtime.format.files import MANIFEST
from runtime.format.manifest import _digest

LOGIT_ATOL = 1e-4  # fp32
# A bundle whose integer kernels quantize activations: a last-bit difference upstream can move a value
# across a rounding boundary (exporter.parity.INTEGER_TOLERANCE), so logits agree to a share of their scale.
INTEGER_RTOL = 5e-2


def hf_generate(model, inputs: dict, new_tokens: int):
    """HF eager generate, greedy, forced to produce exactly `new_tokens` tokens; returns (ids, raw logits)."""
    out = model.generate(
        **inputs,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences, torch.stack(out.logits, dim=1)  # (B, S + n), (B, n, vocab)


def aot_generate(rt, inputs: dict, new_tokens: int):
    """The runtime's greedy generate with the same forcing; returns (ids, raw logits)."""
    tokens, logits = [], []
    for token, step_logits in rt.iter_steps(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens):
        tokens.append(token)
        logits.append(step_logits)
    ids = torch.cat([inputs["input_ids"], torch.stack(tokens, dim=1)], dim=1)
    return ids, torch.stack(logits, dim=1)


def assert_parity(rt, model, inputs: dict, new_tokens: int, logit_steps: int | None = None):
    """Greedy tokens identical, and raw logits within LOGIT_ATOL on the first `logit_steps` steps (all by
    default); within INTEGER_RTOL of the largest logit for a bundle with the integer kernels.

    Logits are compared where both sides have seen the same tokens, i.e. while tokens agree (all steps here).
    A bundle with the integer kernels may take another token only where HF's logits of the two tokens are
    closer than that tolerance (a near tie, which rounding an activation the other way can flip: see the
    README's integer kernels); the steps after it are not compared, since the two sides' inputs differ."""
    ref_ids, ref_logits = hf_generate(model, inputs, new_tokens)
    ids, logits = aot_generate(rt, inputs, new_tokens)
    assert ids.shape == ref_ids.shape
    # integer kernels, or bf16/fp16 sums rounded at every layer: a share of the logits' scale (the export's)
    integer = rt.manifest is not None and (rt.manifest.native is not None or rt.manifest.dtype != "float32")
    tolerance = INTEGER_RTOL * max(1.0, ref_logits.float().abs().max().item()) if integer else LOGIT_ATOL
    steps = logit_steps or new_tokens
    mismatch = (ids != ref_ids).nonzero()
    if mismatch.numel() and integer:
        row, position = mismatch[mismatch[:, 1].argmin()].tolist()  # the earliest step of any row
        step = position - (ids.shape[1] - new_tokens)
        ours, theirs = ref_logits[row, step, ids[row, position]], ref_logits[row, step, ref_ids[row, position]]
        gap = (theirs - ours).item()
        assert gap < tolerance, f"tokens differ first at (row, position) {[row, position]}, HF's by {gap:.3g}"
        steps = min(steps, step + 1)
    else:
        assert mismatch.numel() == 0, f"tokens differ first at (row, position) {mismatch[0].tolist()}"
    diff = (logits[:, :steps] - ref_logits[:, :steps].float()).abs().max().item()
    assert diff < tolerance, f"max |logit diff| {diff:.3g} over the first {steps} steps"


def chat(rt_or_tok, conversations: list[list[dict]]) -> dict:
    """A left-padded batch from chat messages, through the bundle's own tokenizer/processor."""
    processor = getattr(rt_or_tok, "processor", rt_or_tok)
    return dict(
        processor.apply_chat_template(
            conversations,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            padding=True,
        )
    )


def staggered(submit, requests):
    """Submit (inputs, options, seed) requests one after another, each once the previous one has
    produced two tokens, so every request joins a batch that is already decoding (and requests beyond
    the bundle's rows wait their turn). `submit(inputs, generator, **options)` -> a Handle with logits.
    Returns [(tokens (b, n), logits (b, n, vocab))] in request order."""
    streams, heads = [], []
    for inputs, options, seed in requests:
        stream = iter(submit(inputs, _seeded(seed), **options))
        heads.append([next(stream), next(stream)])
        streams.append(stream)
    return [collected(head + list(stream)) for stream, head in zip(streams, heads, strict=True)]


def admitted_together(engine, submit, requests):
    """Submit (inputs, options, seed) requests so that `engine` admits them in one iteration: they are
    all in use at once whatever the machine's load (`staggered`'s joins depend on its timing). Returns
    what `staggered` returns."""
    with engine.together():
        handles = [submit(inputs, _seeded(seed), **options) for inputs, options, seed in requests]
    return [collected(handle) for handle in handles]


def _seeded(seed: int | None) -> torch.Generator | None:
    return torch.Generator().manual_seed(seed) if seed is not None else None


def collected(steps) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (b, n), logits (b, n, vocab)) of a handle's or stream's (tokens, logits) steps."""
    steps = list(steps)
    return torch.stack([t for t, _ in steps], 1), torch.stack([s for _, s in steps], 1)


def submitter(rt):
    """`staggered`'s submit over a Runtime: each request through `rt.submit`, logits kept."""

    def submit(inputs: dict, generator, **options):
        return rt.submit(**inputs, generator=generator, want_logits=True, **options)

    return submit


def lone_generate(model, inputs: dict, seed=None, **options):
    """HF eager generate of one request alone: (new tokens (b, n), raw logits (b, n, vocab))."""
    if seed is not None:
        torch.manual_seed(seed)  # HF samples from the global generator; aotpack from its own, seeded alike
    with torch.inference_mode():
        out = model.generate(**inputs, **options, output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, inputs["input_ids"].shape[1] :], torch.stack(out.logits, dim=1).float()


def assert_each_matches_lone_generate(model, plan, results) -> None:
    """Every request's tokens equal HF's for it alone; greedy ones' logits within LOGIT_ATOL."""
    for (inputs, options, seed), (tokens, logits) in zip(plan, results, strict=True):
        ref_tokens, ref_logits = lone_generate(model, inputs, seed, **options)
        where = f"{tuple(inputs['input_ids'].shape)} prompt, {options}"
        assert torch.equal(tokens, ref_tokens), where
        if seed is None:
            diff = (logits - ref_logits).abs().max().item()
            assert diff < LOGIT_ATOL, f"{where}: max |logit diff| {diff:.3g}"


GREEDY = {"max_new_tokens": 24, "min_new_tokens": 24, "do_sample": False}
SAMPLED = {"max_new_tokens": 20, "min_new_tokens": 20, "do_sample": True, "temperature": 0.9, "top_k": 30}


def rewrite_manifest(path: Path, **changes) -> None:
    """Rewrite a bundle's manifest with changed fields and a valid digest (a deliberate, consistent edit)."""
    raw = json.loads((path / MANIFEST).read_text())
    raw.pop("digest")
    raw.update(changes)
    (path / MANIFEST).write_text(json.dumps(raw | {"digest": _digest(raw)}))


# ---- threads and OpenMP teams (tests/unit/test_openmp.py, tests/bundle/test_threads.py) ----


def tasks() -> int:
    """This process's threads (OpenMP's workers included)."""
    return len(os.listdir("/proc/self/task"))


def parallel_op() -> None:
    torch.ones(4_000_000).sum()  # far above ATen's grain size: runs on the calling thread's team


def steady_tasks(quiet: float = 0.2, timeout: float = 5.0) -> int:
    """The thread count once it has not changed for `quiet` seconds (threads that were ending, ended)."""
    deadline, count, since = time.monotonic() + timeout, tasks(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.01)
        if tasks() != count:
            count, since = tasks(), time.monotonic()
    return count


def settles_at(count: int, timeout: float = 5.0) -> bool:
    """Whether the process's thread count comes down to `count` (exiting threads free their teams
    in thread-exit destructors, a moment after Python's join returns)."""
    deadline = time.monotonic() + timeout
    while tasks() != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return tasks() == count


def in_fresh_thread(body):
    """Run body() on a new thread, which starts without a team; re-raise what it raised."""
    outcome = {}

    def run():
        try:
            outcome["value"] = body()
        except BaseException as e:  # handed to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextmanager
def graphs_stepped(rt, verify: list | None = None):
    """The batch of each compiled decode graph the runtime's decode steps inside the block, in order (and
    into `verify`, each verify graph's)."""
    stepped, runs, verifies = [], rt.decode._runs, rt.decode._verifies
    rt.decode._runs = {b: (lambda inputs, b=b, run=run: stepped.append(b) or run(inputs)) for b, run in runs.items()}
    if verify is not None:
        rt.decode._verifies = {
            b: (lambda inputs, b=b, run=run: verify.append(b) or run(inputs)) for b, run in verifies.items()
        }
    try:
        yield stepped
    finally:
        rt.decode._runs, rt.decode._verifies = runs, verifies


class ScriptedDrafter:
    """The engine's drafter interface (runtime.engine.speculation.Drafter) for drafts a test scripts:
    subclasses say what to `propose`; it expects all its drafts accepted and counts what happens."""

    drafted = accepted = declines = 0

    def expected(self, drafts: int) -> float:
        return 1.0 + drafts

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted, self.accepted = self.drafted + drafted, self.accepted + accepted

    def declined(self, drafts, at: int) -> None:
        self.declines += 1


@contextmanager
def verifying_whenever_drafted(rt):
    """Inside the block the engine runs a verify step whenever a row drafts: its cost policy
    (StepCosts.pays) reads the machine's recent step times, and a test of what a verify step computes
    must not depend on how loaded the machine was (a slow verify step under CI load declined them)."""
    costs = rt.engine.costs
    costs.pays = lambda *args: True
    try:
        yield
    finally:
        del costs.pays


def prefilled_step(rt, ids, rows: int | None = None):
    """Eager prefill of one prompt `ids` (1, S), repeated in `rows` rows (default: the smallest batch the
    runtime's decode steps), into fresh cache tensors; returns the next decode call's inputs
    (token (rows, 1), position_ids, cache_position, pad_mask, kv) and the prefill's logits (rows, vocab)."""
    from runtime.model.positions import prompt_positions
    from runtime.model.prefill import prefill

    rows = rows or rt.decode.batches[0]
    ids = ids.expand(rows, -1).contiguous()  # (rows, S)
    mask = torch.ones_like(ids)
    kv = [torch.zeros_like(t[:rows]) for t in rt.kv]
    logits = prefill(rt.model, kv, rt.layout, ids, mask, prompt_positions(mask))
    seq = ids.shape[1]
    pad_mask = torch.zeros(rows, rt.manifest.max_cache_len, dtype=torch.bool)
    pad_mask[:, : seq + 1] = True
    position, cache_position = torch.full((rows, 1), seq), torch.full((rows,), seq)
    return (logits.argmax(-1)[:, None], position, cache_position, pad_mask, kv), logits


# A JSON schema a random-weight model can finish within a few dozen tokens (bounded values only), and
# that its free text essentially never matches: the structured-output tests hold replies to it.
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "ok"],
    "additionalProperties": False,
}


class WholeWords:
    """A logits processor leaving only tokens that are one space and a lowercase word: a reply the chat
    template renders back as the same tokens (a random model otherwise emits byte fragments that
    re-tokenize differently, and a session then prefills its conversation again)."""

    def __init__(self, tokenizer):
        import re

        vocab = len(tokenizer)
        words = [t for t in range(vocab) if re.fullmatch(r" [a-z]{2,}", tokenizer.decode([t]))]
        self.banned = torch.ones(vocab, dtype=torch.bool)
        self.banned[words] = False

    def __call__(self, input_ids, scores):
        return scores.masked_fill(self.banned[: scores.shape[-1]], -float("inf"))


def isa_library(path: str):
    """aotpack's kernels compiled for one instruction path and loaded without serving the eager op, or the
    test skipped, naming the CPU flags the path needs that this machine lacks."""
    import pytest

    from exporter import kernels
    from runtime.cpu import KERNEL_ISA_FLAGS, cpu_flags

    missing = KERNEL_ISA_FLAGS[path] - (cpu_flags() or set())
    if missing:
        pytest.skip(f"the {path} path needs CPU flags {sorted(missing)}, which this machine lacks")
    built = kernels.build(isa_override=path, log=lambda _: None, serve=False)
    assert built.library.isa == path
    return built.library
