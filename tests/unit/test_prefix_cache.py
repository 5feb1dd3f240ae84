"""The prefix cache, in seconds: the engine over an eagerly run decode step (no compile).

A finished request's row keeps its tokens; a later prompt starting the same way prefills only the rest.
Whatever it reuses, every request must produce exactly what a lone HF `generate` produces for it,
logits included, and it reuses only what is valid: within Gemma 3's ring (a window of 8 here) and with
the same images.
"""

from __future__ import annotations

import pytest
import torch
from helpers import GREEDY, assert_each_matches_lone_generate, chat, collected

from runtime.backends.base import checked_each_call
from runtime.engine.engine import Engine

ROWS, CACHE = 2, 96
SHORT = {"max_new_tokens": 3, "min_new_tokens": 3, "do_sample": False}


@pytest.fixture(scope="module")
def runtimes(eager_runtime):
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = eager_runtime(name, ROWS, CACHE)
        return cache[name]

    return get


def _run(rt, engine: Engine, requests: list[tuple[dict, dict]]) -> list[int]:
    """Each request alone, one after another on `engine`: its tokens and logits equal a lone HF generate;
    returns how many prompt tokens each found in the cache."""
    reused = []
    for inputs, options in requests:
        inputs = dict(inputs)
        ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask", None)
        handle = engine.submit(rt.request(ids, mask, None, **inputs, **options), want_logits=True)
        tokens, logits = zip(*handle, strict=True)
        result = (torch.stack(tokens, dim=1), torch.stack(logits, dim=1))
        given = {"input_ids": ids} | ({"attention_mask": mask} if mask is not None else {})
        assert_each_matches_lone_generate(rt.model, [(given | inputs, options, None)], [result])
        reused.append(handle.cached_tokens)
    return reused


def _ids(*parts) -> dict:
    return {"input_ids": torch.cat([torch.as_tensor(p).reshape(1, -1) for p in parts], dim=1)}


def _history(rt, inputs: dict, options: dict) -> torch.Tensor:
    """The tokens a row keeps after `inputs`: the prompt and what was generated, all but the last (1, T)."""
    with torch.inference_mode():
        out = rt.model.generate(**inputs, **options)
    return out[:, :-1]


def test_a_prompt_sharing_a_finished_requests_prefix_prefills_only_the_rest(runtimes):
    rt = runtimes("tiny-llama")
    torch.manual_seed(0)
    system, first, second = (torch.randint(8, 300, (n,)) for n in (12, 5, 7))
    a = _ids(system, first)
    continued = _ids(_history(rt, a, GREEDY), second)  # the conversation's next turn
    requests = [(a, GREEDY), (_ids(system, second), GREEDY), (continued, GREEDY), (a, GREEDY)]
    reused = _run(rt, Engine(rt.model, rt.decode, rt.contract), requests)
    # the shared system prompt; then the whole of the first request's row (prompt and reply, 17 + 23);
    # then the same prompt again: all but its last token, which the decode step takes
    assert reused == [0, 12, 40, 16]


def test_the_same_ids_under_another_mask_are_another_prefix(runtimes):
    """A row holds keys computed under its prompt's mask: the same ids with their first two tokens as
    padding (an explicit mask, or none: generate then takes the pad id for padding) hold other keys at
    other positions. A prompt reuses a kept row only as far as both ids and mask agree."""
    rt = runtimes("tiny-llama")
    pad = rt.model.generation_config.pad_token_id
    torch.manual_seed(2)
    ids = _ids([pad, pad], torch.randint(8, 300, (10,)))
    ones = ids | {"attention_mask": torch.ones_like(ids["input_ids"])}
    padded = ids | {"attention_mask": (ids["input_ids"] != pad).long()}
    engine = Engine(rt.model, rt.decode, rt.contract)
    assert _run(rt, engine, [(ones, SHORT), (padded, SHORT), (ids, SHORT)]) == [0, 0, 11]


def test_without_the_prefix_cache_every_prompt_is_prefilled_whole(runtimes):
    rt = runtimes("tiny-llama")
    a = _ids(torch.arange(8, 25))  # past every special token id
    assert _run(rt, Engine(rt.model, rt.decode, rt.contract, prefix_cache=False), [(a, SHORT), (a, SHORT)]) == [0, 0]


def test_gemma3s_ring_is_reused_only_where_it_still_holds_the_prefix(runtimes):
    """A window of 8: a row that has held 8 tokens or more has overwritten its oldest, so it serves only
    a prompt extending all it holds (past the window, the logits still equal HF's); a row that has held
    fewer serves any shared prefix."""
    rt = runtimes("tiny-gemma3")
    torch.manual_seed(1)
    head, tail = torch.randint(8, 300, (6,)), torch.randint(8, 300, (5,))
    a = _ids(head, tail)
    engine = Engine(rt.model, rt.decode, rt.contract)
    continued = _ids(_history(rt, a, GREEDY), tail)
    assert _run(rt, engine, [(a, GREEDY), (_ids(head, tail.flip(0)), GREEDY), (continued, GREEDY)]) == [0, 0, 34]
    small = Engine(rt.model, rt.decode, rt.contract)
    short = _ids(head[:3])  # 3 tokens and 3 new: the row holds 5, inside the window
    assert _run(rt, small, [(short, SHORT), (_ids(head[:3], tail), SHORT)]) == [0, 3]


