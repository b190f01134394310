"""Label scoring before and after the shared prefix, on the story's slices (GPU), with the scores compared.

Evaluation scores every label of an example after the example's prompt and thinking. Before, each label
was a row of its own: the prefix went through the model once a label, rows packed to `SCORE_TOKENS`
tokens a forward, every position's logits kept (`row_logprobs` here, as evaluation ran it).
Now an example is one row, its prefix once and its labels behind it under a 4-D mask, and only the
scored positions reach the head (`trainer.evaluation.scoring.score_ids`). Both score the same random examples
here: `--examples` prefixes of `--prefix` tokens (the story's 1,000-token prompt and 512 thinking tokens),
each with `--labels` labels of `LABEL_TOKENS` tokens.

The slice is loaded once at the deepest depth, as evaluation loads it (random weights, NF4), and each
shallower depth runs the first layers of it. Per depth and path: forwards, tokens, the median of 3 timed
calls after a warm-up, and the GPU's allocated peak over the call; then the slope over the depths (a
layer's seconds) and the line read at the full model's depth (out of sample: a line over slices). The
scores of the two paths are compared: the largest difference, and whether every example picks the same
label.

    python benchmarks/scoring_speed.py --out $OUT             # one GPU: the story, 2, 8, 16 layers
    python benchmarks/scoring_speed.py --tiny --out /tmp/ss   # the CPU smoke test: tiny-cpu, 1 and 2

Writes scoring_speed_<gpu>.md and .json under --out (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"


def log(text: str) -> None:
    print(text, flush=True)


def row_logprobs(model: Any, rows: list[list[int]], pad: int) -> list[Any]:
    """Each row's next-token log-probabilities of its own tokens, one right-padded forward with every
    position's logits: evaluation's scoring before the shared prefix, kept here to measure it."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=model.device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=model.device)
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return [picked[i, : len(r) - 1] for i, r in enumerate(rows)]


