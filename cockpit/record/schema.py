"""The record's schema: every event kind's fields (units in their names) with their types, and run.json's.

One table for the whole cockpit. The record check reads it (`event_problem`: a line whose field has the wrong
type is damage, named with its file, line and field), so do the columns that compare and export read
(`STEP_FIGURES`) and the fields an importer says are absent (`cockpit.importers.model`). `docs/record.md`
documents the same kinds; `tests/test_record_schema.py` holds the two, and real runs' records, to it.

Any field may be absent or null unless required. A field not listed is allowed (a newer writer's, a kind's
extras); a kind not listed is checked for `t`, `kind` and `rank` only.

JSON has no NaN or infinity: a writer puts a non-finite number as the text `"nan"`, `"inf"` or `"-inf"`
(`encode`), and a number field takes it back as the float (`event_problem` decodes in place), so a
diverged loss stays a NaN from the trainer to every viewer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode(value: Any) -> Any:
    """A value as JSON can hold it: a non-finite float as its word (`"nan"`, `"inf"`, `"-inf"`), in any
    list or object too."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: Any) -> Any:
    """The value as a number field holds it (a non-finite word as its float), or `_WRONG`."""
    if value is None or _is_number(value):
        return value
    if isinstance(value, str) and value in NONFINITE:
        return NONFINITE[value]
    return _WRONG


_WRONG = object()


@dataclass(frozen=True)
class Type:
    """A field's type: what an error calls it, `read`: the value as readers get it, or `_WRONG`, and
    `plain`: the Python types whose values are read as they are (checked first: most values are)."""

    name: str
    read: Callable[[Any], Any]
    plain: tuple[type, ...] = ()


def _whole(value: Any) -> Any:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return value if isinstance(value, float) and value.is_integer() else _WRONG


def _time(value: Any) -> Any:
    return value if _is_number(value) and math.isfinite(value) else _WRONG


def _numbers(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, list):
        return _WRONG
    if all(type(v) is float or type(v) is int for v in value):
        return value
    out = [_number(v) for v in value]
    return _WRONG if any(v is _WRONG for v in out) else out


def _number_table(value: Any) -> Any:
    if not isinstance(value, dict):
        return None if value is None else _WRONG
    out = {k: _number(v) for k, v in value.items()}
    return _WRONG if any(v is _WRONG for v in out.values()) else out


def _of(kind: type | tuple[type, ...]) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        return value if value is None or isinstance(value, kind) else _WRONG

    return read


TIME = Type("a finite number (Unix seconds)", _time)
INT = Type("a whole number", _whole, (int,))
NUMBER = Type("a number (or nan, inf, -inf)", _number, (float, int))
TEXT = Type("text", _of(str), (str,))
FLAG = Type("true or false", _of(bool), (bool,))
LIST = Type("a list", _of(list), (list,))
NUMBERS = Type("a list of numbers", _numbers)
TABLE = Type("an object", _of(dict), (dict,))
NUMBER_TABLE = Type("an object of numbers", _number_table)


@dataclass(frozen=True)
class Required:
    """A field that must be there, and not null."""

    type: Type


Fields = Mapping[str, "Type | Required"]

HEADER: Fields = {"t": Required(TIME), "kind": Required(TEXT), "rank": INT}  # every event's own fields

# The step event's fields by name: the writer (`trainer/callbacks.py`), the columns (`record.scalars`), the
# importers (`cockpit.importers.model`) and the folds (`record.view`, `record.series`) name them through
# these, never spelled again.
# A thinking batch timed on a rehearsal's slice (`trainer.evaluation.eval_timing`): these figures at the
# batch, one prompt (`single_`), the largest batch (`large_`) and each decode step launched alone (`eager_`).
THINKING_TIMED = ("prefill_s", "prefill_sd_s", "decode_step_s", "decode_step_sd_s", "first_s", "think_s")
THINKING_PREFIXES = ("", "single_", "large_", "eager_")
FORWARDS_TIMED = dict.fromkeys(("first_s", "forward_s", "forward_sd_s"), NUMBER)  # validation's, rehearsed
REHEARSE_EVAL = {
    "layers": INT, "load_s": NUMBER, "gpus": INT, "device": TEXT, "batch": INT, "prompt_tokens": INT,
    "new_tokens": INT, "think_tokens": INT, "repeats": INT, "large_batch": INT, "large_new_tokens": INT,
    "decode_path": TEXT,
    **{prefix + field: NUMBER for prefix in THINKING_PREFIXES for field in THINKING_TIMED},
    "score_rows": INT, "score_labels": INT, "score_tokens": INT, "score_s": NUMBER, "score_sd_s": NUMBER,
    "score_path": TEXT,
}  # fmt: skip
STEP = "step"  # the event's kind, and its field: the optimizer step's number
MAX_STEPS = "max_steps"
LOSS = "loss"
LEARNING_RATE = "learning_rate"
GRAD_NORM = "grad_norm"
EPOCH = "epoch"
TOKENS_PER_S = "tokens_per_s"
SAMPLES_PER_S = "samples_per_s"
STEP_TIME_S = "step_time_s"
TOKENS = "tokens"  # input tokens of the step
# A rank's memory, in the step event and others (`MEMORY`).
RSS_MIB = "rss_mib"
RSS_PEAK_MIB = "rss_peak_mib"
CUDA_ALLOC_MIB = "cuda_alloc_mib"
CUDA_RESERVED_MIB = "cuda_reserved_mib"
CUDA_PEAK_ALLOC_MIB = "cuda_peak_alloc_mib"
CUDA_PEAK_RESERVED_MIB = "cuda_peak_reserved_mib"

