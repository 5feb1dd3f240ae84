"""Carrying a plan out over the KV cache: prefill pieces into a request's rows, one decode step over the
rows in use.

Owns the tensors the requests share: the KV cache (allocated once, B rows of the contract's layout),
each row's step inputs (runtime.model.positions.RowPositions), and the next token of every row. Rows
carry nothing from one request to the next: a NaN left in a slot poisons attention even where masked
(0 * NaN), so a request's rows are zeroed when it takes them (and when a failure leaves them); a row
nobody holds steps harmlessly (it writes and attends to its own slot 0 only).

What keeps rows apart is that nothing in a decode step mixes rows: attention, norms and the weight-only
quantized linears are all per row. A kernel that mixed rows (activation quantization with one scale
per batch, say) would have to clear every idle row first.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from runtime.engine.request import RequestState
from runtime.engine.scheduler import Piece
from runtime.engine.status import Status
from runtime.format.contract import DecodeContract
from runtime.model.cache import allocate
from runtime.model.positions import RowPositions, prompt_positions
from runtime.model.prefill import head_inputs, prefill, prefill_more, prefill_states


def covering(batches: tuple[int, ...], width: int, rows: int) -> int:
    """The smallest of `batches` (ascending) that steps the first `width` of a cache's `rows` rows."""
    cover = next((b for b in batches if b >= width), None)
    if cover is None or cover > rows:
        raise ValueError(f"the decode steps {list(batches)} rows; none covers {width} of this cache's {rows}")
    return cover


def _first(logits: torch.Tensor, width: int) -> torch.Tensor:
    """logits (rows, ...) -> the first `width` rows in fp32, calling torch only where that changes them
    (each call just after a step costs ~10 us: runtime.engine.runner.Runner._active)."""
    logits = logits if logits.shape[0] == width else logits[:width]
    return logits if logits.dtype == torch.float32 else logits.float()


