"""Evaluation in the trainer's process: scoring the label set, thinking by greedy decoding, validation
during training, the best adapter, and the timings a rehearsal and the serving figures read."""
