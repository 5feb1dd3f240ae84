"""Continuous batching, in seconds: the engine over an eagerly run decode step (no compile).

Independent requests with different prompts, options and arrival times share the engine's rows; each
must produce exactly what a lone batch-1 HF `generate` produces for it, logits included. The compiled
bundles repeat the main cases in test_parity.py and test_vlm.py.
"""

from __future__ import annotations

import functools
import threading

import pytest
import torch
from helpers import (
    GREEDY,
    LOGIT_ATOL,
    SAMPLED,
    admitted_together,
    assert_each_matches_lone_generate,
    collected,
    lone_generate,
    staggered,
)

from runtime.engine.engine import Engine
from runtime.errors import EngineClosedError, ImageInputError, InvalidInputError, RuntimeBusyError

ROWS, CACHE = 4, 64


@pytest.fixture(scope="module")
def stand_in(eager_runtime):
    """stand_in(name) -> a Runtime of the preset over the eager backend (ROWS rows of CACHE slots), shared."""
    return functools.cache(lambda name: eager_runtime(name, ROWS, CACHE))


def _engine(rt, **options) -> Engine:
    """Another engine over the runtime's model and decode step."""
    return Engine(rt.model, rt.decode, rt.contract, **options)


def _submit(rt, inputs: dict, generator=None, engine=None, **options):
    inputs = dict(inputs)
    ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask", None)
    request = rt.request(ids, mask, generator, **inputs, **options)
    return (engine or rt.engine).submit(request, want_logits=True)


def _hf(rt, inputs: dict, seed=None, **options):
    return lone_generate(rt.model, inputs, seed, **options)


def _prompts(rt, lengths):
    torch.manual_seed(len(lengths))
    vocab = rt.tokenizer.vocab_size if rt.is_multimodal else rt.validator.vocab_size
    return [{"input_ids": torch.randint(3, min(vocab, 300), (1, n))} for n in lengths]


def _staggered(rt, plan, engine=None):
    return staggered(lambda inputs, generator, **options: _submit(rt, inputs, generator, engine, **options), plan)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_staggered_requests_each_match_a_lone_generate(stand_in, name):
    """Prompts of 3 to 29 tokens (Gemma3's window is 8: every request decodes past it), greedy and
    seeded sampling mixed, six requests over four rows."""
    bundle = stand_in(name)
    prompts = _prompts(bundle, [5, 17, 3, 29, 11, 8])
    plan = [(p, SAMPLED if i % 2 else GREEDY, 100 + i if i % 2 else None) for i, p in enumerate(prompts)]
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan))
    assert bundle.engine.peak_running >= 2  # the requests did share steps


def test_one_token_prompts_have_nothing_to_prefill_and_decode_from_their_first_step(stand_in):
    """A prompt of one token goes straight to the decode step, which feeds it; beside longer ones, and
    in rows that held other requests' tokens before."""
    bundle = stand_in("tiny-llama")
    prompts = _prompts(bundle, [1, 7, 1, 1])
    plan = [(p, GREEDY, None) for p in prompts]
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan))


def test_a_left_padded_batch_request_beside_single_requests(stand_in):
    """A request with its own left-padded batch takes adjacent rows; its rows stay HF's batch."""
    bundle = stand_in("tiny-llama")
    tok = bundle.tokenizer
    batch = dict(tok(["a b c d e f g h", "x y"], return_tensors="pt", padding=True))
    single = _prompts(bundle, [6])[0]
    plan = [(single, GREEDY, None), (batch, GREEDY, None), (single, GREEDY, None)]
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan))


def test_vlm_requests_with_images_arrive_while_others_decode(stand_in):
    from helpers import chat
    from PIL import Image

    bundle = stand_in("tiny-gemma3-vlm")
    red, blue = Image.new("RGB", (40, 30), (200, 20, 20)), Image.new("RGB", (32, 32), (10, 10, 240))

    def ask(text, *images):
        content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": text}]
        return chat(bundle.processor, [[{"role": "user", "content": content}]])

    requests = [ask("hello there"), ask("what is this", red), ask("compare", red, blue), ask("and this", blue)]
    plan = [(r, SAMPLED if i == 3 else GREEDY, 7 if i == 3 else None) for i, r in enumerate(requests)]
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan))


