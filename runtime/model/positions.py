"""Where each cache row stands: the per-row inputs of the decode step besides the token.

Owns: for every row of a KV cache, the padding mask over absolute cache indices, the rotary position
of its newest token and the absolute cache index that token occupies. Rows are independent sequences
(runtime.format.contract: one cache position per row), so a left-padded batch placed at once and requests
admitted one by one into free rows are the same thing here.

An idle row (no request) is kept harmless: its step writes cache index 0 of its own row and attends to
that slot alone, so it stays finite and touches no other row.
"""

from __future__ import annotations

import torch


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Rotary positions for a padded batch (left padding, or padding anywhere but last), as HF generate
    computes them where it reads them (real tokens): (B, S) int64."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


class RowPositions:
    """Where each row of a (B, ...) cache stands; `rows` arguments are slices of its rows."""

    def __init__(self, batch: int, max_cache_len: int, device):
        self.pad_mask = torch.zeros(batch, max_cache_len, dtype=torch.bool, device=device)  # (B, L)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1) rotary
        self.index = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) absolute cache index
        self.idle(slice(None))

    def idle(self, rows: slice) -> None:
        self.park(rows, 0)

    def park(self, rows: slice, index: int) -> None:
        """Rows that are not decoding but sit inside the stepped batch: the step writes `index` of each
        row (an idle row's 0; a prompt being prefilled in chunks its next index, which the next chunk
        overwrites before anything reads it) and attends to that slot alone."""
        self.pad_mask[rows] = False
        self.pad_mask[rows, index] = True
        self.position[rows] = 0
        self.index[rows] = index

    def place(self, rows: slice, attention_mask: torch.Tensor, fed: int) -> None:
        """Rows that hold the first `fed` tokens of a padded prompt (attention_mask (b, S)); the
        next `advance` admits token `fed`, which may still be the prompt's last."""
        self.pad_mask[rows] = False
        self.pad_mask[rows, :fed] = attention_mask[:, :fed].bool()
        self.position[rows] = attention_mask[:, :fed].sum(-1, keepdim=True) - 1  # the last real token fed so far
        self.index[rows] = fed - 1

    def swap(self, source: slice, target: slice) -> None:
        """Rows `source` and `target` trade where they stand (a request moved down, runtime.engine.runner)."""
        for t in (self.pad_mask, self.position, self.index):
            t[target], t[source] = t[source].clone(), t[target].clone()

    def advance(self, active: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Admit one more token in each `active` row ((B,) bool; `rows` (n,): their indices, if known):
        the step inputs move on by one."""
        self.index += active
        self.position += active[:, None]
        rows = active.nonzero().squeeze(1) if rows is None else rows  # (n,)
        self.pad_mask[rows, self.index[rows]] = True

    def reach(self, rows: slice, drafts: int) -> None:
        """A verify step feeds `rows` their next token and `drafts` drafted ones after it: the drafts'
        indices count as real for the step (each query still sees only those before it)."""
        for row in range(*rows.indices(self.index.shape[0])):
            start = int(self.index[row]) + 1
            self.pad_mask[row, start : start + drafts] = True

    def settle(self, rows: slice, accepted: int, drafts: int) -> None:
        """After a verify step: `accepted` of the `drafts` drafted tokens of `rows` stand, so their rows
        move on by as many, and the rejected ones' indices are padding again (what the step wrote there
        is overwritten before anything reads it)."""
        self.index[rows] += accepted
        self.position[rows] += accepted
        for row in range(*rows.indices(self.index.shape[0])):
            start = int(self.index[row]) + 1
            self.pad_mask[row, start : start + drafts - accepted] = False

    def far(self, active: torch.Tensor, tokens: int = 1, index: torch.Tensor | None = None) -> torch.Tensor:
        """Rows (n,) of the first len(active) that do not decode (`active` (b,) bool: those that do) and
        stand past the decoding rows' furthest index (`index` (b,): where the rows stand, if not where they
        stand now): stepped there, they would widen every row's attention to their index
        (runtime.engine.runner rests them instead)."""
        index = self.index[: active.shape[0]] if index is None else index
        if not bool(active.any()):
            return index.new_zeros(0)
        span = int(index[active].max()) + tokens
        return ((~active) & (index + tokens > span)).nonzero().squeeze(1)

    def rest(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (n,) stand at index 0 for one step (attending to that slot alone); returns what undoes it."""
        undo = (self.pad_mask[rows].clone(), self.index[rows].clone())
        self.pad_mask[rows] = False
        self.pad_mask[rows, 0] = True
        self.index[rows] = 0
        return undo

    def unrest(self, rows: torch.Tensor, undo: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.pad_mask[rows], self.index[rows] = undo

    def inputs(self, count: int, tokens: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(position_ids (n, T), cache_position (n,), pad_mask (n, span)) of the first `count` rows for a
        step of T = `tokens` per row (T > 1: a verify step, its queries at indices cache_position + t): the
        step attends to cache indices [0, span), just past the furthest row's last."""
        position = self.position[:count]
        if tokens > 1:
            position = position + torch.arange(tokens, device=position.device)  # (n, T)
        return position, self.index[:count], self.mask(count, tokens)

    def mask(self, count: int, tokens: int = 1) -> torch.Tensor:
        """pad_mask (n, span) of the first `count` rows: the indices [0, span) a step of `tokens` a row
        attends to, just past the furthest row's last."""
        span = int(self.index[:count].max()) + tokens
        return self.pad_mask[:count, :span].contiguous()
