"""Greedy decoding for evaluation: a static KV cache, masks built once, the step captured in a CUDA graph.

`generate` with its dynamic cache grows every layer's keys and values by a concatenation each step,
rebuilds the attention mask each step and runs its logits processors in Python: about 43 ms a step of
fixed cost at the story's geometry, whatever the depth. Here the cache is allocated once for the whole
prompt plus the new tokens, the 4-D mask is a buffer with one column switched on a step, and positions
and cache slots live on the device, so a step is the same kernels on the same addresses every time. On
one CUDA device that step is captured once as a CUDA graph and replayed (no Python, no launches); over
several GPUs each GPU's layers are one graph (`trainer.evaluation.decode_blocks`). The host reads the tokens
back only every `CHECK_EVERY` steps to stop when every row has ended.

The arithmetic is the model's own: the same forward, the same greedy argmax; a row's tokens do not
depend on the other rows of its batch, so `trainer.evaluation.evaluate.cut_at_end` gives what `generate`
gives. `COCKPIT_FAST_DECODE=0` (read once) takes `generate` instead; so does any model this cannot drive
(an attention other than sdpa or eager), and any failure of the fast path, said once in the log.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from cockpit.contract import prefill_rows
from trainer.evaluation import decode_blocks

log = logging.getLogger(__name__)

ENABLED = os.environ.get("COCKPIT_FAST_DECODE", "1") != "0"
CHECK_EVERY = 16  # steps between host reads of "has every row ended"
# Whether a step is captured as CUDA graphs (one, or one a GPU); a rehearsal turns it off to time the
# steps launched one by one, what they cost where a capture fails (`graphs_off`).
GRAPHS = True
ATTENTION = ("sdpa", "eager")


class StaticKV(Cache):
    """Each layer's keys and values of `batch` rows in buffers of `length` slots, written at the slots
    `slot` says (a device tensor the decoder advances); allocated on a layer's first write, on that layer's
    device. A forward reads and writes the rows `rows` says: all of them, or a prefill chunk's."""

    def __init__(self, layers: int, length: int, slot: torch.Tensor, batch: int) -> None:
        super().__init__(layers=[DynamicLayer() for _ in range(layers)])
        self.length = length
        self.slot = slot
        self.batch = batch
        self.rows = slice(None)
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self._steps: dict[torch.device, torch.Tensor] = {}
        self._mirrors: dict[torch.device, torch.Tensor] = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer_idx] is None:
            _, h, _, d = key_states.shape
            self.keys[layer_idx] = key_states.new_zeros(self.batch, h, self.length, d)
            self.values[layer_idx] = value_states.new_zeros(
                self.batch, h, self.length, value_states.shape[-1]
            )
        keys, values = self.keys[layer_idx][self.rows], self.values[layer_idx][self.rows]
        n = key_states.shape[-2]
        where = self._slots(keys.device, n)
        keys.index_copy_(2, where, key_states)
        values.index_copy_(2, where, value_states)
        return keys, values

    def _slots(self, device: torch.device, n: int) -> torch.Tensor:
        if device not in self._steps or self._steps[device].shape[0] < n:
            self._steps[device] = torch.arange(max(n, 1), device=device)
        if self.slot.device == device:
            return self._steps[device][:n] + self.slot
        if not _capturing():  # a graph reads the copy `sync_slot` made before its replay
            self.sync_slot(device)
        return self._steps[device][:n] + self._mirrors[device]

    def sync_slot(self, device: torch.device) -> None:
        """Copy the slot to `device` (another GPU's layers), into a buffer of fixed address."""
        if device == self.slot.device:
            return
        if device not in self._mirrors:
            self._mirrors[device] = torch.empty_like(self.slot, device=device)
        self._mirrors[device].copy_(self.slot, non_blocking=True)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return self.length, 0


