"""`rt.generate` as a drop-in for `model.generate`: HF's own objects and options, compared with HF eager
`generate` on the same weights (tiny-llama, fp32): streamers, stop strings, GenerateDecoderOnlyOutput
scores and logits, GenerationConfig objects, num_return_sequences, max_time, custom processors and
stopping criteria."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import LOGIT_ATOL, chat
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)
from transformers.generation import GenerateDecoderOnlyOutput

from runtime import InvalidInputError

NAME = "tiny-llama"
CONVERSATIONS = [
    [{"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Describe it."}],
]


@pytest.fixture
def pair(runtime, reference):
    """(runtime, HF eager model, a left-padded batch of 2 chat prompts)."""
    rt = runtime(NAME)
    return rt, reference(NAME), chat(rt.tokenizer, CONVERSATIONS)


def _one(inputs: dict) -> dict:
    return {k: v[:1] for k, v in inputs.items()}


def _streamed(generate, tokenizer, inputs: dict, **options) -> str:
    """HF's pattern: generate in a thread, the caller iterates a TextIteratorStreamer."""
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    thread = threading.Thread(target=generate, kwargs=inputs | options | {"streamer": streamer})
    thread.start()
    text = "".join(streamer)
    thread.join(timeout=60)
    return text


def test_text_iterator_streamer_in_a_thread_yields_hfs_text(pair):
    rt, model, inputs = pair
    options = {"max_new_tokens": 24, "do_sample": False}
    ours = _streamed(rt.generate, rt.tokenizer, _one(inputs), **options)
    assert ours == _streamed(model.generate, rt.tokenizer, _one(inputs), **options)
    assert len(ours) > 0


