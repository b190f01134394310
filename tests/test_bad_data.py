"""Bad data ends in one line naming the file, the line or row and the field, with exit 2, before training.

Each case writes one broken file; `cockpit data FILE` must refuse it with the words given, and `cockpit
run` refuses the same data before a run record exists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cockpit.cli import main


def _row(i: int, **change: object) -> dict:
    row = {
        "tenant": "acme",
        "id": f"a{i}",
        "split": "eval" if i % 4 == 3 else "train",
        "system": "Label the entity.",
        "user": f"Document {i} mentions [[Foo Ltd]].",
        "labels": ["ORG", "PERSON"],
        "gold": "ORG",
        "reasoning": "Ltd ends a company name.",
    }
    row.update(change)
    return {k: v for k, v in row.items() if v is not ...}


def _jsonl(*rows: dict) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _good(n: int = 8) -> list[dict]:
    return [_row(i) for i in range(1, n + 1)]


def _csv(bad: int, line: str) -> bytes:
    """Four good CSV rows, row `bad` replaced by `line`."""
    rows = [f"acme,a{i},{'eval' if i == 4 else 'train'},u,ORG|PERSON,ORG" for i in range(1, 5)]
    rows[bad - 1] = line
    return "\n".join(["tenant,id,split,user,labels,gold", *rows, ""]).encode()


def _parquet(rows: list[dict]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))

    return write


@dataclass(frozen=True)
class Case:
    """A broken data file and the words its one-line error must hold (besides the file's name)."""

    name: str
    file: str
    content: bytes | Callable[[Path], None]
    words: tuple[str, ...]
    overrides: tuple[str, ...] = ()


CASES = [
    Case("empty file", "empty.jsonl", b"\n  \n", ("empty file",)),
    Case("broken JSON line", "broken.jsonl", _jsonl(*_good(2)) + b'{"tenant": "acme", "id": \n',
         ("line 3", "not valid JSON")),
    Case("not UTF-8", "latin1.jsonl", _jsonl(_row(1)) + '{"user": "café"}\n'.encode("latin-1"),
         ("line 2", "not UTF-8", "0xe9")),
    Case("a line that is not an object", "array.jsonl", _jsonl(_row(1)) + b"[1, 2]\n",
         ("line 2", "not a JSON object")),
    Case("missing column", "nogold.jsonl", _jsonl(*[_row(i, gold=...) for i in range(1, 5)]),
         ("no column 'gold'", "field gold", "data.columns.gold")),
    Case("missing value", "nouser.jsonl", _jsonl(_row(1), _row(2, user=None), _row(3)),
         ("line 2", "field user", "missing")),
    Case("empty value", "emptygold.jsonl", _jsonl(*_good(3), _row(4, gold="  ")),
         ("line 4", "field gold", "empty")),
    Case("label outside its tenant's set", "label.jsonl", _jsonl(_row(1), _row(2, gold="PLACE")),
         ("line 2", "field gold", "'PLACE' is not in its tenant's label set ['ORG', 'PERSON']")),
    Case("labels as one text with commas", "commas.jsonl", _jsonl(_row(1, labels="ORG, PERSON")),
         ("line 1", "field gold", "label set ['ORG, PERSON'] (labels in text are joined by '|')")),
    Case("labels not a list", "labels.jsonl", _jsonl(_row(1, labels=7)),
         ("line 1", "field labels", "expected a list of labels")),
    Case("text of the wrong type", "usertype.jsonl", _jsonl(_row(1), _row(2, user={"text": "x"})),
         ("line 2", "field user", "expected text, got dict")),
    Case("unknown split", "split.jsonl", _jsonl(_row(1), _row(2, split="holdout")),
         ("line 2", "field split", "'holdout' is not one of train, eval")),
    Case("repeated id", "dup.jsonl", _jsonl(_row(1), _row(2), _row(3, id="a1")),
         ("line 3", "field id", "'a1' repeats line 1")),
    Case("no training examples", "alleval.jsonl", _jsonl(*[_row(i, split="eval") for i in range(4)]),
         ("no example is in the train split",)),
    Case("bad chat messages", "chat.jsonl",
         _jsonl({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                              {"role": "assistant", "content": "ORG"}]}),
         ("line 1", "field messages", "one user and one assistant message, found 2 and 1")),
    Case("CSV labels not a list", "labels.csv",
         b'tenant,id,split,user,labels,gold\nacme,a1,train,u,"[""ORG""]",ORG\nacme,a2,train,u,"[ORG",ORG\n',
         ("row 2", "field labels", "not a JSON list")),
    Case("CSV with only a header", "header.csv", b"tenant,user,gold\n", ("no examples (only a header)",)),
    Case("broken JSON file", "broken.json", b'[\n {"user": "u", "gold": "g"},\n {"user": \n]\n',
         ("line 4", "not valid JSON")),
    Case("not a Parquet file", "fake.parquet", b"PAR1 this is not parquet", ("not a readable Parquet file",)),
    Case("renamed column not there", "mapped.parquet", _parquet(_good()),
         ("no column 'customer' (data.columns.tenant)", "the data has: tenant"),
         ("data.columns.tenant=customer",)),
    Case("unknown format", "data.txt", b"hello\n", ("cannot tell the format from the suffix '.txt'",)),
    Case("CSV row with a column missing", "short.csv", _csv(3, "acme,a3,train,u,ORG|PERSON"),
         ("row 3 (line 4)", "5 columns, where the header has 6", "a ragged row")),
    Case("CSV row with a column too many", "long.csv", _csv(2, "acme,a2,train,u,ORG|PERSON,ORG,x"),
         ("row 2 (line 3)", "7 columns, where the header has 6", "a ragged row")),
    Case("CSV field over the example limit", "field.csv", _csv(3, f"acme,a3,train,{'x' * 3000},ORG,ORG"),
         ("row 3 (line 4)", "a field over the limit of data.limits.example_kib (2.0 KiB"),
         ("data.limits.example_kib=2",)),
    Case("example over the limit", "huge.jsonl", _jsonl(*_good(2), _row(3, user="x" * 3000)),
         ("line 3", "an example of 3.0 KiB, over the limit of data.limits.example_kib (2.0 KiB"),
         ("data.limits.example_kib=2",)),
    Case("file over the limit", "big.jsonl", _jsonl(*[_row(i, user="x" * 1000) for i in range(1100)]),
         ("1.2 MiB, over the limit of data.limits.file_mib (1.0 MiB", "--set data.limits.file_mib=N"),
         ("data.limits.file_mib=1",)),
    Case("not a regular file", "pipe.jsonl", os.mkfifo, ("a pipe, not a file to read",)),
]  # fmt: skip


