"""Run profiles: one TOML file per run, validated field by field before anything starts.

A profile says which model to tune on which hardware, how to quantize it, where DeepSpeed puts
parameters and optimizer state, and what to train and evaluate on. `load_profile` turns a file (or a
name from `./profiles/` or the shipped `cockpit/profiles_data/`) into a `Profile`, or raises
`ProfileError` whose message names the file, the field and what was expected.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cockpit.launcher import BACKENDS, NODE_SPECS, extra_args_problem, selection_problem
from cockpit.limits import DataLimits
from cockpit.textfile import NotUtf8, read_utf8
from cockpit.trackers import Trackers, tracker_problems


def shipped_profiles_dir() -> Path:
    """The shipped profiles (and the story's config.json beside them): the package data
    `cockpit.shipped_profiles` where the cockpit is installed (a wheel, or editable: the checkout's
    `profiles/`), else a checkout's `profiles/` beside `cockpit/` (run from the source, unbuilt)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("cockpit.shipped_profiles")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(__file__).resolve().parent.parent / "profiles"


PROFILES_DIR = shipped_profiles_dir()
DEFAULT_PROFILE = "tiny-cpu"
BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("builtin:tiny-qwen3-moe",)
BUILTIN_DATA = ("builtin:tiny-tenants",)

# Every float of a profile is finite (`allow_inf_nan=False` on every section): TOML spells inf and nan.
PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]
Seed = Annotated[int, Field(ge=0, lt=2**32)]  # NumPy's seed range (Transformers seeds NumPy with it)
MAX_GPUS = 1024
MAX_NODES = 4096
Port = Annotated[int, Field(ge=0, le=65535)]
MAX_GPU_MEM_GIB = 4096.0
MAX_HOST_RAM_GIB = 1024.0**2  # 1 PiB


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Section):
    """The base model: a local directory with `config.json` and weights, or `builtin:tiny-qwen3-moe`."""

    path: str = Field(min_length=1, description="Local model directory, or builtin:tiny-qwen3-moe.")
    config: str = Field(
        default="",
        description="A config.json to plan from when the weights are elsewhere (relative to the profile).",
    )
    name: str = Field(default="", description="Human name shown in the app and reports.")
    trust_remote_code: bool = False
    loader: Literal["layerwise", "transformers"] = Field(
        default="layerwise",
        description="layerwise: read, quantize and (under ZeRO-3) partition one decoder layer at a time; "
        "transformers: from_pretrained, which holds the whole model on each rank's GPU before partitioning.",
    )


class HardwareSpec(_Section):
    """The machines the run is planned for: `nodes` hosts of `gpus` GPUs each. `gpus = 0` trains on the CPU
    (one rank a node)."""

    gpus: Annotated[int, Field(ge=0, le=MAX_GPUS)] = Field(default=0, description="GPUs a node; 0: the CPU.")
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = Field(
        default=1,
        description="Hosts the run spans, each with `gpus` GPUs; more than one needs launcher.hostfile.",
    )
    gpu_name: str = ""
    gpu_mem_gib: Annotated[float, Field(ge=0, le=MAX_GPU_MEM_GIB)] = Field(
        default=0.0, description="Memory of each GPU in GiB; 0: unknown (this machine's, for a plan)."
    )
    host_ram_gib: Annotated[float, Field(ge=0, le=MAX_HOST_RAM_GIB)] = Field(
        default=0.0, description="Host RAM in GiB; 0: unknown (this machine's, for a plan)."
    )
    host_ram_limit_gib: Annotated[float, Field(ge=0, le=MAX_HOST_RAM_GIB)] = Field(
        default=0.0,
        description="The resident memory (GiB) the run's processes (launcher, ranks, evaluation) may reach "
        "before the supervisor asks for a checkpoint and stops the run, ahead of the kernel's OOM killer; "
        "0: this host's RAM less max(5%, 4 GiB), at least half of it.",
    )


class QuantizationSpec(_Section):
    """bitsandbytes 4-bit loading of the frozen base weights."""

    load_in_4bit: bool = True
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    storage_dtype: Literal["uint8", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16",
        description="Dtype the packed 4-bit data is stored in; ZeRO-3 partitions float storage.",
    )
    quantize_experts: bool = Field(
        default=False,
        description="Quantize fused MoE expert tensors too (bitsandbytes only replaces nn.Linear).",
    )


