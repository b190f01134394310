"""Random weights in place of a checkpoint: the real architecture, no download.

A rehearsal (and the speed benchmarks) build a model from its `config.json` alone, sliced to a few
layers, and fill it through the same layer-by-layer loader as a real checkpoint. `RandomWeights` answers
the loader's questions (`key in source`, `get`, `get_row`) with tensors drawn on the loading device, so a
rehearsal of the story's model never writes or reads 20 GB of safetensors. Values follow the usual
initialisation (normal with the config's `initializer_range`, norms at one, biases at zero); every tensor
is a function of its name and the seed, so two ranks draw the same weights.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn


def _seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little") & (2**63 - 1)


class RandomWeights:
    """A stand-in for `trainer.weights.loader.Checkpoint` whose tensors are drawn, not read."""

    def __init__(
        self, model: nn.Module, device: torch.device | str, dtype: torch.dtype, seed: int = 0
    ) -> None:
        """`model` is the meta-device model the loader fills: its parameter and buffer names are the keys."""
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed
        self.std = float(getattr(getattr(model, "config", None), "initializer_range", 0.02) or 0.02)
        self.shapes: dict[str, tuple[int, ...]] = {n: tuple(p.shape) for n, p in model.named_parameters()}
        for module_name, module in model.named_modules():
            for name, buf in module.named_buffers(recurse=False):
                if name not in module._non_persistent_buffers_set:
                    self.shapes[f"{module_name}.{name}" if module_name else name] = tuple(buf.shape)
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.shapes

    def _draw(self, key: str, shape: tuple[int, ...], row: int | None = None) -> torch.Tensor:
        module = key.rsplit(".", 1)[0].rsplit(".", 1)[-1]
        if key.endswith(".bias"):
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        if "norm" in module:
            return torch.ones(shape, dtype=self.dtype, device=self.device)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(_seed(self.seed, key if row is None else f"{key}[{row}]"))
        out = torch.empty(shape, dtype=self.dtype, device=self.device)
        return out.normal_(0.0, self.std, generator=generator)

    def get(self, key: str) -> torch.Tensor:
        if key not in self.shapes:
            raise KeyError(f"random weights: no tensor {key!r} in the model")
        self.used.add(key)
        return self._draw(key, self.shapes[key])

    def get_row(self, key: str, index: int) -> torch.Tensor:
        """One slice along the first dimension (one expert of a fused experts weight)."""
        self.used.add(key)
        return self._draw(key, self.shapes[key][1:], row=index)

    def unused(self) -> list[str]:
        return sorted(set(self.shapes) - self.used)


def sliced_config(config: Any, layers: int) -> Any:
    """A copy of a transformers config with only the first `layers` decoder layers."""
    import copy

    sliced = copy.deepcopy(config)
    text = sliced.get_text_config() if hasattr(sliced, "get_text_config") else sliced
    if layers > text.num_hidden_layers:
        raise ValueError(f"{layers} layers asked, the model has {text.num_hidden_layers}")
    text.num_hidden_layers = layers
    if isinstance(getattr(text, "layer_types", None), list):  # one entry a layer
        text.layer_types = text.layer_types[:layers]
    if isinstance(getattr(text, "mlp_only_layers", None), list):  # layer indices
        text.mlp_only_layers = [i for i in text.mlp_only_layers if i < layers]
    return sliced
