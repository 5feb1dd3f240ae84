"""The "top-k" sampler (runtime.engine.sampling): HF's warpers over the top-k survivors give the distribution
HF's warpers over the whole vocabulary give; the draws land where that distribution says; a tie at the
k-th score, or a processor after top-k that is not a ranking warper, keeps generate's own path; and a
request that asks for it draws among its step's top-k, reproducibly with a seed."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from runtime.engine import sampling
from runtime.engine.sampling import (
    at_top_k,
    draw,
    probabilities,
    ranks_like_its_input,
    shared_top_k,
    survivors_distribution,
    top_k_and_next,
    top_k_distribution,
)
from runtime.errors import InvalidInputError

VOCAB = 1000
HISTORY = torch.zeros(3, 4, dtype=torch.long)  # (B, S): what the processors see; these warpers ignore it


def _warpers(k: int, top_p: float | None, min_p: float | None) -> LogitsProcessorList:
    """As HF orders them when sampling: temperature, top-k, top-p, min-p."""
    warpers = [TemperatureLogitsWarper(0.7), TopKLogitsWarper(k)]
    warpers += [TopPLogitsWarper(top_p)] if top_p is not None else []
    return LogitsProcessorList(warpers + ([MinPLogitsWarper(min_p)] if min_p is not None else []))


def _full(survivors, vocab: int) -> torch.Tensor:
    indices, probs = survivors
    return torch.zeros(indices.shape[0], vocab, dtype=probs.dtype).scatter(1, indices, probs)  # (B, vocab)


@pytest.mark.parametrize("k", [1, 5, 64])
@pytest.mark.parametrize("top_p,min_p", [(None, None), (0.9, None), (0.5, None), (None, 0.1), (0.95, 0.05)])
def test_the_survivors_distribution_is_hfs_over_the_whole_vocabulary(k, top_p, min_p):
    warpers = _warpers(k, top_p, min_p)
    head, top_k, rest = at_top_k(warpers)
    scores = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(k)) * 3  # (B, vocab)
    expected = probabilities(warpers(HISTORY, scores.clone()))  # (B, vocab)
    got = _full(top_k_distribution(head(HISTORY, scores.clone()), top_k, rest, HISTORY), VOCAB)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
def test_one_top_k_over_the_steps_rows_gives_each_request_hfs_distribution_at_its_own_k(temperature):
    """Requests whose processors before top-k only rescale (temperature) share one torch.topk of the raw
    logits at the largest k: each reads its rows' first k + 1 and runs its temperature over those only."""
    scores = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(7)) * 3  # (width, vocab)
    requests = [(slice(0, 1), 3, 0.9), (slice(1, 3), 40, None)]  # (rows, k, top_p)
    values, indices = shared_top_k(scores, [(r.stop - r.start, k) for r, k, _ in requests])  # (3, 41) each
    for rows, k, top_p in requests:
        warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopKLogitsWarper(k)])
        warpers += [TopPLogitsWarper(top_p)] if top_p is not None else []
        head, _, rest = at_top_k(warpers)
        assert ranks_like_its_input(head)
        expected = probabilities(warpers(HISTORY[rows], scores[rows].clone()))
        mine = head(HISTORY[rows], values[rows, : k + 1]), indices[rows, : k + 1]
        got = _full(survivors_distribution(*mine, k, rest, HISTORY[rows]), VOCAB)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_a_step_shares_its_top_k_only_when_such_rows_are_two_and_half_of_it():
    scores = torch.randn(8, VOCAB)
    assert shared_top_k(scores, [(1, 5)]) is None  # one row: its own call is the same call
    assert shared_top_k(scores, [(1, 5), (1, 9), (1, 2)]) is None  # 3 of 8 rows: the other 5 would cost more
    values, indices = shared_top_k(scores, [(2, 5), (1, 9), (1, 2)])
    assert values.shape == indices.shape == (8, 10)
    torch.testing.assert_close(values, scores.topk(10).values)
    assert not ranks_like_its_input(LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)]))


