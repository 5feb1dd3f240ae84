"""Why a request ended, for each way it can end: recorded by the engine per sequence, returned by
`generate(return_dict_in_generate=True)` as `finish_reasons`, and reported by the server as OpenAI's
`finish_reason` (on the eager backend: seconds)."""

from __future__ import annotations

import functools
import logging
import threading

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteria

from runtime.engine.status import FinishReason
from runtime.errors import InvalidInputError
from runtime.serve.choices import TextStream

PROMPT = torch.tensor([[5, 17, 40, 9, 66, 31, 8]])


@pytest.fixture(scope="module")
def rt(eager_runtime):
    return eager_runtime("tiny-llama", rows=4, cache=64)


@functools.cache
def _free(rt, new: int = 12) -> list[int]:
    """The greedy continuation with no eos at all."""
    ids = rt.generate(PROMPT, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return ids[0, PROMPT.shape[1] :].tolist()


def _stop_string(rt) -> str:
    """Text the free continuation produces that HF's StopStringCriteria stops at (a random model makes
    byte tokens too, whose text alone is not a whole character)."""
    free = _free(rt)
    for k in range(2, len(free) - 2):
        stop = rt.tokenizer.decode(free[k : k + 2])
        if stop.strip() and "\ufffd" not in stop:
            ids = rt.model.generate(
                PROMPT, max_new_tokens=12, do_sample=False, stop_strings=[stop], tokenizer=rt.tokenizer
            )
            if ids.shape[1] < PROMPT.shape[1] + 12:
                return stop
    pytest.fail("no stop string found in the free continuation")


def _reasons(rt, inputs=PROMPT, **options):
    out = rt.generate(inputs, do_sample=False, return_dict_in_generate=True, **options)
    return out.sequences[:, PROMPT.shape[1] :], out.finish_reasons


def test_length(rt):
    tokens, reasons = _reasons(rt, max_new_tokens=5, min_new_tokens=5)
    assert tokens.shape[1] == 5 and reasons == (FinishReason.LENGTH,) and reasons[0] == "length"


def test_an_eos_token(rt):
    free = _free(rt)
    eos = free[3]
    tokens, reasons = _reasons(rt, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    assert tokens[0].tolist() == free[: free.index(eos) + 1] and reasons == (FinishReason.EOS,)


def test_a_stop_string(rt):
    tokens, reasons = _reasons(rt, max_new_tokens=12, stop_strings=[_stop_string(rt)])
    assert tokens.shape[1] < 12 and reasons == (FinishReason.STOP_STRING,)


def test_max_time(rt):
    tokens, reasons = _reasons(rt, max_new_tokens=40, max_time=0.0)
    assert tokens.shape[1] == 1 and reasons == (FinishReason.TIME,)


def test_a_callers_stopping_criterion(rt):
    class AfterThree(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= PROMPT.shape[1] + 3)

    tokens, reasons = _reasons(rt, max_new_tokens=12, stopping_criteria=[AfterThree()])
    assert tokens.shape[1] == 3 and reasons == (FinishReason.CRITERION,)


def test_a_callers_criterion_may_answer_one_bool_for_every_row(rt):
    """HF's StoppingCriteriaList ors a criterion's answer into a (batch,) tensor, so a plain bool works there."""

    class AfterTwo(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids.shape[1] >= PROMPT.shape[1] + 2

    two = torch.cat([PROMPT, PROMPT])
    tokens, reasons = _reasons(rt, two, max_new_tokens=12, stopping_criteria=[AfterTwo()])
    assert tokens.shape[1] == 2 and reasons == (FinishReason.CRITERION, FinishReason.CRITERION)
    expected = rt.model.generate(two, max_new_tokens=12, do_sample=False, stopping_criteria=[AfterTwo()])
    assert torch.equal(tokens, expected[:, PROMPT.shape[1] :])


@pytest.mark.parametrize(
    "answer", [torch.zeros(3, dtype=torch.bool), torch.zeros(2, 1, dtype=torch.bool)], ids=["(3,)", "(2, 1)"]
)
def test_a_criterion_answering_in_another_shape_fails_its_request_with_why(rt, answer):
    """A (b, 1) answer (`input_ids[:, -1:] == eos`, say) would read as one list per row, each one true."""

    class Other(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return answer

    two = torch.cat([PROMPT, PROMPT])
    shape = str(tuple(answer.shape)).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(InvalidInputError, match=f"answered with shape {shape} for a 2-row request; it must answer"):
        rt.generate(two, max_new_tokens=4, stopping_criteria=[Other()])
    assert len(_free(rt, 3)) == 3  # the engine goes on


@pytest.mark.parametrize("answer", [(True, True), [True, True], torch.tensor([True])], ids=["tuple", "list", "(1,)"])
def test_a_criterion_may_answer_a_tuple_a_list_or_one_value_for_all(rt, answer):
    class Given(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return answer

    tokens, reasons = _reasons(rt, torch.cat([PROMPT, PROMPT]), max_new_tokens=4, stopping_criteria=[Given()])
    assert tokens.shape[1] == 1 and reasons == (FinishReason.CRITERION, FinishReason.CRITERION)


def test_each_row_of_a_batch_has_its_own_reason(rt):
    """Row 0 meets the eos early and is padded after it, as HF pads; row 1 runs to the length."""
    free = _free(rt)
    other = torch.tensor([[5, 17, 40, 9, 66, 31, 3]])
    eos = free[2]
    assert eos not in rt.generate(other, max_new_tokens=8, do_sample=False)[0, PROMPT.shape[1] :].tolist()
    tokens, reasons = _reasons(rt, torch.cat([PROMPT, other]), max_new_tokens=8, eos_token_id=eos, pad_token_id=0)
    assert reasons == (FinishReason.EOS, FinishReason.LENGTH)
    assert tokens[0, 3:].eq(0).all()  # the finished row is padded


def test_cancelled(rt):
    handle = rt.submit(PROMPT, max_new_tokens=50, min_new_tokens=50)
    stream = iter(handle)
    next(stream)
    handle.cancel()
    list(stream)
    handle.wait()
    assert handle.finish_reasons == (FinishReason.CANCELLED,)


def test_failed(rt, monkeypatch):
    import runtime.engine.runner

    def boom(*args, **kwargs):
        raise RuntimeError("prefill exploded")

    monkeypatch.setattr(runtime.engine.runner, "prefill_states", boom)
    rt.engine.clear_prefix_cache()  # else the prompt's earlier run leaves it in a row: no prefill to fail
    handle = rt.submit(PROMPT, max_new_tokens=4)
    with pytest.raises(RuntimeError, match="exploded"):
        handle.result()
    assert handle.finish_reasons == (FinishReason.FAILED,)


def test_a_bug_in_the_engines_loop_fails_its_requests_is_logged_and_the_next_request_runs(rt, monkeypatch, caplog):
    """An exception of the engine's own (not a request's) ends its loop: every request it held fails with
    it, it goes to the log, no exception escapes the thread (threading.excepthook), and a new loop serves
    the next request."""
    carry_out = rt.engine._carry_out

    def once(plan):
        monkeypatch.setattr(rt.engine, "_carry_out", carry_out)
        raise RuntimeError("engine bug")

    monkeypatch.setattr(rt.engine, "_carry_out", once)
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    with caplog.at_level(logging.ERROR, logger="aotpack.engine"):
        handle = rt.submit(PROMPT, max_new_tokens=4)
        with pytest.raises(RuntimeError, match="engine bug"):
            handle.result()
    assert handle.finish_reasons == (FinishReason.FAILED,) and not escaped
    assert "engine bug" in caplog.text
    assert rt.submit(PROMPT, max_new_tokens=4).result().shape[1] == PROMPT.shape[1] + 4


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"max_new_tokens": 4}, "length"),
        ({"max_new_tokens": 12, "max_time": 0.0}, "length"),
        ("eos", "stop"),
        ("stop string", "stop"),
    ],
)
def test_the_servers_finish_reason_comes_from_the_engine(rt, options, expected):
    """What `aotpack serve` reports (runtime.serve.choices.TextStream over the request's handle)."""
    free = _free(rt)
    stops = None
    if options == "eos":
        options = {"max_new_tokens": 12, "eos_token_id": free[3], "pad_token_id": 0}
    elif options == "stop string":
        stops = [_stop_string(rt)]
        options = {"max_new_tokens": 12, "stop_strings": stops}
    handle = rt.submit(PROMPT, do_sample=False, **options)
    text = TextStream(rt.tokenizer, handle, stops)
    list(text)
    assert text.finish_reason == expected


def test_finish_reasons_are_unset_until_the_request_ends(rt):
    handle = rt.submit(PROMPT, max_new_tokens=30, min_new_tokens=30, generation_config=GenerationConfig())
    stream = iter(handle)
    next(stream)
    assert handle.finish_reasons is None
    list(stream)
    assert handle.finish_reasons == (FinishReason.LENGTH,)


@pytest.mark.parametrize("positions", [None, 9])
def test_hfs_length_and_eos_criteria_read_in_python_answer_as_they_do(positions):
    """The engine reads transformers' own MaxLengthCriteria and EosTokenCriteria without calling them
    (RequestState._stop): at every length around the limit and the model's positions, for tokens in and out
    of the eos ids, each row's answer is the criterion's own; the criterion itself runs only short of its
    limit past the model's positions, where it warns."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    from runtime.engine import request

    length_criterion, eos_criterion = MaxLengthCriteria(12, positions), EosTokenCriteria([3, 7])
    assert request._eos_ids(length_criterion) is None and request._eos_ids(eos_criterion) == {3, 7}
    for length in range(6, 16):
        history = torch.randint(0, 10, (3, length))
        history[:, -1] = torch.tensor([3, 4, 7])
        assert [t in request._eos_ids(eos_criterion) for t in history[:, -1].tolist()] == eos_criterion(
            history, None
        ).tolist()
        if request._quiet(length_criterion, length):
            assert [length >= 12] * 3 == length_criterion(history, None).tolist()
        else:  # short of the limit, past the model's positions: the criterion itself runs (and warns)
            assert positions is not None and positions < length < 12


def test_a_rows_tokens_are_padded_only_after_it_ended():
    """Rows that all run keep their tokens untouched (no pad step); once one ends, its tokens are the pad id."""
    from runtime.engine import request

    state = request.RequestState.__new__(request.RequestState)
    state.finish_reasons = [None, None]
    assert state.all_running
    state.finish_reasons = [FinishReason.EOS, None]
    assert not state.all_running
    state.finish_reasons = [FinishReason.EOS, FinishReason.LENGTH]
    assert not state.all_running


def _hf_like_criteria(rng, prompt: int):
    """One of the criteria a request may carry: HF's own (eos ids as a list, a 0-d tensor; a length with or
    without the model's positions, past which it warns), subclasses of them (called, not read), or a
    caller's criterion answering per row or once for all."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    class CallersEos(EosTokenCriteria):
        pass

    class CallersLength(MaxLengthCriteria):
        pass

    class Caller(StoppingCriteria):
        def __init__(self, mode):
            self.mode = mode

        def __call__(self, input_ids, scores, **kwargs):
            last = input_ids[:, -1]
            return last % 5 == 0 if self.mode == 0 else bool(input_ids.shape[1] % 7 == 0)

    pool = [
        lambda: EosTokenCriteria(rng.sample(range(10), rng.randint(1, 3))),
        lambda: EosTokenCriteria(torch.tensor(rng.randrange(10))),
        lambda: MaxLengthCriteria(prompt + rng.randint(1, 12), rng.choice([None, prompt + 2, prompt + 20])),
        lambda: CallersEos([rng.randrange(10)]),
        lambda: CallersLength(prompt + rng.randint(1, 12)),
        lambda: Caller(rng.randrange(2)),
    ]
    return rng.choice(pool)()


def test_each_step_ends_and_pads_the_rows_hfs_loop_does():
    """RequestState.choose against generate's own loop (`unfinished &= ~criteria(input_ids)`, finished rows
    fed the pad id where an eos criterion exists), over random requests of 1-4 rows with mixes of HF's length
    and eos criteria (read in Python), their subclasses and a caller's (called): the same tokens and the same
    rows ended at every step, each with the most telling reason."""
    import random

    from transformers import StoppingCriteriaList
    from transformers.generation import LogitsProcessorList

    from runtime.engine import request

    rng = random.Random(0)
    logging.disable(logging.WARNING)  # MaxLengthCriteria warns past the model's positions
    try:
        for _ in range(300):
            b, prompt, pad = rng.randint(1, 4), rng.randint(1, 6), rng.choice([0, 3, 9])
            criteria = StoppingCriteriaList(_hf_like_criteria(rng, prompt) for _ in range(rng.randint(1, 4)))
            ids = torch.zeros(b, prompt, dtype=torch.long)
            state = request.RequestState(
                request.Request(
                    ids, torch.ones_like(ids), {}, GenerationConfig(do_sample=False, max_new_tokens=100), (), pad,
                    None, LogitsProcessorList(), criteria,
                )
            )  # fmt: skip
            history, unfinished = ids, torch.ones(b, dtype=torch.bool)
            pads = any(hasattr(c, "eos_token_id") for c in criteria)
            while not state.done and history.shape[1] < prompt + 15:
                raw = torch.tensor([rng.randrange(10) for _ in range(b)])
                token = state.choose(torch.zeros(b, 10), argmax=raw)
                expected = torch.where(unfinished, raw, torch.full_like(raw, pad)) if pads else raw
                history = torch.cat([history, expected[:, None]], dim=-1)
                hits = [(request.reason_of(c), torch.as_tensor(c(history, None)).expand(b)) for c in criteria]
                ended = unfinished & criteria(history, None)  # rows this step ends: generate keeps unfinished & ~them
                unfinished = unfinished & ~ended
                assert torch.equal(token, expected)
                assert [why is None for why in state.finish_reasons] == unfinished.tolist()
                for row in ended.nonzero().flatten().tolist():  # the most telling of the reasons that hit it
                    why = next(r for r in request._PRIORITY if any(r == reason and hit[row] for reason, hit in hits))
                    assert state.finish_reasons[row] == why
    finally:
        logging.disable(logging.NOTSET)
