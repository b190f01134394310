"""Label scoring: the log-probability of each of an example's labels (`label<end of turn>`) after its prefix
(the prompt and the model's thinking).

Every label of an example follows the same prefix, so the prefix goes through the model once (`SharedRows`):
a row holds the prefix, then each label's tokens one after another, and a 4-D mask lets a label's tokens
see the prefix and the earlier tokens of their own label only, at the positions they would have right
after the prefix. That is the arithmetic of one row a label, with the prefix's tokens counted once
instead of once a label: at the story's shape (a prefix of about 1,500 tokens, 4 labels of a few tokens)
a quarter of the tokens. Rows are left-padded, so the positions a score reads are the last columns of
every row, and only those reach the head (`logits_to_keep`), not the whole row's vocabulary logits.

A model whose attention takes no 4-D mask (other than sdpa and eager), or whose forward refuses one, scores
a row a label (`row_scores`), with the same kept logits. Forwards hold at most `SCORE_TOKENS` tokens and
`SCORE_LOGITS` kept positions (one row at least).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cockpit.contract import SCORE_LOGITS, SCORE_TOKENS
from trainer.pass_through import PASS_THROUGH

log = logging.getLogger(__name__)

SHARED_ATTENTION = ("sdpa", "eager")  # attentions that take the 4-D mask a shared row needs
PAD_SEGMENT, PREFIX_SEGMENT = -1, 0  # a column's segment; label j's columns are segment j + 1


@dataclass
class SharedRows:
    """Left-padded rows of a prefix and its labels, with what one forward over them needs."""

    ids: torch.Tensor  # [R, W]
    segment: torch.Tensor  # [R, W] each column's: padding, the prefix, or label j (j + 1)
    positions: torch.Tensor  # [R, W] rotary positions: a label's tokens follow the prefix
    keep: int  # the last columns whose logits the scores read
    rows: torch.Tensor  # [N] for each scored token: its row,
    columns: torch.Tensor  # [N] the kept column that predicts it,
    targets: torch.Tensor  # [N] its id,
    labels: torch.Tensor  # [N] and which (row, label) score it adds to (an index into `shape`)
    shape: list[int]  # labels a row

    def allowed(self, device: torch.device) -> torch.Tensor:
        """[R, W, W] bool, built on `device`: the keys each query sees (the prefix and its own label's
        earlier tokens; a padding query sees itself only, so no row of the softmax is empty)."""
        segment = self.segment.to(device)
        width = segment.shape[1]
        seg_q, seg_k = segment[:, :, None], segment[:, None, :]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()[None]
        sees = ((seg_k == PREFIX_SEGMENT) & (seg_q != PAD_SEGMENT)) | (
            (seg_k == seg_q) & (seg_q > PREFIX_SEGMENT)
        )
        return (causal & sees) | torch.eye(width, dtype=torch.bool, device=device)[None]


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
        if not prefix:
            raise ValueError("a scored prefix needs a token: its last predicts every label's first")
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
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731  (empty when no row has labels)
    return SharedRows(
        ids, segment, positions, keep, as_long(rows), as_long(columns), as_long(targets), as_long(labels),
        [len(ts) for ts in tails],
    )  # fmt: skip


class MaskRefused(Exception):
    """The model's forward failed on a shared row (remote code that builds its own mask, say)."""