def test_a_prefix_holding_an_image_is_reused_only_with_the_same_image(runtimes):
    """The image's placeholder tokens are the same for every image: a prompt extending all a row holds
    reuses it with the same pixels, and is prefilled whole with other pixels."""
    from PIL import Image

    rt = runtimes("tiny-gemma3-vlm")
    red, blue = Image.new("RGB", (40, 30), (200, 20, 20)), Image.new("RGB", (32, 32), (10, 10, 240))
    content = [{"type": "image", "image": red}, {"type": "text", "text": "what is this"}]
    first = chat(rt.processor, [[{"role": "user", "content": content}]])
    held = _history(rt, first, SHORT)  # (1, T): what the row keeps

    def continued(image) -> dict:
        pixels = rt.processor.image_processor(image, return_tensors="pt")["pixel_values"]
        grown = {"input_ids": torch.cat([held, held[:, -1:]], dim=1), "pixel_values": pixels}
        grown["attention_mask"] = torch.ones_like(grown["input_ids"])
        if "token_type_ids" in first:
            grown["token_type_ids"] = (grown["input_ids"] == rt.model.config.image_token_id).long()
        return grown

    reused = _run(rt, Engine(rt.model, rt.decode, rt.contract), [(first, SHORT), (continued(blue), SHORT),
                                                                 (continued(red), SHORT)])  # fmt: skip
    assert reused == [0, 0, held.shape[1]]


def test_requests_admitted_together_into_a_full_cache_each_reuse_their_own_prefix(eager_runtime):
    """Four rows keep prefixes and four requests that each share part of one arrive at once: their copies
    and the trades that make room for them are carried out in the order the scheduler planned them (a
    trade for a later request moved an earlier one's copy source first, and it started from another
    prompt's cache: wrong from its first token; SmolLM2 at 8 streams found it)."""
    rt = eager_runtime("tiny-llama", rows=8, cache=96)
    torch.manual_seed(11)
    shared = [torch.randint(3, 300, (1, 12)) for _ in range(4)]
    with rt.engine.together():  # at once, so each keeps its own row
        first = [rt.submit(ids, **SHORT) for ids in shared]
    for handle in first:
        handle.result()
    later = [torch.cat([ids[:, :8], torch.randint(3, 300, (1, 3))], 1) for ids in reversed(shared)]
    with rt.engine.together():
        handles = [rt.submit(ids, want_logits=True, **SHORT) for ids in later]
    results = [tuple(torch.stack(x, dim=1) for x in zip(*h, strict=True)) for h in handles]
    plan = [({"input_ids": ids}, SHORT, None) for ids in later]
    assert_each_matches_lone_generate(rt.model, plan, results)
    assert [h.cached_tokens for h in handles] == [8] * 4


def _bucketed(eager_runtime):
    """Four rows stepped by graphs of 1 or 4 rows, as a bundle's batch buckets: two requests step all four."""
    rt = eager_runtime("tiny-llama", rows=4, cache=160)
    rt.decode.batches = (1, 4)
    return rt


LONG = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False}


def test_a_kept_prefix_far_past_the_running_requests_stays_and_does_not_widen_their_steps(eager_runtime):
    """Every row of a step attends up to the furthest row's index. A long prompt kept in a row the step's
    graph covers stands far past two short requests: for their steps it rests at index 0 (what the steps
    write to its slot 0 put back after), so they attend only as far as they reach, and it stays kept: a
    later prompt sharing it prefills only the rest and gets a lone generate's tokens and logits, as do
    the short requests. (Stepped where it stood, it had made each of 7 short streams' steps attend over a
    516-token prompt: 30 ms instead of 20, Gemma 3 270M int8; it used to be forgotten instead.)"""
    rt = _bucketed(eager_runtime)
    widths, runner = [], rt.engine.runner
    runner.decode = _Spy(runner.decode, widths)
    torch.manual_seed(12)
    short, long = [torch.randint(10, 300, (1, 5)) for _ in range(2)], torch.randint(10, 300, (1, 104))
    first = rt.submit(short[0], want_logits=True, **LONG)  # row 0
    stream = iter(first)
    head = [next(stream)]
    rt.submit(long, **SHORT).result()  # row 1, kept when it ends
    kept = rt.engine.scheduler.kept
    assert [k.length for k in kept.values()] == [106]
    widths.clear()
    second = rt.submit(short[1], want_logits=True, **LONG)  # row 1: the kept prefix moves up, into graph 4
    other = iter(second)
    steps = [head + list(stream), [next(other)] + list(other)]
    assert 106 in [k.length for k in kept.values()]  # still kept (beside the short ones, ended)
    assert widths and max(widths) <= 5 + 40 + 1  # the short requests' own reach, not the kept prompt's
    results = [tuple(torch.stack(x, dim=1) for x in zip(*s, strict=True)) for s in steps]
    plan = [({"input_ids": ids}, LONG, None) for ids in short]
    assert_each_matches_lone_generate(rt.model, plan, results)
    again = _ids(long, torch.randint(10, 300, (1, 6)))
    handle = rt.engine.submit(rt.request(again["input_ids"], None, None, **SHORT), want_logits=True)
    tokens, logits = zip(*handle, strict=True)
    assert handle.cached_tokens == 104
    result = (torch.stack(tokens, dim=1), torch.stack(logits, dim=1))
    assert_each_matches_lone_generate(rt.model, [(again, SHORT, None)], [result])