def _write(case: Case, folder: Path) -> Path:
    path = folder / case.file
    if callable(case.content):
        case.content(path)
    else:
        path.write_bytes(case.content)
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_data_is_one_line_naming_file_place_and_field(case: Case, tmp_path: Path, capsys) -> None:
    path = _write(case, tmp_path)
    overrides = [a for o in case.overrides for a in ("--set", o)]
    code = main(["data", str(path), "--no-tokens", *overrides])
    captured = capsys.readouterr()
    assert code == 2, captured.out[-2000:]
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and str(path) in lines[0], lines[0]
    for words in case.words:
        assert words in lines[0], lines[0]
    assert "Traceback" not in captured.err


def test_there_are_at_least_ten_kinds() -> None:
    assert len({c.name for c in CASES}) >= 10


def test_a_run_refuses_bad_data_before_it_starts(tmp_path: Path, capsys) -> None:
    case = next(c for c in CASES if c.name == "label outside its tenant's set")
    path = _write(case, tmp_path)
    runs = tmp_path / "runs"
    code = main(["run", "--no-ui", "--set", f"data.source={path}", "--runs-dir", str(runs)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{path}: line 2: field gold: 'PLACE'" in err
    assert not runs.exists() or not any(runs.iterdir()), "no run record was made"


def test_a_csv_field_over_csv_s_own_128_kib_reads_within_the_example_limit(tmp_path: Path, capsys) -> None:
    """Python's csv module stops at 128 KiB a field by default (`_csv.Error`); an example's limit is the
    profile's (1 MiB), and a 200 KiB reasoning is a usable example."""
    path = tmp_path / "long.csv"
    path.write_bytes(_csv(1, f"acme,a1,train,{'x' * 200 * 1024},ORG|PERSON,ORG"))
    assert main(["data", str(path), "--no-tokens"]) == 0, capsys.readouterr().err
    from cockpit.data import load_examples
    from cockpit.profiles import DataSpec

    (first, *_) = load_examples(path, DataSpec(source=str(path)), cache_dir=tmp_path / "cache").examples
    assert len(first["user"]) == 200 * 1024