class LoraSpec(_Section):
    """PEFT LoRA adapters on the frozen quantized model."""

    r: PositiveInt = 16
    alpha: PositiveFloat = 32.0
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )
    target_experts: bool = Field(
        default=False,
        description="Also train LoRA on every MoE expert (needs quantization.quantize_experts).",
    )


class DeepSpeedSpec(_Section):
    """DeepSpeed ZeRO stage and where parameters and optimizer state live."""

    stage: Literal[0, 1, 2, 3] = 3
    offload_param: Literal["none", "cpu", "nvme"] = "cpu"
    offload_optimizer: Literal["none", "cpu", "nvme"] = "cpu"
    nvme_path: str = ""
    zero3_leaf: Literal["moe_block", "decoder_layer"] = Field(
        default="decoder_layer",
        description="What ZeRO-3 gathers as one unit: every whole decoder layer (attention, LoRA and experts "
        "at once: a hook a layer, measured 25% faster a step on the story's slice), or every MoE block (its "
        "experts at once; attention's parameters one module at a time).",
    )
    embeddings_on_gpu: bool = Field(
        default=True,
        description="With parameter offload to the CPU, the input embedding and the lm_head stay on the "
        "GPUs (each rank's ZeRO-3 partition there, whole once gathered) instead of the host: otherwise every "
        "micro-batch copies them from the host three times (the embedding's lookup and its backward hook, "
        "the lm_head), for a lookup of a few thousand rows. Costs their bytes on each GPU.",
    )
    persistence_threshold: NonNegInt = Field(
        default=0,
        description="Parameters with at most this many elements stay whole on every GPU (never gathered); "
        "0: DeepSpeed's 10 x hidden size.",
    )
    prefetch_layers: NonNegFloat = Field(
        default=0.0,
        description="ZeRO-3 prefetch bucket in decoder layers (the next layer's weights fetched while this "
        "one computes); 0: DeepSpeed's size from the hidden size.",
    )

    @model_validator(mode="after")
    def _offload_needs_stage(self) -> DeepSpeedSpec:
        if self.offload_param != "none" and self.stage != 3:
            raise ValueError("offload_param needs stage = 3")
        if "nvme" in (self.offload_param, self.offload_optimizer) and not self.nvme_path:
            raise ValueError("nvme offload needs nvme_path")
        return self


class TrainingSpec(_Section):
    """Optimization and schedule."""

    seq_len: PositiveInt = 1024
    micro_batch_size: PositiveInt = 1
    grad_accum: PositiveInt = 1
    learning_rate: PositiveFloat = 2e-4
    weight_decay: NonNegFloat = 0.0
    warmup_ratio: Fraction = 0.03
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    epochs: PositiveFloat = 1.0
    max_steps: int = Field(default=-1, ge=-1, description="-1: run `epochs` epochs.")
    max_grad_norm: PositiveFloat = 1.0
    gradient_checkpointing: bool = True
    bf16: bool = True
    packing: bool = Field(
        default=True,
        description="Pack several examples into each sequence of seq_len tokens (positions restart, "
        "attention never crosses an example); false: one example a sequence, padded.",
    )
    chunked_loss: bool = Field(
        default=True,
        description="Compute the head's logits and loss a few hundred tokens at a time, only where there "
        "is a target, so the vocabulary-wide logits are never whole in memory.",
    )
    attention: Literal["varlen", "sdpa", "eager", "flex_attention"] = Field(
        default="varlen",
        description="varlen: causal SDPA one packed example at a time (no mask, nothing computed across "
        "examples); otherwise a Transformers attention implementation.",
    )
    save_steps: NonNegInt = Field(
        default=0, description="Checkpoint every N optimizer steps; 0 = only at the end."
    )
    save_total_limit: PositiveInt = 2
    seed: Seed = 0
    report_to: Trackers = Field(
        default_factory=list,
        description="Trackers the HF Trainer also reports to, live (its `report_to`: tensorboard, wandb, "
        "mlflow, trackio, ...; a name or a list; each needs its own package and settings, checked before a "
        "run starts); empty or none: none. The run record stays the cockpit's source of truth.",
    )
    stall_timeout_s: PositiveFloat = Field(
        default=1800.0,
        description="Stop a run with no step for this long (or ten median steps, if longer). Before its "
        "first step a run is stopped only when nothing progresses (no event, its processes idle) for this or "
        "10 min, whichever is longer, or no event comes for 4 times this or 1 h "
        "(cockpit.service.stall.SetupLimits).",
    )


