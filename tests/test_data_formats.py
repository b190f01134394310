"""One data set, every format: JSONL, JSON, Parquet, CSV and a save_to_disk folder give the same examples,
the same tokens and the same first batch; column mapping, chat messages and the seeded split.

The end-to-end tiny run (tests/test_e2e_tiny.py) trains on the JSONL and checks that the other formats
give its very rows; here each format is checked up to the first batch, on a smaller set.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from cockpit.data.examples import load_examples, validation_sample
from cockpit.data.tenants import generate
from cockpit.profiles import DataSpec
from trainer.inputs.data import prepare_data, rows_fingerprint, tokenize_example, tokenize_examples
from trainer.inputs.packing import PackedCollator, pack_rows

SEQ_LEN = 192
FORMATS = ("jsonl", "json", "parquet", "csv", "arrow", "arrow-dict")


def write_formats(examples: list[dict], folder: Path) -> dict[str, Path]:
    """The same examples as every format the cockpit reads (labels in CSV as a JSON list)."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "jsonl": folder / "tenants.jsonl",
        "json": folder / "tenants.json",
        "parquet": folder / "tenants.parquet",
        "csv": folder / "tenants.csv",
        "arrow": folder / "tenants-saved",
        "arrow-dict": folder / "tenants-saved-splits",
    }
    paths["jsonl"].write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
    paths["json"].write_text(json.dumps(examples, indent=1), encoding="utf-8")
    table = datasets.Dataset.from_list(examples)
    table.to_parquet(str(paths["parquet"]))
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(examples[0]))
        writer.writeheader()
        writer.writerows({**e, "labels": json.dumps(e["labels"])} for e in examples)
    table.save_to_disk(str(paths["arrow"]))
    # A DatasetDict: the split is the dict's key, not a column (rows keep their order within a split).
    by_split = {s: [{k: v for k, v in e.items() if k != "split"} for e in examples if e["split"] == s]
                for s in ("train", "eval")}  # fmt: skip
    datasets.DatasetDict({s: datasets.Dataset.from_list(rows) for s, rows in by_split.items()}).save_to_disk(
        str(paths["arrow-dict"])
    )
    return paths


@pytest.fixture(scope="module")
def examples() -> list[dict]:
    return generate(0, 24, 6)


