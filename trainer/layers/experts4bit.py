"""Fused MoE experts in NF4: a drop-in experts module, and optional expert LoRA (the packed storage is
`trainer.nf4_pack`).

bitsandbytes replaces only `nn.Linear`, and transformers 5 keeps the Qwen3-MoE experts as two fused
3-D parameters (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]), so under plain QLoRA they stay in
16 bit. This module quantizes them itself with bitsandbytes' functional NF4 kernels.

Each packed tensor is a frozen `nn.Parameter` stored as the training dtype, so DeepSpeed ZeRO-3
partitions, offloads and gathers it like any other parameter (it moves bytes, never values, and only
casts float parameters that are not yet ZeRO parameters).

Forward: tokens are routed exactly as in the 16-bit model (the router is untouched). Token-expert pairs
are sorted by expert and each weight is applied by one of these paths (`COCKPIT_NF4_EXPERTS`):
  fused    Triton grouped GEMM that dequantizes NF4 inside its K loop (`trainer.kernels.nf4_triton`):
           no dequantized weight in memory, no host sync; backward runs the transposed kernel
  dequant  one Triton launch dequantizes every expert of a weight, then one `torch._grouped_mm`
  grouped  bitsandbytes dequantizes the hit experts a chunk at a time, one `torch._grouped_mm` a chunk
  loop     the same chunks, one matmul an expert
  auto     on CUDA (bf16/fp16) where Triton works: fused below `DEQUANT_MIN_ROWS` token-expert pairs an
           expert, dequant from there on (the faster of the two on an H200); else grouped (CPU) or loop
Dequantized weights are not kept for backward (it dequantizes them again, or runs the fused kernel),
except on dequant under checkpointing's recompute (`trainer.layers.frozen_experts.PackedGroupedMM`).
On fused and dequant, the activation and the routing weight (`silu(gate) * up * w`) are one Triton
kernel each way (`trainer.kernels.swiglu`; COCKPIT_FUSED_ACT=0 gives torch's kernels).
Expert LoRA works on every path (on fused and dequant its term loops over the experts, one host sync).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cockpit.contract import dequant_chunk_experts, dequant_rows
from trainer.layers.frozen_experts import (
    DequantChunk,
    FrozenExpertLinear,
    FrozenExpertsGrouped,
    PackedGroupedMM,
    grouped_product,
)
from trainer.nf4_pack import (
    PackedLayout,
    dequantize_experts_nf4,
    quantize_experts_nf4,
)
from trainer.pass_through import PASS_THROUGH

log = logging.getLogger(__name__)
# Off for the speed benchmark's control row: COCKPIT_FUSED_ACT=0 (torch's kernels for the activation).
FUSED_ACT = os.environ.get("COCKPIT_FUSED_ACT", "1") != "0"


# --- the experts module ---------------------------------------------------------------------------


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    """A tensor's shape, or the whole shape of a ZeRO-3 partitioned parameter (whose data is empty)."""
    return tuple(getattr(t, "ds_shape", None) or t.shape)


