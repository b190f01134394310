"""What tokenizing the user's data costs on the CPU: 3,600 examples of about 2,000 tokens, once, and again
from `Dataset.map`'s cache file (what the other ranks, and the next run on the same data, do).

The examples are the tiny tenants' with long documents (more filler sentences around the marked entity)
and longer reasoning, written as JSON Lines; tokens are the tiny model's tokenizer's (a byte-level BPE of
1,024 tokens, trained locally: nothing is downloaded), through its chat template, as the trainer tokenizes
them. Timed, each on a fresh cache folder, then again on the warm one:

- read: `cockpit.data.load_examples` (`datasets` reads the file into Arrow, the rows are mapped and checked);
- tokenize: `trainer.inputs.data.tokenize_examples` over the train split (`Dataset.map`, batched, into
  its cache file), then the same call reading that file;
- whole: `trainer.inputs.data.prepare_data`, read + check + tokenize, as the trainer's main process runs it.

    python benchmarks/tokenize_cost.py                 # 3,600 examples of about 2,000 tokens
    python benchmarks/tokenize_cost.py --examples 360  # a quick look

Writes tokenize_cost.md and .json under $OUT (else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEQ_LEN = 4096  # the story's: nothing is cut
TARGET_TOKENS = 2000


def long_examples(count: int, fillers: int, seed: int = 0) -> list[dict]:
    """Tiny-tenant examples whose documents carry `fillers` more sentences and whose reasoning is longer."""
    from cockpit.data.tenants import TENANTS, generate

    per_tenant = -(-count // len(TENANTS))
    rng = random.Random(seed)
    by_name = {t.name: t for t in TENANTS}
    examples = []
    for e in generate(seed, per_tenant, 0)[:count]:
        tenant = by_name[e["tenant"]]
        head, _, question = e["user"].partition("\n\n")
        extra = " ".join(f"Item {rng.randint(1, 9999)}: {rng.choice(tenant.fillers)}" for _ in range(fillers))
        reasoning = (
            e["reasoning"]
            + " "
            + " ".join(f"Step {i + 1}: the cue and the word ending agree." for i in range(fillers // 4))
        )
        examples.append({**e, "user": f"{head}\n{extra}\n\n{question}", "reasoning": reasoning})
    split = max(1, count // 10)  # the last tenth held out, as a data set would
    for e in examples[-split:]:
        e["split"] = "eval"
    return examples


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=3600)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from cockpit.data import load_examples
    from cockpit.data.builtin import build_tokenizer
    from cockpit.data.chat import token_lengths
    from cockpit.profiles import DataSpec
    from trainer.inputs.data import prepare_data, tokenize_examples

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_tokenizer(work / "tokenizer", 0, 1024)
        tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")

        # Calibrate the filler count on a sample, so that the mean example is about TARGET_TOKENS long.
        def mean_tokens(fillers: int) -> float:
            return statistics.fmean(map(sum, token_lengths(tokenizer, long_examples(50, fillers))))

        base = mean_tokens(0)
        per_filler = (mean_tokens(100) - base) / 100
        fillers = max(0, round((TARGET_TOKENS - base) / per_filler))
        examples = long_examples(args.examples, fillers)
        path = work / "long.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
        spec = DataSpec(source=str(path))

        cold, warm = work / "cold", work / "warm"
        data, read_cold = timed(lambda: load_examples(path, spec, cache_dir=cold))
        _, read_warm = timed(lambda: load_examples(path, spec, cache_dir=cold))
        train = data.split("train")
        built = tokenize_examples(tokenizer, train, SEQ_LEN, cold)
        again = tokenize_examples(tokenizer, train, SEQ_LEN, cold)
        assert not built.reused and again.reused and again.rows == built.rows
        whole_cold = timed(lambda: prepare_data(tokenizer, path, spec, SEQ_LEN, 0, warm))[1]
        whole_warm = timed(lambda: prepare_data(tokenizer, path, spec, SEQ_LEN, 0, warm))[1]
        tokens = [len(r["input_ids"]) for r in built.rows]
        cache_mib = built.cache_file.stat().st_size / 2**20 if built.cache_file else 0.0
        file_mib = path.stat().st_size / 2**20

    result = {
        "examples": len(examples),
        "train_examples": len(train),
        "mean_tokens": round(statistics.fmean(tokens), 1),
        "min_tokens": min(tokens),
        "max_tokens": max(tokens),
        "train_tokens": sum(tokens),
        "file_mib": round(file_mib, 1),
        "tokenizer": "tiny-qwen3-moe byte-level BPE, 1,024 tokens, chat template",
        "seconds": {
            "read_cold": round(read_cold, 2),
            "read_warm": round(read_warm, 2),
            "tokenize_once": round(built.seconds, 2),
            "tokenize_from_cache": round(again.seconds, 2),
            "read_and_tokenize_cold": round(whole_cold, 2),
            "read_and_tokenize_warm": round(whole_warm, 2),
        },
        "tokens_per_s_once": round(sum(tokens) / built.seconds),
        "cache_file_mib": round(cache_mib, 1),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    s = result["seconds"]
    rows = [
        ("read and check (datasets -> Arrow, cold)", s["read_cold"]),
        ("read and check again (Arrow cached)", s["read_warm"]),
        ("tokenize, once (Dataset.map into its cache file)", s["tokenize_once"]),
        ("tokenize again, from the cache file", s["tokenize_from_cache"]),
        ("read + check + tokenize, cold (the main process)", s["read_and_tokenize_cold"]),
        ("read + check + tokenize, warm (the other ranks)", s["read_and_tokenize_warm"]),
    ]
    lines = [
        "# Tokenization cost on the CPU",
        "",
        f"{result['examples']:,} examples ({result['train_examples']:,} in the train split, a "
        f"{result['file_mib']:.0f} MiB JSON Lines file) of {result['mean_tokens']:,.0f} tokens on average "
        f"({result['min_tokens']:,}–{result['max_tokens']:,}), {result['train_tokens']:,} training tokens; "
        f"{result['tokenizer']}; {result['cpus']} CPU cores.",
        "",
        "| step | seconds |",
        "|---|---|",
        *(f"| {name} | {sec:.2f} |" for name, sec in rows),
        "",
        f"Tokenizing once: {result['tokens_per_s_once']:,} tokens/s; the cache file is "
        f"{result['cache_file_mib']:.1f} MiB.",
        f"`python benchmarks/tokenize_cost.py --examples {args.examples}`",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    dest = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenize_cost.md").write_text(text, encoding="utf-8")
    (dest / "tokenize_cost.json").write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
