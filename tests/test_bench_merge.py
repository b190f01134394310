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
