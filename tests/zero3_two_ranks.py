"""Helper for tests/test_experts4bit.py, run by the DeepSpeed launcher with two CPU ranks (gloo).

Rank 1's tokens are all the same token, so in each MoE layer they reach the same top-k experts
while rank 0's reach all of them: ZeRO-3 with parameter offload must still gather the packed
experts on both ranks, reduce the expert-LoRA gradients and finish. Prints one JSON line a rank.
"""

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cockpit.profiles import Profile, load_profile
from trainer.ds_config import zero_init_config
from trainer.inputs import tiny
from trainer.model import attach_lora, load_base

deepspeed.init_distributed(dist_backend="gloo")
rank = int(os.environ["RANK"])
Profile.world_size = property(lambda self: 2)  # two CPU ranks: a profile says hardware.gpus = 0
profile, _ = load_profile("tiny-cpu")
profile = profile.model_copy(
    update={
        "quantization": profile.quantization.model_copy(update={"quantize_experts": True}),
        "lora": profile.lora.model_copy(update={"target_experts": True}),
        "training": profile.training.model_copy(update={"micro_batch_size": 4}),
    }
)
model = attach_lora(profile, load_base(profile, str(tiny.model_path(0))))
config = zero_init_config(profile, model.config.hidden_size)
config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
trainable = [p for p in model.parameters() if p.requires_grad]
engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
hits: list[list[int]] = []
model.base_model.model.model.layers[0].mlp.experts.register_forward_pre_hook(
    lambda module, args: hits.append(sorted(set(args[1].flatten().tolist())))
)
torch.manual_seed(rank)
ids = torch.full((4, 48), 7) if rank == 1 else torch.randint(0, model.config.vocab_size, (4, 48))
losses = []
for _ in range(3):
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
# One file per rank: two ranks printing to one pipe can interleave within a line.
result = {"rank": rank, "experts_hit_layer0": hits[0], "losses": losses}
Path(f"result-rank{rank}.json").write_text(json.dumps(result))
