"""Sample packing: several examples a sequence, positions restarting, attention never crossing a border.

An expert's GEMM is only efficient when many tokens reach it, and a padded token is pure waste, so short
examples are packed into rows of up to `seq_len` tokens. Each example keeps its own positions (0, 1, ...),
and the collator sends no attention mask: Transformers then reads the example borders from the restarting
`position_ids` and builds a block-diagonal causal mask (`masking_utils.find_packed_sequence_indices`), so
no token attends across an example. The first token of every example is never a target (its predecessor
is another example's last token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cockpit.contract import best_fit_decreasing
from trainer.inputs.data import IGNORE


def pack_rows(
    rows: list[dict[str, list[int]]], seq_len: int, seed: int = 0, token_keys: tuple[str, ...] = ()
) -> list[dict[str, list[int]]]:
    """Examples (`input_ids`, `labels`) packed into rows of `seq_len` (`best_fit_decreasing`: longest
    first, rows in a seeded random order).

    Every example is kept whole (tokenization already cut it to `seq_len`). Returns rows with
    `input_ids`, `labels`, `position_ids` and `lengths` (the examples' lengths, in order), and the
    examples' other per-token lists named in `token_keys`, joined the same way.
    """
    bins = best_fit_decreasing([len(r["input_ids"]) for r in rows], seq_len, seed)
    packed = []
    for members in bins:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        extra: dict[str, list[int]] = {k: [] for k in token_keys}
        for i in members:
            example = rows[i]
            n = len(example["input_ids"])
            ids += example["input_ids"]
            labels += [IGNORE, *example["labels"][1:n]]
            positions += range(n)
            for k in token_keys:
                extra[k] += example[k]
        packed.append(
            {
                "input_ids": ids,
                "labels": labels,
                "position_ids": positions,
                "lengths": [len(rows[i]["input_ids"]) for i in members],
                **extra,
            }
        )
    return packed


def packing_efficiency(packed: list[dict[str, list[int]]], seq_len: int) -> float:
    """Fraction of the rows' `seq_len` slots that hold a real token."""
    return sum(len(r["input_ids"]) for r in packed) / max(1, len(packed) * seq_len)


@dataclass
class PackedCollator:
    """Pads packed rows to the longest in the batch (a multiple of `multiple`) and sends no attention mask.

    Padding forms its own trailing "example" (positions restart at 0, labels ignored), so Transformers'
    block-diagonal mask keeps it apart from the last real example.
    """

    pad_token_id: int
    multiple: int = 8
    doc_lens: bool = False  # also send each row's example lengths (`doc_lens`) for the varlen attention

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        longest = max(len(f["input_ids"]) for f in features)
        width = -(-longest // self.multiple) * self.multiple
        ids, labels, positions = [], [], []
        for f in features:
            pad = width - len(f["input_ids"])
            ids.append(list(f["input_ids"]) + [self.pad_token_id] * pad)
            labels.append(list(f["labels"]) + [IGNORE] * pad)
            positions.append(list(f["position_ids"]) + list(range(pad)))
        batch: dict[str, Any] = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(positions, dtype=torch.long),
        }
        if self.doc_lens:
            batch["doc_lens"] = [list(f["lengths"]) for f in features]
        return batch
