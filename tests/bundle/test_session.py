"""Sessions: a conversation that keeps its KV cache between turns (`rt.session()`).

Turn 2 of each conversation must equal HF eager `generate` over the whole conversation (fresh, on the
same weights), and its prefill must process only the tokens not already in the session's row: counted
here by spying on the engine's prefill calls, not taken from the session's own report. Turn 1's reply
is restricted to whole-word tokens so that the chat template renders it back as the same tokens (a
random model otherwise emits byte fragments that re-tokenize differently, which is the case where a
session must re-prefill, tested separately).
"""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import WholeWords
from PIL import Image
from transformers import LogitsProcessorList

import runtime.engine.runner
from runtime import CacheOverflowError, InvalidInputError, RuntimeBusyError

GREEDY = {"max_new_tokens": 10, "do_sample": False}


@pytest.fixture
def prefilled(monkeypatch):
    """A list that records the number of tokens of every prefill call the engine makes."""
    calls = []
    for name in ("prefill", "prefill_states", "prefill_more"):
        real = getattr(runtime.engine.runner, name)

        def spy(model, kv, layout, ids, *args, _real=real, **kwargs):
            calls.append(ids.shape[1])
            return _real(model, kv, layout, ids, *args, **kwargs)

        monkeypatch.setattr(runtime.engine.runner, name, spy)
    return calls


def _fresh(rt, model, messages, **options) -> str:
    """HF eager generate over the whole conversation, decoded as the session decodes its replies."""
    inputs = rt.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    ids = model.generate(**inputs, **options)
    return rt.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def _two_turns(rt, model, prefilled, first, second, system=None, between=None):
    prefilled.clear()  # the bundle's export may have run under the spy (its parity check prefills)
    with rt.session(system=system) as session:
        session.send(first, logits_processor=LogitsProcessorList([WholeWords(rt.tokenizer)]), **GREEDY)
        turn1 = session.last
        assert prefilled == [turn1.prompt_tokens - 1] or prefilled == [turn1.prompt_tokens]
        held = turn1.prompt_tokens + turn1.new_tokens - 1  # the last reply token was never fed
        if between is not None:
            between()
        prefilled.clear()
        reply = session.send(second, **GREEDY)
        turn2 = session.last
        system_message = [{"role": "system", "content": system}] if system else []
        expected = _fresh(rt, model, system_message + session.messages[:-1], **GREEDY)
    assert reply == expected
    assert turn2.reused == held, "turn 1 (prompt and reply) must come from the cache"
    assert sum(prefilled) == turn2.prompt_tokens - 1 - held, "only the tokens added since turn 1 are prefilled"
    return turn2


def test_llama_turn_two_prefills_only_the_new_tokens(runtime, reference, prefilled):
    """While the session waits between turns, another request decodes in the other rows: the steps run
    over the session's parked row and must leave what it holds intact."""
    rt = runtime("tiny-llama")

    def other_request():
        ids = torch.randint(5, 200, (2, 30))
        rt.generate(ids, max_new_tokens=40, min_new_tokens=40)

    turn2 = _two_turns(
        rt, reference("tiny-llama"), prefilled, "Why is the sky blue?", "And the sea?",
        system="You are terse.", between=other_request,
    )  # fmt: skip
    assert turn2.prefilled < turn2.reused, "the new turn is the smaller part of the conversation"


def test_gemma3_text_past_the_sliding_window(runtime, reference, prefilled):
    rt = runtime("tiny-gemma3")
    window = next(layer.window for layer in rt.layout if layer.window)
    turn2 = _two_turns(rt, reference("tiny-gemma3"), prefilled, "Tell me about the sky today.", "More?")
    assert turn2.reused > 3 * window, "the conversation must have wrapped the ring buffers"


def test_vlm_image_in_turn_one_then_a_text_question(runtime, reference, prefilled):
    rt = runtime("tiny-gemma3-vlm")
    image = Image.new("RGB", (40, 30), (200, 120, 30))
    with rt.session() as session:
        session.send("Describe the image.", images=[image], logits_processor=[WholeWords(rt.tokenizer)], **GREEDY)
        turn1 = session.last
        held = turn1.prompt_tokens + turn1.new_tokens - 1
        prefilled.clear()
        reply = session.send("What colour is it?", **GREEDY)
        expected = _fresh(rt, reference("tiny-gemma3-vlm"), session.messages[:-1], **GREEDY)
        assert reply == expected
        assert session.last.reused == held
        assert sum(prefilled) == session.last.prompt_tokens - 1 - held