def _takes_keep(model: Any) -> bool:
    """Whether the model's forward takes `logits_to_keep` (a PEFT model's base model's does); where it
    does not, the forward makes every position's logits, said once."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    takes = "logits_to_keep" in inspect.signature(base.forward).parameters
    if not takes and not _said_full:
        _said_full.append(True)
        log.warning("label scoring: the model's forward takes no logits_to_keep: every position's logits")
    return takes


def _kept_logprobs(model: Any, batch: SharedRows, mask: torch.Tensor) -> torch.Tensor:
    """[R, keep, V] fp32 log-probabilities at the rows' last `batch.keep` columns (the compute-dtype
    logits are gone before the log-softmax: two fp32 copies at most, `SCORE_LOGIT_BYTES`)."""
    from trainer.evaluation.decode import router_off

    device = model.device
    keep = {"logits_to_keep": batch.keep} if _takes_keep(model) else {}
    logits = (
        model(
            input_ids=batch.ids.to(device),
            attention_mask=mask,
            position_ids=batch.positions.to(device),
            use_cache=False,
            **keep,
            **router_off(model),
        )
        .logits[:, -batch.keep :]
        .float()
    )
    return torch.log_softmax(logits, dim=-1)


def row_scores(model: Any, batch: SharedRows, shared: bool) -> list[list[float]]:
    """One forward over `batch`: each row's labels' log-probabilities, in order. `shared`: rows of several
    labels under their 4-D mask; else rows of one label each, where the padding is all a mask says."""
    from trainer.evaluation.decode import attention_mask, model_dtype

    device = model.device
    if shared:
        eager = getattr(model.config, "_attn_implementation", None) == "eager"
        mask = attention_mask(batch.allowed(device), model_dtype(model) if eager else None)[:, None]
    else:
        mask = (batch.segment != PAD_SEGMENT).long().to(device)
    try:
        logp = _kept_logprobs(model, batch, mask)
    except PASS_THROUGH:
        raise
    except Exception as exc:
        if not shared:
            raise
        raise MaskRefused(f"{type(exc).__name__}: {exc}") from exc
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


def shares_prefix(model: Any) -> bool:
    """Whether `model`'s attention takes the 4-D mask of a shared row (and no shared row failed before)."""
    return not _refused and getattr(model.config, "_attn_implementation", None) in SHARED_ATTENTION


def chunks(widths: Sequence[int], kept: Sequence[int]) -> list[range]:
    """Consecutive rows a forward at a time: padded to the widest, at most `SCORE_TOKENS` tokens and
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


def _scores(
    model: Any,
    prefixes: Sequence[Sequence[int]],
    tails: Sequence[Sequence[Sequence[int]]],
    pad: int,
    shared: bool,
) -> list[list[float]]:
    widths = [len(p) + sum(len(t) for t in ts) for p, ts in zip(prefixes, tails, strict=True)]
    kept = [1 + sum(len(t) for t in ts) for ts in tails]
    out: list[list[float]] = []
    for part in chunks(widths, kept):
        out += row_scores(
            model, shared_rows([prefixes[i] for i in part], [tails[i] for i in part], pad), shared
        )
    return out


_refused: list[str] = []  # why a model's forward refused a shared row: a row a label from then on
_said_full: list[bool] = []
_last = ["none yet"]


def path() -> str:
    """How the last scoring ran: `shared prefix`, or `a row a label: why`; the rehearsal records it
    beside its timing, evaluation prints it."""
    return _last[0]


@torch.no_grad()
def score_ids(
    model: Any, prefixes: Sequence[Sequence[int]], tails: Sequence[Sequence[Sequence[int]]], pad: int
) -> list[list[float]]:
    """For each prefix (token ids, one at least), the summed log-probability of each of its tails after
    it: behind a shared prefix where the model allows (`shares_prefix`), else a row a label."""
    if any(not p for p in prefixes):
        raise ValueError("a scored prefix needs a token: its last predicts every label's first")
    if shares_prefix(model):
        try:
            scores = _scores(model, prefixes, tails, pad, shared=True)
        except MaskRefused as exc:  # a row a label from then on, said once
            _refused.append(str(exc))
            log.warning("label scoring: a row a label (the forward refused a shared row: %s)", _refused[0])
        else:
            _last[0] = "shared prefix"
            return scores
    attention = getattr(model.config, "_attn_implementation", None)
    _last[0] = f"a row a label: {_refused[0] if _refused else f'attention {attention}'}"
    jobs = [(n, p, t) for n, (p, ts) in enumerate(zip(prefixes, tails, strict=True)) for t in ts]
    flat = _scores(model, [p for _, p, _ in jobs], [[t] for _, _, t in jobs], pad, shared=False)
    scores: list[list[float]] = [[] for _ in prefixes]
    for (n, _, _), (score,) in zip(jobs, flat, strict=True):
        scores[n].append(score)
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