def test_a_cancelled_request_frees_its_rows_and_leaves_the_others_alone(stand_in):
    bundle = stand_in("tiny-gemma3")
    a, b = _prompts(bundle, [7, 12])
    long = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False}
    expected = _hf(bundle, b, **long)[0]
    cancelled, kept = _submit(bundle, a, **long), _submit(bundle, b, **long)
    stream = iter(cancelled)
    got = [next(stream) for _ in range(3)]
    cancelled.cancel()
    rest = list(stream)  # ends early: the engine stops it at its next step
    assert len(got) + len(rest) < 40
    assert torch.equal(collected(kept)[0], expected)
    _wait_idle(bundle.engine)
    assert all(owner is None for owner in bundle.engine.scheduler.owners)


def test_leaving_the_iterator_early_cancels_the_request(stand_in):
    bundle = stand_in("tiny-llama")
    handle = _submit(bundle, _prompts(bundle, [5])[0], max_new_tokens=50, min_new_tokens=50)
    for _ in handle:
        break
    assert handle.cancelled
    _wait_idle(bundle.engine)


def _items(handle, stop_after: int | None = None) -> list:
    """The handle's steps read on an asyncio loop (Handle.items, as the server reads them); with
    `stop_after`, the reader leaves after that many."""
    import asyncio
    from contextlib import aclosing

    async def read():
        got = []
        async with aclosing(handle.items()) as steps:
            async for item in steps:
                got.append(item)
                if len(got) == stop_after:
                    break
        return got

    return asyncio.run(read())


def test_an_asyncio_reader_gets_every_step_in_order_beside_a_thread_reader(stand_in):
    """Two requests decode together, one read on an asyncio loop woken by the engine's thread, one by a
    blocked thread: the same tokens and logits as each one's lone generate."""
    bundle = stand_in("tiny-llama")
    g = torch.Generator().manual_seed(123)  # prompts of their own: _prompts' would seed the prefix cache for others
    a, b = ({"input_ids": torch.randint(3, 300, (1, n), generator=g)} for n in (6, 9))
    options = {**GREEDY, "max_new_tokens": 12, "min_new_tokens": 12}
    first, second = _submit(bundle, a, **options), _submit(bundle, b, **options)
    woken, threaded = collected(_items(first)), collected(second)
    for (tokens, logits), prompt in ((woken, a), (threaded, b)):
        expected_tokens, expected_logits = _hf(bundle, prompt, **options)
        assert torch.equal(tokens, expected_tokens)
        torch.testing.assert_close(logits, expected_logits, atol=LOGIT_ATOL, rtol=0)
    assert first.finish_reasons is not None and first._state.wake is None


def test_an_asyncio_reader_that_leaves_early_cancels_and_one_that_fails_raises(stand_in, monkeypatch):
    bundle = stand_in("tiny-llama")
    prompt = {"input_ids": torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(321))}
    handle = _submit(bundle, prompt, max_new_tokens=50, min_new_tokens=50)
    assert len(_items(handle, stop_after=2)) == 2 and handle.cancelled
    _wait_idle(bundle.engine)

    def exploding(input_ids, scores):
        raise ValueError("processor exploded")

    failing = _submit(bundle, prompt, max_new_tokens=5, logits_processor=[exploding])
    with pytest.raises(ValueError, match="processor exploded"):
        _items(failing)
    _wait_idle(bundle.engine)


def test_waking_a_closed_loop_is_a_no_op():
    """The engine's thread may wake a reader whose loop has just closed: it must not raise there."""
    import asyncio

    from runtime.engine.handle import _call_soon

    loop = asyncio.new_event_loop()
    loop.close()
    _call_soon(loop, lambda: None)


def _wait_idle(engine, timeout: float = 30.0):
    done = threading.Event()

    def poll():
        while engine.load != (0, 0):
            threading.Event().wait(0.01)
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(timeout), f"engine still busy: {engine.load}"


