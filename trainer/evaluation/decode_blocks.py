"""CUDA graphs of a decode step, one a GPU, for a model placed block by block over several GPUs.

A CUDA graph is captured on one device, so a model that accelerate's device map spreads over GPUs had its
decode step launched kernel by kernel (about 0.7 ms more a layer than a replayed graph on an H200,
`benchmarks/results/decode_speed_h200.md`). Here the decoder layers of each device form a block
(`blocks_of`): while a decoding runs they are swapped for stand-ins (`BlockGraphs.installed`). The first
step runs the real layers and keeps each block's inputs in buffers on its device (`record`); each block is
then captured as one graph on those buffers (`capture`, which runs nothing); every later step launches
the embedding, rotary and mask work as before, and for each block copies its inputs into its buffers and
replays its graph (`replay`). The cache's slot reaches the other devices through per-device copies made
outside the graphs (`trainer.evaluation.decode.StaticKV.sync_slot`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from trainer.kernels.device import on_device

# Tests and benchmarks: also cut a block every N layers on one device (None: cut at device changes only).
# Set, it also takes the blocks' path on the CPU, where a "replay" runs the layers on the blocks' buffers.
SPLIT_EVERY: int | None = None


def layer_list(model: Any) -> torch.nn.ModuleList:
    """The model's decoder layers (a ModuleList named `...layers` holding the config's count at least:
    the forward runs the first `num_hidden_layers` of them)."""
    n = model.config.num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.endswith("layers") and len(module) >= n:
            return module
    raise ValueError(f"no decoder layer list of {n} layers in {type(model).__name__}")


def _device(module: torch.nn.Module) -> torch.device:
    return next(p.device for p in module.parameters())


def placeable(model: Any) -> bool:
    """Whether every decoder layer sits on a CUDA device (not offloaded to the CPU or the disk by
    accelerate, where its parameters are on `meta`): then a graph a GPU can hold them."""
    n = model.config.num_hidden_layers
    try:
        layers = layer_list(model)[:n]
    except ValueError:
        return False
    return all(_device(layer).type == "cuda" for layer in layers)


def blocks_of(layers: torch.nn.ModuleList, split_every: int | None = None) -> list[range]:
    """Runs of consecutive layers on one device (cut every `split_every` layers too, where given)."""
    blocks: list[range] = []
    start = 0
    for i in range(1, len(layers) + 1):
        cut = i == len(layers) or _device(layers[i]) != _device(layers[start])
        if cut or (split_every and i - start >= split_every):
            blocks.append(range(start, i))
            start = i
    return blocks


def _static(value: Any, device: torch.device) -> Any:
    """A copy of a layer input on `device` at an address of its own (tuples element by element)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_static(v, device) for v in value)
    return value


def _load(static: Any, value: Any) -> None:
    """Copy this step's input into the buffer a graph reads (the same shape, or ValueError)."""
    if isinstance(static, torch.Tensor):
        if static.shape != value.shape:
            raise ValueError(
                f"a block's input changed shape: {tuple(value.shape)}, recorded {tuple(static.shape)}"
            )
        if static is not value:
            static.copy_(value, non_blocking=True)
    elif isinstance(static, (tuple, list)):
        for s, v in zip(static, value, strict=True):
            _load(s, v)


class _Block:
    """The layers of one block: run (and their inputs kept), captured, or replayed."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        self.layers = layers
        self.device = _device(layers[0])
        self.mode = "record"
        self.hidden: torch.Tensor | None = None
        self.kwargs: dict[str, Any] = {}
        self.out: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    def _run(self, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        with on_device(self.device):
            for layer in self.layers:
                hidden = layer(hidden, **kwargs)
        return hidden

    def __call__(self, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        if self.mode == "record":
            self.hidden = _static(hidden, self.device)
            self.kwargs = {k: _static(v, self.device) for k, v in kwargs.items()}
            return self._run(hidden, kwargs)
        _load(self.hidden, hidden)
        for name, value in kwargs.items():
            _load(self.kwargs[name], value)
        for value in kwargs.values():  # the cache, whatever the transformers version calls it
            if hasattr(value, "sync_slot"):
                value.sync_slot(self.device)
        if self.graph is None:  # no CUDA (tests): the layers run on the buffers, as a replay would
            self.out = self._run(self.hidden, self.kwargs)
            return self.out
        with torch.cuda.device(self.device):
            self.graph.replay()
        return self.out

    def capture(self) -> None:
        """Record the block's layers on its buffers as a graph (runs nothing; off CUDA, no graph)."""
        self.mode = "replay"
        if self.device.type != "cuda":
            return
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                self.out = self._run(self.hidden, self.kwargs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = graph


class _Stand(torch.nn.Module):
    """In a decoder layer's place: the first of a block runs the block, the others pass their input on."""

    def __init__(self, block: _Block, first: bool) -> None:
        super().__init__()
        self.block = [block]  # a list: not a submodule, so the real layers are not registered twice
        self.first = first

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.block[0](hidden_states, kwargs) if self.first else hidden_states


class BlockGraphs:
    """The blocks of a model's decoder layers (see the module docstring)."""

    def __init__(self, model: Any, split_every: int | None = None) -> None:
        self.layers = layer_list(model)
        n = model.config.num_hidden_layers
        ranges = blocks_of(self.layers[:n], split_every if split_every is not None else SPLIT_EVERY)
        self.blocks = [_Block([self.layers[i] for i in r]) for r in ranges]
        self._stands = [_Stand(b, i == r.start) for b, r in zip(self.blocks, ranges, strict=True) for i in r]

    @contextlib.contextmanager
    def installed(self) -> Iterator[BlockGraphs]:
        """The stand-ins in the layers' places; the real layers back afterwards, whatever happens."""
        real = list(self.layers[: len(self._stands)])
        for i, stand in enumerate(self._stands):
            self.layers[i] = stand
        try:
            yield self
        finally:
            for i, layer in enumerate(real):
                self.layers[i] = layer

    def capture(self) -> None:
        """Capture every block on the inputs the last (recorded) step gave it."""
        for block in self.blocks:
            block.capture()