# A step's training figures, in the columns' order (compare and export, `record.scalars`).
STEP_FIGURES: Fields = {
    LOSS: NUMBER,
    LEARNING_RATE: NUMBER,
    GRAD_NORM: NUMBER,
    EPOCH: NUMBER,
    TOKENS_PER_S: NUMBER,
    SAMPLES_PER_S: NUMBER,
    STEP_TIME_S: NUMBER,
    TOKENS: NUMBER,
}
MEMORY: Fields = {
    RSS_MIB: NUMBER,
    RSS_PEAK_MIB: NUMBER,
    CUDA_ALLOC_MIB: NUMBER,
    CUDA_RESERVED_MIB: NUMBER,
    CUDA_PEAK_ALLOC_MIB: NUMBER,
    CUDA_PEAK_RESERVED_MIB: NUMBER,
}
_RANK_PLACE: Fields = {
    "pid": INT,
    "host": TEXT,
    "node_rank": INT,
    "local_rank": INT,
    "world_size": INT,
    "nodes": INT,
}
_NODE: Fields = {
    "node_rank": INT,
    "host": TEXT,
    "pid": INT,
    "argv": LIST,
    "exit_code": INT,
    "exit": TEXT,
    "launch_t": NUMBER,
}

EVENTS: dict[str, Fields] = {
    "phase": {
        "phase": TEXT,
        "pid": INT,
        "message": TEXT,
        "model": TEXT,
        "train_examples": INT,
        "ops": LIST,
        "cache": TEXT,
        **MEMORY,
    },
    "load_progress": {"layer": INT, "layers": INT},
    "rank_start": _RANK_PLACE,
    "error": {"type": TEXT, "message": TEXT, "step": INT},
    "rank_exit": {**_RANK_PLACE, "exit_code": INT, "signal": TEXT},
    "loaded": {
        "load_s": NUMBER,
        "partitioned_at_load": FLAG,
        "loader": TEXT,
        "weights": TEXT,
        "load_device": TEXT,
        "layers": INT,
        "linear_4bit": INT,
        "experts_nf4": INT,
        "experts_16bit": INT,
        "unused_checkpoint_tensors": INT,
        "checkpoint_tensors_read": INT,
        "load_quantize_s": NUMBER,
        "load_share": TABLE,
        "nf4_cache": TABLE,
        "zero3_leaf_modules": LIST,
        "nf4_expert_tensors": INT,
        "nf4_expert_tensors_partitioned": INT,
        "attention": TEXT,
        "attention_kernel": TEXT,
        "chunked_loss": FLAG,
        "fused_rms_norms": INT,
        "fused_rope": FLAG,
        "lean_lora": INT,
        "cuda_peak_per_layer_mib": NUMBERS,
        "async_fetch": FLAG,
        "embeddings_on_gpu": INT,
        "cpu_4bit_repack_off": INT,
        **MEMORY,
    },
    "load_peak": MEMORY,
    "audit": {
        "params_total": INT,
        "params_4bit": INT,
        "fraction_4bit": NUMBER,
        "fraction_4bit_body": NUMBER,
        "params_trainable": INT,
        "groups": TABLE,
        "lora_targets": TABLE,
        "requested": TABLE,
        "applied": TABLE,
        "warnings": LIST,
    },
    "train_begin": {
        "max_steps": INT,
        "num_train_epochs": NUMBER,
        "start_step": INT,
        "world_size": INT,
        "micro_batch_size": INT,
        "grad_accum": INT,
    },
    STEP: {STEP: Required(INT), MAX_STEPS: INT, **STEP_FIGURES, **MEMORY},
    "checkpoint": {"step": INT, "path": TEXT, "save_s": NUMBER},
    "stop_ack": {"step": INT},
    "resume": {"checkpoint": TEXT, "skipped_incomplete": LIST},
    "adapter": {"step": INT, "path": TEXT, "val_loss": NUMBER, "last_step": INT, "last_path": TEXT},
    "expert_adapter": {"path": TEXT, "tensors": INT},
    "trainer_end": {"step": INT, "outcome": TEXT},
    "best_adapter": {"step": INT, "val_loss": NUMBER, "path": TEXT, "save_s": NUMBER},
    # `examples`: the sample to score (all of the held-out `population` unless eval.examples asks fewer).
    "eval_begin": {"systems": LIST, "examples": INT, "population": INT, "time_budget_s": NUMBER, "seed": INT},
    "eval_progress": {"system": TEXT, "done": INT, "total": INT},
    "eval_system": {
        "system": TEXT,
        "path": TEXT,
        "examples": INT,
        "population": INT,
        "by": LIST,  # why `examples` is fewer than `population`: "examples", "time budget"
        "accuracy": NUMBER,
        "seconds": NUMBER,
    },
    "serving": {
        "system": TEXT,
        "ttft_ms": NUMBER,
        "per_token_ms": NUMBER,
        "stream_tokens_per_s": NUMBER,
        "batch_size": INT,
        "batch_tokens_per_s": NUMBER,
        "new_tokens": INT,
        "prompt_tokens_mean": NUMBER,
        "device": TEXT,
        "gpus": INT,
    },
    "eval_end": {"systems": LIST},
    "data": {
        "source": TEXT,
        "examples": INT,
        "tokens": INT,
        "target_fraction": NUMBER,
        "rows": INT,
        "packing": FLAG,
        "fill": NUMBER,
        "format": TEXT,
        "split_from": TEXT,
        "eval_examples": INT,
        "val_examples": INT,
        "val_split": TEXT,
        "over_seq_len": INT,
        "answer_cut": INT,
        "tokenize_s": NUMBER,
        "tokenize_cache": TEXT,
        "data_sha256": TEXT,
        "rows_sha256": TEXT,
    },
    "val_loss": {
        "step": Required(INT),
        "epoch": NUMBER,
        "loss": NUMBER,
        "tenant_loss": NUMBER_TABLE,
        "examples": INT,
        "target_tokens": INT,
        "split": TEXT,
        "eval_s": NUMBER,
    },
    "early_stop": {
        "step": INT,
        "best_step": INT,
        "best_loss": NUMBER,
        "patience": INT,
        "min_delta": NUMBER,
        "reason": TEXT,
    },
    "train_end": {
        "train_runtime_s": NUMBER,
        "steps": INT,
        "tokens": NUMBER,
        "bare": FLAG,
        "step_times_s": NUMBERS,
    },
    "profile": {
        "first_step": INT,
        "last_step": INT,
        "step_wall_s": NUMBER,
        "device_busy_s": NUMBER,
        "host_bound_s": NUMBER,
        "categories_s": NUMBER_TABLE,
        "h2d_bytes_per_step": NUMBER,
        "top_kernels_s": LIST,
        "top_ops_s": LIST,
        "python_top": LIST,
    },
    "launch": {"stage": TEXT, "argv": LIST, "pid": INT, "world_size": INT},
    "launch_end": {"stage": TEXT, "exit_code": INT},
    "node_start": _NODE,
    "node_launch": _NODE,
    "node_end": _NODE,
    "supervisor_start": {"pid": INT, "argv": LIST, "resume": FLAG, "host_ram_limit_mib": NUMBER},
    "stop_request": {"phase": TEXT, "step": INT},
    "note": {"message": TEXT, "run_rss_mib": NUMBER, "host_ram_limit_mib": NUMBER},
    "report": {"path": TEXT, "summary": TEXT},
    "end": {"status": TEXT, "diagnosis": TEXT, "exit_code": INT},
    "rehearse_begin": {"layers": INT, "steps": INT, "step_offset": INT},
    "rehearse_end": {"layers": INT, "status": TEXT, "message": TEXT, "exit_code": INT},
    "rehearsal": {"path": TEXT, "summary": TEXT},
    "rehearse_eval": REHEARSE_EVAL,
    "rehearse_validation": {**dict.fromkeys(("layers", "forwards", "rows", "tokens"), INT), **FORWARDS_TIMED},
    "telemetry_start": {
        "pid": INT,
        "root_pid": INT,
        "interval_s": NUMBER,
        "nvml": TEXT,
        "gpus": LIST,
        "output_log_bytes": NUMBER,
    },
    "telemetry": {
        "gpu_mem_used_mib": NUMBERS,
        "gpu_mem_total_mib": NUMBERS,
        "gpu_util_pct": NUMBERS,
        "gpu_power_w": NUMBERS,
        "gpu_temp_c": NUMBERS,
        "ram_used_mib": NUMBER,
        "ram_available_mib": NUMBER,
        "ram_total_mib": NUMBER,
        "swap_used_mib": NUMBER,
        "swap_total_mib": NUMBER,
        "cpu_pct": NUMBER,
        "run_rss_mib": NUMBER,
        "run_cpu_pct": NUMBER,
        "run_processes": INT,
        "output_log_bytes": NUMBER,
    },
    "telemetry_end": {"samples": INT},
}

