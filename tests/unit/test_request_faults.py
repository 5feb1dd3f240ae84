"""A request's own faults stay its own: what its code raises, a distribution that overflows, a turn a
session cannot run. Each fails that request with a specific error; the engine, and every other request,
carry on. On the eager backend (seconds)."""

from __future__ import annotations

import pytest
import torch
from helpers import GREEDY
from transformers import LogitsProcessor, LogitsProcessorList

from runtime.errors import EngineClosedError, InvalidInputError

IDS = torch.tensor([[5, 6, 7]])
SHORT = {**GREEDY, "max_new_tokens": 4, "min_new_tokens": 4}


@pytest.fixture(scope="module")
def rt(eager_runtime):
    return eager_runtime("tiny-llama", rows=2, cache=64)


class _Raises(LogitsProcessor):
    def __init__(self, error: BaseException):
        self.error = error

    def __call__(self, input_ids, scores):
        raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt("from a processor"), SystemExit(3), ValueError("bad")])
def test_what_a_requests_code_raises_fails_that_request_alone(rt, error):
    """Even KeyboardInterrupt and SystemExit: they used to end the engine's loop, failing every request
    it held, another one running beside it included."""
    expected = rt.generate(IDS, **SHORT)
    beside = rt.submit(IDS, **{**SHORT, "max_new_tokens": 12, "min_new_tokens": 12})
    with pytest.raises(type(error)):
        rt.generate(IDS, logits_processor=LogitsProcessorList([_Raises(error)]), **SHORT)
    assert beside.wait(timeout=60) and beside.error is None  # the request beside it ran to its end
    assert torch.equal(rt.generate(IDS, **SHORT), expected)


def test_a_distribution_that_overflows_is_refused_with_the_fix(rt):
    with pytest.raises(InvalidInputError, match="NaN or inf.*temperature >= 1e-5"):
        rt.generate(IDS, max_new_tokens=3, do_sample=True, temperature=1e-300)
    rt.generate(IDS, max_new_tokens=3, do_sample=True, temperature=1e-30)  # small, but finite: samples


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("hi",), {"num_return_sequences": 2, "do_sample": True}, "one sequence in its one cache row, not 2"),
        ((), {"input_ids": IDS}, "not input_ids"),
        (([1, 2, 3],), {}, "got list '\\[1, 2, 3\\]'"),
        ((None,), {}, "got NoneType"),
    ],
)
def test_a_turn_a_session_cannot_run_is_refused_and_leaves_no_trace(rt, args, kwargs, message):
    with rt.session() as chat:
        chat.send("first", max_new_tokens=2)
        before = list(chat.messages)
        with pytest.raises(InvalidInputError, match=message):
            chat.send(*args, **{"max_new_tokens": 2, **kwargs})
        assert chat.messages == before


def test_a_turn_refused_by_a_closed_engine_leaves_no_user_message(eager_runtime):
    rt = eager_runtime("tiny-llama", rows=1, cache=64)
    chat = rt.session()
    chat.send("first", max_new_tokens=2)
    before = list(chat.messages)
    rt.engine.stop_admitting()
    with pytest.raises(EngineClosedError, match="admits no new requests"):
        chat.send("second", max_new_tokens=2)
    assert chat.messages == before  # the next turn will not find two user messages in a row
