"""Serving the tuned model, priced at the profile's scale, from evaluation's timings on the rehearsal's slices
(`cockpit.rehearse.evaluation`: each figure a line over depth, read at full depth and scaled to the
profile's GPUs).

- **Latency of a request** served alone (batch 1): its prompt's prefill, its thinking (`eval.max_think_tokens`
  decode steps at batch 1), and its answer scored (its row, the prefix and its labels: its share of a
  scoring forward).
- **Throughput** at evaluation's batch on the target (as evaluation chooses it from the free memory):
  new tokens a second while a batch thinks (the batch's tokens over its prefill and its decode steps).
- **Cost** of 1M generated tokens at that throughput on the profile's machine (`cost.serving_hour_usd`),
  beside the API's price (`cost.api_usd_per_mtok`).

The engine is the cockpit's own (Transformers' `generate` over the model as evaluation loads it), one
copy of the model over all the machine's GPUs: a production server batches more and pages its cache, so
this cost is an upper bound.
"""

from __future__ import annotations

from typing import Any

from cockpit.rehearse.evaluation import EvalForecast


def serving(ev: EvalForecast, profile: Any, machine: str) -> dict[str, Any] | None:
    """The serving figures on `machine` (the profile's), or None where evaluation was not timed on the
    rehearsal's slices (nothing measured to price)."""
    t, shape = ev.target, ev.shape
    needed = ("prefill_s", "decode_step_s", "score_s", "single_prefill_s", "single_decode_step_s")
    if not ev.measured or shape is None or any(k not in t for k in needed):
        return None
    think = shape.think_tokens
    answer_s = t["score_s"] / shape.rows_per_forward  # one row: the request's prefix and its labels
    thinking_s = think * t["single_decode_step_s"]
    latency = t["single_prefill_s"] + thinking_s + answer_s
    at = ev.costs()  # at evaluation's batch on the target
    batch_s = at.prefill_s + think * at.decode_step_s
    tokens_per_s = shape.batch * think / batch_s if batch_s > 0 else 0.0
    cost = profile.cost
    usd_per_mtok = (
        cost.serving_hour_usd / 3600 / tokens_per_s * 1e6 if cost.serving_hour_usd and tokens_per_s else None
    )
    api = cost.api_usd_per_mtok or None
    return {
        "machine": machine,
        "latency_s": latency,
        "prompt_s": t["single_prefill_s"],
        "thinking_s": thinking_s,
        "answer_s": answer_s,
        "prompt_tokens": shape.prompt_tokens,
        "think_tokens": think,
        "labels": shape.split.labels,
        "stream_tokens_per_s": 1.0 / t["single_decode_step_s"] if t["single_decode_step_s"] > 0 else None,
        "batch": shape.batch,
        "batch_tokens_per_s": tokens_per_s,
        "hour_usd": cost.serving_hour_usd or None,
        "usd_per_mtok": usd_per_mtok,
        "api_name": cost.api_name,
        "api_usd_per_mtok": api,
        "vs_api": usd_per_mtok / api if usd_per_mtok and api else None,
        "assumptions": [
            f"a request alone (batch 1): its {shape.prompt_tokens:,.0f}-token prompt prefilled, {think} "
            f"thinking tokens (eval.max_think_tokens, each thinks to the limit), its "
            f"{shape.split.labels:.1f} labels scored behind it (its row's share of a scoring forward, "
            "compute-bound)",
            f"throughput: {shape.batch} requests a batch (evaluation's), new tokens over the batch's prefill "
            "and decode steps; prompt tokens are not counted as output",
            f"price: cost.serving_hour_usd ${cost.serving_hour_usd:g} an hour for {machine}, one copy of the "
            "model over all its GPUs (layer blocks in turn), busy all the time",
            "engine: the cockpit's own (Transformers' generate, as evaluation runs it): a production server "
            "(vLLM) batches more and pages its KV cache, so this cost is an upper bound",
        ],
    }


def serving_lines(data: dict[str, Any] | None) -> list[str]:
    """The serving figures in two lines (empty without them)."""
    if not data:
        return []
    cost = (
        f"${data['usd_per_mtok']:,.2f} per 1M generated tokens at ${data['hour_usd']:g} an hour"
        if data.get("usd_per_mtok")
        else "no hourly price in the profile (cost.serving_hour_usd)"
    )
    api = (
        f", {data['vs_api']:.2g}x the API's ${data['api_usd_per_mtok']:g} ({data['api_name'] or 'API'})"
        if data.get("vs_api")
        else ""
    )
    return [
        f"serving on {data['machine']}: a request alone {data['latency_s']:.1f} s (prompt "
        f"{data['prompt_s']:.2f} s + thinking {data['thinking_s']:.1f} s + answer {data['answer_s']:.2f} s), "
        f"{data['stream_tokens_per_s'] or 0:,.1f} tokens/s streamed",
        f"serving at batch {data['batch']}: {data['batch_tokens_per_s']:,.0f} new tokens/s; {cost}{api}",
    ]
