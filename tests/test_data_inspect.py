"""`cockpit data`: tenants, labels, token lengths against seq_len, and the problems found, as the trainer
would meet them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.cli import main
from cockpit.data.inspection import Histogram, Truncation
from cockpit.data.tenants import generate


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cockpit.data.builtin import build_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(folder, 0, 1024)
    return folder


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _inspect(path: Path, tokenizer_dir: Path, capsys, *more: str) -> tuple[int, dict]:
    code = main(["data", str(path), "--format", "json", "--set", f"model.path={tokenizer_dir}", *more])
    return code, json.loads(capsys.readouterr().out)


def test_tenants_splits_labels_and_token_lengths(tmp_path: Path, tokenizer_dir: Path, capsys) -> None:
    from transformers import AutoTokenizer

    from cockpit.data.chat import token_lengths
    from trainer.inputs.data import tokenize_examples

    examples = generate(0, 12, 3)
    code, found = _inspect(_write(tmp_path / "d.jsonl", examples), tokenizer_dir, capsys,
                           "--set", "training.seq_len=96")  # fmt: skip
    assert code == 0 and found["problems"] == []
    assert found["examples"] == 75 and found["format"] == "jsonl"
    assert found["tenants"]["helix"] == {"train": 12, "eval": 3}
    helix = [e for e in examples if e["tenant"] == "helix"]
    assert list(found["labels"]["helix"]) == helix[0]["labels"]
    assert sum(found["labels"]["helix"].values()) == 15
    assert found["labels"]["helix"]["DRUG"] == sum(e["gold"] == "DRUG" for e in helix)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    lengths = token_lengths(tokenizer, examples)
    tokens = found["tokens"]
    assert tokens["total"]["max"] == max(sum(x) for x in lengths)
    assert tokens["prompt"]["min"] == min(p for p, _, _ in lengths)
    assert sum(tokens["total"]["histogram"]["counts"]) == 75
    # What truncation would cut is what the trainer's tokenization does cut.
    cut = tokenize_examples(tokenizer, examples, 96, None)
    assert tokens["truncation"]["over"] == cut.over_seq_len > 0
    assert tokens["truncation"]["prompt_tokens_cut"] == sum(cut.prompt_cut)
    assert tokens["over_seq_len_share"] == pytest.approx(cut.over_seq_len / 75, abs=1e-4)


def test_problems_are_listed_and_a_blocking_one_exits_2(tmp_path: Path, tokenizer_dir: Path, capsys) -> None:
    examples = generate(0, 6, 2)
    examples[3] = {**examples[3], "id": examples[1]["id"]}
    examples[4] = {**examples[4], "gold": "NOT-A-LABEL"}
    examples[5] = {**examples[5], "reasoning": ""}
    path = _write(tmp_path / "d.jsonl", examples)
    code = main(["data", str(path), "--format", "json", "--no-tokens"])
    captured = capsys.readouterr()
    found = json.loads(captured.out)
    kinds = {p["kind"]: p for p in found["problems"]}
    assert set(kinds) == {"duplicate", "label", "reasoning"}
    assert kinds["duplicate"]["message"].endswith(f"line 4: field id: {examples[1]['id']!r} repeats line 2")
    assert "line 5: field gold: 'NOT-A-LABEL'" in kinds["label"]["message"]
    assert (
        not kinds["reasoning"]["blocking"]
        and "1 example(s) with empty reasoning" in kinds["reasoning"]["message"]
    )
    assert code == 2
    # the first blocking problem in the file's order, and how many more there are
    assert captured.err.strip().splitlines() == [f"error: {kinds['label']['message']} (and 1 more)"]


def test_a_split_on_some_rows_says_every_row_or_none(tmp_path: Path, capsys) -> None:
    """A JSON Lines file with `split` on some rows: those without are problems that say the rule, and the
    head counts the usable examples against the rows read."""
    examples = generate(0, 5, 1)[:5]
    rows = [{k: v for k, v in e.items() if k != "split" or i in (1, 3)} for i, e in enumerate(examples)]
    path = _write(tmp_path / "d.jsonl", rows)
    code = main(["data", str(path), "--format", "json", "--no-tokens"])
    found = json.loads(capsys.readouterr().out)
    assert code == 2 and found["rows"] == 5 and found["examples"] == 2
    missing = [p["message"] for p in found["problems"] if p["kind"] == "missing"]
    assert len(missing) == 3 and all(
        "field split: missing: give it on every row or on none" in m for m in missing
    )
    assert main(["data", str(path), "--no-tokens"]) == 2
    assert "2 examples (of 5 rows" in capsys.readouterr().out


def test_the_text_tables(tmp_path: Path, tokenizer_dir: Path, capsys) -> None:
    path = _write(tmp_path / "d.jsonl", generate(0, 8, 2))
    assert main(["data", str(path), "--set", f"model.path={tokenizer_dir}"]) == 0
    out = capsys.readouterr().out
    for words in ("tenants: examples per split", "northwind", "labels per tenant", "CARRIER",
                  "tokens an example", "reasoning", "against training.seq_len 192", "nothing is cut",
                  "no problems"):  # fmt: skip
        assert words in out, words


def test_histogram_bins_and_truncation() -> None:
    h = Histogram.of([10, 12, 19, 30], bins=4, hi=40)
    assert (h.lo, h.hi, h.counts) == (10, 42, (2, 1, 1, 0))  # bins of 8 from the smallest
    assert h.edges() == [10, 18, 26, 34, 42]
    t = Truncation.of([(50, 20, 2), (10, 5, 2), (5, 100, 3)], seq_len=60)
    assert (t.over, t.prompt_tokens_cut, t.answer_cut) == (2, 50 - 38 + 5, 1)


def test_a_missing_data_source_names_the_profile_the_field_and_where_it_was_looked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = Path(__file__).resolve().parent.parent / "profiles" / "tiny-cpu.toml"
    mine = tmp_path / "profiles" / "mine.toml"
    mine.parent.mkdir()
    lines = shipped.read_text().splitlines()
    section = ""
    out = []
    for line in lines:
        section = line.strip() if line.startswith("[") else section
        out.append(
            'source = "data/mine.jsonl"' if section == "[data]" and line.startswith("source") else line
        )
    mine.write_text("\n".join(out) + "\n")
    assert main(["data", "--profile", str(mine), "--no-tokens"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{mine}: data.source: no such file or folder '{tmp_path / 'profiles' / 'data' / 'mine.jsonl'}'"
        in err
    )
    assert "read from the profile's folder" in err and len(err.strip().splitlines()) == 1


def test_a_tenant_without_train_or_eval_examples_is_said_not_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {
            "tenant": "ledger",
            "user": "Pay ACME 40 USD",
            "labels": ["PAYER", "PAYEE"],
            "gold": "PAYEE",
            "split": s,
        }
        for s in ("train", "eval")
    ] + [
        {"tenant": "northwind", "user": "Bob", "labels": ["PAYER", "PAYEE"], "gold": "PAYER", "split": "eval"}
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["data", str(path), "--format", "json", "--no-tokens"]) == 0  # not blocking
    problems = [p for p in json.loads(capsys.readouterr().out)["problems"] if p["kind"] == "tenant-split"]
    assert [p["message"] for p in problems] == [
        f"{path}: tenant 'northwind' has no train example: nothing of its labels is trained"
    ]
    assert not problems[0]["blocking"]