def test_a_bad_request_is_refused_alone(stand_in):
    """NaN pixel values are refused at submit, before any model work, while another request runs."""
    from helpers import chat
    from PIL import Image

    bundle = stand_in("tiny-gemma3-vlm")
    image = Image.new("RGB", (32, 32), (90, 160, 30))
    inputs = chat(bundle.processor, [[{"role": "user", "content": [{"type": "image", "image": image}]}]])
    expected = _hf(bundle, inputs, **GREEDY)[0]
    running = _submit(bundle, inputs, **GREEDY)
    bad = dict(inputs, pixel_values=inputs["pixel_values"].clone().fill_(float("nan")))
    with pytest.raises(ImageInputError, match="NaN"):
        _submit(bundle, bad, **GREEDY)
    assert torch.equal(collected(running)[0], expected)


def test_a_request_that_fails_in_prefill_fails_alone(stand_in, monkeypatch):
    import runtime.engine.runner

    bundle = stand_in("tiny-llama")
    poison, fine = _prompts(bundle, [9, 6])
    real = runtime.engine.runner.prefill_states

    def failing(model, kv, layout, input_ids, *args, **kwargs):
        if torch.equal(input_ids, poison["input_ids"][:, :-1]):  # the prompt but its last token
            raise RuntimeError("prefill exploded")
        return real(model, kv, layout, input_ids, *args, **kwargs)

    monkeypatch.setattr(runtime.engine.runner, "prefill_states", failing)
    expected = _hf(bundle, fine, **GREEDY)[0]
    good, bad = _submit(bundle, fine, **GREEDY), _submit(bundle, poison, **GREEDY)
    with pytest.raises(RuntimeError, match="prefill exploded"):
        collected(bad)
    assert torch.equal(collected(good)[0], expected)


def test_nan_in_an_idle_row_touches_no_other_row(stand_in, monkeypatch):
    """An idle row between busy ones is stepped too; whatever it holds stays in its own row. (The engine
    would move the request in row 2 down into the freed row 1; it is kept from doing so here, so that
    row 1 stays idle while this test writes into it.)"""
    bundle = stand_in("tiny-gemma3")
    engine = bundle.engine
    monkeypatch.setattr(engine.scheduler, "_compact", lambda plan: None)
    engine.clear_prefix_cache()  # rows in order: no prefix kept by an earlier test draws a request elsewhere
    prompts = _prompts(bundle, [6, 9])
    expected = [_hf(bundle, p, **GREEDY) for p in prompts]
    with engine._cond:  # the loop plans once all three wait (a reentrant lock): one plan, rows in order
        blocker = _submit(bundle, prompts[0], **GREEDY)  # row 0
        middle = _submit(bundle, prompts[1], max_new_tokens=1)  # row 1, freed after one token
        last = _submit(bundle, prompts[1], **GREEDY)  # row 2 (not row 1 once free: it was admitted first)
    collected(middle)
    for t in engine.kv:
        t[1].fill_(float("nan"))  # row 1 is idle now, below busy row 2
    for handle, (tokens, _) in zip([blocker, last], expected, strict=True):
        ours = collected(handle)
        assert torch.equal(ours[0], tokens) and torch.isfinite(ours[1]).all()


def test_stop_strings_end_a_request_where_hf_ends_it(stand_in):
    bundle = stand_in("tiny-llama")
    tok = bundle.tokenizer
    prompt = _prompts(bundle, [8])[0]
    free = collected(_submit(bundle, prompt, max_new_tokens=30, do_sample=False))[0][0]
    stop = tok.decode(free[10:12])  # text the free run produces around its 11th token
    ours = collected(_submit(bundle, prompt, max_new_tokens=30, do_sample=False, stop_strings=[stop]))[0]
    with torch.inference_mode():
        ref = bundle.model.generate(**prompt, max_new_tokens=30, do_sample=False, stop_strings=[stop], tokenizer=tok)
    assert torch.equal(ours, ref[:, prompt["input_ids"].shape[1] :])
    assert ours.shape[1] < 30


