"""The trainer's audit against the plan: every setting the plan counted on and the run did not get, with
the memory (and time) it costs.

Pure: it reads two JSON mappings, the `audit` event the trainer writes after load (`trainer/audit.py`)
and the `plan.json` that `cockpit run` stores beside `run.json`, so a viewer can call it on a live run
or on a replay alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cockpit.units import size

# A group whose 4-bit shortfall is below this fraction of the model is not worth a warning.
MIN_FRACTION = 0.01


@dataclass(frozen=True)
class PlanWarning:
    setting: str
    message: str
    cost_bytes: int  # extra bytes where it hurts most (per GPU, or host RAM)


def _basis(plan: dict[str, Any]) -> dict[str, Any]:
    """The figures the comparison needs, from a plan.json."""
    configured = plan["configured"]
    setup = configured["setup"]
    prec = plan["precision"]
    act_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(prec["compute_dtype"], 2)
    return {
        "ranks": max(1, setup["gpus"]),
        "gpus": setup["gpus"],
        # Plans before the layerwise loader had `load_on` ("gpu": from_pretrained onto the GPU; "host").
        "loader": setup.get("loader") or ("transformers" if setup.get("load_on") == "gpu" else "host"),
        "offload_param": setup["offload_param"],
        "offload_optimizer": setup["offload_optimizer"],
        "grad_ckpt": setup["grad_ckpt"],
        "extra_per_param": act_bytes - prec["bytes_per_param_4bit"],
        "stored": plan["weights_bytes"]["stored"],
        "stored_data": plan["weights_bytes"]["stored_data"],
        "kinds": {k["kind"]: k for k in plan["kinds"]},
        "activations": plan["activations"],
        "optimizer_bytes": plan["lora"]["optimizer_bytes"],
        "h2d_gbps": plan["assumptions"]["h2d_gbps"],
    }


def compare_audit(audit: dict[str, Any], plan: dict[str, Any]) -> list[PlanWarning]:
    """Warnings for what the audit shows was not applied as the plan assumed, each with its cost."""
    if not audit or not plan or "configured" not in plan:
        return []
    b = _basis(plan)
    n = b["ranks"]
    out: list[PlanWarning] = []
    groups = audit.get("groups") or {}
    total = sum(g.get("params", 0) for k, g in groups.items() if k != "lora") or 1

    # 4-bit storage, group by group (experts included).
    for kind, planned in b["kinds"].items():
        want = planned.get("planned_4bit_params", 0)
        got = groups.get(kind, {}).get("params_4bit", 0)
        have = groups.get(kind, {}).get("params", 0)
        short = min(want, have) - got
        if want and have and short > MIN_FRACTION * total:
            extra = int(short * b["extra_per_param"])
            where = []
            if b["gpus"] and b["loader"] == "transformers":
                where.append(f"+{size(extra)} per GPU at load (the whole model lands on each GPU)")
            if b["offload_param"] == "cpu":
                where.append(f"+{size(extra)} of pinned host RAM across the ranks")
                where.append(
                    f"+{2 * extra / n / (b['h2d_gbps'] * 1e9):.2f} s a step in host-to-device copies"
                )
            elif b["gpus"] and b["offload_param"] == "none":
                where.append(f"+{size(extra / n)} per GPU in training")
            if not b["gpus"]:
                where.append(f"+{size(extra)} of host RAM")
            out.append(
                PlanWarning(
                    f"4bit:{kind}",
                    f"{kind}: {short / 1e9:,.2f} B parameters the plan puts in 4 bit are in 16 bit: "
                    + "; ".join(where),
                    extra,
                )
            )

    requested = audit.get("requested") or {}
    applied = audit.get("applied") or {}
    if requested.get("zero_stage") == 3 and applied.get("partitioned_at_load") is False and n > 1:
        whole = b["stored"]
        if b["loader"] != "host":
            cost = whole - whole // n
            text = f"+{size(cost)} per GPU at load against a partitioned load"
        else:
            cost = (n - 1) * whole
            text = f"+{size(cost)} of host RAM at load against a partitioned load"
        out.append(
            PlanWarning(
                "partition_at_load",
                f"ZeRO-3 did not partition at load: each of {n} ranks held the whole model "
                f"({size(whole)}): {text} "
                + (
                    "(the plan counts the whole model: Transformers skips zero.Init for quantized models)"
                    if b["loader"] == "transformers"
                    else "(the plan counts one partition per GPU: the layerwise loader partitions each layer)"
                ),
                cost,
            )
        )
    if requested.get("gradient_checkpointing") and applied.get("gradient_checkpointing") is False:
        acts = b["activations"]
        cost = int(acts["without_checkpointing"] - acts["with_checkpointing"])
        out.append(
            PlanWarning(
                "gradient_checkpointing",
                f"gradient checkpointing is off: +{size(cost)} of activations per GPU "
                f"at seq {acts['seq_len']}"
                + (
                    "; with offload, every gathered layer is kept until backward"
                    if b["offload_param"] != "none"
                    else ""
                ),
                cost,
            )
        )
    if b["offload_param"] != "none" and applied.get("offload_param") == "none":
        cost = b["stored_data"] // n
        out.append(
            PlanWarning(
                "offload_param", f"parameter offload is not in effect: +{size(cost)} of weights per GPU", cost
            )
        )
    if b["offload_optimizer"] != "none" and applied.get("offload_optimizer") == "none":
        cost = b["optimizer_bytes"] // n
        out.append(
            PlanWarning(
                "offload_optimizer",
                f"optimizer offload is not in effect: +{size(cost)} of optimizer state per GPU",
                cost,
            )
        )
    stage = applied.get("zero_stage")
    if requested.get("zero_stage") == 3 and stage is not None and stage != 3 and n > 1:
        cost = b["stored_data"] - b["stored_data"] // n
        out.append(
            PlanWarning(
                "zero_stage",
                f"ZeRO-{stage} in effect, not 3: +{size(cost)} of unpartitioned weights per GPU",
                cost,
            )
        )
    return out


def plan_warnings(audit: dict[str, Any] | None, plan: dict[str, Any] | None) -> list[str]:
    """What the audit costs against the plan, as the lines a viewer shows after the trainer's own."""
    if not audit or not plan:
        return []
    return [f"against the plan: {w.message}" for w in compare_audit(audit, plan)]