def router_off(model: Any) -> dict[str, bool]:
    """The forward's argument that turns an MoE config's router logits off, where it asks for them: they
    are recorded with hooks, which a replayed graph does not run, and neither decoding nor scoring
    needs them."""
    return {"output_router_logits": False} if getattr(model.config, "output_router_logits", False) else {}


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of a model's first floating-point parameter: its compute dtype."""
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


def attention_mask(allowed: torch.Tensor, additive: torch.dtype | None) -> torch.Tensor:
    """A mask of the keys each query sees as the attention takes it: `allowed` itself (sdpa), or, given
    `additive`, zeros and that dtype's lowest value (eager)."""
    if additive is None:
        return allowed
    zero = torch.zeros((), dtype=additive, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(additive).min)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def grouped_query_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one new token a row: the query heads that share a key/value head are that head's
    queries, so the cache is read as it is stored ([B, kv heads, L, D]) and never repeated for every
    query head (16 copies at the story's 64 heads over 4). Longer queries: transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, d = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads % kv_heads or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    grouped = query.view(b, kv_heads, heads // kv_heads, d)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.view(b, heads, 1, d).transpose(1, 2).contiguous(), None


STEP_ATTENTION = "cockpit_decode"  # registered with transformers on first use; sdpa models decode with it


def _register_step_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(STEP_ATTENTION, grouped_query_attention)


@contextlib.contextmanager
def grouped_steps(model: Any) -> Iterator[None]:
    """An sdpa model attends through `grouped_query_attention` (which hands queries longer than one token
    to sdpa: the prefill) while it decodes."""
    config = model.config
    attention = config._attn_implementation
    if attention != "sdpa":
        yield
        return
    _register_step_attention()
    config._attn_implementation = STEP_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = attention


def _attention(model: Any) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _cache_kwarg(model: Any) -> str:
    """The forward's name for the cache: `cache` in newer transformers, `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def usable(model: Any) -> str | None:
    """Why the fast path cannot drive `model`, or None when it can."""
    if not ENABLED:
        return "COCKPIT_FAST_DECODE=0"
    if _attention(model) not in ATTENTION:
        return f"attention {_attention(model)!r} (the fast path builds masks for {', '.join(ATTENTION)})"
    return None


@dataclass
class _State:
    """The device buffers one step reads and writes, at fixed addresses."""

    ids: torch.Tensor  # [B, 1] the token fed this step
    positions: torch.Tensor  # [B, 1] its rotary position
    slot: torch.Tensor  # [1] its cache slot
    mask: torch.Tensor  # [B, 1, 1, L] the keys it may see (bool for sdpa, additive float for eager)
    out: torch.Tensor  # [B, new] the tokens produced
    step: torch.Tensor  # [1] how many have been produced


class GreedyDecoder:
    """One batch's greedy decoding (see the module docstring)."""

    def __init__(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, new: int) -> None:
        self.model = model
        self.device = input_ids.device
        self.batch, self.prompt = input_ids.shape
        self.new = new
        self.length = self.prompt + new
        self.additive = _attention(model) == "eager"
        self.cache_kwarg = _cache_kwarg(model)
        self.router_off = router_off(model)
        self.layers = model.config.num_hidden_layers
        self.graph: torch.cuda.CUDAGraph | None = None
        self.blocks: list[Any] = []  # the per-GPU graphs (`decode_blocks`) where the model spans GPUs
        self.tried_graphs = False
        self.ran = "launched"
        self.mask_dtype = model_dtype(model) if self.additive else torch.bool
        valid = attention_mask.to(self.device).bool()
        self.valid = valid
        self.state = _State(
            ids=input_ids[:, -1:].clone(),
            positions=(valid.sum(-1, keepdim=True) - 1).clamp(min=0),
            slot=torch.full((1,), self.prompt, dtype=torch.long, device=self.device),
            mask=self._keys_mask(valid),
            out=torch.zeros(self.batch, max(new, 1), dtype=torch.long, device=self.device),
            step=torch.zeros(1, dtype=torch.long, device=self.device),
        )
        self.cache = StaticKV(self.layers, self.length, self.state.slot, self.batch)

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        return attention_mask(allowed, self.mask_dtype if self.additive else None)

    def _keys_mask(self, valid: torch.Tensor) -> torch.Tensor:
        """[B, 1, 1, L]: the prompt's real tokens; the new slots are switched on as they are written."""
        keys = torch.zeros(self.batch, self.length, dtype=torch.bool, device=self.device)
        keys[:, : self.prompt] = valid
        return self._mask(keys)[:, None, None, :].contiguous()

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kwarg: self.cache},
            **self.router_off,
        )
        return out.logits[:, -1, :]

    def prefill(self, input_ids: torch.Tensor) -> None:
        """The prompt through the model (left-padded rows), its last logits giving the first new token;
        a chunk of `prefill_rows` rows a forward (their keys span the whole cache), so its activations are
        a chunk's, not the batch's."""
        valid = self.valid
        positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)
        causal = torch.ones(self.prompt, self.length, dtype=torch.bool, device=self.device).tril()
        # A padding query sees itself, so no row of the softmax is empty (its output is never used).
        itself = torch.eye(self.prompt, self.length, dtype=torch.bool, device=self.device)
        keys = torch.nn.functional.pad(valid, (0, self.new))
        per = prefill_rows(self.length)
        self.cache.slot.zero_()
        logits = []
        for start in range(0, self.batch, per):
            rows = slice(start, min(start + per, self.batch))
            allowed = (causal[None] & keys[rows, None, :]) | itself[None]
            self.cache.rows = rows
            logits.append(self._forward(input_ids[rows], positions[rows], self._mask(allowed)[:, None]))
        self.cache.rows = slice(None)
        self.cache.slot.fill_(self.prompt)
        self._take(torch.cat(logits))

    def _take(self, logits: torch.Tensor) -> None:
        """Record the argmax as this step's token and make it the next step's input."""
        s = self.state
        token = logits.argmax(-1)
        s.out.index_copy_(1, s.step, token[:, None])
        s.ids.copy_(token[:, None])

    def _step(self) -> None:
        s = self.state
        open_value = True if not self.additive else 0.0
        s.mask.index_fill_(3, s.slot, open_value)
        s.positions.add_(1)
        logits = self._forward(s.ids, s.positions, s.mask)
        s.step.add_(1)
        self._take(logits)
        s.slot.add_(1)

    def _capture(self) -> None:
        """Capture the next step as a graph (after one eager step: kernels compiled, caches made)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        graph = torch.cuda.CUDAGraph()
        # Capture records the step without running it: the buffers keep the eager step's state.
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            self._step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = graph

    def run(self, input_ids: torch.Tensor, stop: set[int], graph: bool = True) -> torch.Tensor:
        """[B, n] greedy tokens, n <= new; rows go on past their end (cut them with `cut_at_end`), and
        the loop stops early (n < new) once every row has produced a token of `stop`."""
        with grouped_steps(self.model):
            return self._run(input_ids, stop, graph)

    def _run(self, input_ids: torch.Tensor, stop: set[int], graph: bool) -> torch.Tensor:
        self.prefill(input_ids)
        stops = torch.tensor(sorted(stop) or [-1], device=self.device)
        done = 1
        one = _one_device(self.model) and not decode_blocks.SPLIT_EVERY
        test_blocks = bool(decode_blocks.SPLIT_EVERY) and self.device.type != "cuda"  # tests, on the CPU
        placed = one or test_blocks or decode_blocks.placeable(self.model)
        capturable = self.new > 2 and placed and (self.device.type == "cuda" or test_blocks)
        with contextlib.ExitStack() as blocks:
            if graph and capturable and not _graph_failed:
                self.tried_graphs = True
                graphs = self._record(blocks)
                done = 2
                try:
                    self._capture() if graphs is None else graphs.capture()
                except torch.OutOfMemoryError:
                    raise
                except Exception as exc:  # not capturable: the same steps, launched one by one
                    self.graph = None
                    blocks.close()
                    _graph_failed.append(f"{type(exc).__name__}: {exc}")
                    _say_once(f"CUDA graph off: {_graph_failed[0]}")
                else:
                    self.blocks = graphs.blocks if graphs is not None else []
            self.ran = "graph" if self.graph is not None else "graphs per GPU" if self.blocks else "launched"
            while done < self.new:
                if done % CHECK_EVERY == 0 and _all_ended(self.state.out[:, :done], stops):
                    break
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._step()
                done += 1
        return self.state.out[:, :done]

    def _record(self, blocks: contextlib.ExitStack) -> decode_blocks.BlockGraphs | None:
        """One step run eagerly before a capture. A model on one GPU is then captured whole (None); one
        over several gets a graph a GPU: its decoder layers are swapped for `decode_blocks` stand-ins
        (until `blocks` closes), which keep each block's inputs of this step."""
        if _one_device(self.model) and not decode_blocks.SPLIT_EVERY:
            self._step()
            return None
        graphs = decode_blocks.BlockGraphs(self.model)
        blocks.enter_context(graphs.installed())
        self._step()
        return graphs