class _Spy:
    """A decode step that records how many cache indices each call attends to (its pad mask's width)."""

    def __init__(self, decode, widths: list[int]):
        self.decode, self.widths = decode, widths

    def __call__(self, tokens, position, index, pad_mask, kv):
        self.widths.append(pad_mask.shape[1])
        return self.decode(tokens, position, index, pad_mask, kv)

    def bind(self, *tensors):  # every step through __call__
        return checked_each_call(self, *tensors)

    def __getattr__(self, name):
        return getattr(self.decode, name)


def test_a_kept_prefix_not_much_longer_than_the_running_ones_stays(eager_runtime):
    rt = _bucketed(eager_runtime)
    torch.manual_seed(13)
    first = iter(rt.submit(torch.randint(10, 300, (1, 30)), **LONG))  # row 0
    next(first)
    rt.submit(torch.randint(10, 300, (1, 20)), **SHORT).result()  # row 1, kept
    second = iter(rt.submit(torch.randint(10, 300, (1, 5)), **LONG))  # row 1; the prefix moves up, into graph 4
    next(second)
    assert [k.length for k in rt.engine.scheduler.kept.values()] == [22]
    list(first), list(second)


def test_a_copied_prefix_waiting_for_its_first_chunk_keeps_what_it_holds(eager_runtime):
    """Prompts a chunk at a time while another request decodes: of two requests admitted together that
    copy a kept prefix into idle rows, the second waits steps for its first chunk. Those steps write its
    row's parked slot, which must be one its prompt's rest overwrites, not the copied prefix's first (an
    idle row is parked at 0): `aotpack serve` (chunked) answered 3 of 8 Gemma 3 prompts wrongly after a
    request sharing their first tokens."""
    rt = eager_runtime("tiny-llama", rows=4, cache=96, prefill_chunk=4)
    rt.decode.batches = (4,)  # one graph for every row, as a bundle's default: each step writes every row
    torch.manual_seed(5)
    shared, running = torch.randint(3, 300, (1, 8)), torch.randint(3, 300, (1, 6))
    rt.submit(torch.cat([shared, torch.randint(3, 300, (1, 4))], 1), **SHORT).result()  # kept in row 0
    decoding = iter(rt.submit(running, want_logits=True, **GREEDY))  # takes row 0; the prefix moves up
    head = [next(decoding)]
    later = [torch.cat([shared, torch.randint(3, 300, (1, 9))], 1) for _ in range(2)]
    with rt.engine.together():
        handles = [rt.submit(ids, want_logits=True, **SHORT) for ids in later]
    results = [collected(h) for h in handles] + [collected(head + list(decoding))]
    plan = [({"input_ids": ids}, SHORT, None) for ids in later] + [({"input_ids": running}, GREEDY, None)]
    assert_each_matches_lone_generate(rt.model, plan, results)
    assert [h.cached_tokens for h in handles] == [8, 8]


def test_a_ring_wider_than_its_window_is_reused_partly_only_below_the_window():
    """With speculation a ring has window + k slots, and a verify step beside a parked row writes its next
    k + 1 slots: once the row has held `window` tokens those writes wrap onto its oldest slots. So a row
    that held window tokens or more serves only prompts extending all it holds (Gemma 3, window 512,
    k = 4: a row keeping 514 tokens had its first slots overwritten, and a prompt sharing its first 500
    read them)."""
    from runtime.engine.prefix import reusable
    from runtime.format.layout import FULL, SLIDING, LayerLayout

    layout = (LayerLayout(SLIDING, 8 + 3, 8, 1, 4), LayerLayout(FULL, 64, None, 1, 4))
    for held, expected in ((7, 5), (8, 0), (10, 0)):
        kept = torch.arange(10, 10 + held)[None]  # (1, held)
        prompt = torch.cat([kept[:, :5], torch.tensor([[99, 98]])], 1)  # shares 5 of them, then differs
        assert reusable(kept, prompt, torch.ones_like(prompt), layout, None) == expected, held
    extends = torch.cat([kept, torch.tensor([[99, 98]])], 1)  # all it holds and more: still reusable
    assert reusable(kept, extends, torch.ones_like(extends), layout, None) == 10
