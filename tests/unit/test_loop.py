"""The generation loop alone, in milliseconds: no export, no compile.

The bundle is a stand-in: a Runtime assembled around a tiny random Llama with the eager backend (the
decode step the exporter traces, run by torch through the same contract checks) in place of the
`.so`. Everything the runtime does around the step (validation, eos and padding, length budgets,
logits processors, the sampling generator, the engine's rows) is then compared with HF `generate` on
the same model.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import assert_parity, hf_generate
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from exporter.model import cache_layout
from runtime.backends.eager import EagerDecode
from runtime.config import LoadConfig
from runtime.engine.engine import Engine
from runtime.errors import AotpackError, CacheOverflowError, InvalidInputError
from runtime.format.contract import DecodeContract
from runtime.generation.options import FLOATS
from runtime.generation.validate import GENERATE_KWARGS
from runtime.runtime import Runtime

VOCAB, CACHE, ROWS = 96, 64, 4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.generation_config.save_pretrained(path)  # what the Runtime reads of a bundle besides the model
    contract = DecodeContract(cache_layout(model, CACHE), ROWS, CACHE, "float32", "cpu")
    return Runtime(path, model, EagerDecode(model, contract), contract, LoadConfig(backend="eager"))


def _generate(bundle, input_ids, attention_mask=None, generator=None, **kwargs) -> torch.Tensor:
    return bundle.engine.submit(bundle.request(input_ids, attention_mask, generator, **kwargs)).result()


def _hf(bundle, input_ids, attention_mask=None, **kwargs) -> torch.Tensor:
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    with torch.inference_mode():
        return bundle.model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)


PROMPT = torch.tensor([[1, 17, 40, 5, 66, 9, 31]])
PADDED = (torch.tensor([[0, 0, 1, 17, 40, 5], [1, 9, 31, 44, 3, 70]]), torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]))


@pytest.mark.parametrize("new_tokens", [1, 2, 16])
def test_greedy_budget_matches_hf(bundle, new_tokens):
    options = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    assert torch.equal(_generate(bundle, PROMPT, **options), _hf(bundle, PROMPT, **options))


def test_left_padded_batch_matches_hf(bundle):
    ids, mask = PADDED
    options = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}
    assert torch.equal(_generate(bundle, ids, mask, **options), _hf(bundle, ids, mask, **options))


@pytest.mark.parametrize("prompt", [[0, 0, 17, 40, 5, 66], [17, 40, 0, 5, 0, 66]])
def test_a_prompt_without_a_mask_is_masked_as_generate_masks_it(bundle, prompt):
    """Without an attention_mask, generate takes the pad id's tokens (0, no eos id here) for padding,
    wherever they stand; so does aotpack: tokens and logits as HF's generate called without a mask."""
    inputs = {"input_ids": torch.tensor([prompt])}
    assert_parity(bundle, bundle.model, inputs, new_tokens=8)
    attended = hf_generate(bundle.model, inputs | {"attention_mask": torch.ones(1, 6, dtype=torch.long)}, 8)[1]
    assert not torch.allclose(attended, hf_generate(bundle.model, inputs, 8)[1])  # the mask matters here


def test_a_prompt_ending_in_the_pad_id_without_a_mask_is_refused_by_name(bundle):
    """generate would take the last token for padding: a right-padded row, refused before any model work;
    with a mask saying it is real, it runs as HF runs it. With pad == eos nothing is inferred (as in HF)."""
    ids = torch.tensor([[17, 40, 5, 0]])
    with pytest.raises(InvalidInputError, match="row 0 of input_ids ends in the pad token id 0.*pass attention_mask"):
        _generate(bundle, ids, max_new_tokens=4)
    for option in ({"pad_token_id": 2**64}, {"eos_token_id": 2**64}, {"bos_token_id": -(2**64)}):  # HF overflows
        with pytest.raises(InvalidInputError, match="must be token ids of this bundle"):
            _generate(bundle, PROMPT, max_new_tokens=2, **option)
    ones = torch.ones_like(ids)
    assert torch.equal(_generate(bundle, ids, ones, max_new_tokens=4), _hf(bundle, ids, ones, max_new_tokens=4))
    ids = torch.tensor([[17, 2, 5, 2, 9]])  # eos = pad = 2: attended
    with torch.inference_mode():
        expected = bundle.model.generate(ids, max_new_tokens=4, pad_token_id=2)
    assert torch.equal(_generate(bundle, ids, max_new_tokens=4, pad_token_id=2), expected)


