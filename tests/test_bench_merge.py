"""benchmarks/experts4bit.py --merge: rows measured now replace an earlier run's, nothing is lost."""

from benchmarks.experts4bit import merge_rows


def row(layers: int, variant: str, offload: str, status: str = "ok", step: float | None = None) -> dict:
    return {"layers": layers, "variant": variant, "offload": offload, "status": status, "median_step_s": step}


def test_merge_keeps_order_replaces_measured_and_appends_new():
    earlier = [
        row(1, "nf4", "cpu", step=0.2),
        row(2, "nf4", "cpu", status="skipped (budget 400 s)"),
        row(4, "nf4", "cpu", step=0.5),
    ]
    new = [
        row(2, "nf4", "cpu", step=0.3),  # fills a skipped row
        row(4, "nf4", "cpu", status="failed (exit 1)"),  # does not overwrite a measurement
        row(2, "bf16", "none", step=0.1),  # a configuration the earlier run never had
    ]
    merged = merge_rows(earlier, new)
    assert [(r["layers"], r["variant"], r["offload"]) for r in merged] == [
        (1, "nf4", "cpu"),
        (2, "nf4", "cpu"),
        (4, "nf4", "cpu"),
        (2, "bf16", "none"),
    ]
    assert [r["median_step_s"] for r in merged] == [0.2, 0.3, 0.5, 0.1]
    assert all(r["status"] == "ok" for r in merged)


def test_rehearsal_results_are_rated_at_the_micro_batch_they_ran():
    """benchmarks/rehearsal_accuracy.py: a result keeps the overrides its depths ran with, and one written
    before it kept them is taken at the story profile's micro-batch of then (4 rows, 2 a step), not at
    the profile's of now; the note names each."""
    from benchmarks import rehearsal_accuracy as ra
    from cockpit.profiles import load_profile

    story = "qwen3-235b-a22b-thinking-4xh100"
    now = load_profile(story)[0].training
    kept = ra.config_overrides("nf4-offload", gpu=True)
    assert ra.ran_with({"overrides": kept}, "nf4-offload", gpu=True) == kept
    earlier = ra.ran_with({"measures": []}, "nf4-offload", gpu=True)
    assert earlier[: len(kept)] == kept
    then = load_profile(story, earlier)[0].training
    assert (then.micro_batch_size, then.grad_accum) == (4, 2) != (now.micro_batch_size, now.grad_accum)
    words = ra.accumulation(story, earlier)
    assert words.startswith("4 rows a micro-batch, gradient accumulation 2 (the profile's: ")
    assert ra.accumulation(story, kept).endswith("(the profile's own)")