class Runner:
    def __init__(self, model, decode, contract: DecodeContract):
        """`model`: the eager model (prefill); `decode`: a backend's step (runtime.backends), over the
        same weights; `contract`: the cache's shape."""
        self.model, self.decode, self.layout = model, decode, contract.layout
        rows, device = contract.batch_size, contract.device
        self.kv = allocate(contract.layout, rows, getattr(torch, contract.dtype), device)  # [k0, v0, ...] (B, ...)
        self.positions = RowPositions(rows, contract.max_cache_len, device)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)  # (B, 1) each row's next step input
        self.chunk_tokens = decode.chunk_tokens  # C: text prompts go in C tokens a call (0: eagerly)
        self._steps: tuple = ((None, (), []), {})  # (decode, KV tensors, their ids), rows -> bound step
        self._stepping: tuple = (None, None, {})  # the decoding rows' key, _active's answer, _everyone's

    def clear(self, rows: slice) -> None:
        """Rows a request takes start empty."""
        self.release(rows, wipe=True)

    def hold(self, rows: slice, fed: int) -> None:
        """Rows a request takes that hold the first `fed` tokens of its prompt (a kept prefix, copied or
        taken over): parked at `fed` until its prompt's rest goes in. They stood where their last holder
        parked, or idle at 0 under a copy, and a chunked prompt may wait several steps for its first
        piece: each step writes the parked slot, which must be one the prompt's rest overwrites."""
        self.positions.park(rows, fed)

    def release(self, rows: slice, wipe: bool = False) -> None:
        """Rows nobody holds: stepped harmlessly. `wipe`: zero what their cache holds too."""
        if wipe:
            for t in self.kv:
                t[rows].zero_()
        self.positions.idle(rows)
        self.tokens[rows] = 0

    def move(self, state: RequestState, source: slice) -> None:
        """A decoding request moved from rows `source` to `state.rows` (disjoint, lower): its cache,
        positions and next token go with it (a few ms for a 2,048-slot Gemma 3 row), and what the rows it
        took held (idle, or a prefix kept for later prompts, parked) goes to the rows it left: they
        trade places."""
        self.swap(source, state.rows)

    def swap(self, a: slice, b: slice) -> None:
        """Rows `a` and `b` (disjoint, as long) trade caches, positions and next tokens."""
        for t in (*self.kv, self.tokens):
            t[a], t[b] = t[b].clone(), t[a].clone()
        self.positions.swap(a, b)

    def copy(self, source: slice, target: slice) -> None:
        """Rows `target` start as copies of the caches of rows `source` (a prefix they share)."""
        for t in self.kv:
            t[target] = t[source]

    def prefill(self, piece: Piece) -> torch.Tensor | None:
        """Put prompt tokens [start, end) in the request's rows: from an empty cache through the model's
        own forward (images included), or continuing it, text only. Once the prompt is in (all but the
        last token, which the next step feeds), the rows join the decode steps; a prompt ending in an
        image token runs whole and returns its first logits (b, vocab) fp32. Otherwise None."""
        state, start, end = piece.state, piece.start, piece.end
        r, c = state.request, state.request.copies
        # views of one row per distinct prompt (every row unless copies > 1), and those prompts
        kv = [t[state.rows.start : state.rows.stop : c] for t in self.kv]
        ids, mask = r.input_ids[::c], r.attention_mask[::c]  # (b / c, S)
        assert start == 0 or end < r.prompt_len, "a continuing prefill is text only: it cannot give logits"
        logits = None
        if self._chunkable(r, ids, mask, start, end):
            self._chunks(kv, ids, mask, start, end)
        elif start > 0:
            prefill_more(self.model, kv, self.layout, ids[:, start:end], mask[:, :end], start)
        elif end == r.prompt_len:
            positions = prompt_positions(mask)  # (b, S)
            logits = prefill(self.model, kv, self.layout, ids, mask, positions, **r.model_inputs)
        elif end > 0:
            extra = head_inputs(r.model_inputs, ids.shape, end)
            prefill_states(
                self.model, kv, self.layout, ids[:, :end], mask[:, :end], prompt_positions(mask[:, :end]), **extra
            )
        if end >= state.final:
            self._copy_prompts(state.rows, c)
            self.begin_decoding(state, end)
        else:
            self.positions.park(state.rows, end)  # the next chunk overwrites what the steps write there
        return logits

    def _chunkable(self, r, ids: torch.Tensor, mask: torch.Tensor, start: int, end: int) -> bool:
        """Whether text tokens [start, end) of `r` go in through the chunk graph: one prompt row without
        padding (a padding query, which sees no key in the decode step's masks, would come out NaN and
        poison the slots it writes), text only (a piece from the start, of a prompt without images or
        per-token inputs, that does not end the prompt)."""
        if not self.chunk_tokens or ids.shape[0] != 1 or not bool(mask[:, :end].all()):
            return False
        return start > 0 or (end < r.prompt_len and not r.model_inputs)

    def _chunks(self, kv: list[torch.Tensor], ids: torch.Tensor, mask: torch.Tensor, start: int, end: int) -> None:
        """One prompt's text tokens [start, end) (ids, mask (1, S)) into its row's cache `kv`, C at a time
        through the decode's chunk graph: an eager chunk pays a pass of Python dispatch over every layer's
        ops (~10 ms on Gemma 3 270M, 2 threads) however few its tokens, the graph one call. The last call
        is padded past `end`: what it writes there is overwritten before anything reads it, as a parked
        row's step is (its rotary positions, pad mask and ring slots are those real tokens would have:
        runtime.format.layout gives rings C - 1 slots to spare for that). Pieces the cache's end leaves no
        room for a whole chunk go in eagerly. The row has no padding (`_chunkable`): token t sits at
        rotary position t and every index before a call's last is real."""
        c, length = self.chunk_tokens, self.positions.pad_mask.shape[1]
        for s in range(start, end, c):
            if s + c > length:
                prefill_more(self.model, kv, self.layout, ids[:, s:end], mask[:, :end], s)
                return
            n = min(c, end - s)
            chunk = torch.cat([ids[:, s : s + n], ids.new_zeros(1, c - n)], 1)  # (1, C)
            position = torch.arange(s, s + c, device=ids.device)[None]  # (1, C)
            pad_mask = torch.ones(1, s + c, dtype=torch.bool, device=ids.device)  # (1, s + C)
            self.decode.chunk(chunk, position, ids.new_full((1,), s), pad_mask, kv)

    def _copy_prompts(self, rows: slice, copies: int) -> None:
        """Each prefilled row's cache into the `copies - 1` rows after it (num_return_sequences)."""
        for k in range(1, copies):
            for t in self.kv:
                t[rows.start + k : rows.stop : copies] = t[rows.start : rows.stop : copies]

    def begin_decoding(self, state: RequestState, fed: int) -> None:
        """The prompt's first `fed` tokens are in the cache: the rows decode from the next step, fed the
        prompt's last token (unless the prefill took it too)."""
        r = state.request
        self.positions.place(state.rows, r.attention_mask, fed)
        if fed < r.prompt_len:
            self.tokens[state.rows] = r.input_ids[:, -1:]

    def step(self, decoding: list[RequestState], width: int) -> torch.Tensor:
        """One decode call advances every decoding request's rows by one token; the first `width` rows
        are needed, and the smallest batch the decode has a graph for that covers them is computed (the
        rows past `width` step harmlessly, as every row does). Returns the raw logits (width, vocab) fp32."""
        active = self._advance(decoding)
        rows = covering(self.decode.batches, width, self.tokens.shape[0])
        if self._everyone(active, rows):  # no row to rest
            return _first(self._bound(rows)(self.positions.mask(rows)), width)
        with self._resting(active[:rows], 1):
            logits = self._bound(rows)(self.positions.mask(rows))
        return _first(logits, width)

    def _bound(self, rows: int):
        """The decode step bound to the first `rows` rows' tensors (Decode.bind), made again when the
        decode or a KV tensor of the list was replaced (tests wrap the decode; a cache tensor put in the
        list would otherwise be written by prefills and never read by the steps)."""
        decode, kv = self.decode, [id(t) for t in self.kv]
        held, steps = self._steps
        if held[0] is not decode or held[2] != kv:
            held, steps = (decode, tuple(self.kv), kv), {}  # the tensors kept: their ids stay theirs
            self._steps = (held, steps)
        if rows not in steps:
            position, index = self.positions.position[:rows], self.positions.index[:rows]
            steps[rows] = decode.bind(self.tokens[:rows], position, index, [t[:rows] for t in self.kv])
        return steps[rows]

    def _advance(self, decoding: list[RequestState]) -> torch.Tensor:
        """Every decoding request's rows admit the token this step feeds them; returns those rows (B,) bool."""
        active, rows = self._active(decoding)
        self.positions.advance(active, rows)
        return active

    def _active(self, decoding: list[RequestState]) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoding requests' rows: (B,) bool and their indices (n,). The same requests step for many
        steps in a row, so both are kept until the rows change: a step's few small torch calls cost
        ~10 us each here, just after a step has swept the caches (SmolLM2-135M int8, AMD EPYC Zen 4)."""
        key = tuple((s.rows.start, s.rows.stop) for s in decoding)
        if self._stepping[0] != key:
            active = self._rows(decoding)
            self._stepping = (key, (active, active.nonzero().squeeze(1)), {})
        return self._stepping[1]

    def _everyone(self, active: torch.Tensor, rows: int) -> bool:
        """Whether the first `rows` rows all decode (`active` the current _active's): nothing rests then."""
        everyone = self._stepping[2]
        if rows not in everyone:
            everyone[rows] = bool(active[:rows].all())
        return everyone[rows]

    def _rows(self, decoding: list[RequestState]) -> torch.Tensor:
        """The decoding requests' rows (B,) bool."""
        active = torch.zeros(self.tokens.shape[0], dtype=torch.bool, device=self.tokens.device)  # (B,)
        for state in decoding:
            active[state.rows] = True
        return active

    @contextmanager
    def _resting(self, active: torch.Tensor, tokens: int):
        """For one step of `tokens` a row over the rows `active` (n,) bool marks among those stepped: rows
        that do not decode but stand past every decoding row (a long prompt between its chunks, a kept
        prefix, a session's row between turns) stand at index 0 instead, and what the step writes to
        their slots [0, tokens) is put back after. Stepped where they stand, they made every row of the
        step attend as far as they reach: Gemma 3 270M int8's 8-row step took 16 ms instead of 9-10
        while a 512-token prompt went in, in chunks, beside 7 short streams."""
        far = self.positions.far(active, tokens)  # (f,)
        if not far.numel():
            yield
            return
        held = [t[far, :, :tokens].clone() for t in self.kv]  # (f, kv_heads, tokens, head_dim) each
        undo = self.positions.rest(far)
        try:
            yield
        finally:
            for t, h in zip(self.kv, held, strict=True):
                t[far, :, :tokens] = h
            self.positions.unrest(far, undo)

    @property
    def draft_tokens(self) -> int:
        """k: drafted tokens a verify step takes a row (0: the decode has no verify step)."""
        return self.decode.contract.draft_tokens if self.decode.verify_batches else 0

    def verify_batch(self, decoding: list[RequestState], width: int) -> int | None:
        """The verify graph's batch covering the first `width` rows, if every row it steps has room for
        its next token and k drafts in the cache (idle and parked rows write k + 1 slots too, rested ones
        from slot 0); else None."""
        rows, k = covering(self.decode.verify_batches, width, self.tokens.shape[0]), self.draft_tokens
        active = self._rows(decoding)[:rows]
        index = self.positions.index[:rows] + active  # where the step's rows will stand (_advance)
        index[self.positions.far(active, k + 1, index)] = 0
        end = int(index.max()) + 1 + k  # the furthest write
        return rows if end < self.positions.pad_mask.shape[1] else None

    def verify(self, decoding: list[RequestState], width: int, drafts: dict[int, torch.Tensor]) -> torch.Tensor:
        """One verify call: every decoding request's rows take their next token, and a row with drafts
        (`drafts`: row -> ids (d,), d <= k) takes them after it. Returns the raw logits (width, k + 1,
        vocab) fp32, after each token; `settle` then says how many drafts each row keeps."""
        active = self._advance(decoding)
        rows, k = covering(self.decode.verify_batches, width, self.tokens.shape[0]), self.draft_tokens
        tokens = self.tokens[:rows].repeat(1, k + 1)  # (rows, k + 1): past a row's drafts, queries nobody reads
        for row, drafted in drafts.items():
            tokens[row, 1 : 1 + drafted.shape[0]] = drafted
            self.positions.reach(slice(row, row + 1), drafted.shape[0])
        with self._resting(active[:rows], k + 1):
            logits = self.decode(tokens, *self.positions.inputs(rows, k + 1), [t[:rows] for t in self.kv])
        return _first(logits, width)

    def settle(self, state: RequestState, accepted: int, drafted: int) -> None:
        """After a verify step: the request's row keeps `accepted` of its `drafted` tokens."""
        self.positions.settle(state.rows, accepted, drafted)

    def feed(self, state: RequestState, token: torch.Tensor) -> None:
        """The request's rows take `token` (b,) at the next step."""
        self.tokens[state.rows] = token[:, None]

    def keep(self, state: RequestState, failed: bool) -> int:
        """A request ended in a row that keeps what it holds (a session's leased row, or a row of the
        prefix cache): how many tokens of its history the row's cache holds (all but the last chosen
        token, which was never fed), parked where the next request there writes first, so the steps of
        other requests over it change nothing before it (runtime.engine.prefix: a ring's next slots are
        the exception; a row parked past the decoding rows rests, see _resting). A failed request leaves
        nothing trusted (0)."""
        if failed:
            cached = 0
        elif state.status is Status.DECODING:
            cached = int(self.positions.index[state.rows.start]) + 1
        else:  # cancelled while its prompt was still being prefilled
            cached = state.fed
        cached = min(cached, self.positions.pad_mask.shape[1] - 1)  # the parked slot must exist; it is lost
        if cached:
            self.positions.park(state.rows, cached)
        else:
            self.release(state.rows, wipe=failed)
        return cached