def one_row_a_label(
    model: Any, prefixes: list[list[int]], tails: list[list[list[int]]], per: int | None = None
) -> list[list[float]]:
    """The scoring evaluation ran before the shared prefix: a row a label, `SCORE_TOKENS` tokens a
    forward (or `per` rows), every position's logits."""
    from cockpit.contract import SCORE_TOKENS

    jobs = [(n, len(p), [*p, *t]) for n, (p, ts) in enumerate(zip(prefixes, tails, strict=True)) for t in ts]
    width = max(len(j[2]) for j in jobs)
    per = per or max(1, SCORE_TOKENS // width)
    scores: list[list[float]] = [[] for _ in prefixes]
    for start in range(0, len(jobs), per):
        chunk = jobs[start : start + per]
        for (n, plen, _), lp in zip(chunk, row_logprobs(model, [j[2] for j in chunk], 0), strict=True):
            scores[n].append(lp[plen - 1 :].sum().item())
    return scores


def measure(torch: Any, fn: Any, repeats: int = 3) -> tuple[float, float, Any]:
    """Median seconds of `fn()` after a warm-up, the GPU's allocated peak above its start (GiB), and
    what `fn` returned."""
    cuda = torch.cuda.is_available()
    result = fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else 0.0
    return statistics.median(times), peak, result


def slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line (per layer, fixed) through (depth, seconds)."""
    n = len(points)
    mx = sum(d for d, _ in points) / n
    my = sum(s for _, s in points) / n
    sxx = sum((d - mx) ** 2 for d, _ in points)
    per = sum((d - mx) * (s - my) for d, s in points) / sxx if sxx else 0.0
    return per, my - per * mx


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    from cockpit.contract import LABEL_TOKENS, SCORE_TOKENS
    from cockpit.profiles import load_profile
    from trainer.evaluation import scoring
    from trainer.evaluation.scoring import chunks, score_ids, shares_prefix
    from trainer.model import load_base

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from eval_placement import model_dir_of

    profile, _ = load_profile(args.profile)
    model_dir, _ = model_dir_of(profile)
    full = int(transformers.AutoConfig.from_pretrained(model_dir).get_text_config().num_hidden_layers)
    deepest = max(args.depths)
    t0 = time.perf_counter()
    model = load_base(profile, model_dir, spread=True, random_layers=deepest)
    model.eval()
    attention = model.config._attn_implementation
    log(f"loaded {deepest} layers in {time.perf_counter() - t0:.0f} s; attention {attention}")
    if not shares_prefix(model):
        raise SystemExit(f"attention {attention}: scoring would take a row a label")
    config = model.config
    g = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    prefixes = [torch.randint(1, vocab, (args.prefix,), generator=g).tolist() for _ in range(args.examples)]
    tails = [
        [torch.randint(1, vocab, (LABEL_TOKENS,), generator=g).tolist() for _ in range(args.labels)]
        for _ in range(args.examples)
    ]
    before_tokens = args.examples * args.labels * (args.prefix + LABEL_TOKENS)
    after_tokens = args.examples * (args.prefix + args.labels * LABEL_TOKENS)
    before_per = max(1, SCORE_TOKENS // (args.prefix + LABEL_TOKENS))
    shared_forwards = chunks([args.prefix + args.labels * LABEL_TOKENS] * args.examples,
                             [1 + args.labels * LABEL_TOKENS] * args.examples)  # fmt: skip
    rows, worst, agree = [], 0.0, 1.0
    for depth in sorted(args.depths):
        config.num_hidden_layers = depth
        with torch.no_grad():
            b_s, b_peak, b = measure(torch, lambda: one_row_a_label(model, prefixes, tails))
            a_s, a_peak, a = measure(torch, lambda: score_ids(model, prefixes, tails, 0))
        if scoring.path() != "shared prefix":
            raise SystemExit(f"scoring took {scoring.path()}: the shared prefix was not what was timed")
        diff = max(abs(x - y) for bs, as_ in zip(b, a, strict=True) for x, y in zip(bs, as_, strict=True))
        same = sum(max(range(len(bs)), key=bs.__getitem__) == max(range(len(as_)), key=as_.__getitem__)
                   for bs, as_ in zip(b, a, strict=True)) / len(b)  # fmt: skip
        worst, agree = max(worst, diff), min(agree, same)
        for path, secs, peak, tokens, forwards in (
            (
                "a row a label (before)",
                b_s,
                b_peak,
                before_tokens,
                -(-args.examples * args.labels // before_per),
            ),
            ("shared prefix (now)", a_s, a_peak, after_tokens, len(shared_forwards)),
        ):
            rows.append({"layers": depth, "path": path, "forwards": forwards, "tokens": tokens,
                         "seconds": round(secs, 4), "peak_gib": round(peak, 2)})  # fmt: skip
        log(f"{depth} layers: before {b_s:.3f} s ({b_peak:.1f} GiB), now {a_s:.3f} s ({a_peak:.1f} GiB), "
            f"{b_s / a_s:.2f}x; scores differ by {diff:.3g} at most, same label {same:.0%}")  # fmt: skip
    # The path before against itself: the same rows, an example's labels a forward instead of 21 examples'
    # (other GEMM shapes, so other bf16 roundings), at the deepest depth.
    with torch.no_grad():
        alone = one_row_a_label(model, prefixes, tails, per=args.labels)
    floor = max(abs(x - y) for bs, cs in zip(b, alone, strict=True) for x, y in zip(bs, cs, strict=True))
    log(f"the path before against itself, {args.labels} rows a forward: {floor:.3g} at most")
    lines = {}
    for path in ("a row a label (before)", "shared prefix (now)"):
        per, fixed = slope([(r["layers"], r["seconds"]) for r in rows if r["path"] == path])
        lines[path] = {"per_layer_s": per, "fixed_s": fixed, "at_full_s": fixed + per * full}
    return {
        "profile": args.profile,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "examples": args.examples,
        "prefix_tokens": args.prefix,
        "labels": args.labels,
        "label_tokens": LABEL_TOKENS,
        "full_layers": full,
        "rows": rows,
        "lines": lines,
        "max_abs_diff": worst,
        "max_abs_diff_before_alone": floor,
        "same_label": agree,
        "command": " ".join(["python benchmarks/scoring_speed.py", *_shown_args()]),
    }


def _shown_args() -> list[str]:
    """This run's arguments as a command to reproduce it: `--out DIR` left out (a machine's own path)."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--out="):
            skip = False
            continue
        if arg == "--out":
            skip = True
            continue
        args.append(arg)
    return args