def test_rows_that_meet_eos_are_padded_and_the_loop_stops(bundle):
    ids, mask = PADDED
    free = _generate(bundle, ids, mask, max_new_tokens=6)
    eos = [int(free[0, 7]), int(free[1, 9])]  # row 0 meets its eos at step 2, row 1 at step 4
    ours = _generate(bundle, ids, mask, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(ours, _hf(bundle, ids, mask, max_new_tokens=20, do_sample=False, eos_token_id=eos))
    assert ours.shape[1] == ids.shape[1] + 4 and int(ours[0, -1]) == 0  # stopped; row 0 padded with pad id 0


def test_length_rules_match_hf(bundle):
    seq = PROMPT.shape[1]
    for options, new in (({}, 20), ({"max_length": seq + 5}, 5)):
        ours = _generate(bundle, PROMPT, min_new_tokens=new, **options)
        assert ours.shape[1] == seq + new
        assert torch.equal(ours, _hf(bundle, PROMPT, min_new_tokens=new, do_sample=False, **options))


def test_logits_processors_match_hf(bundle):
    options = {"max_new_tokens": 10, "min_new_tokens": 10, "repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    assert torch.equal(_generate(bundle, PROMPT, **options), _hf(bundle, PROMPT, do_sample=False, **options))


def test_seeded_sampling_matches_hf_and_repeats(bundle):
    options = {"do_sample": True, "temperature": 0.8, "top_k": 20, "max_new_tokens": 12, "min_new_tokens": 12}
    torch.manual_seed(7)
    reference = _hf(bundle, PROMPT, **options)
    ours = _generate(bundle, PROMPT, generator=torch.Generator().manual_seed(7), **options)
    assert torch.equal(ours, reference)
    assert torch.equal(_generate(bundle, PROMPT, generator=torch.Generator().manual_seed(7), **options), ours)


def test_requests_are_checked_before_any_model_work(bundle):
    with pytest.raises(CacheOverflowError, match="needs 107 cache slots"):
        _generate(bundle, PROMPT, max_new_tokens=100)
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        _generate(bundle, torch.tensor([[1, VOCAB]]), max_new_tokens=2)
    with pytest.raises(InvalidInputError, match="right-padded"):
        _generate(bundle, PADDED[0], PADDED[1].flip(1), max_new_tokens=2)


def test_the_step_is_called_through_the_contract(bundle):
    """A cache of the wrong layout is refused by the contract before the step runs."""
    engine = Engine(bundle.model, bundle.decode, bundle.contract)
    engine.kv[1] = engine.kv[1][:, :, :-1].contiguous()
    handle = engine.submit(bundle.request(PROMPT, max_new_tokens=3))
    with pytest.raises(InvalidInputError, match="layer 0 values has shape"):
        handle.result()


def test_a_cache_tensor_replaced_after_steps_is_checked_before_the_next_step(bundle):
    """The engine steps through a decode bound to its cache (Decode.bind, checked once): a tensor put in
    the cache list afterwards is bound, and so checked, again."""
    engine = Engine(bundle.model, bundle.decode, bundle.contract)
    engine.submit(bundle.request(PROMPT, max_new_tokens=3)).result()
    engine.kv[1] = engine.kv[1][:, :, :-1].contiguous()
    with pytest.raises(InvalidInputError, match="layer 0 values has shape"):
        engine.submit(bundle.request(PROMPT, max_new_tokens=3)).result()


@pytest.mark.parametrize(
    "options",
    [{"pad_token_id": VOCAB}, {"pad_token_id": -1}, {"eos_token_id": 10**9}, {"eos_token_id": [2, -5]}],
    ids=["pad past vocab", "negative pad", "huge eos", "negative eos in a list"],
)
def test_special_ids_outside_the_vocabulary_are_refused(bundle, options):
    """A pad id past the vocabulary would reach the compiled step when a row finishes (an abort)."""
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        _generate(bundle, PADDED[0], PADDED[1], max_new_tokens=4, **options)


_values = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.integers(-3, 120)
    | st.floats(allow_nan=True, allow_infinity=True) | st.floats(0, 2) | st.text(max_size=4)
    | st.lists(st.integers(-5, 130), max_size=3) | st.lists(st.lists(st.integers(-5, 130), max_size=2), max_size=2)
)  # fmt: skip
# stop_strings: test_engine; max_time stops by the clock, differently in two runs (test_drop_in)
_names = st.sampled_from(sorted(set(GENERATE_KWARGS) - {"max_length", "stop_strings", "max_time"}))


@given(st.dictionaries(_names, _values, max_size=3), st.sampled_from([None, 42, "cpu", "generator"]))
@example({"prompt_lookup_num_tokens": 0}, None)  # ours: no drafts; HF refuses 0 (found by hypothesis)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_generate_option_works_like_hf_or_is_an_aotpack_error(bundle, options, generator):
    """Whatever the values, generate() either runs, and then greedy output equals HF generate's, or raises
    aotpack's own error; never another exception."""
    options = {"max_new_tokens": 4} | options
    generator = torch.Generator().manual_seed(0) if generator == "generator" else generator
    try:
        ours = _generate(bundle, PROMPT, None, generator, **options)
    except AotpackError:
        return
    if not options.get("do_sample") and not bundle.generation_config.do_sample:
        budget = {"max_new_tokens": ours.shape[1] - PROMPT.shape[1]}
        # as ours does: None means unset (HF itself crashes on some, num_beams=None), integral floats are
        # floats, and prompt_lookup_num_tokens=0 means no drafts (HF refuses 0; drafts never change greedy tokens)
        options = {
            k: float(v) if k in FLOATS else v
            for k, v in options.items()
            if v is not None and not (k == "prompt_lookup_num_tokens" and v == 0)
        }
        expected = _hf(bundle, PROMPT, **(options | budget | {"do_sample": False}))
        assert torch.equal(ours, getattr(expected, "sequences", expected))  # return_dict_in_generate


class _ByteTokenizer:
    """Each id is one UTF-8 byte, decoded as HF byte-level tokenizers do (bad bytes become U+FFFD)."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("text", ["plain", "café", "naïve ☃", "ends mid-character é"])
def test_stream_pieces_join_to_the_decoded_ids(text):
    """Also when generation stops inside a multi-byte character: the held-back tail is flushed."""
    from runtime.text import stream_text

    data = list(text.encode())
    for cut in range(1, len(data) + 1):
        ids = data[:cut]
        pieces = list(stream_text(_ByteTokenizer(), (torch.tensor([t]) for t in ids)))
        assert "".join(pieces) == _ByteTokenizer().decode(ids)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-mistral", "tiny-gemma2", "tiny-gemma3"])
def test_stream_pieces_of_each_presets_tokenizer_join_to_its_decode(checkpoint, name):
    """The presets' fast tokenizers take tokenizers' DecodeStream (a window a token, not the whole text):
    over random ids, special and byte tokens among them, ending anywhere (inside a character too), its
    pieces join to what decode gives, skipping special tokens or not. A tokenizer that cleans up spaces
    after decoding decodes the whole text instead, and joins the same way."""
    import random

    from transformers import AutoTokenizer

    from runtime.text import TextPieces

    tokenizer = AutoTokenizer.from_pretrained(checkpoint(name))
    rnd, vocab = random.Random(name), len(tokenizer)
    for cleans_up in (False, True):
        tokenizer.clean_up_tokenization_spaces = cleans_up
        for _ in range(60):
            length = rnd.choice([1, 3, 20, 80])
            ids = [rnd.randrange(vocab if rnd.random() < 0.7 else min(300, vocab)) for _ in range(length)]
            for skip in (True, False):
                pieces = TextPieces(tokenizer, skip)
                assert (pieces.stream is None) == cleans_up
                joined = "".join([pieces.add(t) for t in ids] + [pieces.finish()])
                assert joined == tokenizer.decode(ids, skip_special_tokens=skip), (ids, skip)


def _byte_fallback_tokenizer():
    """A fast tokenizer whose decoder is ByteFallback's (as Llama 2's, Mistral's, Gemma's): every byte a
    token, and "x" and an eos "</s>"."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "x": 257, "</s>": 258}
    model = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    model.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", eos_token="</s>")


