"""The profile's schema: every section as a pydantic model, each field with its type, bounds, default and
description (`docs/profiles.md` is generated from them), and the checks across fields. Reading a file into
a `Profile` is `cockpit.profiles.load`'s job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cockpit.launcher import BACKENDS, NODE_SPECS, extra_args_problem
from cockpit.limits import DataLimits
from cockpit.trackers import Trackers

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
    # A field's description is its own, or the docstring under it (as posting's config sections do).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)


class ModelSpec(_Section):
    """The base model: a local directory with `config.json` and weights, or `builtin:tiny-qwen3-moe`."""

    path: str = Field(min_length=1, description="Local model directory, or builtin:tiny-qwen3-moe.")
    config: str = Field(
        default="",
        description="A config.json to plan from when the weights are elsewhere (relative to the profile).",
    )
    name: str = Field(default="", description="Human name shown in the app and reports.")
    trust_remote_code: bool = False
    """Run the model repository's own Python code (transformers' trust_remote_code): only where needed."""
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
    """The GPU model the plan is for (e.g. "H100-80GB"); empty: this machine's, where it has GPUs."""
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
    disk_gbps: Annotated[float, Field(gt=0, le=1000)] = Field(
        default=2.0,
        description="Read rate in GB/s of the disk holding the checkpoint and the NF4 cache on the machines "
        "planned for: the plan and the rehearsal's forecast time the load's reads at it (2: assumed; the "
        "H200 host read the story slice's cache at 1.8).",
    )


class QuantizationSpec(_Section):
    """bitsandbytes 4-bit loading of the frozen base weights."""

    load_in_4bit: bool = True
    """Load the frozen base weights in 4 bit with bitsandbytes (QLoRA); false keeps them in 16 bit."""
    quant_type: Literal["nf4", "fp4"] = "nf4"
    """The 4-bit data type: nf4 (normal float, QLoRA's) or fp4."""
    double_quant: bool = True
    """Quantize the 4-bit blocks' scales too (8-bit, in blocks of 256): about 0.4 bit a weight less."""
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """The dtype 4-bit weights are dequantized to for each matrix product."""
    storage_dtype: Literal["uint8", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16",
        description="Dtype the packed 4-bit data is stored in; ZeRO-3 partitions float storage.",
    )
    quantize_experts: bool = Field(
        default=False,
        description="Quantize fused MoE expert tensors too (bitsandbytes only replaces nn.Linear).",
    )
    cache: bool = Field(
        default=True,
        description="Keep the quantized model on disk after the layer-by-layer loader's first load of a "
        "checkpoint ($COCKPIT_CACHE/nf4, about a quarter of the checkpoint's bytes) and load from it next "
        "time: no checkpoint read, no quantization. Keyed by the checkpoint's fingerprint and these "
        "settings; a stale or foreign cache is refused with its reason. `cockpit ls --caches` lists the "
        "caches, `cockpit doctor --clear-cache` removes them. Random-weight rehearsals never use it.",
    )