class ColumnsSpec(_Section):
    """Which of the data's columns holds each field the cockpit needs (each defaults to its own name).

    `user` and `gold` are needed, or a `messages` column (a chat: system, user and assistant turns, as
    role/content or ShareGPT's from/value, the assistant's `<think>...</think>` giving the reasoning and
    what follows it the label). The others are optional: no `tenant` column puts every example in one
    tenant, no `id` numbers them, no `split` splits each tenant with `data.eval_fraction`, no `labels` takes
    each tenant's gold labels as its label set, no `system` or `reasoning` leaves them empty.
    """

    tenant: str = "tenant"
    id: str = "id"
    split: str = Field(default="split", description="train, eval (or test), validation (or val, dev).")
    system: str = "system"
    user: str = "user"
    labels: str = Field(
        default="labels", description="A list; in CSV a JSON list or labels separated by '|'."
    )
    gold: str = "gold"
    reasoning: str = "reasoning"
    messages: str = "messages"


class DataSpec(_Section):
    """Chat-formatted training data: a local file or folder read with `datasets`, or the built-in tenants."""

    source: str = Field(
        min_length=1,
        description="A .jsonl, .json, .parquet or .csv file, a folder written by `save_to_disk`, or "
        "builtin:tiny-tenants.",
    )
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "arrow"] = Field(
        default="auto", description="auto: from the file's suffix (a folder is `arrow`, save_to_disk's)."
    )
    columns: ColumnsSpec = ColumnsSpec()
    eval_fraction: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.1,
        description="With no split column: the share of each tenant held out for evaluation (seeded by "
        "data.seed).",
    )
    train_examples_per_tenant: PositiveInt = 320
    eval_examples_per_tenant: PositiveInt = 40
    seed: Seed = 0
    examples: NonNegInt = Field(
        default=0,
        description="Training examples, for plans and rehearsals where the data file is not (0: unknown).",
    )
    mean_tokens: NonNegInt = Field(
        default=0,
        description="Mean tokens an example, for plans and rehearsals made where the data file is not.",
    )
    tenants: NonNegInt = Field(
        default=0,
        description="Tenants in the data, for plans and rehearsals made where the data file is not: the "
        "validation sample is `validation.examples_per_tenant` of each (0: unknown, every held-out example).",
    )
    limits: DataLimits = DataLimits()


class ValidationSpec(_Section):
    """Loss on a small held-out sample per tenant during training (no generation), and early stopping."""

    eval_steps: NonNegInt = Field(
        default=50, description="Every N optimizer steps (and at the last); 0: no validation loss."
    )
    examples_per_tenant: PositiveInt = Field(
        default=16,
        description="Held-out examples a tenant: the first ones of its validation split, else of its "
        "eval split.",
    )
    early_stopping_patience: NonNegInt = Field(
        default=0,
        description="Stop after this many validations in a row without improvement; 0: never stop early.",
    )
    early_stopping_min_delta: NonNegFloat = Field(
        default=0.0, description="An improvement is a validation loss lower than the best by more than this."
    )


class EvalSpec(_Section):
    """Held-out evaluation after training."""

    enabled: bool = True
    max_think_tokens: PositiveInt = 64
    bootstrap_samples: PositiveInt = 1000
    base_models: list[str] = Field(default_factory=list, description="Extra base models to score.")


class CostSpec(_Section):
    """Prices for the serving-cost comparison."""

    serving_hour_usd: NonNegFloat = Field(
        default=0.0, description="Hourly price of the machine that serves the tuned model (all its GPUs)."
    )
    api_usd_per_mtok: NonNegFloat = 0.0
    api_name: str = ""


