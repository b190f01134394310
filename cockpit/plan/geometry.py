"""A model's parameters from its `config.json` alone: every tensor with its shape, kind and role.

No weights and no torch: the shapes follow the Transformers 5 modeling code of each supported family
(checked against models instantiated on the meta device in the tests). In Transformers 5 the MoE
experts of a layer are two fused 3-D parameters (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`),
not `nn.Linear` modules, which is why bitsandbytes leaves them in 16 bit.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.contract import experts_storage_dtype, kind_of, packed_expert_problem
from cockpit.profiles import Profile

KINDS = ("embeddings", "attention", "router", "experts", "dense_mlp", "norms", "lm_head")
MOE_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class GeometryError(ValueError):
    """A config.json the planner cannot read."""


@dataclass(frozen=True)
class TensorSpec:
    """One parameter tensor of the model."""

    name: str
    shape: tuple[int, ...]
    block: str  # the unit ZeRO-3 gathers together: "embed", "layer.<i>", "norm", "lm_head"
    linear: bool = False  # the weight of an nn.Linear: what bitsandbytes replaces with Linear4bit
    merged_from: int = 1  # checkpoint tensors stacked into this one at load (fused experts), else 1

    @functools.cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def kind(self) -> str:
        return kind_of(self.name)

    @property
    def module(self) -> str:
        """The leaf module name (`q_proj`, `experts`, ...), what LoRA `target_modules` match."""
        parts = self.name.split(".")
        return parts[-2] if len(parts) >= 2 else parts[0]


@dataclass(frozen=True)
class ModelGeometry:
    """The shapes that decide memory: read from config.json."""

    model_type: str
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (dense models and the dense layers of an MoE)
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0
    sparse_layers: tuple[int, ...] = ()
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    checkpoint_dtype: str = "bfloat16"
    name: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and bool(self.sparse_layers)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def with_layers(self, layers: int) -> ModelGeometry:
        """The same geometry cut to its first `layers` decoder layers (a slice, as the benchmark runs)."""
        from dataclasses import replace

        return replace(self, layers=layers, sparse_layers=tuple(i for i in self.sparse_layers if i < layers))

    # --- tensors -------------------------------------------------------------------------------
    def tensors(self) -> list[TensorSpec]:
        """Every parameter, in the order the model registers them (tied lm_head omitted, as PyTorch does)."""
        return list(_tensors_of(self))

    def _all_tensors(self) -> list[TensorSpec]:
        h = self.hidden
        out = [TensorSpec("model.embed_tokens.weight", (self.vocab, h), "embed")]
        for i in range(self.layers):
            out.extend(self._layer(i))
        out.append(TensorSpec("model.norm.weight", (h,), "norm"))
        if not self.tie_embeddings:
            out.append(TensorSpec("lm_head.weight", (self.vocab, h), "lm_head", linear=True))
        return out

    def _linear(self, name: str, out_f: int, in_f: int, block: str, bias: bool) -> list[TensorSpec]:
        specs = [TensorSpec(f"{name}.weight", (out_f, in_f), block, linear=True)]
        if bias:
            specs.append(TensorSpec(f"{name}.bias", (out_f,), block))
        return specs

    def _layer(self, i: int) -> list[TensorSpec]:
        h, p, b = self.hidden, f"model.layers.{i}", f"layer.{i}"
        a = f"{p}.self_attn"
        specs = [
            *self._linear(f"{a}.q_proj", self.q_dim, h, b, self.qkv_bias),
            *self._linear(f"{a}.k_proj", self.kv_dim, h, b, self.qkv_bias),
            *self._linear(f"{a}.v_proj", self.kv_dim, h, b, self.qkv_bias),
            *self._linear(f"{a}.o_proj", h, self.q_dim, b, self.o_bias),
        ]
        if self.qk_norm:
            specs += [
                TensorSpec(f"{a}.q_norm.weight", (self.head_dim,), b),
                TensorSpec(f"{a}.k_norm.weight", (self.head_dim,), b),
            ]
        m = f"{p}.mlp"
        if i in self.sparse_layers:
            e, w = self.experts, self.moe_intermediate
            specs += [
                TensorSpec(f"{m}.gate.weight", (e, h), b),
                TensorSpec(f"{m}.experts.gate_up_proj", (e, 2 * w, h), b, merged_from=2 * e),
                TensorSpec(f"{m}.experts.down_proj", (e, h, w), b, merged_from=e),
            ]
            if self.shared_expert_intermediate:
                s = self.shared_expert_intermediate
                specs += [
                    *self._linear(f"{m}.shared_expert.gate_proj", s, h, b, False),
                    *self._linear(f"{m}.shared_expert.up_proj", s, h, b, False),
                    *self._linear(f"{m}.shared_expert.down_proj", h, s, b, False),
                    *self._linear(f"{m}.shared_expert_gate", 1, h, b, False),
                ]
        else:
            w = self.intermediate
            specs += [
                *self._linear(f"{m}.gate_proj", w, h, b, self.mlp_bias),
                *self._linear(f"{m}.up_proj", w, h, b, self.mlp_bias),
                *self._linear(f"{m}.down_proj", h, w, b, self.mlp_bias),
            ]
        specs += [
            TensorSpec(f"{p}.input_layernorm.weight", (h,), b),
            TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), b),
        ]
        return specs

    def counts(self) -> dict[str, int]:
        """Parameters by kind (every kind in KINDS present, zero where the model has none)."""
        counts = dict.fromkeys(KINDS, 0)
        for t in self.tensors():
            counts[t.kind] = counts.get(t.kind, 0) + t.numel
        return counts

    @property
    def total_params(self) -> int:
        return sum(t.numel for t in self.tensors())

    def packing_problem(self, storage_dtype: str) -> str | None:
        """Why the trainer would refuse to pack this model's fused MoE experts in NF4 stored as
        `storage_dtype` (its own rule, `cockpit.contract.packed_expert_problem`), or None. Every sparse
        layer holds the same experts: the first says it."""
        if not self.is_moe:
            return None
        for t in self._layer(self.sparse_layers[0]):
            if t.kind == "experts" and len(t.shape) == 3:
                problem = packed_expert_problem(t.shape[1], t.shape[2], storage_dtype)
                if problem:
                    return f"{t.name.split('.', 3)[-1]}: {problem}"
        return None

    def active_matmul_params(self) -> int:
        """Weights one token multiplies through (top-k experts only; embeddings are a lookup)."""
        active = 0
        for t in self.tensors():
            if t.kind == "embeddings" or len(t.shape) < 2:
                continue
            if t.kind == "experts":
                active += t.numel * self.top_k // self.experts
            else:
                active += t.numel
        return active


@functools.lru_cache(maxsize=32)
def _tensors_of(geometry: ModelGeometry) -> tuple[TensorSpec, ...]:
    """A geometry's tensors, built once: a plan weighs its options against the same geometry ~100 times."""
    return tuple(geometry._all_tensors())