@pytest.mark.parametrize("value", [[], [""], 5, ["ok", 3]])
def test_bad_stop_strings_are_refused(stand_in, value):
    bundle = stand_in("tiny-llama")
    with pytest.raises(InvalidInputError, match="stop_strings must be"):
        _submit(bundle, _prompts(bundle, [4])[0], max_new_tokens=3, stop_strings=value)


def test_a_request_that_finds_no_rows_in_time_fails_with_runtime_busy(stand_in):
    bundle = stand_in("tiny-llama")
    engine = _engine(bundle, busy_timeout=0.0)
    tok = bundle.tokenizer
    wide = dict(tok(["a b c"] * ROWS, return_tensors="pt"))
    hog = engine.submit(bundle.request(wide["input_ids"], max_new_tokens=60))
    late = engine.submit(bundle.request(wide["input_ids"][:1], max_new_tokens=2))
    with pytest.raises(RuntimeBusyError, match="no free cache rows"):
        late.result()
    assert hog.result().shape == (ROWS, wide["input_ids"].shape[1] + 60)


def test_close_finishes_or_cancels_what_is_in_flight_and_refuses_more(stand_in):
    bundle = stand_in("tiny-llama")
    engine = _engine(bundle)
    prompt = _prompts(bundle, [5])[0]["input_ids"]
    short = engine.submit(bundle.request(prompt, max_new_tokens=3))
    long = engine.submit(bundle.request(prompt, max_new_tokens=55, min_new_tokens=55))
    engine.close(grace=0.0)
    assert short.done and long.done
    assert len(list(long.tokens())) < 55  # cancelled, not run to its end
    with pytest.raises(EngineClosedError, match="shutting down"):
        engine.submit(bundle.request(prompt, max_new_tokens=3))


EXIT_SCRIPT = """
import sys, torch
sys.path[:0] = [{root!r}]
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from exporter.model import cache_layout
from runtime.backends.eager import EagerDecode
from runtime.engine.engine import Engine
from runtime.format.contract import DecodeContract
from runtime.generation.validate import Validator
model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2)).eval()
model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=0)
contract = DecodeContract(cache_layout(model, 512), 1, 512, "float32", "cpu")
request = Validator(model, contract, 96, lambda: None).request(torch.tensor([[5, 6, 7]]), max_new_tokens=500,
                                                               min_new_tokens=500)
handle = Engine(model, EagerDecode(model, contract), contract).submit(request)
stream = iter(handle)
next(stream)
print("exiting with a request in flight", flush=True)
"""