# Accepted by Pydantic's Literal only as a tuple of literals: spelled out, and checked against BACKENDS.
Backend = Literal["pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi"]
assert set(Backend.__args__) == set(BACKENDS)  # type: ignore[attr-defined]


class LauncherSpec(_Section):
    """How DeepSpeed's launcher (`deepspeed.launcher.runner`) starts the ranks: on this host, or on
    `hardware.nodes` hosts of a hostfile, by ssh or on every node without ssh. Passed to it unchanged."""

    hostfile: str = Field(
        default="",
        description="An MPI-style hostfile, `HOST slots=N` a line (relative to the profile); empty: this "
        "host only. Its first host is node 0.",
    )
    include: str = Field(
        default="", description="The runner's --include: NAME[:SLOT[,SLOT...]][@NAME...] of the hostfile."
    )
    exclude: str = Field(default="", description="The runner's --exclude, same syntax; not with include.")
    master_addr: str = Field(
        default="",
        description="Address of node 0 for the rendezvous; needed without ssh (found by ssh otherwise).",
    )
    master_port: Port = Field(
        default=0,
        description="Rendezvous port; 0: a free port on this host (one host, or node 0 without ssh), "
        "29500 when ssh starts node 0 elsewhere.",
    )
    no_ssh: bool = Field(
        default=False,
        description="Start each node's ranks on that node (`cockpit join RUN --node-rank N` on every other "
        "node), instead of from here by ssh.",
    )
    node_rank: Annotated[int, Field(ge=0)] = Field(
        default=0, description="This node's index in the hostfile, with no_ssh (node 0 starts the run)."
    )
    backend: Backend = Field(default="pdsh", description="The runner's --launcher for ssh launches.")
    launcher_args: str = Field(default="", description="The runner's --launcher_args, one string.")
    ssh_port: Port = Field(default=0, description="The runner's --ssh_port; 0: ssh's default.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More runner options, verbatim (e.g. --bind_cores_to_rank, --save_pid).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> LauncherSpec:
        for name in ("include", "exclude"):
            value = getattr(self, name)
            if value and not NODE_SPECS.match(value):
                raise ValueError(f"{name}: expected NAME[:SLOT[,SLOT...]][@NAME...], got {value!r}")
            if value and not self.hostfile:
                raise ValueError(f"{name} needs a hostfile (the hosts it names are the hostfile's)")
        if self.include and self.exclude:
            raise ValueError("include and exclude cannot both be set (the runner takes one)")
        if self.node_rank and not self.no_ssh:
            raise ValueError("node_rank is for launches without ssh (no_ssh = true)")
        if self.no_ssh and self.hostfile and not self.master_addr:
            raise ValueError("no_ssh with a hostfile needs master_addr (node 0's address)")
        problem = extra_args_problem(self.extra_args)
        if problem:
            raise ValueError(f"extra_args: {problem}")
        return self


class Profile(_Section):
    """A whole run profile."""

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Letters, digits, '.', '_' and '-': it becomes part of every run id and directory name.",
    )
    description: str = ""
    model: ModelSpec
    hardware: HardwareSpec = HardwareSpec()
    quantization: QuantizationSpec = QuantizationSpec()
    lora: LoraSpec = LoraSpec()
    deepspeed: DeepSpeedSpec = DeepSpeedSpec()
    training: TrainingSpec = TrainingSpec()
    data: DataSpec
    validation: ValidationSpec = ValidationSpec()
    eval: EvalSpec = EvalSpec()
    cost: CostSpec = CostSpec()
    launcher: LauncherSpec = LauncherSpec()

    @model_validator(mode="after")
    def _node_rank_in_range(self) -> Profile:
        if self.launcher.node_rank >= self.hardware.nodes:
            raise ValueError(
                f"launcher.node_rank: {self.launcher.node_rank} is not a node of hardware.nodes = "
                f"{self.hardware.nodes} (0..{self.hardware.nodes - 1})"
            )
        return self

    @model_validator(mode="after")
    def _nvme_needs_gpu(self) -> Profile:
        if self.hardware.gpus == 0 and "nvme" in (
            self.deepspeed.offload_param,
            self.deepspeed.offload_optimizer,
        ):
            raise ValueError("deepspeed: nvme offload needs a GPU (hardware.gpus > 0)")
        return self

    @model_validator(mode="after")
    def _packed_storage_survives_casts(self) -> Profile:
        q = self.quantization
        if q.load_in_4bit and self.training.bf16 and q.storage_dtype in ("float16", "float32"):
            raise ValueError(
                f"quantization.storage_dtype: {q.storage_dtype} with training.bf16 = true: DeepSpeed "
                "casts float parameters to bf16, which would scramble the packed 4-bit bytes "
                "(use bfloat16 or uint8)"
            )
        if self.lora.target_experts and not q.quantize_experts:
            raise ValueError("lora.target_experts needs quantization.quantize_experts = true")
        return self

    @property
    def ranks_per_node(self) -> int:
        """Training ranks on each node: one a GPU, or one on the CPU."""
        return max(1, self.hardware.gpus)

    @property
    def world_size(self) -> int:
        """Number of training ranks: nodes x ranks a node."""
        return self.hardware.nodes * self.ranks_per_node


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file and field."""


def resolve_profile_path(name_or_path: str) -> Path:
    """Find a profile by path, or by name (with or without `.toml`) in `./profiles/`, then shipped ones."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    for directory in (Path.cwd() / "profiles", PROFILES_DIR):
        for name in (name_or_path, f"{name_or_path}.toml"):
            path = directory / name
            if path.is_file():
                return path
    names = sorted({p.stem for d in (Path.cwd() / "profiles", PROFILES_DIR) for p in d.glob("*.toml")})
    close = difflib.get_close_matches(Path(name_or_path).stem, names, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ProfileError(
        f"{name_or_path}: no such profile file or name ({hint}known: {', '.join(names)}; "
        "`cockpit profiles` lists them with their files)"
    )


def profile_names() -> list[tuple[str, str, Path]]:
    """Every profile a name finds (`./profiles` first, then the shipped ones): name, description, file."""
    found: dict[str, tuple[str, str, Path]] = {}
    for directory in (Path.cwd() / "profiles", PROFILES_DIR):
        for path in sorted(directory.glob("*.toml")):
            if path.stem in found:
                continue
            try:
                description = str(tomllib.loads(read_utf8(path)).get("description", ""))
            except (OSError, tomllib.TOMLDecodeError, NotUtf8):
                description = "(cannot be read as TOML)"
            found[path.stem] = (path.stem, description, path)
    return sorted(found.values())


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names a profile allows at `loc` (a section, or the top level); none if it is no model."""
    model: Any = Profile
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        near = difflib.get_close_matches(str(error["loc"][-1]), _keys_at(error["loc"][:-1]), n=1)
        return f"{loc}: unknown key" + (f" (did you mean {near[0]}?)" if near else "")
    if kind == "missing":
        return f"{loc}: required field is missing"
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" (got {given!r})"
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:  # a whole-profile check: its message names the fields itself
        return f"{message}{shown}"
    return f"{loc}: {message}{shown}"


def parse_profile(data: dict[str, Any], source: str) -> Profile:
    """Validate a profile mapping; `source` names it in errors."""
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(err) for err in exc.errors(include_url=False)]
        if len(lines) == 1:  # one line naming the file and the field
            raise ProfileError(f"{source}: {lines[0]}") from None
        raise ProfileError(f"{source}: invalid profile\n  " + "\n  ".join(lines)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides to a profile mapping (value as a TOML literal, else a string)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ProfileError(f"--set {item!r}: expected section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        *parents, leaf = key.strip().split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ProfileError(f"--set {item!r}: {part} is not a section")
            node = child
        node[leaf] = value
    return data


def load_profile(
    name_or_path: str = DEFAULT_PROFILE, overrides: list[str] | None = None
) -> tuple[Profile, Path]:
    """Read and validate a profile, with optional `section.key=value` overrides; returns it and its file.

    Relative `model.config`, `data.source` and `launcher.hostfile` paths are taken relative to the
    profile's folder when the file gives them, and to the working directory when `--set` does.
    """
    path = resolve_profile_path(name_or_path)
    try:
        data = tomllib.loads(read_utf8(path))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, NotUtf8) as exc:  # a NotUtf8 says where: the line, the column and the byte
        raise ProfileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if overrides:
        data = apply_overrides(data, overrides)
        anchor_set_paths(data, overrides, Path.cwd())
    profile = parse_profile(data, str(path) + (" (with --set overrides)" if overrides else ""))
    return _anchor_paths(profile, path.parent), path


ANCHORED = (("model", "config"), ("data", "source"), ("launcher", "hostfile"))  # relative paths resolved


def _anchored(value: str, base: Path) -> str:
    """A path field's value made absolute against `base` (`~` expanded); empty and built-in ones kept."""
    if not value or value.startswith(BUILTIN_PREFIX):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def anchor_set_paths(data: dict[str, Any], overrides: list[str], cwd: Path) -> None:
    """Paths given on the command line are where the user stands: made absolute against `cwd` (the file's
    own stay relative to the file, `_anchor_paths`)."""
    given = {tuple(item.partition("=")[0].strip().split(".")) for item in overrides}
    for section, key in ANCHORED:
        node = data.get(section)
        if (section, key) in given and isinstance(node, dict) and isinstance(node.get(key), str):
            node[key] = _anchored(node[key], cwd)


def _anchor_paths(profile: Profile, base: Path) -> Profile:
    """The file's relative paths (ANCHORED) made absolute against its folder."""
    update = {}
    for section, key in ANCHORED:
        part = getattr(profile, section)
        update[section] = part.model_copy(update={key: _anchored(getattr(part, key), base)})
    return profile.model_copy(update=update)


WEIGHT_FILES = ("*.safetensors", "*.bin")  # a checkpoint's shards, as Transformers writes them
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_runnable(profile: Profile, source: str) -> None:
    """What a run needs here before it starts: the model (config, weights, tokenizer), the data, and the
    trackers of `training.report_to` able to start. Every missing piece is named, in one line."""
    problems = _model_problems(profile.model.path) + _data_problems(profile.data.source)
    paths = " (set them with --set KEY=PATH)" if problems else ""
    if problems := problems + tracker_problems(profile.training.report_to):
        raise ProfileError(f"{source}: " + "; ".join(problems) + paths)
    check_hosts(profile, source)


def _model_problems(spec: str) -> list[str]:
    if spec.startswith(BUILTIN_PREFIX):
        if spec not in BUILTIN_MODELS:
            return [f"model.path: unknown built-in model {spec!r} (known: {', '.join(BUILTIN_MODELS)})"]
        return []
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        return [f"model.path: no config.json in {spec!r} on this machine"]
    missing = []
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        missing.append("weights (*.safetensors)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json)")
    return [f"model.path: no {' and no '.join(missing)} in {spec!r}"] if missing else []


def _data_problems(data: str) -> list[str]:
    if data.startswith(BUILTIN_PREFIX):
        if data not in BUILTIN_DATA:
            return [f"data.source: unknown built-in data {data!r} (known: {', '.join(BUILTIN_DATA)})"]
        return []
    if not Path(data).expanduser().exists():
        return [f"data.source: no such file or folder {data!r}"]
    return []


def check_hosts(profile: Profile, source: str) -> None:
    """The hosts the launcher will use are the run's plan: `hardware.nodes` of the hostfile's hosts, each
    with a slot for each of its ranks (`ProfileError` naming the field otherwise)."""
    spec = profile.launcher
    if not spec.hostfile:
        if profile.hardware.nodes > 1:
            raise ProfileError(
                f"{source}: hardware.nodes: {profile.hardware.nodes} nodes need launcher.hostfile "
                "(DeepSpeed's launcher finds the other hosts there)"
            )
        return
    try:
        text = read_utf8(Path(spec.hostfile).expanduser())
    except (OSError, NotUtf8) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ProfileError(f"{source}: launcher.hostfile: cannot read {spec.hostfile!r}: {why}") from None
    problem = selection_problem(spec, profile.hardware.nodes, profile.ranks_per_node, text)
    if problem:
        raise ProfileError(f"{source}: {problem} ({spec.hostfile})")


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The resolved profile as plain JSON-able data (for run.json)."""
    return profile.model_dump(mode="json")
