"""Padding-free caption batches: the frozen LM runs on the batch's real tokens only, packed into one row.

A padded batch of captions of mixed lengths is mostly padding (the demo's world: 1.7x the real tokens), and the
frozen LM's forward, the I-Tuning modules' backward through it and the vocabulary head all pay for every padded
position. For the caption loss, `ITuningForCaptioning.forward` instead packs the real tokens of the batch into a few
rows, with position ids that restart at 0 for each caption; transformers' mask builder then gives each caption a
block of its own (attention never crosses captions: `masking_utils.find_packed_sequence_indices`), and the I-Tuning
modules see each token next to its own image (`PackedCaptions.unpack`, back to the batch's layout, through
`VisionContext.packing`). The loss is the same mean over the same caption tokens; the logits come back in the batch's
`(B, T, V)` layout, zero on padding.

Packing is used only when it computes what the padded batch computes: `packing_matches` checks this once per model
on two short captions (an LM whose masks ignore packed position ids would let captions attend to each other, and is
left padded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: The row length at which a token's attention costs what its linear layers do (a d=576 LM: about 3,000 tokens; the
#: same order for wider ones): rows are chosen to minimise `rows * capacity * (1 + capacity / ATTENTION_TOKENS)`.
ATTENTION_TOKENS = 3000
#: The row lengths tried, in multiples of the batch's padded length (at most the batch size): a few, so that choosing
#: stays cheap for large batches (trying every multiple up to the batch size costs a visible share of a step there).
CAPACITY_MULTIPLES = (1, 2, 3, 4, 6, 8, 12, 16)
#: Largest relative difference between the packed and padded logits of the probe (`packing_matches`) that still
#: counts as equal: fp32 runs differ by ~1e-6, half-precision weights by ~1e-3; captions that attend to each other
#: differ by orders of magnitude more.
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
HALF_PRECISION_TOLERANCE = 2e-2


def first_fit(lengths: list[int], capacity: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Captions of `lengths` packed first-fit, longest first, into rows of `capacity` tokens: the tokens each row
    uses, and each caption's (row, first column)."""
    fill: list[int] = []
    where = [(0, 0)] * len(lengths)
    for caption in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, used in enumerate(fill) if used + lengths[caption] <= capacity), len(fill))
        if row == len(fill):
            fill.append(0)
        where[caption], fill[row] = (row, fill[row]), fill[row] + lengths[caption]
    return fill, where


@dataclass
class PackedCaptions:
    """Where the real tokens of a `(B, T)` caption batch go in its packed rows.

    Captions are packed first-fit, longest first, into rows of a multiple of `T` tokens, the one that minimises the
    estimated cost (`ATTENTION_TOKENS`: longer rows waste fewer slots, but attention costs the square of a row, so
    one row for the whole batch makes the LM's attention dearer than padding); a row's unused tail is a
    sequence of its own (positions from 0), which no caption attends to and no loss reads.

    Args:
        batch: Captions in the batch (`B`).
        length: Padded length (`T`).
        index: `(N,)` flat index (`row * T + column`) of each real token of the batch.
        slot: `(N,)` where each of those tokens goes in the packed rows (`packed_row * capacity + column`).
        position_ids: `(R, capacity)` each slot's position within its caption.
        capacity: Tokens per packed row.
    """

    batch: int
    length: int
    index: torch.Tensor
    slot: torch.Tensor
    position_ids: torch.Tensor
    capacity: int

    @classmethod
    def of(cls, attention_mask: torch.Tensor, capacity: int | None = None) -> PackedCaptions:
        """The packing of a batch whose `attention_mask` (`(B, T)`, 0 on padding) marks its real tokens; each
        caption's real tokens must be contiguous (left or right padding).

        Args:
            attention_mask: The batch's mask.
            capacity: Tokens per packed row (at least `T`); default: the cheapest of `CAPACITY_MULTIPLES` times `T`.
        """
        mask = attention_mask.bool()
        batch, length = mask.shape
        lengths = mask.sum(-1).tolist()
        capacities = [capacity] if capacity else sorted({min(k, batch) * length for k in CAPACITY_MULTIPLES})
        capacity, (fill, where) = min(
            ((c, first_fit(lengths, c)) for c in capacities),
            key=lambda packed: len(packed[1][0]) * packed[0] * (1 + packed[0] / ATTENTION_TOKENS),
        )
        positions, slots = [], []
        for used in fill:  # a row's unused tail is a sequence of its own
            positions += [0] * used + list(range(capacity - used))
        for caption, (row, column) in enumerate(where):
            start = row * capacity + column
            positions[start : start + lengths[caption]] = range(lengths[caption])
            slots += range(start, start + lengths[caption])
        index = mask.reshape(-1).nonzero().squeeze(-1)
        position_ids = torch.tensor(positions, device=mask.device).reshape(len(fill), capacity)
        slot = torch.tensor(slots, device=mask.device, dtype=torch.long)
        return cls(batch, length, index, slot, position_ids, capacity)

    @property
    def rows(self) -> int:
        return self.position_ids.shape[0]

    def pack(self, padded: torch.Tensor, fill: float = 0) -> torch.Tensor:
        """`(B, T, ...)` -> `(R, capacity, ...)`: the real tokens' entries in their slots, `fill` elsewhere."""
        flat = padded.reshape(self.batch * self.length, *padded.shape[2:]).index_select(0, self.index)
        packed = flat.new_full((self.rows * self.capacity, *flat.shape[1:]), fill).index_copy(0, self.slot, flat)
        return packed.reshape(self.rows, self.capacity, *flat.shape[1:])

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """`(R, capacity, ...)` -> `(B, T, ...)`, zero on padding (differentiable)."""
        flat = packed.reshape(self.rows * self.capacity, *packed.shape[2:]).index_select(0, self.slot)
        padded = flat.new_zeros(self.batch * self.length, *flat.shape[1:]).index_copy(0, self.index, flat)
        return padded.reshape(self.batch, self.length, *flat.shape[1:])


def worth_packing(attention_mask: torch.Tensor | None) -> bool:
    """Whether a batch has padding to leave out (a 2-D mask with zeros)."""
    return attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all())


def probe_tolerance(dtype: torch.dtype) -> float:
    """The relative difference `packing_matches` allows for weights of `dtype`."""
    return PROBE_TOLERANCE.get(dtype, HALF_PRECISION_TOLERANCE)


def packing_matches(padded_logits: torch.Tensor, packed_logits: torch.Tensor, mask: torch.Tensor, dtype) -> bool:
    """Whether the logits of a packed run equal those of the padded run on the real tokens (`mask`), within
    `probe_tolerance(dtype)` of the logits' scale."""
    real = mask.bool()
    padded, packed = padded_logits[real].float(), packed_logits[real].float()
    scale = padded.abs().max().clamp_min(1e-6)
    return bool(((padded - packed).abs().max() / scale) <= probe_tolerance(dtype))