def test_exiting_with_a_request_in_flight_is_clean(tmp_path):
    """Without the engine's exit hook the interpreter froze its loop inside a native call and the
    process aborted ("terminate called without an active exception", status 134)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT.format(root=str(Path(__file__).parents[2])))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "in flight" in done.stdout and "terminate" not in done.stderr


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama", "tiny-gemma2", "tiny-mistral"])
@pytest.mark.parametrize("chunk", [3, 11])
def test_chunked_prefill_matches_a_lone_generate(stand_in, name, chunk):
    """Long prompts prefilled a chunk per step, continuing the cache (sliding rings of 8 included:
    chunks of 3 and of 11 straddle the window), while other requests decode. Gemma 2 runs eager
    attention, so its chunks take additive float masks."""
    bundle = stand_in(name)
    engine = _engine(bundle, prefill_chunk=chunk)
    tok = bundle.tokenizer
    padded = dict(tok(["one two three four five six", "x y z"], return_tensors="pt", padding=True))
    plan = [(p, GREEDY, None) for p in _prompts(bundle, [30, 5, 36])] + [(padded, GREEDY, None)]
    plan[1] = (plan[1][0], SAMPLED, 4)
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan, engine))


@pytest.mark.parametrize("chunk", [3, 5])
def test_chunks_in_a_ring_wider_than_the_window_still_see_only_the_window(eager_runtime, chunk):
    """A bundle with verify graphs widens each ring by k slots past the window (8 + 3 here): a chunk that
    ends inside the ring but past the window attends to the ring's slots in index order, and its mask
    still keeps each query to its last 8 tokens; later chunks wrap the ring."""
    rt = eager_runtime("tiny-gemma3", ROWS, CACHE, drafts=3)
    engine = _engine(rt, prefill_chunk=chunk)
    plan = [(p, GREEDY, None) for p in _prompts(rt, [30, 5, 11, 36])]
    assert_each_matches_lone_generate(rt.model, plan, _staggered(rt, plan, engine))


@pytest.mark.parametrize("chunk", [None, 3])
def test_prompts_with_pad_tokens_inside_and_no_mask_equal_hf_beside_decoding_rows(stand_in, chunk):
    """Without an attention_mask generate takes tiny-llama's pad id (4) for padding wherever it stands;
    such prompts, whole or in chunks of 3 that end on both sides of the pads, beside a decoding row."""
    bundle = stand_in("tiny-llama")
    pad = bundle.model.generation_config.pad_token_id
    torch.manual_seed(3)
    first, inside, left = (torch.randint(8, 300, (1, n)) for n in (9, 14, 11))
    inside[0, [2, 7, 8]] = pad
    left[0, :3] = pad
    plan = [({"input_ids": ids}, GREEDY, None) for ids in (first, inside, left)]
    engine = _engine(bundle, prefill_chunk=chunk)
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan, engine))


def test_a_prompt_that_goes_in_past_every_decoding_row_joins_at_the_next_step(stand_in, monkeypatch):
    """The step of the iteration whose piece finished a prompt that stands past every decoding row runs
    without it (it would widen that step's attention on top of the piece); it decodes from the next step.
    A prompt within the others' reach joins at once; every request still equals a lone generate."""
    import runtime.engine.runner

    bundle = stand_in("tiny-gemma3")
    engine = _engine(bundle, prefill_chunk=6)
    events, runner = [], runtime.engine.runner.Runner
    real_prefill, real_step = runner.prefill, runner.step
    monkeypatch.setattr(runner, "prefill", lambda self, p: events.append(("in", p)) or real_prefill(self, p))
    monkeypatch.setattr(
        runner,
        "step",
        lambda self, d, w: events.append(("step", {s.request.prompt_len for s in d})) or real_step(self, d, w),
    )
    plan = [(p, GREEDY, None) for p in _prompts(bundle, [20, 40, 4])]
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan, engine))
    steps_after, reach = {}, {}  # prompt length -> the next two steps' request sets after its last piece
    for i, (kind, what) in enumerate(events):
        if kind == "in" and what.end == what.state.final and what.state.request.prompt_len in (40, 4):
            following = [w for k, w in events[i + 1 :] if k == "step"][:2]
            steps_after[what.state.request.prompt_len] = following
            reach[what.state.request.prompt_len] = 20 + sum(20 in w for k, w in events[:i] if k == "step")
    # Staggered: 40 arrives once 20 has decoded 2 tokens and goes in 7 pieces, 20 then at about 29, unless
    # the machine's load held the test's thread back while 20 decoded on; the rule is checked either way
    if reach[40] < 40:  # past the others (20): one step later
        assert 40 not in steps_after[40][0] and 40 in steps_after[40][1], reach
    else:
        assert 40 in steps_after[40][0], reach
    assert 4 in steps_after[4][0]  # within their reach: at once


def test_rows_that_wait_a_step_stand_past_every_row_stepped_nearest_joining_first(stand_in):
    """Several prompts that went in together beside a decoding row: those within reach step, and each one
    that does moves the reach (it advances too); a row waits only if it then still stands past them all,
    so that the step rests it (stepped in place without advancing, it would overwrite its last prompt
    token's slot). The review's case: others at 9, joiners at 10 and 11 both step; 13 waits."""
    from types import SimpleNamespace

    from runtime.engine.status import Status

    engine = _engine(stand_in("tiny-gemma3"))
    index = engine.runner.positions.index
    states = [SimpleNamespace(rows=slice(r, r + 1), status=Status.DECODING) for r in range(4)]
    for state, at in zip(states, (9, 11, 10, 13), strict=True):
        index[state.rows] = at
    pieces = [SimpleNamespace(state=s) for s in states[1:]]
    stepped = engine._joining(states, pieces)
    assert [s.rows.start for s in stepped] == [0, 1, 2]
    active = torch.tensor([True, True, True, False])
    index += active  # the step's advance
    assert engine.runner.positions.far(active).tolist() == [3]  # the waiting row rests
    index[3] = 12
    assert len(engine._joining(states, pieces)) == 4  # 12 is within reach of 11's advance: all step
    engine.close()


