"""Helper for tests/test_load_share.py: one of two CPU ranks (gloo), started by the test with the
launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

The tiny model (NF4 attention through bitsandbytes, packed NF4 experts) is loaded layer by layer
without ZeRO, under ZeRO-3, and sliced to 3 layers with random weights under ZeRO-3, each once with
every rank building every unit (the old way, `COCKPIT_LOAD_SHARE=0`) and once shared; then shared
under ZeRO-3 twice with the NF4 cache (each rank writes its units, then reads them). Writes
`result-rank<N>.json`: what differs between the two ways, byte for byte (this rank's ZeRO-3
partitions, every bitsandbytes quantization state, buffers, shapes, dtypes and the audit's
attributes), how many tensors were compared, and the load facts.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cockpit.profiles import load_profile
from trainer.inputs import tiny
from trainer.model import _zero3_init_config
from trainer.weights import load_share
from trainer.weights.loader import load_layerwise

deepspeed.init_distributed(dist_backend="gloo")
rank = int(os.environ["RANK"])
# two ranks (on the CPU: gloo); the NF4 cache off but where it is asked for (the last load, below)
profile, _ = load_profile("tiny-cpu", ["hardware.gpus=2", "quantization.cache=false"])
cached_profile, _ = load_profile("tiny-cpu", ["hardware.gpus=2"])
model_dir = str(tiny.model_path(0))
os.environ["COCKPIT_CACHE"] = str(
    Path.cwd() / "cache"
)  # the NF4 cache this test writes, the tiny model found
cpu = torch.device("cpu")


# The audit's attributes of packed experts, and bitsandbytes' of a Params4bit.
ATTRIBUTES = ("cockpit_4bit", "cockpit_logical_numel", "blocksize", "compress_statistics", "quant_type")
ATTRIBUTES += ("quant_storage", "bnb_quantized")


def contents(model: torch.nn.Module) -> dict[str, Any]:
    """Everything this rank holds of the model: tensors as bytes, the rest as plain values."""
    out: dict[str, Any] = {}
    for name, p in model.named_parameters():
        data = p.ds_tensor if hasattr(p, "ds_tensor") else p.data
        out[f"param {name}"] = data
        out[f"about {name}"] = {
            "type": type(p).__name__,
            "dtype": str(p.dtype),
            "shape": tuple(getattr(p, "ds_shape", None) or p.shape),
            "requires_grad": p.requires_grad,
            "partitioned": hasattr(p, "ds_id"),  # by ZeRO-3
            "attributes": sorted(k for k in vars(p) if not k.startswith("ds_")),
            **{k: str(getattr(p, k, None)) for k in ATTRIBUTES},
        }
    for name, b in model.named_buffers():
        out[f"buffer {name}"] = b
    for name, m in model.named_modules():
        out[f"module {name}"] = type(m).__name__
        state = getattr(getattr(m, "weight", None), "quant_state", None)
        if state is not None:
            for key, value in state.as_dict(packed=False).items():
                out[f"qstate {name}.{key}"] = value
            out[f"qstate {name} is the module's"] = m.quant_state is state
    return out


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    wrong = sorted(set(old) ^ set(new))
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        if isinstance(a, torch.Tensor):
            same = (
                isinstance(b, torch.Tensor)
                and a.dtype == b.dtype
                and a.shape == b.shape
                and a.device == b.device
                and torch.equal(
                    a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
                )
            )
        else:
            same = a == b
        if not same:
            wrong.append(key)
    return wrong


def load(
    zero_init: dict[str, Any] | None, shared: bool, random_layers: int | None, cached: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    load_share.SHARING = shared
    chosen = cached_profile if cached else profile
    model, facts = load_layerwise(chosen, model_dir, cpu, zero_init, random_layers=random_layers)
    return contents(model), facts


result: dict[str, Any] = {"rank": rank}
zero3 = _zero3_init_config(profile, model_dir)
# Without ZeRO, under ZeRO-3, and a rehearsal's random weights (3 layers: rank 0 builds one more).
for what, zero_init, random_layers in (("plain", None, None), ("zero3", zero3, None), ("random", zero3, 3)):
    old, old_facts = load(zero_init, False, random_layers)
    new, new_facts = load(zero_init, True, random_layers)
    result[what] = {
        "tensors": sum(isinstance(v, torch.Tensor) for v in new.values()),
        "qstate_tensors": sum(
            k.startswith("qstate ") and isinstance(v, torch.Tensor) for k, v in new.items()
        ),
        "params": sum(k.startswith("param ") for k in new),
        "partitioned": sum(v["partitioned"] for k, v in new.items() if k.startswith("about ")),
        "different": differences(old, new),
        "old_facts": old_facts,
        "new_facts": new_facts,
    }
# Shared under ZeRO-3 with the NF4 cache: the first load writes each rank's units, the second reads them.
old, _ = load(zero3, False, None)
_, first_facts = load(zero3, True, None, cached=True)
new, second_facts = load(zero3, True, None, cached=True)
result["cached"] = {
    "different": differences(old, new),
    "first_facts": first_facts,
    "second_facts": second_facts,
}
Path(f"result-rank{rank}.json").write_text(json.dumps(result))