def check_packable(geometry: ModelGeometry, profile: Profile) -> None:
    """GeometryError when `profile` packs the experts in NF4 (`quantization.quantize_experts`) and the
    trainer's loader would refuse this model's (`ModelGeometry.packing_problem`): plan and doctor refuse
    what the loader refuses, by its rule, before anything loads."""
    q = profile.quantization
    if not q.quantize_experts:
        return
    problem = geometry.packing_problem(experts_storage_dtype(profile.training.bf16, q.storage_dtype))
    if problem:
        raise GeometryError(
            f"quantization.quantize_experts: the trainer cannot pack this model's experts in NF4 "
            f"({problem}); set it to false to keep them in 16 bit"
        )


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def geometry_from_config(cfg: dict[str, Any], name: str = "") -> ModelGeometry:
    """A geometry from a config.json mapping (Qwen3-MoE, Qwen2-MoE, Mixtral; Llama, Mistral, Qwen2, Qwen3)."""
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = cfg["text_config"]
    model_type = str(cfg.get("model_type", "")).lower()
    notes: list[str] = []
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
        heads = int(cfg["num_attention_heads"])
    except KeyError as exc:
        raise GeometryError(f"config.json has no {exc.args[0]!r}") from None
    if model_type not in MOE_TYPES + DENSE_TYPES:
        notes.append(
            f"model_type {model_type or '?'!r} is not a known family: planned as a Llama-style dense model"
        )
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    experts = int(_get(cfg, "num_experts", "num_local_experts", default=0)) if model_type in MOE_TYPES else 0
    if model_type == "mixtral":
        moe_width, dense_width = int(cfg["intermediate_size"]), int(cfg["intermediate_size"])
    else:
        dense_width = int(_get(cfg, "intermediate_size", default=4 * hidden))
        moe_width = int(_get(cfg, "moe_intermediate_size", default=dense_width))
    sparse: tuple[int, ...] = ()
    if experts:
        step = int(_get(cfg, "decoder_sparse_step", default=1)) or 1
        dense_only = set(_get(cfg, "mlp_only_layers", default=[]) or [])
        sparse = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    attention_bias = bool(_get(cfg, "attention_bias", default=False))
    if model_type in ("qwen2", "qwen2_moe"):
        qkv_bias, o_bias = bool(_get(cfg, "qkv_bias", default=True)), False
    elif model_type == "mixtral":
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = attention_bias
    dtype = str(_get(cfg, "torch_dtype", "dtype", default="bfloat16")).replace("torch.", "")
    return ModelGeometry(
        model_type=model_type or "unknown",
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=dense_width,
        experts=experts,
        top_k=int(_get(cfg, "num_experts_per_tok", default=0)) if experts else 0,
        moe_intermediate=moe_width if experts else 0,
        shared_expert_intermediate=int(_get(cfg, "shared_expert_intermediate_size", default=0))
        if model_type == "qwen2_moe"
        else 0,
        sparse_layers=sparse,
        tie_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(_get(cfg, "mlp_bias", default=False)) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        checkpoint_dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
        name=name,
        notes=tuple(notes),
    )


def load_geometry(path: str | Path, name: str = "") -> ModelGeometry:
    """Read a config.json file (or a model directory holding one)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GeometryError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise GeometryError(f"{path}: not valid JSON: {exc.msg}") from None
    return geometry_from_config(cfg, name=name or path.parent.name)