def render(result: dict[str, Any]) -> str:
    """The results as Markdown: the table, the lines over depth, the numerics."""
    r = result
    out = [
        f"# Label scoring before and after the shared prefix ({r['device']})",
        "",
        f"{r['examples']} examples, each a prefix of {r['prefix_tokens']:,} tokens (prompt and thinking) and "
        f"{r['labels']} labels of {r['label_tokens']} tokens; {r['profile']}, random weights loaded as "
        "evaluation loads them. Median of 3 calls after a warm-up; peak: the GPU's allocated peak above "
        "the loaded model.",
        "",
        f"Reproduce: `{r['command']}`",
        "",
        "| layers | path | forwards | tokens | seconds | peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        out.append(f"| {row['layers']} | {row['path']} | {row['forwards']} | {row['tokens']:,} | "
                   f"{row['seconds']:.4f} | {row['peak_gib']:.2f} |")  # fmt: skip
    out += [
        "",
        f"A line over the depths, read at the full model's {r['full_layers']} layers (out of sample):",
        "",
    ]
    out += ["| path | s a layer | fixed s | at full depth s |", "|---|---|---|---|"]
    for path, line in r["lines"].items():
        out.append(
            f"| {path} | {line['per_layer_s']:.5f} | {line['fixed_s']:.4f} | {line['at_full_s']:.2f} |"
        )
    before, now = (line["at_full_s"] for line in r["lines"].values())
    deepest = max(row["layers"] for row in r["rows"])
    out += [
        "",
        f"At full depth: {before / now:.2f}x faster for these {r['examples']} examples.",
        "",
        f"Scores: the two paths differ by {r['max_abs_diff']:.3g} at most (sums of log-probabilities, "
        "in the model's compute dtype); "
        f"the same label picked for {r['same_label']:.0%} of the examples at every depth. Beside it, the "
        f"path before against itself with an example's {r['labels']} rows a forward instead of "
        f"{r['examples']} examples' (other matmul shapes, other roundings), at {deepest} layers: "
        f"{r['max_abs_diff_before_alone']:.3g} at most. Random weights make the labels' scores close, "
        "so a small difference can change which is highest.",
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=STORY, help=f"a profile name or file (default: {STORY})")
    parser.add_argument("--depths", default="2,8,16", help="slice depths, comma-separated (default: 2,8,16)")
    parser.add_argument("--examples", type=int, default=21, help="examples scored (default: 21, a forward's)")
    parser.add_argument("--prefix", type=int, default=1512, help="prefix tokens (default: 1,000 + 512)")
    parser.add_argument("--labels", type=int, default=4, help="labels an example (default: 4)")
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke test: tiny-cpu at 1 and 2 layers")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if args.tiny:
        args.profile, args.depths, args.examples, args.prefix = "tiny-cpu", "1,2", 6, 48
    try:
        args.depths = sorted({int(d) for d in args.depths.split(",")})
    except ValueError:
        parser.error(f"--depths {args.depths!r}: comma-separated layer counts")
    if len(args.depths) < 2 or min(args.depths) < 1 or min(args.examples, args.prefix, args.labels) < 1:
        parser.error("at least two depths of 1 layer or more, and examples, prefix and labels of 1 or more")
    result = run(args)
    text = render(result)
    print(text)
    from benchmarks.cards import card_tag

    gpu = card_tag(result["device"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"scoring_speed_{gpu}.md").write_text(text)
    (args.out / f"scoring_speed_{gpu}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
