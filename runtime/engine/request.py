"""One request, from submission to its end: the validated call, and the state the engine owns.

Owns: `Request`, what a validated generate() call asks for (runtime.generation.validate builds it);
`RequestState`, the one record of a request's progress (status, its cache rows, how much of the prompt
is in the cache, what it has generated, and why each of its sequences ended); and choosing the next
tokens from a step's logits exactly as HF `generate` does: transformers' own logits processors over the
request's history, greedy or sampled with the request's own generator, finished rows padded with the
pad id, transformers' own stopping criteria ending rows (length, time, stop strings, eos, the caller's).

The engine's thread writes a state's progress and outcome; a caller reads them through its Handle
(runtime.engine.handle), from the token stream while it runs and the rest once it has finished. The
one field other threads write is `cancel_requested` (Engine.cancel and Engine.close, under the
engine's lock), which the scheduler reads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation import LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StopStringCriteria,
)

from runtime.engine import sampling
from runtime.engine.prefix import image_digests
from runtime.engine.sampling import at_top_k, next_token, probabilities
from runtime.engine.speculation import rejection_sample
from runtime.engine.status import FinishReason, Status
from runtime.errors import InvalidInputError
from runtime.generation.grammar import GrammarProcessor

# Several criteria can end a row at the same step: the model's own stop wins, then the request's stops,
# then the limits (vLLM reports an eos on the last allowed token as "stop" too).
_PRIORITY = (FinishReason.EOS, FinishReason.STOP_STRING, FinishReason.CRITERION, FinishReason.TIME, FinishReason.LENGTH)
_KINDS = {
    EosTokenCriteria: FinishReason.EOS,
    StopStringCriteria: FinishReason.STOP_STRING,
    MaxTimeCriteria: FinishReason.TIME,
    MaxLengthCriteria: FinishReason.LENGTH,
}


def _pooled_grammar(head: LogitsProcessorList) -> tuple[GrammarProcessor | None, LogitsProcessorList | None]:
    """(the grammar, the other processors) when the processors before top-k are one grammar and processors
    that only rescale (runtime.engine.sampling.ranks_like_its_input): a positive rescaling keeps -inf and
    the order, so the mask and it commute. Else (None, None)."""
    grammars = [p for p in head if isinstance(p, GrammarProcessor)]
    rest = LogitsProcessorList(p for p in head if not isinstance(p, GrammarProcessor))
    if len(grammars) != 1 or not sampling.ranks_like_its_input(rest):
        return None, None
    return grammars[0], rest


def reason_of(criterion) -> FinishReason:
    return next((r for kind, r in _KINDS.items() if isinstance(criterion, kind)), FinishReason.CRITERION)


# transformers' own length and eos criteria (these classes exactly) read only the history's length and last
# tokens: RequestState._stop reads them in Python. Called, they made 3-4 torch calls a request a step, each
# ~10 us just after a step has swept the caches (8 one-row requests of Gemma 3 270M int8: ~0.3 ms a step)
def _eos_ids(criterion) -> frozenset[int] | None:
    """An EosTokenCriteria's ids (it ends a row whose last token is one of them); None for any other."""
    return frozenset(criterion.eos_token_id.flatten().tolist()) if type(criterion) is EosTokenCriteria else None


def _quiet(criterion: MaxLengthCriteria, length: int) -> bool:
    """Whether the criterion, called at `length`, would answer without its warning (which it logs short of
    its limit past the model's positions): then its answer is `length >= max_length` for every row."""
    positions = criterion.max_position_embeddings
    return positions is None or length >= criterion.max_length or length <= positions


def _rows(hit, b: int) -> list[bool]:
    """A criterion's answer as b bools: one for each row (b,), or one bool for all, as HF's
    StoppingCriteriaList takes it (one read: each torch call just after a step costs ~10 us)."""
    hit = hit if isinstance(hit, torch.Tensor) else torch.as_tensor(hit)
    if hit.dim() > 1 or hit.numel() not in (1, b):
        raise InvalidInputError(
            f"a stopping criterion answered with shape {tuple(hit.shape)} for a {b}-row request; it must "
            f"answer a bool for each row ({b},), or one for all"
        )
    read = hit.tolist()  # one value (0-d), or a list of 1 or b
    read = read if isinstance(read, list) else [read]
    return [bool(x) for x in read] if len(read) == b else [bool(read[0])] * b