@pytest.mark.parametrize("vocab", [262_144, 49_152 + 77, 20_000])
@pytest.mark.parametrize("k", [1, 5, 64])
@pytest.mark.parametrize("kind", ["random", "ties", "masked"])
def test_the_blocked_top_k_holds_atens_values_at_large_vocabularies(vocab, k, kind):
    """Large vocabularies take the k + 1 highest among the blocks with the highest maxima (and the entries
    after the last whole block): the same values as torch.topk, each at an index that holds it, with
    repeated values (all in few blocks or tied at the boundary) and rows mostly -inf (a grammar's mask)."""
    generator = torch.Generator().manual_seed(vocab + k)
    scores = torch.randn(3, vocab, generator=generator) * 3  # (B, vocab)
    if kind == "ties":  # few distinct values: ties inside the top k, at the k-th, and blocks sharing maxima
        scores = torch.randint(0, 12, (3, vocab), generator=generator).float()
        scores[1, -3:] = 20.0  # the highest values after the last whole block
    elif kind == "masked":
        keep = torch.rand(3, vocab, generator=generator) < 0.0005
        scores = scores.masked_fill(~keep, float("-inf"))
    values, indices = top_k_and_next(scores, k)
    assert values.shape == indices.shape == (3, k + 1)
    torch.testing.assert_close(values, scores.topk(k + 1).values)
    assert torch.equal(scores.gather(1, indices), values)
    assert all(len(set(row.tolist())) == k + 1 for row in indices)  # distinct entries


def test_top_p_cutting_through_tied_survivors_keeps_the_tokens_hf_keeps():
    """HF's top-p sorts the whole vocabulary and, among equal scores, drops the lowest index first; the
    survivors reach HF's warpers in vocabulary order, so the cut keeps the same tokens (a blocked top-k
    returned the tie the other way round, found by review). bf16-rounded logits tie often."""
    scores = torch.full((1, 262_144), -10.0)
    scores[0, [5000, 100, 200_000, 70_000]] = torch.tensor([3.0, 2.0, 2.0, 1.0])
    warpers = LogitsProcessorList([TopKLogitsWarper(4), TopPLogitsWarper(0.6)])
    head, k, rest = at_top_k(warpers)
    expected = probabilities(warpers(HISTORY[:1], scores.clone()))
    got = _full(top_k_distribution(head(HISTORY[:1], scores), k, rest, HISTORY[:1]), 262_144)
    torch.testing.assert_close(got, expected)
    rounded = (torch.randn(3, 262_144, generator=torch.Generator().manual_seed(1)) * 4).bfloat16().float()
    for top_p in (0.5, 0.8, 0.95):
        warpers = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(64), TopPLogitsWarper(top_p)])
        head, k, rest = at_top_k(warpers)
        survivors = top_k_distribution(head(HISTORY, rounded.clone()), k, rest, HISTORY)
        if survivors is not None:  # else a tie at the 64th score: HF's path
            expected = probabilities(warpers(HISTORY, rounded.clone()))
            torch.testing.assert_close(_full(survivors, 262_144), expected, rtol=1e-5, atol=1e-7)


def test_a_seeded_draw_does_not_depend_on_which_top_k_call_found_the_survivors():
    """A request's own top-k and the step's shared one (at another request's larger k) may return tied
    survivors in different orders; in vocabulary order, the same generator draws the same tokens."""
    generator = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 262_144, generator=generator) * 3).clamp(max=9).bfloat16().float()  # (2, vocab)
    top = torch.randperm(262_144, generator=generator)[:8]  # the 8 highest, ties among them, none at the 8th
    logits[:, top] = torch.tensor([13.0, 13.0, 12.5, 12.5, 12.5, 11.0, 11.0, 10.5])
    _, k, rest = at_top_k(LogitsProcessorList([TopKLogitsWarper(8)]))
    alone = sampling.top_k_and_next(logits[:1], k)
    shared = shared_top_k(logits, [(1, k), (1, 300)])
    assert shared is not None and shared[0].shape[-1] == 301
    draws = []
    for values, indices in (alone, (shared[0][:1], shared[1][:1])):
        survivors = survivors_distribution(values, indices, k, rest, HISTORY[:1])
        draws.append([int(sampling.draw(survivors, torch.Generator().manual_seed(s))) for s in range(200)])
    assert draws[0] == draws[1]