class LoraSpec(_Section):
    """PEFT LoRA adapters on the frozen quantized model."""

    r: PositiveInt = 16
    """LoRA rank: the inner width of each adapter (vLLM serves ranks up to its --max-lora-rank)."""
    alpha: PositiveFloat = 32.0
    """LoRA scaling numerator: the adapter's update is scaled by alpha / r."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the adapters' input, in training only."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="The linear layers that get an adapter, by name (the attention projections by default: "
        "what vLLM serves with --enable-lora on Qwen3-MoE).",
    )
    target_experts: bool = Field(
        default=False,
        description="Also train LoRA on every MoE expert (needs quantization.quantize_experts).",
    )


class DeepSpeedSpec(_Section):
    """DeepSpeed ZeRO stage and where parameters and optimizer state live."""

    stage: Literal[0, 1, 2, 3] = 3
    """DeepSpeed ZeRO stage: 3 partitions parameters, gradients and optimizer state over the ranks."""
    offload_param: Literal["none", "cpu", "nvme"] = "cpu"
    """Where ZeRO-3 keeps the parameters between uses: the GPU (none), pinned host memory (cpu), NVMe."""
    offload_optimizer: Literal["none", "cpu", "nvme"] = "cpu"
    """Where the optimizer state lives and steps: the GPU (none), the CPU (DeepSpeed's CPU Adam), NVMe."""
    nvme_path: str = ""
    """A folder on a fast local disk for NVMe offload (needed with offload "nvme")."""
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
    """Tokens in a row: longer examples are cut, shorter ones packed together (training.packing)."""
    micro_batch_size: PositiveInt = 1
    """Rows a rank computes at once (a micro-batch)."""
    grad_accum: PositiveInt = 1
    """Micro-batches a rank accumulates before each optimizer step."""
    learning_rate: PositiveFloat = 2e-4
    """The adapters' peak learning rate (AdamW)."""
    weight_decay: NonNegFloat = 0.0
    """AdamW's weight decay on the adapters."""
    warmup_ratio: Fraction = 0.03
    """The share of the steps over which the learning rate rises from 0 to its peak."""
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    """How the learning rate falls after the warm-up (the HF Trainer's schedulers)."""
    epochs: PositiveFloat = 1.0
    """Passes over the training data (a fraction is allowed); training.max_steps overrides it."""
    max_steps: int = Field(default=-1, ge=-1, description="-1: run `epochs` epochs.")
    max_grad_norm: PositiveFloat = 1.0
    """Gradients are clipped to this global norm before each step."""
    gradient_checkpointing: bool = True
    """Keep each layer's input only, recompute the rest in the backward: far less memory, one more forward."""
    keep_dequantized_experts: bool = True
    """With checkpointing, on a GPU: NF4 experts' 16-bit weights kept from a layer's recompute for its
    backward, one dequantization fewer (2 ms a layer, story step on an H100) for 4.5 GiB (story layer)."""
    bf16: bool = True
    """Train in bfloat16 mixed precision (needs a GPU; the tiny CPU profile sets false)."""
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
        description="varlen: causal attention within each packed example, nothing computed across "
        "examples (on a GPU one varlen_attn call a micro-batch, else SDPA one example at a time); "
        "otherwise a Transformers attention implementation.",
    )
    save_steps: NonNegInt = Field(
        default=0, description="Checkpoint every N optimizer steps; 0 = only at the end."
    )
    save_total_limit: PositiveInt = 2
    """Checkpoints kept on disk; older ones are removed as new ones are saved."""
    seed: Seed = 0
    """Seeds the data order and the adapters' first weights: two runs of one profile train alike."""
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
    """The column naming each example's tenant (its label set)."""
    id: str = "id"
    """The column with each example's id."""
    split: str = Field(default="split", description="train, eval (or test), validation (or val, dev).")
    system: str = "system"
    """The column with the system prompt."""
    user: str = "user"
    """The column with the text to classify (the user turn)."""
    labels: str = Field(
        default="labels", description="A list; in CSV a JSON list or labels separated by '|'."
    )
    gold: str = "gold"
    """The column with the correct label."""
    reasoning: str = "reasoning"
    """The column with the reasoning trace the answer follows."""
    messages: str = "messages"
    """The column with a whole chat, in place of system, user, reasoning and gold."""


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
    """For builtin:tiny-tenants: training examples generated for each tenant."""
    eval_examples_per_tenant: PositiveInt = 40
    """For builtin:tiny-tenants: held-out examples generated for each tenant."""
    seed: Seed = 0
    """Seeds the split of each tenant (no split column) and the generated tenants."""
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
    """Evaluate the base and the tuned model on the held-out split after training."""
    max_think_tokens: PositiveInt = 64
    """Tokens of thinking each model may generate before its label is scored."""
    bootstrap_samples: PositiveInt = 1000
    """Paired bootstrap resamples for the F1 confidence intervals."""
    base_models: list[str] = Field(default_factory=list, description="Extra base models to score.")
    examples: NonNegInt = 0
    """Score a stratified sample of this many held-out examples (each tenant its share, at least one), drawn
    with `data.seed`; 0: all of them. `cockpit eval --examples N` overrides it."""
    time_budget_s: NonNegFloat = 0.0
    """Seconds of scoring the evaluation may take, split evenly over the systems: the first system scored
    stops after the batch that uses up its share, and every later system scores the same examples (model
    loads not counted); 0: no budget. `cockpit eval --time-budget 20m` overrides it."""


class CostSpec(_Section):
    """Prices for the serving-cost comparison."""

    serving_hour_usd: NonNegFloat = Field(
        default=0.0, description="Hourly price of the machine that serves the tuned model (all its GPUs)."
    )
    api_usd_per_mtok: NonNegFloat = 0.0
    """The API's price per million tokens that the tuned model would replace (0: not compared)."""
    api_name: str = ""
    """The API's name, shown beside its price."""


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
    """One line on what the profile is for, shown by `cockpit profiles`."""
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


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The resolved profile as plain JSON-able data (for run.json)."""
    return profile.model_dump(mode="json")