@pytest.mark.parametrize("budget", [1e-6, 1e6])
def test_chunks_sized_to_a_time_budget_keep_the_tokens_and_follow_the_measured_cost(stand_in, monkeypatch, budget):
    """With a budget, each chunk's size comes from the last piece's measured time (runtime.engine.chunking):
    a budget far below what a token costs gives the smallest chunks, one far above it prefill_chunk's; the
    tokens stay a lone generate's."""
    import runtime.engine.runner
    from runtime.engine.chunking import MIN_CHUNK

    bundle = stand_in("tiny-gemma3")
    engine = _engine(bundle, prefill_chunk=12, prefill_budget=budget)
    pieces = []
    real = runtime.engine.runner.Runner.prefill
    monkeypatch.setattr(
        runtime.engine.runner.Runner, "prefill", lambda self, piece: pieces.append(piece) or real(self, piece)
    )
    plan = [(p, GREEDY, None) for p in _prompts(bundle, [5, 40])]
    assert_each_matches_lone_generate(bundle.model, plan, _staggered(bundle, plan, engine))
    long = [(p.start, p.end) for p in pieces if p.state.request.prompt_len == 40]
    assert long[0][0] == 0 and long[-1][1] == 39
    assert all(end == start for (_, end), (start, _) in zip(long, long[1:], strict=False))  # in order, no gap
    # once the short request decodes, the long prompt goes MIN_CHUNK (or 12) tokens at a time, its last
    # piece the rest
    assert len(long) >= 3 and {end - start for start, end in long[1:-1]} == {MIN_CHUNK if budget < 1 else 12}
    assert engine.prefill_chunk == 12 and engine.prefill_budget == budget
    assert engine.chunks.last is not None and engine.chunks.last[0] == long[-1][1] - long[-1][0]  # measured


def test_a_long_prompt_is_prefilled_between_decode_steps(stand_in):
    """With chunks, a running request keeps getting tokens while a long prompt is prefilled."""
    bundle = stand_in("tiny-llama")
    engine = _engine(bundle, prefill_chunk=4)
    running = engine.submit(bundle.request(torch.tensor([[5, 6, 7]]), max_new_tokens=40))
    stream = iter(running)
    next(stream)
    before = engine.steps
    long = engine.submit(bundle.request(torch.randint(3, 90, (1, 41)), max_new_tokens=2))
    long.result()
    assert engine.steps - before >= 10  # 40 prompt tokens in chunks of 4, a decode step after each
    list(stream)


def test_a_request_waiting_for_a_sessions_row_starts_as_soon_as_the_session_closes(eager_runtime):
    """Nothing runs, so the loop sleeps until the waiting request's deadline: closing the session must
    wake it (it used to sleep out the whole busy_timeout)."""
    import time

    rt = eager_runtime("tiny-llama", rows=1, cache=CACHE)
    session = rt.session()
    start = time.monotonic()
    handle = rt.submit(torch.tensor([[5, 6, 7]]), max_new_tokens=2)
    threading.Timer(0.3, session.close).start()
    assert handle.result().shape == (1, 5)
    assert time.monotonic() - start < 30  # not the 300 s busy_timeout


def test_a_failure_of_the_loop_itself_fails_its_requests_and_the_next_starts_a_new_loop(stand_in, monkeypatch):
    bundle = stand_in("tiny-llama")
    engine = _engine(bundle)
    real = engine.scheduler.plan

    def broken(now):
        monkeypatch.setattr(engine.scheduler, "plan", real)  # once
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine.scheduler, "plan", broken)
    handle = engine.submit(bundle.request(torch.tensor([[5, 6, 7]]), max_new_tokens=2))
    with pytest.raises(RuntimeError, match="scheduler bug"):
        handle.result()
    assert engine.submit(bundle.request(torch.tensor([[5, 6, 7]]), max_new_tokens=2)).result().shape == (1, 5)


