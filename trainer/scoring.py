"""Label scoring: the log-probability of each of an example's labels (`label<end of turn>`) after its prefix
(the prompt and the model's thinking).

Every label of an example follows the same prefix, so the prefix goes through the model once (`SharedRows`):
a row holds the prefix, then each label's tokens one after another, and a 4-D mask lets a label's tokens
see the prefix and the earlier tokens of their own label only, at the positions they would have right
after the prefix. That is the arithmetic of one row a label (`row_logprobs`), with the prefix's tokens
counted once instead of once a label: at the story's shape (a prefix of about 1,500 tokens, 4 labels of a
few tokens) a quarter of the tokens. Only the positions a score reads reach the head (`logits_to_keep`:
rows are left-padded, so those are the last columns of every row), not the whole row's vocabulary logits.

A model whose attention takes no 4-D mask (other than sdpa and eager) scores one row a label.
Forwards hold at most `SCORE_TOKENS` tokens and `SCORE_LOGITS` kept positions (one row at least).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cockpit.contract import SCORE_LOGITS, SCORE_TOKENS

SHARED_ATTENTION = ("sdpa", "eager")  # attentions that take the 4-D mask a shared row needs
PAD_SEGMENT, PREFIX_SEGMENT = -1, 0  # a column's segment; label j's columns are segment j + 1


@dataclass
class SharedRows:
    """Left-padded rows of a prefix and its labels, with what one forward over them needs."""

    ids: torch.Tensor  # [R, W]
    allowed: torch.Tensor  # [R, W, W] bool: the keys each query sees
    positions: torch.Tensor  # [R, W] rotary positions: a label's tokens follow the prefix
    keep: int  # the last columns whose logits the scores read
    rows: torch.Tensor  # [N] for each scored token: its row,
    columns: torch.Tensor  # [N] the kept column that predicts it,
    targets: torch.Tensor  # [N] its id,
    labels: torch.Tensor  # [N] and which (row, label) score it adds to (an index into `shape`)
    shape: list[int]  # labels a row


def shared_rows(
    prefixes: Sequence[Sequence[int]], tails: Sequence[Sequence[Sequence[int]]], pad: int
) -> SharedRows:
    """Rows of `prefixes[i]` followed by each of `tails[i]` (every prefix at least one token, every tail
    at least one), as `SharedRows` (see the module docstring)."""
    lengths = [len(p) + sum(len(t) for t in ts) for p, ts in zip(prefixes, tails, strict=True)]
    width = max(lengths)
    keep = 1 + max(sum(len(t) for t in ts) for ts in tails)
    ids = torch.full((len(prefixes), width), pad, dtype=torch.long)
    segment = torch.full((len(prefixes), width), PAD_SEGMENT, dtype=torch.long)
    positions = torch.zeros((len(prefixes), width), dtype=torch.long)
    rows, columns, targets, labels = [], [], [], []
    label = 0  # the labels numbered in row order
    for r, (prefix, row_tails) in enumerate(zip(prefixes, tails, strict=True)):
        col = width - lengths[r]
        n = len(prefix)
        ids[r, col : col + n] = torch.tensor(prefix)
        segment[r, col : col + n] = PREFIX_SEGMENT
        positions[r, col : col + n] = torch.arange(n)
        col += n
        last_prefix = col - 1 - (width - keep)  # its kept column: it predicts every label's first token
        for j, tail in enumerate(row_tails):
            k = len(tail)
            ids[r, col : col + k] = torch.tensor(tail)
            segment[r, col : col + k] = j + 1
            positions[r, col : col + k] = n + torch.arange(k)
            before = [last_prefix] + [col + o - (width - keep) for o in range(k - 1)]
            rows += [r] * k
            columns += before
            targets += list(tail)
            labels += [label] * k
            label += 1
            col += k
    seg_q, seg_k = segment[:, :, None], segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()[None]
    sees = ((seg_k == PREFIX_SEGMENT) & (seg_q != PAD_SEGMENT)) | (
        (seg_k == seg_q) & (seg_q > PREFIX_SEGMENT)
    )
    # A padding query sees itself, so no row of the softmax is empty (its output is never read).
    allowed = (causal & sees) | torch.eye(width, dtype=torch.bool)[None]
    return SharedRows(
        ids, allowed, positions, keep, torch.tensor(rows), torch.tensor(columns), torch.tensor(targets),
        torch.tensor(labels), [len(ts) for ts in tails],
    )  # fmt: skip


def shared_logprobs(model: Any, batch: SharedRows) -> list[list[float]]:
    """One forward over `batch`: each row's labels' log-probabilities, in order."""
    from trainer.decode import attention_mask, model_dtype

    device = model.device
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    mask = attention_mask(batch.allowed.to(device), model_dtype(model) if eager else None)
    logits = model(
        input_ids=batch.ids.to(device),
        attention_mask=mask[:, None],
        position_ids=batch.positions.to(device),
        logits_to_keep=batch.keep,
        use_cache=False,
        **_router_off(model),
    ).logits
    logp = torch.log_softmax(logits.float(), dim=-1)
    at = logp.device  # the head's, where the model spans devices
    picked = logp[batch.rows.to(at), batch.columns.to(at), batch.targets.to(at)]
    sums = torch.zeros(sum(batch.shape), dtype=picked.dtype, device=at)
    sums.index_add_(0, batch.labels.to(at), picked)
    flat = sums.tolist()
    out, start = [], 0
    for n in batch.shape:
        out.append(flat[start : start + n])
        start += n
    return out


@torch.no_grad()
def row_logprobs(model: Any, rows: list[list[int]], pad: int) -> list[torch.Tensor]:
    """Each row's next-token log-probabilities of its own tokens (one right-padded forward): the path of
    a model whose attention takes no 4-D mask, a row a label."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=model.device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=model.device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **_router_off(model)).logits.float()
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return [picked[i, : len(r) - 1] for i, r in enumerate(rows)]