def test_a_k_too_large_for_the_blocks_takes_its_own_call():
    """One request at k 20,000 would make the shared call a topk over the whole vocabulary for every row
    (3 -> 52 ms for 8 rows): it takes its own, and the others share theirs."""
    logits = torch.randn(8, 262_144)
    values, indices = shared_top_k(logits, [(7, 64), (1, 20_000)])
    assert values.shape == indices.shape == (8, 65)  # the engine gives it only to the k = 64 request
    assert shared_top_k(logits, [(1, 20_000), (7, 20_000)]) is None
    assert not ranks_like_its_input(LogitsProcessorList([_temperature(-1.0)]))
    assert not ranks_like_its_input(LogitsProcessorList([_temperature(torch.ones(262_144))]))


def _temperature(value) -> TemperatureLogitsWarper:
    """A temperature warper whose value was changed after HF checked it (through a caller's own list)."""
    warper = TemperatureLogitsWarper(1.0)
    warper.temperature = value
    return warper


def test_fewer_possible_tokens_than_k_keep_hfs_distribution():
    """A grammar's mask leaves 3 tokens: the k-th score is -inf, and the -inf survivors get probability 0."""
    warpers = _warpers(64, 0.9, None)
    head, k, rest = at_top_k(warpers)
    scores = torch.full((3, VOCAB), float("-inf"))
    scores[:, [7, 300, 999]] = torch.tensor([1.0, 2.0, 0.5])
    expected = probabilities(warpers(HISTORY, scores.clone()))
    got = _full(top_k_distribution(head(HISTORY, scores.clone()), k, rest, HISTORY), VOCAB)
    torch.testing.assert_close(got, expected)
    assert set(got.nonzero()[:, 1].tolist()) <= {7, 300, 999}


def test_a_tie_at_the_kth_score_is_left_to_hfs_path():
    """HF's top-k keeps every token tied with the k-th score: more than k, so the survivors are not enough."""
    scores = torch.arange(VOCAB, dtype=torch.float32).repeat(3, 1)  # (B, vocab)
    scores[1, 10] = scores[1, VOCAB - 5]  # row 1: a token tied with its 5th highest
    _, k, rest = at_top_k(_warpers(5, None, None))
    assert top_k_distribution(scores, k, rest, HISTORY) is None
    assert top_k_distribution(scores[[0, 2]], k, rest, HISTORY) is not None
    scores[0, 20] = scores[0, VOCAB - 2]  # a tie inside the top k (the 2nd highest): exactly k survive
    assert top_k_distribution(scores[[0, 2]], k, rest, HISTORY) is not None


def test_draws_land_where_the_distribution_says():
    """20,000 draws over 4 survivors of a 1,000-token vocabulary: each token's share within 5 sigma of its
    probability, and no draw outside the survivors."""
    warpers = _warpers(4, None, None)
    head, k, rest = at_top_k(warpers)
    scores = torch.full((1, VOCAB), -5.0)
    scores[0, [3, 500, 501, 998]] = torch.tensor([0.0, 0.5, 1.0, 1.5])
    p = probabilities(warpers(HISTORY[:1], scores.clone()))[0]  # (vocab,)
    generator, n = torch.Generator().manual_seed(0), 20_000
    headed = head(HISTORY[:1], scores).expand(n // 10, -1)  # (n / 10, vocab)
    draws = torch.stack([draw(top_k_distribution(headed, k, rest, HISTORY[:1]), generator) for _ in range(10)])
    counts = torch.bincount(draws.flatten(), minlength=VOCAB).double()
    assert set(counts.nonzero()[:, 0].tolist()) <= {3, 500, 501, 998}
    sigma = (n * p * (1 - p)).double().sqrt()
    survivors = [3, 500, 501, 998]
    assert ((counts - n * p.double()).abs() <= 5 * sigma + 1e-9).all(), (counts[survivors], n * p[survivors])


def test_only_ranking_warpers_may_follow_top_k():
    plain = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(8), TopPLogitsWarper(0.9)])
    head, k, rest = at_top_k(plain)
    assert (list(head), k, list(rest)) == ([plain[0]], 8, [plain[1], plain[2]])
    assert at_top_k(LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])) is None
    assert at_top_k(LogitsProcessorList([TopKLogitsWarper(8), TypicalLogitsWarper(0.9)])) is None
    assert at_top_k(LogitsProcessorList([TopKLogitsWarper(8, filter_value=-1e4)])) is None
    # a later warper's finite filter value gives the tokens top-k removed a probability: HF's path
    assert at_top_k(LogitsProcessorList([TopKLogitsWarper(8), TopPLogitsWarper(0.9, filter_value=-1.0)])) is None
    assert at_top_k(LogitsProcessorList([TopKLogitsWarper(8), MinPLogitsWarper(0.1, filter_value=-1.0)])) is None

    class Wider(TopKLogitsWarper):  # a caller's own top-k may do anything in __call__
        pass

    assert at_top_k(LogitsProcessorList([Wider(8)])) is None