def test_a_byte_run_that_rewrites_released_text_falls_back_to_the_whole_text():
    """With ByteFallback (Llama 2, Mistral, Gemma), a stray continuation byte after a character turns the
    run into replacement characters, so the text no longer starts with the released "é": DecodeStream
    raises there; the pieces go on the whole-text way, as they always did (the rewrite is not re-sent)."""
    from runtime.text import TextPieces

    tokenizer = _byte_fallback_tokenizer()
    ids = tokenizer.convert_tokens_to_ids(["<0xC3>", "<0xA9>", "<0xA9>", "x", "x"])
    pieces = TextPieces(tokenizer)
    assert pieces.stream is not None
    assert [pieces.add(t) for t in ids] + [pieces.finish()] == ["", "é", "", "", "x", ""]
    assert pieces.stream is None and tokenizer.decode(ids) == "\ufffd\ufffd\ufffdxx"


def test_a_reply_that_an_eos_ends_inside_a_character_ends_as_decode_does():
    """The text held back for an incomplete character is let out when an eos ends the row, as decode
    renders it (it was dropped: the row's end came with the eos, and nothing asked for the rest)."""
    from runtime.serve.choices import ChoiceText

    tokenizer = _byte_fallback_tokenizer()
    ids = tokenizer.convert_tokens_to_ids(["x", "<0xC3>", "</s>"])
    row = ChoiceText(tokenizer, [], None, (tokenizer.eos_token_id,))
    sent = "".join(row.add(t, None) for t in ids) + row.end("length")
    assert sent == row.content == tokenizer.decode(ids, skip_special_tokens=True) == "x\ufffd"
    assert row.finish_reason == "stop"