def test_stop_strings_with_a_tokenizer_cut_where_hf_cuts(pair):
    rt, model, inputs = pair
    one = _one(inputs)
    free = model.generate(**one, max_new_tokens=24, do_sample=False)
    pieces = [rt.tokenizer.decode([t]) for t in free[0, one["input_ids"].shape[1] :].tolist()]
    # a string HF's output reaches halfway through: a whole token's text (random weights also emit bytes)
    stop = next(p for p in pieces[len(pieces) // 2 :] if p.strip() and "\ufffd" not in p)
    options = {"max_new_tokens": 24, "do_sample": False, "stop_strings": [stop], "tokenizer": rt.tokenizer}
    expected = model.generate(**one, **options)
    assert expected.shape[1] < free.shape[1], "the stop string must end HF's generation early"
    assert torch.equal(rt.generate(**one, **options), expected)


@pytest.mark.parametrize("sampled", [False, True])
def test_return_dict_in_generate_scores_and_logits_equal_hfs(pair, sampled):
    """Processed scores (here through a repetition penalty, and top-k/temperature when sampling) and raw
    logits of every step, for a left-padded batch; sampling draws from the same global seed."""
    rt, model, inputs = pair
    options = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": sampled, "repetition_penalty": 1.3}
    options |= {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
    if sampled:
        options |= {"temperature": 0.8, "top_k": 20}
    torch.manual_seed(0)
    expected = model.generate(**inputs, **options)
    torch.manual_seed(0)
    ours = rt.generate(**inputs, **options)
    assert isinstance(ours, GenerateDecoderOnlyOutput)
    assert torch.equal(ours.sequences, expected.sequences)
    assert len(ours.scores) == len(expected.scores) == len(ours.logits) == 12
    for got, want in zip(ours.scores + ours.logits, expected.scores + expected.logits, strict=True):
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        finite = torch.isfinite(want)
        assert torch.allclose(got[finite], want[finite], atol=LOGIT_ATOL, rtol=0)


def test_only_what_is_asked_is_returned(pair):
    rt, _, inputs = pair
    out = rt.generate(**_one(inputs), max_new_tokens=4, return_dict_in_generate=True)
    assert out.scores is None and out.logits is None and out.sequences.shape[1] == inputs["input_ids"].shape[1] + 4
    assert isinstance(rt.generate(**_one(inputs), max_new_tokens=4), torch.Tensor)


def test_a_generation_config_object_behaves_as_in_hf(pair):
    """Its unset fields come from the bundle's generation config and HF's defaults, keywords override it."""
    rt, model, inputs = pair
    config = GenerationConfig(max_new_tokens=16, do_sample=False, repetition_penalty=1.4, no_repeat_ngram_size=2)
    expected = model.generate(**inputs, generation_config=config)
    assert torch.equal(rt.generate(**inputs, generation_config=config), expected)
    both = {"generation_config": config, "max_new_tokens": 6}
    assert torch.equal(rt.generate(**inputs, **both), model.generate(**inputs, **both))
    assert config.max_new_tokens == 16, "the caller's config object is not modified"


def test_num_return_sequences_samples_each_prompt_n_times_as_hf(pair):
    rt, model, inputs = pair
    options = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": True, "num_return_sequences": 2}
    torch.manual_seed(3)
    expected = model.generate(**inputs, **options)
    torch.manual_seed(3)
    ours = rt.generate(**inputs, **options)
    assert ours.shape[0] == 4 and torch.equal(ours, expected)


def test_num_return_sequences_refused_where_hf_refuses_it(pair):
    """Greedy with several sequences is an error in HF too; past the bundle's rows it names the option."""
    rt, model, inputs = pair
    with pytest.raises(ValueError, match="num_return_sequences"):
        model.generate(**inputs, max_new_tokens=4, do_sample=False, num_return_sequences=2)
    with pytest.raises(InvalidInputError, match="num_return_sequences"):
        rt.generate(**inputs, max_new_tokens=4, do_sample=False, num_return_sequences=2)
    with pytest.raises(InvalidInputError, match="batch size 6 is larger than this bundle's 4"):
        rt.generate(**inputs, max_new_tokens=4, do_sample=True, num_return_sequences=3)


def test_max_time_stops_as_hf_stops(pair):
    """HF checks the time after each token: an elapsed max_time ends the generation after one."""
    rt, model, inputs = pair
    options = {"max_new_tokens": 20, "do_sample": False, "max_time": 0.0}
    expected = model.generate(**inputs, **options)
    assert expected.shape[1] == inputs["input_ids"].shape[1] + 1
    assert torch.equal(rt.generate(**inputs, **options), expected)


class _Ban(LogitsProcessor):
    """A caller's processor: bans the tokens HF would otherwise pick first."""

    def __init__(self, banned):
        self.banned = banned

    def __call__(self, input_ids, scores):
        scores[:, self.banned] = -float("inf")
        return scores


class _Length(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_custom_logits_processor_and_stopping_criteria_as_in_hf(pair):
    rt, model, inputs = pair
    first = model.generate(**inputs, max_new_tokens=1, do_sample=False)[:, -1].tolist()
    seq = inputs["input_ids"].shape[1]
    options = {"max_new_tokens": 20, "do_sample": False, "logits_processor": LogitsProcessorList([_Ban(first)])}
    options["stopping_criteria"] = StoppingCriteriaList([_Length(seq + 7)])
    expected = model.generate(**inputs, **options)
    assert expected.shape[1] == seq + 7 and not set(expected[:, seq].tolist()) & set(first)
    assert torch.equal(rt.generate(**inputs, **options), expected)


def test_a_custom_processor_of_a_type_hf_builds_takes_its_place_as_in_hf(pair):
    """transformers 5 lets the caller's processor replace the one its own options would build."""
    from transformers.generation import RepetitionPenaltyLogitsProcessor

    rt, model, inputs = pair
    options = {"max_new_tokens": 12, "do_sample": False, "repetition_penalty": 1.01}
    options["logits_processor"] = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0)])
    expected = model.generate(**inputs, **options)
    without = model.generate(**inputs, max_new_tokens=12, do_sample=False, repetition_penalty=1.01)
    assert not torch.equal(expected, without), "the custom processor must change HF's output"
    assert torch.equal(rt.generate(**inputs, **options), expected)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_beams": 2}, "num_beams=2: aotpack decodes greedily or by sampling"),
        ({"output_attentions": True}, "output_attentions=True: the compiled decode step returns logits only"),
        ({"use_cache": False}, "use_cache=False"),
        ({"generation_config": {"max_new_tokens": 3}}, "generation_config must be a transformers.GenerationConfig"),
        ({"generation_config": GenerationConfig(top_p=2.0)}, "top_p must be a number in"),
        ({"streamer": object()}, "streamer must have put() and end()"),
        ({"logits_processor": "nope"}, "logits_processor must be a LogitsProcessorList"),
        ({"assistant_model": object()}, "unsupported generate() arguments ['assistant_model']"),
    ],
)
def test_what_the_compiled_decode_cannot_do_is_refused_by_name(pair, options, message):
    rt, _, inputs = pair
    with pytest.raises(InvalidInputError) as refused:
        rt.generate(**_one(inputs), max_new_tokens=4, **options)
    assert message in str(refused.value)


@pytest.mark.parametrize("prompt", ["Why is the sky blue?", CONVERSATIONS[1]])
def test_pipeline_text_generation_takes_the_runtime_as_its_model(pair, prompt, capfd):
    """transformers' own pipeline, unpatched, with the runtime where a model goes: the same text as the
    pipeline over HF's model, for a plain prompt and for chat messages; without the log record that
    lists every model class of the task (it checks the class name, then works)."""
    from transformers import pipeline

    rt, model, _ = pair
    options = {"max_new_tokens": 12, "do_sample": False}
    capfd.readouterr()
    ours = pipeline("text-generation", model=rt, tokenizer=rt.tokenizer)(prompt, **options)
    assert "is not supported for text-generation" not in capfd.readouterr().err
    expected = pipeline("text-generation", model=model, tokenizer=rt.tokenizer)(prompt, **options)
    assert ours == expected