def _router_off(model: Any) -> dict[str, bool]:
    """An MoE config that asks for router logits would return them too: scoring needs none."""
    return {"output_router_logits": False} if getattr(model.config, "output_router_logits", False) else {}


def shares_prefix(model: Any) -> bool:
    """Whether `model`'s attention takes the 4-D mask of a shared row."""
    return getattr(model.config, "_attn_implementation", None) in SHARED_ATTENTION


def chunks(widths: Sequence[int], kept: Sequence[int]) -> list[range]:
    """Consecutive rows a forward at a time: right-padded to the widest, at most `SCORE_TOKENS` tokens and
    `SCORE_LOGITS` kept positions (`kept[i]` each), one row at least."""
    out, start = [], 0
    while start < len(widths):
        end, width, keep = start + 1, widths[start], kept[start]
        while end < len(widths):
            w, k = max(width, widths[end]), max(keep, kept[end])
            if w * (end - start + 1) > SCORE_TOKENS or k * (end - start + 1) > SCORE_LOGITS:
                break
            end, width, keep = end + 1, w, k
        out.append(range(start, end))
        start = end
    return out


@torch.no_grad()
def score_ids(
    model: Any, prefixes: Sequence[Sequence[int]], tails: Sequence[Sequence[Sequence[int]]], pad: int
) -> list[list[float]]:
    """For each prefix (token ids), the summed log-probability of each of its tails after it."""
    if shares_prefix(model):
        widths = [len(p) + sum(len(t) for t in ts) for p, ts in zip(prefixes, tails, strict=True)]
        kept = [1 + sum(len(t) for t in ts) for ts in tails]
        out: list[list[float]] = []
        for part in chunks(widths, kept):
            batch = shared_rows([prefixes[i] for i in part], [tails[i] for i in part], pad)
            out += shared_logprobs(model, batch)
        return out
    jobs = [(n, len(p), [*p, *t]) for n, (p, ts) in enumerate(zip(prefixes, tails, strict=True)) for t in ts]
    scores: list[list[float]] = [[] for _ in prefixes]
    for part in chunks([len(j[2]) for j in jobs], [len(j[2]) for j in jobs]):
        chunk = [jobs[i] for i in part]
        for (n, plen, _), lp in zip(chunk, row_logprobs(model, [j[2] for j in chunk], pad), strict=True):
            scores[n].append(lp[plen - 1 :].sum().item())
    return scores


def score_many(
    model: Any, tokenizer: Any, prefixes: list[str], label_sets: list[list[str]]
) -> list[dict[str, float]]:
    """For each prefix, the log-probability of each of its labels (`label<eos>`) after it."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prefix_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prefixes]
    tails = [
        [tokenizer(label + tokenizer.eos_token, add_special_tokens=False)["input_ids"] for label in labels]
        for labels in label_sets
    ]
    scores = score_ids(model, prefix_ids, tails, pad)
    return [dict(zip(labels, s, strict=True)) for labels, s in zip(label_sets, scores, strict=True)]
