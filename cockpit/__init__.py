"""cockpit: plan, launch, watch and report QLoRA fine-tuning runs of large MoE models."""

__version__ = "0.1.0"