def test_the_engine_steps_the_smallest_graph_that_covers_the_rows_in_use(eager_runtime):
    """A bundle with graphs for 1, 4 and 8 of its 8 rows: one request steps 1 row, three step 4, five
    step 8, never a batch without a graph; each request still matches HF alone (the rows stepped
    beyond those in use change nothing)."""
    rt = eager_runtime("tiny-llama", rows=8, cache=CACHE)
    rt.decode.batches = (1, 4, 8)  # as a compiled bundle exported with --batch-buckets 1,4,8 has them
    stepped, step = [], rt.decode.step
    rt.decode.step = lambda *inputs: stepped.append(inputs[0].shape[0]) or step(*inputs)
    for count, widest in ((1, 1), (3, 4), (5, 8)):
        stepped.clear()
        plan = [(p, GREEDY, None) for p in _prompts(rt, [4 + 3 * i for i in range(count)])]
        results = admitted_together(rt.engine, lambda inputs, generator, **o: _submit(rt, inputs, generator, **o), plan)
        assert_each_matches_lone_generate(rt.model, plan, results)
        assert set(stepped) <= {1, 4, 8} and max(stepped) == widest, (count, sorted(set(stepped)))


def test_covering_refuses_a_width_no_graph_covers():
    from runtime.engine.runner import covering

    assert [covering((1, 4, 8), w, 8) for w in range(1, 9)] == [1, 4, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError, match="none covers 5 of this cache's 4"):
        covering((1, 4, 8), 5, 4)


def test_a_request_left_alone_in_a_high_row_moves_down_and_steps_the_batch_1_graph(eager_runtime):
    """Two requests in rows 0 and 1; the first ends early, so the second moves into row 0 (its cache,
    positions and next token with it) and the steps that follow compute one row, not two. Its tokens
    and logits still match HF's for it alone."""
    rt = eager_runtime("tiny-gemma3", rows=8, cache=CACHE)  # sliding window 8: the move carries a ring
    rt.decode.batches = (1, 2, 8)
    stepped, step = [], rt.decode.step
    rt.decode.step = lambda *inputs: stepped.append(inputs[0].shape[0]) or step(*inputs)
    short, long = _prompts(rt, [5, 7])
    plan = [(short, GREEDY | {"max_new_tokens": 4, "min_new_tokens": 4}, None), (long, GREEDY, None)]
    with rt.engine.together():  # admitted in one iteration: they share steps whatever the threads' timing
        handles = [_submit(rt, inputs, **options) for inputs, options, _ in plan]
    assert_each_matches_lone_generate(rt.model, plan, [collected(h) for h in handles])
    assert 2 in stepped and stepped[-1] == 1 and stepped.count(1) > GREEDY["max_new_tokens"] // 2


@pytest.mark.parametrize("chunk", [None, 3])
def test_num_return_sequences_prefills_each_prompt_once_and_copies_its_rows(eager_runtime, monkeypatch, chunk):
    """Two prompts x 2 sampled sequences: the prefill runs over the 2 prompts, not 4 rows, whole or in
    chunks, and every sequence is what HF generate samples for it (the same seed)."""
    import runtime.engine.runner

    rt = eager_runtime("tiny-llama", rows=4, cache=64, prefill_chunk=chunk)
    seen = []
    for name in ("prefill_states", "prefill_more"):
        real = getattr(runtime.engine.runner, name)
        monkeypatch.setattr(
            runtime.engine.runner,
            name,
            lambda m, kv, layout, ids, *a, real=real, **k: (
                seen.append(ids.shape[0]) or real(m, kv, layout, ids, *a, **k)
            ),
        )
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    options = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": True, "num_return_sequences": 2}
    expected, _ = lone_generate(rt.model, inputs, 7, **options)
    torch.manual_seed(7)
    ours = rt.generate(**inputs, **options)[:, 9:]
    assert torch.equal(ours, expected)
    assert seen and set(seen) == {2}, seen  # each prefill call saw the 2 prompts, never the 4 rows