def _one_device(model: Any) -> bool:
    devices = {p.device for p in model.parameters()}
    return len(devices) == 1


def _all_ended(tokens: torch.Tensor, stops: torch.Tensor) -> bool:
    return bool(torch.isin(tokens, stops).any(dim=1).all())


@contextlib.contextmanager
def graphs_off() -> Iterator[None]:
    """Within it, decoding launches its steps one by one, as it does where its graphs cannot be captured."""
    global GRAPHS
    saved, GRAPHS = GRAPHS, False
    try:
        yield
    finally:
        GRAPHS = saved


_failed: list[str] = []
_graph_failed: list[str] = []
_last = ["none yet"]


def path() -> str:
    """How the last batch decoded: `graph` (one CUDA graph replayed), `graphs per GPU` (the model spans
    GPUs: a graph a GPU, `decode_blocks`), `launched` (steps launched one by one: the CPU, graphs off or
    not capturable) or `generate: why` (the fast path could not drive the model); a rehearsal records
    it beside its timings."""
    return _last[0]


@torch.no_grad()
def greedy(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, new: int, stop: set[int]
) -> torch.Tensor | None:
    """[B, new] greedy new tokens by the fast path, or None where it cannot run here (then the caller
    takes `generate`; why is logged once)."""
    why = _failed[0] if _failed else usable(model)
    if why is not None:
        _say_once(why)
        _last[0] = f"generate: {why}"
        return None
    decoder = None
    try:
        decoder = GreedyDecoder(model, input_ids, attention_mask, new)
        tokens = decoder.run(input_ids, stop, graph=GRAPHS)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        if decoder is not None and decoder.tried_graphs and not _graph_failed:
            # Failed with its graphs (a capture or a replay): the batch again, steps launched one by one.
            _graph_failed.append(f"{type(exc).__name__}: {exc}")
            _say_once(f"CUDA graph off: {_graph_failed[0]}")
            return greedy(model, input_ids, attention_mask, new, stop)
        # A model this path cannot drive: generate instead, from now on.
        _failed.append(f"{type(exc).__name__}: {exc}")
        _say_once(_failed[0])
        _last[0] = f"generate: {_failed[0]}"
        return None
    _last[0] = decoder.ran
    return tokens


_said: set[str] = set()


def _say_once(why: str) -> None:
    if why not in _said:
        _said.add(why)
        graph_only = why.startswith("CUDA graph")
        log.warning("fast decoding: %s", why if graph_only else f"off ({why}): using generate")
