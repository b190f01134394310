"""How long a run is: tokens from a trainer's count, the data file, or the profile's assumption."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cockpit.plan.run_length import DataSize, data_size, run_steps
from cockpit.profiles import DataSpec


def _profile(tmp_path, source="missing.jsonl", examples=0, mean_tokens=0, packing=True):
    return SimpleNamespace(
        data=DataSpec(source=str(tmp_path / source), examples=examples, mean_tokens=mean_tokens),
        model=SimpleNamespace(path=str(tmp_path / "model")),
        training=SimpleNamespace(
            packing=packing, seq_len=100, micro_batch_size=2, grad_accum=3, epochs=2, max_steps=-1
        ),
    )


def _write_data(tmp_path, texts):
    rows = [{"split": "train", "system": "", "user": t, "reasoning": "", "gold": "g"} for t in texts]
    rows.append({"split": "eval", "system": "", "user": "held out " * 50, "reasoning": "", "gold": "g"})
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


# Each part at about four characters a token: the prompt (37 or 80 characters), the label "g" (one token at
# least) and the end of the turn (one more).
ESTIMATED = (round(37 / 4) + 1 + 1) + (round(80 / 4) + 1 + 1)


def test_data_file_counted_by_characters_without_a_tokenizer(tmp_path):
    _write_data(tmp_path, ["a" * 37, "b" * 80])
    size = data_size(_profile(tmp_path, "d.jsonl", examples=999, mean_tokens=999))
    assert size.examples == 2  # the eval split is left out; the file wins over the assumption
    assert size.tokens == ESTIMATED
    assert "characters a token (no tokenizer in" in size.how


def test_data_file_counted_as_the_trainer_tokenizes_it(tmp_path):
    """The model's tokenizer and chat template: the plan counts the tokens the trainer trains on."""
    from cockpit.data.builtin import build_tokenizer
    from cockpit.data.chat import load_tokenizer
    from cockpit.data.inspection import count_tokens
    from trainer.inputs.data import tokenize_examples

    build_tokenizer(tmp_path / "model", 0, 1024)
    _write_data(tmp_path, ["one two three", "four five"])
    size = data_size(_profile(tmp_path, "d.jsonl"))
    train = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()][:2]
    rows = tokenize_examples(load_tokenizer(tmp_path / "model"), train, 10**6, None).rows
    assert size.tokens == sum(len(r["input_ids"]) for r in rows)
    lengths, how = count_tokens(train, str(tmp_path / "model"))  # what `cockpit data` shows
    assert size.tokens == sum(map(sum, lengths)) and how in size.how
    assert "the tokenizer and chat template of" in size.how


def test_a_tokenizer_without_a_chat_template_is_not_used(tmp_path):
    """The trainer could not build the prompt with it: the estimate, saying why."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    (tmp_path / "model").mkdir()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    _write_data(tmp_path, ["a" * 37, "b" * 80])
    size = data_size(_profile(tmp_path, "d.jsonl"))
    assert size.tokens == ESTIMATED and "has no chat template" in size.how


def test_a_trainers_count_wins_and_the_assumption_is_last(tmp_path):
    profile = _profile(tmp_path, examples=10, mean_tokens=50)
    measured = data_size(profile, {"source": "x.jsonl", "tokens": 1234, "examples": 7, "fill": 0.9})
    assert (measured.tokens, measured.fill) == (1234, 0.9)
    random = data_size(profile, {"source": "random tokens (rehearsal)", "tokens": 1234})
    assert random.tokens == 500 and random.how.startswith("assumed")
    assert data_size(_profile(tmp_path)) is None


@pytest.mark.parametrize("packing", [True, False])
def test_steps_from_tokens_fill_and_batch(tmp_path, packing):
    profile = _profile(tmp_path, packing=packing)
    size = DataSize(examples=120, tokens=9000, how="measured", fill=0.9)
    steps, _ = run_steps(profile, size, ranks=2)
    rows = 100 if packing else 120  # 9000 tokens / (100 x 0.9) packed, else one example a row
    assert steps == -(-rows // (2 * 3 * 2)) * 2  # micro-batch x accumulation x ranks a step, two epochs
    nothing, how = run_steps(profile, None, 1)
    assert nothing == 0 and "unknown" in how


def test_a_parquet_data_file_counts_as_its_jsonl_twin(tmp_path):
    """`cockpit plan` and `rehearse` read the data in any format `cockpit.data` reads."""
    import datasets

    _write_data(tmp_path, ["a" * 37, "b" * 80])
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    jsonl, parquet = data_size(_profile(tmp_path, "d.jsonl")), data_size(_profile(tmp_path, "d.parquet"))
    assert (parquet.examples, parquet.tokens) == (jsonl.examples, jsonl.tokens) == (2, ESTIMATED)
    assert "d.parquet" in parquet.how