# run.json (`record.manifest`): what its readers take from it.
MANIFEST: Fields = {
    "format_version": INT,
    "run_id": TEXT,
    "status": TEXT,
    "mode": TEXT,
    "profile_name": TEXT,
    "profile_path": TEXT,
    "profile": TABLE,
    "argv": LIST,
    "eval_args": LIST,
    "eval_request": TABLE,  # `cockpit eval --examples/--time-budget`: {"examples", "time_budget_s"}
    "versions": TABLE,
    "host": TABLE,
    "created_at": NUMBER,
    "started_at": NUMBER,
    "ended_at": NUMBER,
    "exit_code": INT,
    "diagnosis": TEXT,
    "warning": TEXT,
    "supervisor_pid": INT,
    "supervisor_started_at": NUMBER,
    "supervisor_boot_start": TEXT,  # "<boot id>:<ticks from boot to the start>" (`service.liveness`)
    "trainer_pgid": INT,
    "resumed": FLAG,
    "training": TABLE,
    "evaluation": TABLE,
    "rehearsal": TABLE,
    "imported": TABLE,
}


def _key(value: Any) -> Any:
    return value if isinstance(value, str) or _whole(value) is value else _WRONG


KEY = Type("text or a whole number", _key)

# One line of a stored predictions file (`predictions/<system>.jsonl`): the first may be `{"meta": {...}}`.
PREDICTION: Fields = {
    "tenant": Required(TEXT),
    "id": Required(KEY),
    "pred": Required(TEXT),
    "gold": TEXT,
    "scores": NUMBER_TABLE,
    "thinking": TEXT,
}
PREDICTION_META: Fields = {"meta": Required(TABLE)}