@dataclass(frozen=True)
class Request:
    """One validated generate() call."""

    input_ids: torch.Tensor  # (B, S) int64; B counts num_return_sequences
    attention_mask: torch.Tensor  # (B, S) int64: left padding, or padding anywhere but last (generate's inferred)
    model_inputs: dict  # extra prefill inputs, e.g. pixel_values, token_type_ids
    config: GenerationConfig  # resolved as generate resolves it (runtime.compat.generation_config)
    eos_ids: tuple[int, ...]
    pad_id: int
    generator: torch.Generator | None
    processors: LogitsProcessorList  # transformers' own, built for this call's options
    stopping: StoppingCriteriaList  # transformers' own: length, time, stop strings, eos, the caller's
    ends_in_image: bool = False  # the last prompt token is an image token: the text-only step cannot take it
    # num_return_sequences of a text prompt: each prompt row is repeated `copies` times in a row, and the
    # engine prefills one of each and copies its cache (runtime.engine.runner.Runner.prefill)
    copies: int = 1
    # how a sampled token is drawn (runtime.engine.sampling): "hf", generate's own draws; "top-k", among the
    # top-k warper's survivors (the same distribution, without a 262k-vocabulary sort and draw)
    sampler: str = "hf"

    @property
    def keeps_scores(self) -> bool:
        """HF hands stopping criteria the processed scores so far only when it returns them."""
        return bool(self.config.return_dict_in_generate and self.config.output_scores)

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1]


_END = object()  # the stream's last item


