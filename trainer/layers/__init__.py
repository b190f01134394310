"""The model's own modules as the trainer runs them: attention over packed documents (FlashAttention-4 or
torch's), RoPE, the norms, routing, the NF4 experts and their frozen products, the lean LoRA forward and
the loss. Each is a drop-in for a Transformers module or forward, installed by `trainer.model`."""