def _shown(value: Any) -> str:
    """A wrong value as an error quotes it: short, with its JSON type."""
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_Compiled = tuple[dict[str, tuple[Type, bool]], tuple[str, ...]]
_compiled: dict[int, tuple[Fields, _Compiled]] = {}


def _compile(fields: Fields) -> _Compiled:
    """`fields` as (name -> (type, required)) and its required names, made once per table."""
    hit = _compiled.get(id(fields))
    if hit is not None and hit[0] is fields:
        return hit[1]
    table = {n: (s.type, True) if isinstance(s, Required) else (s, False) for n, s in fields.items()}
    made = (table, tuple(n for n, (_, required) in table.items() if required))
    _compiled[id(fields)] = (fields, made)
    return made


def fields_problem(data: dict[str, Any], fields: Fields) -> str | None:
    """`field NAME: expected T, got V` for the first field of `data` that `fields` types otherwise (its
    non-finite words decoded in place when all is well), else None."""
    table, required = _compile(fields)
    for name in required:
        if data.get(name) is None:
            kind = table[name][0]
            return (
                f"field {name}: missing"
                if name not in data
                else f"field {name}: expected {kind.name}, got null"
            )
    for name, value in data.items():
        spec = table.get(name)
        if spec is None or type(value) in spec[0].plain:
            continue
        read = spec[0].read(value)
        if read is _WRONG:
            return f"field {name}: expected {spec[0].name}, got {_shown(value)}"
        if read is not value:
            data[name] = read
    return None


def event_problem(event: Any) -> str | None:
    """Why a parsed line is not a well-typed event (None when it is; then its non-finite words are
    floats)."""
    if not isinstance(event, dict):
        return f"not an event (a JSON {type(event).__name__}, not an object)"
    problem = fields_problem(event, HEADER)
    if problem is not None:
        return f"not an event: {problem}"
    fields = EVENTS.get(event["kind"])
    if fields is None:
        return None
    problem = fields_problem(event, fields)
    return None if problem is None else f"{event['kind']} event: {problem}"