def is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 fused experts module in the Qwen3-MoE layout ([E, 2I, H] and [E, H, I], no bias)."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)):
        return False
    gate_up_shape, down_shape = _shape(gate_up), _shape(down)
    if len(gate_up_shape) != 3 or len(down_shape) != 3 or not hasattr(module, "act_fn"):
        return False
    if getattr(module, "gate_up_proj_bias", None) is not None or getattr(module, "is_transposed", False):
        return False
    e, two_i, h = gate_up_shape
    return down_shape == (e, h, two_i // 2) and two_i % 2 == 0


MODES = ("auto", "fused", "dequant", "grouped", "loop")
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _grouped_mode(x: torch.Tensor) -> bool:
    """One grouped GEMM a chunk of experts where torch has it for this device and dtype, else a loop."""
    wanted = os.environ.get("COCKPIT_NF4_EXPERTS", "auto")
    if wanted == "loop" or not hasattr(torch, "_grouped_mm"):
        return False
    if wanted == "grouped":
        return True
    return x.device.type == "cpu" or (x.device.type == "cuda" and x.dtype == torch.bfloat16)


def _kernels_work(x: torch.Tensor, mode: str) -> bool:
    """Whether the Triton kernels run for x: CUDA with bf16/fp16 (fp32 too under TRITON_INTERPRET=1 on
    the CPU), Triton importable, and `torch._grouped_mm` for the dequant path."""
    from trainer.kernels import triton_status

    ok, why = triton_status(x.device)
    interpret = x.device.type == "cpu"
    if ok and not interpret and x.dtype not in (torch.bfloat16, torch.float16):
        ok, why = False, f"compute dtype {x.dtype} (the kernels take bf16 or fp16)"
    if ok and mode == "dequant" and not hasattr(torch, "_grouped_mm"):
        ok, why = False, "torch has no _grouped_mm"
    if not ok:
        _warn_once(f"{mode}:{why}", "NF4 experts: %s path unavailable (%s); bitsandbytes path", mode, why)
    return ok


# Measured on an H200, story shapes (benchmarks/results/nf4_kernels_h200.md): the fused kernel is ahead at
# 64 rows an expert (1.5x) and level at 256; from about 384 rows on (`DEQUANT_MIN_ROWS`, in the contract
# the planner reads), one dequantization (0.75 ms a weight pair) plus torch's grouped GEMM (near dense
# speed there) is faster. `auto` takes the faster one.


def expert_path(x: torch.Tensor, rows_per_expert: float = 0.0) -> str:
    """The path the experts take for x: fused, dequant, grouped or loop (see the module docstring)."""
    wanted = os.environ.get("COCKPIT_NF4_EXPERTS", "auto")
    if wanted not in MODES:
        _warn_once(f"mode:{wanted}", "COCKPIT_NF4_EXPERTS=%s is not one of %s; using auto", wanted, MODES)
        wanted = "auto"
    if wanted in ("fused", "dequant") and not NF4Experts.kernels_failed and _kernels_work(x, wanted):
        return wanted
    if wanted == "auto" and x.device.type == "cuda" and not NF4Experts.kernels_failed:
        from trainer.kernels import triton_status

        if triton_status(x.device)[0] and x.dtype in (torch.bfloat16, torch.float16):
            return "dequant" if dequant_rows(rows_per_expert) else "fused"
    if NF4Experts.grouped_failed:
        return "loop"
    return "grouped" if _grouped_mode(x) else "loop"


class NF4Experts(nn.Module):
    """Drop-in replacement for a fused experts module, with its weights packed in NF4 (frozen).

    Called like the original: `forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`.
    """

    WEIGHTS = ("gate_up_proj", "down_proj")

    def __init__(
        self,
        num_experts: int,
        hidden_dim: int,
        intermediate_dim: int,
        act_fn: Callable[[torch.Tensor], torch.Tensor],
        compute_dtype: torch.dtype,
        storage_dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.act_fn = act_fn
        self.compute_dtype = compute_dtype
        self.layouts = {
            "gate_up_proj": PackedLayout(num_experts, 2 * intermediate_dim, hidden_dim, storage_dtype),
            "down_proj": PackedLayout(num_experts, hidden_dim, intermediate_dim, storage_dtype),
        }
        for name, layout in self.layouts.items():
            layout.check()
            for suffix, shape in layout.shapes().items():
                param = nn.Parameter(
                    torch.empty(shape, dtype=storage_dtype, device=device), requires_grad=False
                )
                param.cockpit_4bit = suffix == "nf4"
                # The audit counts the codes at the size of the weight they stand for, the scales as nothing.
                param.cockpit_logical_numel = layout.experts * layout.numel if suffix == "nf4" else 0
                self.register_parameter(f"{name}_{suffix}", param)
        self.chunk_experts = dequant_chunk_experts(
            num_experts, sum(layout.numel for layout in self.layouts.values())
        )
        self.lora_r = 0
        self.lora_scaling = 0.0
        self.lora_dropout: nn.Module = nn.Identity()
        # Set under non-reentrant checkpointing (`trainer.layers.frozen_experts.keep_for_backward`): the
        # recompute's dequantized weights serve its backward.
        self.keep_dequantized = False

    # --- building ---------------------------------------------------------------------------------
    @classmethod
    def from_fused(
        cls, experts: nn.Module, storage_dtype: torch.dtype, device: torch.device | str | None = None
    ) -> NF4Experts:
        """Quantize an existing fused experts module (weights already in memory) on `device`."""
        gate_up, down = experts.gate_up_proj, experts.down_proj
        device = torch.device(device) if device is not None else gate_up.device
        e, two_i, h = gate_up.shape
        new = cls(e, h, two_i // 2, experts.act_fn, gate_up.dtype, storage_dtype, device="meta")
        new.load_weights({"gate_up_proj": lambda i: gate_up[i], "down_proj": lambda i: down[i]}, device)
        return new

    def load_weights(
        self, sources: dict[str, Callable[[int], torch.Tensor]], device: torch.device | str
    ) -> None:
        """Quantize and store each fused weight from a per-expert source (`source(e)` -> [out, in])."""
        for name, layout in self.layouts.items():
            chunk = dequant_chunk_experts(layout.experts, layout.numel)
            packed = quantize_experts_nf4(sources[name], layout, device, chunk=chunk)
            for suffix, tensor in packed.items():
                old = getattr(self, f"{name}_{suffix}")
                param = nn.Parameter(tensor, requires_grad=False)
                param.cockpit_4bit, param.cockpit_logical_numel = old.cockpit_4bit, old.cockpit_logical_numel
                setattr(self, f"{name}_{suffix}", param)

    def packed(self, which: str) -> dict[str, torch.Tensor]:
        return {suffix: getattr(self, f"{which}_{suffix}") for suffix in ("nf4", "absmax", "qstate")}

    def dequantize(self, which: str, experts: int | list[int]) -> torch.Tensor:
        """Weights of the selected experts in the compute dtype ([k, out, in], or [out, in] for an int)."""
        return dequantize_experts_nf4(self.packed(which), self.layouts[which], experts, self.compute_dtype)

    # --- optional LoRA on the experts ---------------------------------------------------------------
    def add_lora(self, r: int, alpha: float, dropout: float, dtype: torch.dtype = torch.float32) -> None:
        """Trainable per-expert low-rank updates on both fused weights (B starts at zero, as in PEFT)."""
        device = self.gate_up_proj_nf4.device
        self.lora_r, self.lora_scaling = r, alpha / r
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        for name, layout in self.layouts.items():
            a = torch.empty(layout.experts, r, layout.inp, dtype=dtype, device=device)
            for i in range(layout.experts):  # PEFT's default: kaiming-uniform A per expert
                nn.init.kaiming_uniform_(a[i], a=5**0.5)
            self.register_parameter(f"lora_A_{name}", nn.Parameter(a))
            b = torch.zeros(layout.experts, layout.out, r, dtype=dtype, device=device)
            self.register_parameter(f"lora_B_{name}", nn.Parameter(b))

    def lora_parameters(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.named_parameters(recurse=False) if n.startswith("lora_")}

    def _lora(self, which: str, x: torch.Tensor, e: int) -> torch.Tensor:
        a, b = getattr(self, f"lora_A_{which}"), getattr(self, f"lora_B_{which}")
        h = self.lora_dropout(x).to(a.dtype) @ a[e].t()
        return (h @ b[e].t()).to(x.dtype) * self.lora_scaling

    # --- forward --------------------------------------------------------------------------------
    def _linear(
        self, which: str, x: torch.Tensor, weights: torch.Tensor, chunk: DequantChunk | None, j: int, e: int
    ):
        if chunk is None:
            y = torch.nn.functional.linear(x, weights[j].to(x.dtype))
        else:
            y = FrozenExpertLinear.apply(x, weights[j].to(x.dtype), chunk, j)
        if self.lora_r:
            y = y + self._lora(which, x, e)
        return y

    grouped_failed = False
    kernels_failed = False

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        path = expert_path(hidden_states, top_k_index.numel() / self.num_experts)
        if path in ("fused", "dequant") and not self.kernels_fit():
            _warn_once(f"fit:{self.layouts}", "NF4 experts: %s path needs dims multiple of 64", path)
            path = "grouped" if _grouped_mode(hidden_states) and not NF4Experts.grouped_failed else "loop"
        if path in ("fused", "dequant"):
            try:
                return self._forward_sorted(hidden_states, top_k_index, top_k_weights, path)
            except PASS_THROUGH:
                raise
            except Exception as exc:  # a kernel that does not build or run here: the bitsandbytes path
                NF4Experts.kernels_failed = True
                log.warning("NF4 experts: %s path failed (%s: %s); using the bitsandbytes path", path,
                            type(exc).__name__, exc)  # fmt: skip
                path = "grouped" if _grouped_mode(hidden_states) else "loop"
        if path == "grouped" and not NF4Experts.grouped_failed:
            try:
                return self._forward_grouped(hidden_states, top_k_index, top_k_weights)
            except PASS_THROUGH:
                raise
            except (RuntimeError, NotImplementedError) as exc:  # an unsupported grouped GEMM: loop instead
                NF4Experts.grouped_failed = True
                log.warning("NF4 experts: grouped GEMM unavailable (%s); looping over experts", exc)
        return self._forward_loop(hidden_states, top_k_index, top_k_weights)

    def kernels_fit(self) -> bool:
        """Whether both weights' dimensions suit the Triton kernels (multiples of 64)."""
        return all(layout.out % 64 == 0 and layout.inp % 64 == 0 for layout in self.layouts.values())

    def packed_mm(
        self,
        which: str,
        x: torch.Tensor,
        expert_ids: torch.Tensor,
        offs: torch.Tensor,
        trans: bool,
        path: str,
    ) -> torch.Tensor:
        """Sorted rows times their experts' weight (`x @ W.T`, or `x @ W` with trans); rows from offs[-1]
        on come out zero. `fused`: the NF4 grouped GEMM; `dequant`: every listed expert dequantized in one
        launch (expert -1 gives zeros), then one `torch._grouped_mm`."""
        from trainer.kernels import nf4_triton

        if path == "fused":
            packed, layout = self.packed(which), self.layouts[which]
            return nf4_triton.nf4_grouped_mm(x, packed, layout, expert_ids, offs, trans=trans)
        weights, offs = self.dequantized(which, x, expert_ids, offs)
        return grouped_product(x, weights, offs, trans)

    def dequantized(
        self, which: str, x: torch.Tensor, expert_ids: torch.Tensor, offs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every listed expert's weight dequantized in one launch, in x's dtype, and the groups' offsets,
        the tail (rows routed to no expert) one more group with expert -1: zero weights."""
        from trainer.kernels import nf4_triton

        m = torch.full((1,), x.shape[0], dtype=offs.dtype, device=offs.device)
        expert_ids = torch.cat([expert_ids, torch.full_like(expert_ids[:1], -1)])
        weights = nf4_triton.nf4_dequantize(self.packed(which), self.layouts[which], expert_ids, x.dtype)
        return weights, torch.cat([offs, m])

    def _forward_sorted(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        path: str,
    ) -> torch.Tensor:
        """Token-expert pairs sorted by expert, one grouped product a weight, offsets kept on the device;
        the routing weights scale the intermediate activation (`trainer.layers.routing`)."""
        from trainer.layers import routing

        pairs = routing.SortedPairs.of(top_k_index, self.num_experts)
        experts = torch.arange(self.num_experts, device=hidden_states.device, dtype=torch.int32)
        offs = pairs.offs
        x = routing.spread(hidden_states, pairs)
        grad = self._needs_grad(hidden_states, top_k_weights)
        lora_sizes = torch.diff(offs, prepend=offs.new_zeros(1)).tolist() if self.lora_r else None

        def apply(which: str, rows: torch.Tensor) -> torch.Tensor:
            if grad:
                y = PackedGroupedMM.apply(rows, self, which, experts, offs, path)
            else:
                y = self.packed_mm(which, rows, experts, offs, trans=False, path=path)
            if lora_sizes is not None:
                y = y + self._lora_sorted(which, rows, lora_sizes)
            return y

        gu = apply("gate_up_proj", x)
        if routing.ENABLED:  # down(h) * w == down(h * w): scale the narrower tensor
            h = self._activate(gu, routing.pair_weights(top_k_weights, pairs))
            return routing.combine(apply("down_proj", h), pairs, None).to(hidden_states.dtype)
        gate, up = gu.chunk(2, dim=-1)
        h = self.act_fn(gate) * up
        return routing.combine(apply("down_proj", h), pairs, top_k_weights).to(hidden_states.dtype)

    def _activate(self, gu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`act(gate) * up * weight` of the sorted pairs: for SiLU one Triton kernel each way
        (`trainer.kernels.swiglu`; this path's kernels already run here), else torch's."""
        from trainer.kernels import swiglu

        return swiglu.activate(gu, weights, self.act_fn, fused=FUSED_ACT)

    def _lora_sorted(self, which: str, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """The expert LoRA term of rows sorted by expert (`sizes` rows an expert), zero on the tail."""
        hit = [e for e, n in enumerate(sizes) if n]
        rows = sum(sizes)
        split = x[:rows].split([sizes[e] for e in hit])
        parts = [self._lora(which, part, e) for part, e in zip(split, hit, strict=True)]
        if rows < x.shape[0]:
            parts.append(x.new_zeros(x.shape[0] - rows, self.layouts[which].out))
        return torch.cat(parts) if parts else x.new_zeros(x.shape[0], self.layouts[which].out)

    def _needs_grad(self, hidden_states: torch.Tensor, top_k_weights: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (
            hidden_states.requires_grad or top_k_weights.requires_grad or bool(self.lora_r)
        )

    def _forward_grouped(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ):
        """Token-expert pairs sorted by expert; per chunk of hit experts, one grouped GEMM a weight."""
        k = top_k_index.shape[-1]
        with torch.no_grad():
            expert_sorted, perm = torch.sort(top_k_index.reshape(-1), stable=True)
            counts = torch.bincount(expert_sorted, minlength=self.num_experts + 1)[
                : self.num_experts
            ].tolist()
        token = perm // k
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        rows = starts[-1]  # pairs routed to a real expert (an index of num_experts sorts last)
        hit = [e for e in range(self.num_experts) if counts[e]]
        x_sorted = hidden_states[token[:rows]]
        grad = self._needs_grad(hidden_states, top_k_weights)
        outputs = []
        for c0 in range(0, len(hit), self.chunk_experts):
            experts = hit[c0 : c0 + self.chunk_experts]
            r0, r1 = starts[experts[0]], starts[experts[-1] + 1]
            sizes = [counts[e] for e in experts]
            offs = torch.tensor(sizes, device=hidden_states.device, dtype=torch.int32).cumsum(
                0, dtype=torch.int32
            )
            x = x_sorted[r0:r1]
            with torch.no_grad():
                gate_up = self.dequantize("gate_up_proj", experts).to(x.dtype)
                down = self.dequantize("down_proj", experts).to(x.dtype)
            if grad:
                gu = FrozenExpertsGrouped.apply(x, gate_up, offs, DequantChunk(self, "gate_up_proj", experts))
            else:
                gu = torch._grouped_mm(x, gate_up.transpose(-2, -1), offs=offs)
            del gate_up
            if self.lora_r:
                gu = gu + self._lora_rows("gate_up_proj", x, experts, sizes)
            gate, up = gu.chunk(2, dim=-1)
            h = self.act_fn(gate) * up
            if grad:
                y = FrozenExpertsGrouped.apply(
                    h.contiguous(), down, offs, DequantChunk(self, "down_proj", experts)
                )
            else:
                y = torch._grouped_mm(h.contiguous(), down.transpose(-2, -1), offs=offs)
            del down
            if self.lora_r:
                y = y + self._lora_rows("down_proj", h, experts, sizes)
            outputs.append(y)
        final = torch.zeros_like(hidden_states)
        if not outputs:
            return final
        out = torch.cat(outputs) * top_k_weights.reshape(-1)[perm[:rows], None]
        return final.index_add(0, token[:rows], out.to(final.dtype))

    def _lora_rows(self, which: str, x: torch.Tensor, experts: list[int], sizes: list[int]) -> torch.Tensor:
        parts = [self._lora(which, rows, e) for rows, e in zip(x.split(sizes), experts, strict=True)]
        return torch.cat(parts)

    def _forward_loop(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ):
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            # num_experts + 1 classes, as transformers does: an index equal to num_experts means "no expert".
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = [e for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().flatten().tolist()]
            hit = [e for e in hit if e < self.num_experts]
        grad = self._needs_grad(hidden_states, top_k_weights)
        for c0 in range(0, len(hit), self.chunk_experts):
            experts = hit[c0 : c0 + self.chunk_experts]
            with torch.no_grad():
                gate_up = self.dequantize("gate_up_proj", experts)
                down = self.dequantize("down_proj", experts)
            chunks = (
                (DequantChunk(self, "gate_up_proj", experts), DequantChunk(self, "down_proj", experts))
                if grad
                else (None, None)
            )
            for j, e in enumerate(experts):
                top_k_pos, token_idx = torch.where(mask[e])
                x = hidden_states[token_idx]
                gate, up = self._linear("gate_up_proj", x, gate_up, chunks[0], j, e).chunk(2, dim=-1)
                h = self.act_fn(gate) * up
                y = self._linear("down_proj", h, down, chunks[1], j, e)
                y = y * top_k_weights[token_idx, top_k_pos, None]
                final.index_add_(0, token_idx, y.to(final.dtype))
            del gate_up, down
        return final

    def extra_repr(self) -> str:
        lora = f", lora_r={self.lora_r}" if self.lora_r else ""
        return (
            f"num_experts={self.num_experts}, hidden={self.hidden_dim}, "
            f"intermediate={self.intermediate_dim}, nf4, "
            f"storage={self.layouts['down_proj'].storage_dtype}{lora}"
        )