@pytest.fixture(scope="module")
def rt(eager_runtime):
    return eager_runtime("tiny-llama", rows=4, cache=64)


def _sampled(rt, sampler: str, seed: int, **options) -> list[tuple[int, torch.Tensor]]:
    prompt = torch.tensor([[2, 40, 41, 42, 43]])  # (1, 5)
    generator = torch.Generator().manual_seed(seed)
    handle = rt.submit(prompt, generator=generator, want_logits=True, sampler=sampler, do_sample=True, **options)
    return [(int(token[0]), logits[0]) for token, logits in handle]


def test_a_top_k_request_draws_among_each_steps_top_k_reproducibly(rt):
    steps = _sampled(rt, "top-k", 3, top_k=3, max_new_tokens=24)
    assert len(steps) == 24
    for token, logits in steps:  # (vocab,) raw: temperature 1, no other processor, so the top 3 are these
        assert token in logits.topk(3).indices.tolist()
    assert [t for t, _ in _sampled(rt, "top-k", 3, top_k=3, max_new_tokens=24)] == [t for t, _ in steps]
    draws = {tuple(t for t, _ in _sampled(rt, "top-k", seed, top_k=3, max_new_tokens=8)) for seed in range(6)}
    assert len(draws) > 1  # it samples


def test_sampled_requests_in_one_step_share_a_top_k_and_each_draws_among_its_own(rt, monkeypatch):
    """Three requests with their own k and temperature decode together: the steps they share take one
    torch.topk (sampling.shared_top_k), and each token is among its request's own top k of its logits."""
    shared, real = [], sampling.shared_top_k
    monkeypatch.setattr(sampling, "shared_top_k", lambda *a: shared.append(real(*a)) or shared[-1])
    prompt = torch.tensor([[2, 40, 41, 42, 43]])  # (1, 5)
    asks = [(2, 1.0), (3, 0.5), (5, 1.7)]  # (top_k, temperature)
    options = dict(want_logits=True, sampler="top-k", do_sample=True, max_new_tokens=24)
    handles = [
        rt.submit(prompt, generator=torch.Generator().manual_seed(i), top_k=k, temperature=t, **options)
        for i, (k, t) in enumerate(asks)
    ]
    for (k, _), handle in zip(asks, handles, strict=True):
        steps = [(int(token[0]), logits[0]) for token, logits in handle]  # logits (vocab,) raw
        assert steps and all(token in logits.topk(k).indices.tolist() for token, logits in steps)
    assert any(top is not None for top in shared), "no step shared its top-k"


def test_an_unknown_sampler_is_refused_by_name(rt):
    with pytest.raises(InvalidInputError, match=r"sampler must be one of hf, top-k, got 'fast'"):
        rt.submit(torch.tensor([[2, 40]]), sampler="fast", max_new_tokens=2)
    with pytest.raises(InvalidInputError, match="sampler must be one of"):
        rt.session(sampler="fast")