class RequestState:
    """A request as the engine runs it. The scheduler (runtime.engine.scheduler) sets its scheduling
    fields (`status`, `rows`, `fed`) and reads `cancel_requested`; the engine sets its tokens."""

    def __init__(self, request: Request, want_logits: bool = False, lease=None, reuse: int = 0):
        self.request = request
        self.want_logits = want_logits
        self.lease = lease  # a session's row (runtime.engine.scheduler.Lease), or None: any free rows
        self.status = Status.WAITING
        self.rows: slice | None = None  # its cache rows, one per sequence, while it holds them
        self.fed = reuse  # prompt tokens in the cache: with a lease, those its row already holds
        self.reused = 0  # prompt tokens its rows held when it was admitted: not prefilled (the engine sets it)
        self.images = image_digests(request.model_inputs)  # for the prefix cache: same images, same prefix
        self.cancel_requested = False
        self.submitted = time.monotonic()
        self.times: list[float] = []  # time.monotonic() of each step's tokens, as the engine produced them
        self.history = request.input_ids  # (b, S + steps): what the processors see, as in generate
        self.criteria = [(c, reason_of(c), _eos_ids(c)) for c in request.stopping]
        # HF pads finished rows only when an eos criterion can finish one early
        self.pads = any(hasattr(c, "eos_token_id") for c in request.stopping)
        self.scores: list[torch.Tensor] = []  # processed scores (b, vocab) per step, when the request keeps them
        self.steps = 0
        self.finish_reasons: list[FinishReason | None] = [None] * request.batch  # None while the row runs
        self.error: BaseException | None = None
        self.stream: queue.SimpleQueue = queue.SimpleQueue()  # (tokens (b,), logits or None) per step, then _END
        self.wake: Callable[[], None] | None = None  # called after each put on `stream` (an asyncio reader's)
        self.finished = threading.Event()
        self.drafter = None  # runtime.engine.speculation.Drafter when it drafts tokens (the engine sets it)
        # (processors before HF's top-k, k, the rest) when it samples among the survivors (Request.sampler)
        sampled = request.sampler == "top-k" and request.config.do_sample and not request.keeps_scores
        self.survivors = at_top_k(request.processors) if sampled else None
        # its k when the processors before top-k only rescale: it then ranks the raw logits (shared_top_k);
        # with a grammar among them too, it reads the grammar's mask over a pool of 2(k + 1) of them
        # (GrammarProcessor.top_allowed) and masks the whole vocabulary only where the pool cannot tell
        self.pooled, self.rescalers = _pooled_grammar(self.survivors[0]) if self.survivors else (None, None)
        ranks_raw = self.survivors is not None and sampling.ranks_like_its_input(
            self.survivors[0] if self.pooled is None else self.rescalers
        )
        k = self.survivors[1] if self.survivors else 0
        self.raw_top_k: int | None = (2 * k + 1 if self.pooled is not None else k) if ranks_raw else None
        # a greedy request whose last processor is a grammar and whose processed scores no one keeps:
        # its argmax is checked against the grammar before the grammar masks anything (_checked_greedy)
        greedy_grammar = not request.config.do_sample and not request.keeps_scores and request.processors
        self.checks_grammar = bool(greedy_grammar) and isinstance(request.processors[-1], GrammarProcessor)
        self.grammars = [p for p in request.processors if isinstance(p, GrammarProcessor)]

    # ---- what the scheduler plans with: plain numbers ----
    @property
    def batch(self) -> int:
        return self.request.batch

    @property
    def final(self) -> int:
        """Prompt tokens that go into the cache before the first decode step: all but the last, which the
        step takes; all of them when the last is an image token (the prefill then gives the first logits)."""
        return self.request.prompt_len if self.request.ends_in_image else self.request.prompt_len - 1

    @property
    def chunkable(self) -> bool:
        """Chunks continue the cache through aotpack's own masks, which know text only: a prompt with
        images is prefilled whole (a session's continuation, text by construction, is chunkable), and so is
        one ending in an image token, whose prefill gives the first logits."""
        return not self.request.ends_in_image and (self.fed > 0 or not self.request.model_inputs)

    # ---- the engine's side ----
    @property
    def takes_argmax(self) -> bool:
        """Whether its tokens start from the raw logits' argmax, which the engine takes for every such row
        of a step in one call (8 rows of a 262k vocabulary: 3.8 ms, against 6.8 ms as 8 calls): greedy with
        no processor, or greedy under a grammar alone (checked against it first, _checked_greedy)."""
        r = self.request
        return not r.config.do_sample and (not r.processors or (self.checks_grammar and len(r.processors) == 1))

    def choose(
        self,
        logits: torch.Tensor,
        argmax: torch.Tensor | None = None,
        draft: int | None = None,
        top: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """logits (b, vocab) raw fp32 -> the next token ids (b,); finished rows get the pad id.
        `argmax` (b,): the logits' argmax, already taken, for a request that `takes_argmax`. `draft`: the token
        drafted for this position (one row): a sampled request accepts it by the rejection rule
        (runtime.engine.speculation), a greedy one when it is the argmax. `top`: the raw logits' highest
        (values, indices), at least `raw_top_k` + 1 columns each, already taken (sampling.shared_top_k)."""
        r = self.request
        # A processor may write its input in place; the raw logits need a copy only if the caller gets
        # them (a 262k-vocabulary copy cost 1-5 ms a token, as much as the rest of the engine)
        # (HF's temperature and ranking warpers, all a raw_top_k request has but a grammar, write nothing in
        # place; a grammar masks in place where its pool cannot tell, which copies them then, _whole)
        whole = self.raw_top_k is None or (self.pooled is not None and draft is not None)
        protect = bool(r.processors) and self.want_logits and whole
        logits = logits.clone() if protect else logits
        if self.pads and self.grammars:  # a row that has ended is padded: its grammar must not follow it
            ended = [why is not None for why in self.finish_reasons]
            for grammar in self.grammars:
                grammar.ended = ended
        if self.survivors is not None and draft is None:
            scores, token = None, self._sample_survivors(logits, top)
        elif self.checks_grammar:  # greedy: a draft is accepted when it is the chosen token
            scores, token = None, self._checked_greedy(logits, argmax)
        else:
            scores = r.processors(self.history, logits)  # (b, vocab)
            if draft is not None and r.config.do_sample:
                token = rejection_sample(probabilities(scores), draft, r.generator)
            else:
                token = argmax if argmax is not None else next_token(scores, r.config.do_sample, r.generator)
        if self.pads and not self.all_running:  # (b,): a finished row's token is the pad id
            running = torch.tensor([why is None for why in self.finish_reasons], device=token.device)  # (b,)
            token = torch.where(running, token, torch.full_like(token, r.pad_id))
        self.history = torch.cat([self.history, token[:, None]], dim=-1)
        if r.keeps_scores:
            self.scores.append(scores)
        self._stop(token)
        self.steps += 1
        if self.steps >= r.config.max_new_tokens:
            self._end_rows(FinishReason.LENGTH)
        return token

    def _sample_survivors(self, logits: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """logits (b, vocab) -> token ids (b,) drawn among the top-k warper's survivors; a tie at the k-th
        score takes generate's own draw (runtime.engine.sampling)."""
        head, k, rest = self.survivors
        pooled = None
        if self.raw_top_k is not None:  # raw: at least raw_top_k + 1 columns
            values, indices = top if top is not None else sampling.top_k_and_next(logits, self.raw_top_k)
            pooled = (values, indices) if self.pooled is None else self.pooled.top_allowed(
                self.history, logits, values, indices, k + 1
            )  # fmt: skip
        if pooled is not None:  # temperature keeps the order: it runs over the k + 1 survivors only
            values, indices = pooled
            rescale = self.rescalers if self.pooled is not None else head
            values, indices, scores = rescale(self.history, values[:, : k + 1]), indices[:, : k + 1], None
            survivors = sampling.survivors_distribution(values, indices, k, rest, self.history)
        else:
            scores = self._whole(head, logits)  # (b, vocab)
            survivors = sampling.top_k_distribution(scores, k, rest, self.history)
        if survivors is not None:
            return sampling.draw(survivors, self.request.generator)
        scores = self._whole(head, logits) if scores is None else scores  # HF's path, ties and all
        return next_token(rest(self.history, scores), True, self.request.generator)

    def _whole(self, head: LogitsProcessorList, logits: torch.Tensor) -> torch.Tensor:
        """logits (b, vocab) -> `head` over the whole vocabulary. A pooled grammar masks in place there,
        so a caller who keeps the raw logits gets them unmasked: a copy is masked (`choose` copies them up
        front only where the processors always run over the whole vocabulary)."""
        return head(self.history, logits.clone() if self.want_logits and self.pooled is not None else logits)

    def _checked_greedy(self, logits: torch.Tensor, argmax: torch.Tensor | None) -> torch.Tensor:
        """logits (b, vocab) -> token ids (b,): the argmax of the scores before the grammar when the grammar's
        mask lets each running row's through, which is then the masked scores' argmax too; else the
        masked argmax. llama.cpp's sampler checks its token against the grammar before it masks the
        candidates, too: the mask's application and HF's processor list cost 0.3 ms a row at a 262k
        vocabulary, reading one bit of the mask nothing, and free rows of the step wait for both."""
        *head, grammar = self.request.processors
        scores = LogitsProcessorList(head)(self.history, logits) if head else logits  # (b, vocab)
        token = argmax if argmax is not None and not head else next_token(scores, False, None)  # (b,)
        if grammar.allows(self.history, token):
            return token
        return next_token(grammar(self.history, scores), False, None)

    def put(self, token: torch.Tensor, logits: torch.Tensor) -> None:
        """Hand a step's tokens (b,) (and its raw logits, if the caller wants them) to the caller."""
        self.times.append(time.monotonic())
        self.stream.put((token, logits if self.want_logits else None))
        self._woken()

    def _stop(self, token: torch.Tensor) -> None:
        """As in generate: each criterion reads the history with the new tokens `token` (b,) (and the scores
        HF keeps); a row they end records the most telling reason among those that ended it. transformers'
        own length and eos criteria are read in Python (_eos_ids, _quiet)."""
        scores = tuple(self.scores) if self.request.keeps_scores else None
        b, length, last = self.request.batch, self.history.shape[1], None
        hits: dict[FinishReason, list[bool]] = {}
        for criterion, reason, eos in self.criteria:
            if eos is not None:  # an EosTokenCriteria: the last token of each row among its ids
                last = token.tolist() if last is None else last  # (b,) ints, read once for every such criterion
                hit = [t in eos for t in last]
            elif type(criterion) is MaxLengthCriteria and _quiet(criterion, length):
                hit = [length >= criterion.max_length] * b
            else:
                hit = _rows(criterion(self.history, scores), b)
            hits[reason] = [x or y for x, y in zip(hits[reason], hit, strict=True)] if reason in hits else hit
        for reason in _PRIORITY:
            if reason in hits:
                ended = hits[reason]
                self._end_rows(reason, [row for row in range(b) if ended[row] and self.finish_reasons[row] is None])

    def _end_rows(self, reason: FinishReason, rows: list[int] | None = None) -> None:
        """Rows `rows` (default: every running one) end for `reason`."""
        rows = [row for row, why in enumerate(self.finish_reasons) if why is None] if rows is None else rows
        for row in rows:
            self.finish_reasons[row] = reason

    @property
    def all_running(self) -> bool:
        """Whether no row has ended yet (so no token is a pad)."""
        return all(why is None for why in self.finish_reasons)

    @property
    def done(self) -> bool:
        return all(why is not None for why in self.finish_reasons)

    def finish(self, reason: FinishReason | None = None, error: BaseException | None = None) -> None:
        """The request ends: rows still running end with `reason` (cancelled, failed); the caller's
        stream ends, and its failure (if any) is raised in the caller's thread."""
        if self.status is Status.FINISHED:
            return
        if reason is not None:
            self._end_rows(reason)
        self.status, self.error = Status.FINISHED, error
        self.finished.set()
        self.stream.put(_END)
        self._woken()

    def _woken(self) -> None:
        if (wake := self.wake) is not None:
            wake()