def test_a_reply_the_template_renders_differently_is_prefilled_again_and_still_equals_hf(runtime, reference):
    """Byte fragments re-tokenize as other tokens: reuse stops where the tokens differ (a full-attention
    cache steps back), and turn 2 still equals a fresh generate."""
    rt = runtime("tiny-llama")
    with rt.session() as session:
        session.send("Why is the sky blue?", **GREEDY)
        held = session.last.prompt_tokens + session.last.new_tokens - 1
        reply = session.send("And the sea?", **GREEDY)
        assert reply == _fresh(rt, reference("tiny-llama"), session.messages[:-1], **GREEDY)
        assert session.last.prompt_tokens - 1 > session.last.reused > 0
        assert session.last.reused <= held


def test_overflow_refuses_or_drops_the_oldest_turns(runtime, reference):
    rt = runtime("tiny-llama")
    long = "Tell me everything about the sky. " * 3  # one such turn fits the 160-slot cache, two do not
    with rt.session() as session:
        session.send(long, max_new_tokens=30, do_sample=False)
        with pytest.raises(CacheOverflowError, match="max_cache_len"):
            session.send(long, max_new_tokens=30, do_sample=False)
        assert len(session.messages) == 2, "a refused turn leaves the conversation as it was"
    sea = "Now tell me everything about the sea. " * 3
    with rt.session(drop_oldest=True) as session:
        session.send(long, max_new_tokens=30, do_sample=False)
        reply = session.send(sea, max_new_tokens=30, do_sample=False)
        assert session.last.dropped_turns == 1
        assert [m["content"] for m in session.messages] == [sea, reply]
        assert reply == _fresh(rt, reference("tiny-llama"), session.messages[:1], max_new_tokens=30, do_sample=False)


def test_a_session_holds_a_row_until_closed_and_reset_forgets(runtime):
    rt = runtime("tiny-llama")
    before = rt.engine.rows_in_use
    sessions = [rt.session() for _ in range(rt.manifest.batch_size - before)]
    with pytest.raises(RuntimeBusyError, match="each session holds one"):
        rt.session()
    for s in sessions:
        s.close()
    assert rt.engine.rows_in_use == before
    with pytest.raises(InvalidInputError, match="this session is closed"):
        sessions[0].send("hi")
    with rt.session() as session:
        session.send("Why?", **GREEDY)
        session.reset()
        assert session.messages == []
        session.send("Why?", **GREEDY)
        assert session.last.reused == 0


def test_two_sessions_in_threads_keep_apart(runtime, reference):
    """Two conversations at once, each in its own row, each equal to its fresh generate."""
    rt, model = runtime("tiny-llama"), reference("tiny-llama")
    results = {}

    def converse(name, first, second):
        with rt.session() as session:
            session.send(first, **GREEDY)
            reply = session.send(second, **GREEDY)
            results[name] = (reply, list(session.messages[:-1]))

    threads = [threading.Thread(target=converse, args=(f"s{i}", f"Question {i}?", "Why?")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for reply, messages in results.values():
        assert reply == _fresh(rt, model, messages, **GREEDY)
    assert len(results) == 2


class _Stop(Exception):
    pass


class _StopAfter:
    """A streamer that raises after `n` reply tokens: a turn interrupted mid-reply (Ctrl-C, say)."""

    def __init__(self, n: int):
        self.n, self.seen = n, -1  # the prompt comes first

    def put(self, value):
        self.seen += 1
        if self.seen >= self.n:
            raise _Stop

    def end(self):
        pass


def test_an_interrupted_turn_is_settled_before_the_next(runtime):
    """An interrupted turn only cancels its request; the next turn, sent at once, must still find what
    the row holds (it used to race with the engine's release and reuse nothing)."""
    rt = runtime("tiny-llama")
    for _ in range(5):
        with rt.session() as session:
            with pytest.raises(_Stop):
                session.send("Tell me a long story.", streamer=_StopAfter(3), max_new_tokens=100, do_sample=False)
            assert session.last.new_tokens >= 3
            session.send("Shorter.", **GREEDY)
            assert session.last.reused > 0