def test_the_parity_gates_batch_keeps_the_first_token_in_every_row():
    """Row i is left-padded by i and drops the i tokens after the first: dropping the BOS itself made
    Gemma's bf16 logits move by 30 between a row padded and alone (HF against HF), failing the gate."""
    from exporter.parity import parity_prompt

    class Tokenizer:
        pad_token_id = 0

        def __call__(self, text, return_tensors):
            return SimpleNamespace(input_ids=torch.tensor([[2, 11, 12, 13, 14]]))

    ids, mask = parity_prompt(Tokenizer(), 3, 100, "cpu")
    assert ids.tolist() == [[2, 11, 12, 13, 14], [0, 2, 12, 13, 14], [0, 0, 2, 13, 14]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_torchs_argmax_ties_nan_and_strided_rows_included(dtype):
    """The engine's greedy choice (NumPy's argmax for float32 on the CPU) picks what torch's argmax
    picks: the first of tied maxima, the first NaN, index 0 of a row of -inf, on a strided view."""
    from runtime.engine.sampling import greedy

    scores = torch.randn(12, 257, generator=torch.Generator().manual_seed(0)).to(dtype)[::2]  # (6, 257), strided
    scores[1] = float("-inf")
    scores[2, [5, 9]] = 100.0
    scores[3, [4, 7]] = float("nan")
    with torch.inference_mode():
        chosen = greedy(scores)
    assert chosen.dtype == torch.long and torch.equal(chosen, scores.argmax(-1))
    assert chosen[1:4].tolist() == [0, 5, 4]


@pytest.mark.parametrize("vocab", [262_144, 40_001])
def test_greedy_by_blocks_is_torchs_argmax_too(vocab):
    """Several rows of a large vocabulary take the first block holding each row's maximum, then its place
    there: the same as torch's argmax with maxima tied across blocks and inside one, NaN (the first one,
    in a later block than a larger number), a row of -inf, and the last entries (past the whole blocks)."""
    from runtime.engine.sampling import greedy

    scores = torch.randn(7, vocab, generator=torch.Generator().manual_seed(vocab))  # (7, vocab)
    scores[1] = float("-inf")
    scores[2, [vocab - 1, 300, 301]] = 50.0  # tied: the first wins, inside its block and across blocks
    scores[3, [vocab // 2, vocab // 3]] = float("nan")
    scores[3, 5] = 1e30
    scores[4, -1] = 50.0  # in the tail past the last whole block (when there is one)
    scores[5, 130] = float("inf")
    chosen = greedy(scores)
    assert chosen.dtype == torch.long and torch.equal(chosen, scores.argmax(-1))
    assert chosen[1:6].tolist() == [0, 300, vocab // 3, vocab - 1, 130]