@pytest.fixture(scope="module")
def files(examples: list[dict], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_formats(examples, tmp_path_factory.mktemp("formats"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model's tokenizer (trained locally in about a second), chat template included."""
    from transformers import AutoTokenizer

    from cockpit.data.builtin import build_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(folder, 0, 1024)
    return AutoTokenizer.from_pretrained(folder)


def spec(**fields) -> DataSpec:
    return DataSpec(source="-", **fields)


def test_every_format_reads_the_same_examples(files: dict[str, Path], examples: list[dict], tmp_path) -> None:
    read = {fmt: load_examples(path, spec(), cache_dir=tmp_path) for fmt, path in files.items()}
    assert {fmt: ds.format for fmt, ds in read.items()} == {
        "jsonl": "jsonl", "json": "json", "parquet": "parquet", "csv": "csv", "arrow": "arrow",
        "arrow-dict": "arrow",
    }  # fmt: skip
    assert read["jsonl"].examples == examples
    saved_splits = read.pop("arrow-dict")  # a DatasetDict folder holds its splits one after the other
    assert len({ds.fingerprint() for ds in read.values()}) == 1
    for split in ("train", "eval"):
        assert saved_splits.split(split) == read["jsonl"].split(split)
    assert all(ds.problems == [] for ds in [*read.values(), saved_splits])


def test_every_format_gives_the_same_first_batch(files: dict[str, Path], tokenizer, tmp_path) -> None:
    """The same rows in the same order: the first batch (and so the first step's loss) is the same."""
    batches, hashes = {}, {}
    for fmt, path in files.items():
        prepared = prepare_data(tokenizer, path, spec(), SEQ_LEN, 4, tmp_path / "cache")
        rows = pack_rows(prepared.train.rows, SEQ_LEN, seed=0)
        hashes[fmt] = rows_fingerprint(rows)
        batches[fmt] = PackedCollator(tokenizer.pad_token_id, doc_lens=True)(rows[:16])
    first = batches["jsonl"]
    assert first["input_ids"].shape[0] == 16 and (first["labels"] != -100).any()
    for fmt, batch in batches.items():
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(batch[key], first[key]), (fmt, key)
        assert batch["doc_lens"] == first["doc_lens"], fmt
    assert len(set(hashes.values())) == 1


def test_tokenization_goes_through_the_map_cache(examples: list[dict], tokenizer, tmp_path) -> None:
    """The first call tokenizes into a cache file; the next (another rank, the next run) reads it."""
    train = [e for e in examples if e["split"] == "train"]
    built = tokenize_examples(tokenizer, train, SEQ_LEN, tmp_path)
    again = tokenize_examples(tokenizer, train, SEQ_LEN, tmp_path)
    assert not built.reused and again.reused and again.cache_file == built.cache_file
    assert built.cache_file is not None and built.cache_file.is_file()
    assert again.rows == built.rows
    for example, row in zip(train, built.rows, strict=True):  # batched map == one example at a time
        one = tokenize_example(tokenizer, example, SEQ_LEN)
        assert (row["input_ids"], row["labels"]) == (one.input_ids, one.labels)
    shorter = tokenize_examples(tokenizer, train, 64, tmp_path)  # another seq_len: another cache entry
    assert not shorter.reused and shorter.over_seq_len > 0


def test_columns_are_mapped_by_the_profile(examples: list[dict], tmp_path: Path) -> None:
    renamed = {"tenant": "customer", "user": "prompt", "gold": "answer", "labels": "classes"}
    rows = [{renamed.get(k, k): v for k, v in e.items()} for e in examples]
    path = tmp_path / "renamed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mapped = load_examples(path, spec(columns=renamed), cache_dir=tmp_path)
    assert mapped.examples == examples


def test_a_messages_column_gives_system_user_reasoning_and_gold(examples: list[dict], tmp_path: Path) -> None:
    def chat(e: dict, sharegpt: bool) -> list[dict]:
        turns = [("system", e["system"]), ("user", e["user"]),
                 ("assistant", f"<think>\n{e['reasoning']}\n</think>\n\n{e['gold']}")]  # fmt: skip
        if sharegpt:
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            return [{"from": names[r], "value": c} for r, c in turns]
        return [{"role": r, "content": c} for r, c in turns]

    for sharegpt in (False, True):
        rows = [{k: e[k] for k in ("tenant", "id", "split", "labels")} | {"messages": chat(e, sharegpt)}
                for e in examples]  # fmt: skip
        path = tmp_path / f"chat-{sharegpt}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert load_examples(path, spec(), cache_dir=tmp_path).examples == examples


def test_no_split_column_splits_each_tenant_seeded(examples: list[dict], tmp_path: Path) -> None:
    rows = [{k: v for k, v in e.items() if k not in ("split", "labels", "id")} for e in examples]
    path = tmp_path / "nosplit.parquet"
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    a = load_examples(path, spec(eval_fraction=0.25, seed=3), cache_dir=tmp_path)
    b = load_examples(path, spec(eval_fraction=0.25, seed=3), cache_dir=tmp_path)
    c = load_examples(path, spec(eval_fraction=0.25, seed=4), cache_dir=tmp_path)
    assert "seeded per-tenant split" in a.split_from
    assert [e["split"] for e in a.examples] == [e["split"] for e in b.examples]
    assert [e["split"] for e in a.examples] != [e["split"] for e in c.examples]
    per_tenant = len(examples) // 5
    for tenant in {e["tenant"] for e in examples}:
        held = [e for e in a.split("eval") if e["tenant"] == tenant]
        assert len(held) == round(per_tenant * 0.25)
    # No labels column: each tenant's label set is the gold labels it has; no id column: one from the row.
    golds = {e["gold"] for e in a.examples if e["tenant"] == "helix"}
    assert all(sorted(golds) == e["labels"] for e in a.examples if e["tenant"] == "helix")
    assert a.examples[0]["id"] == "row-1"


def test_the_validation_sample_is_the_first_of_each_tenant(examples: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "v.jsonl"
    marked = [dict(e, split="validation") if e["split"] == "eval" and e["id"].endswith("00000") else e
              for e in examples]  # fmt: skip
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    ds = load_examples(path, spec(), cache_dir=tmp_path)
    sample, source = validation_sample(ds, 2)
    assert source == "eval" and len(sample) == 10
    assert [e["id"] for e in sample[:2]] == ["northwind-eval-00000", "northwind-eval-00001"]
    path.write_text("".join(json.dumps(e) + "\n" for e in marked))
    sample, source = validation_sample(load_examples(path, spec(), cache_dir=tmp_path), 2)
    assert source == "validation" and [e["id"] for e in sample] == [f"{t}-eval-00000" for t in
        ("northwind", "helix", "ledger", "lexis", "orbit")]  # fmt: skip


def test_examples_longer_than_seq_len_are_counted_and_said(examples: list[dict], tokenizer, tmp_path) -> None:
    from trainer.inputs.data import over_seq_len_words

    prompts_cut = tokenize_examples(tokenizer, examples, 72, tmp_path)  # prompts ~80 tokens, answers ~25
    assert prompts_cut.over_seq_len > 0 and not any(prompts_cut.answer_cut)
    cut = tokenize_examples(tokenizer, examples, 24, tmp_path)
    lost = sum(1 for a in cut.answer_cut if a)
    assert cut.over_seq_len == len(examples) and lost > 0 and all(len(r["input_ids"]) <= 24 for r in cut.rows)
    words = over_seq_len_words(cut.over_seq_len, len(cut.rows), lost, 24)
    assert words.startswith(f"{cut.over_seq_len} of {len(cut.rows)} training examples are longer than "
                            "training.seq_len 24: the start of their prompt is cut")  # fmt: skip
    assert f"{lost} of them lose answer tokens, their label among them" in words
