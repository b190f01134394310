"""An evaluation cut to a sample: stratified, reproducible, every prefix (a time budget's cut) stratified
too, every system scored on the same examples, and the report's intervals widening with fewer examples."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cockpit.data.sampling import BUDGET, EXAMPLES, Deadline, Shared, draw, stratified_order
from cockpit.predictions import own_predictions
from cockpit.record import read_events, write_manifest
from cockpit.report import build_report, render_markdown, run_report

SIZES = {
    "acme": 120,
    "bolt": 40,
    "cora": 25,
    "dune": 9,
    "echo": 1,
}  # unequal tenants, one of a single example


def keys_of(sizes: dict[str, int]) -> list[tuple[str, str]]:
    return [(t, f"{t}-{i}") for t, n in sizes.items() for i in range(n)]


KEYS = keys_of(SIZES)


def test_every_prefix_keeps_each_tenant_s_share() -> None:
    """Each tenant with examples has one once the prefix holds one a tenant, and never more than its
    share rounded up (so none is starved either: the counts add up to the prefix)."""
    order = stratified_order(KEYS, seed=0)
    assert sorted(order) == list(range(len(KEYS))), "a permutation of the split"
    total, counts = len(KEYS), Counter()
    for m, i in enumerate(order, 1):
        counts[KEYS[i][0]] += 1
        for tenant, size in SIZES.items():
            assert counts[tenant] <= math.ceil(m * size / total), (m, tenant)
            if m >= len(SIZES):
                assert counts[tenant] >= 1, (m, tenant)
    # a prefix of 60 of 195: acme's share 36.9, bolt's 12.3, cora's 7.7 (echo and dune get theirs first)
    sixty = Counter(KEYS[i][0] for i in order[:60])
    assert sixty["echo"] == 1 and sixty["dune"] in (2, 3)
    assert abs(sixty["acme"] - 60 * 120 / 195) <= 2 and abs(sixty["bolt"] - 60 * 40 / 195) <= 1


def test_equal_tenants_stay_within_one_of_each_other_at_every_prefix() -> None:
    keys = keys_of({"a": 30, "b": 30, "c": 30})
    counts: Counter[str] = Counter()
    for i in stratified_order(keys, seed=3):
        counts[keys[i][0]] += 1
        assert max(counts.values()) - min(counts[t] for t in "abc") <= 1


def test_the_order_is_a_function_of_the_keys_and_the_seed() -> None:
    shuffled = KEYS[:]
    random.Random(1).shuffle(shuffled)
    ordered = [KEYS[i] for i in stratified_order(KEYS, seed=7)]
    assert [shuffled[i] for i in stratified_order(shuffled, seed=7)] == ordered, "input order is irrelevant"
    assert [KEYS[i] for i in stratified_order(KEYS, seed=8)] != ordered, "another seed, another sample"
    # the same in a process with another hash seed (str hashing is randomised per process)
    code = (
        "import json, sys; from cockpit.data.sampling import stratified_order; "
        "keys = [tuple(k) for k in json.load(sys.stdin)]; "
        "print(json.dumps([keys[i] for i in stratified_order(keys, seed=7)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(KEYS),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert [tuple(k) for k in json.loads(out.stdout)] == ordered


def test_a_sample_is_a_prefix_of_the_order_and_a_smaller_one_of_a_larger() -> None:
    order = stratified_order(KEYS, seed=0)
    small, large = draw(KEYS, 30, seed=0), draw(KEYS, 90, seed=0)
    assert list(large.order) == order[:90] and large.order[:30] == small.order
    assert small.by == [EXAMPLES] and small.population == len(KEYS) and small.requested == 30
    assert {KEYS[i][0] for i in small.order} == set(SIZES), "every tenant has its example"
    assert len(draw(KEYS, 3, seed=0).order) == len(SIZES), "raised to one a tenant"
    whole = draw(KEYS, None, seed=0)
    assert len(whole.order) == len(KEYS) and whole.by == []
    assert draw(KEYS, 10_000, seed=0).by == [], "asking for more than there are scores all of them"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_stops_before_the_batch_that_would_overrun() -> None:
    clock = FakeClock()
    deadline = Deadline(50.0, clock)
    batches = 0
    while deadline():
        batches += 1
        clock.now += 10.0  # each batch takes 10 s
    assert batches == 5 and deadline.cut and clock.now == 50.0


def test_with_a_budget_the_first_system_is_cut_and_the_others_score_what_it_finished() -> None:
    clock = FakeClock()
    examples = [{"tenant": t, "id": i} for t, i in (KEYS[j] for j in stratified_order(KEYS, seed=0))]
    shared = Shared(examples, lambda e: (e["tenant"], e["id"]), budget_s=90.0, systems=3, clock=clock)
    scored = []
    for _ in range(3):
        todo, deadline = shared.next()
        done = []
        for start in range(0, len(todo), 16):  # batches of 16, 10 s each
            if deadline is not None and not deadline():
                break
            done += todo[start : start + 16]
            clock.now += 10.0
        shared.scored([(e["tenant"], e["id"]) for e in done])
        scored.append(done)
    first, second, third = scored
    assert len(first) == 3 * 16 and first == examples[:48], (
        "30 s of 90 for 3 systems: a prefix of three batches"
    )
    assert second == first and third == first, "every later system on the first's examples, uncut"
    assert shared.cut


def evaluation(tmp_path: Path, budget_s: float | None, examples: int | None):
    """trainer.evaluation.evaluate's Evaluation on a record whose profile is the tiny one, with the model's
    work (thinking, label scores) replaced by fakes that take 10 s of a fake clock a batch."""
    from cockpit.profiles import load_profile, profile_to_dict
    from trainer.evaluation import evaluate

    profile, _ = load_profile("tiny-cpu")
    write_manifest(tmp_path, {"run_id": "r", "profile": profile_to_dict(profile)})
    ev = evaluate.Evaluation(tmp_path, examples, budget_s)
    population = [
        {"tenant": t, "id": i, "gold": "A", "labels": ["A", "B"]}
        for t, n in SIZES.items()
        for i in range(n * 4)
    ]
    clock = FakeClock()
    ev.draw(population, systems=2)
    ev.shared.clock = clock

    def think(model: object, tokenizer: object, prompts: list[str], max_new: int) -> list[str]:
        clock.now += 10.0
        return ["x"] * len(prompts)

    return ev, population, think


class _Model:
    def eval(self) -> None:
        return None


def run_two_systems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget_s: float | None, n: int | None):
    from trainer.evaluation import evaluate

    ev, population, think = evaluation(tmp_path, budget_s, n)
    monkeypatch.setattr(evaluate, "think", think)
    monkeypatch.setattr(evaluate, "prompt_text", lambda tok, ex: f"{ex['tenant']} {ex['id']}")
    monkeypatch.setattr(
        evaluate, "score_many", lambda m, t, prefixes, labels: [{"A": -1.0, "B": -2.0} for _ in prefixes]
    )
    for name in ("base", "finetuned"):
        ev.score(name, _Model(), None, {"model": "/m"})
    ev.events.close()
    return population


def test_a_budgeted_evaluation_scores_both_systems_on_the_same_examples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget 60 s for 2 systems: the first gets 30 s, three batches of 64 of the 780 held out, and the
    second the same 192; the files and events say 192 of 780, by the time budget."""
    population = run_two_systems(tmp_path, monkeypatch, budget_s=60.0, n=None)
    files = {p.system: p for p in own_predictions(tmp_path)}
    assert set(files["base"].rows) == set(files["finetuned"].rows) and len(files["base"].rows) == 192
    for p in files.values():
        sample = p.meta["sample"]
        assert sample["scored"] == 192 and sample["population"] == len(population) == 780
        assert sample["by"] == [BUDGET] and sample["time_budget_s"] == 60.0
        assert sum(n for n, _ in sample["tenants"].values()) == 192
        assert all(n >= 1 for n, _ in sample["tenants"].values())
    progress = list(read_events(tmp_path, "eval_progress"))
    assert [e["total"] for e in progress if e["system"] == "finetuned"] == [192, 192, 192]
    assert progress[-1]["done"] == 192
    base = [e for e in progress if e["system"] == "base"]
    assert base[-1] == {**base[-1], "done": 192, "total": 192}, "the cut sample is the base's last total"
    systems = list(read_events(tmp_path, "eval_system"))
    assert [(e["examples"], e["population"], e["by"]) for e in systems] == [(192, 780, [BUDGET])] * 2


def test_a_sample_of_n_is_scored_whole_by_every_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_two_systems(tmp_path, monkeypatch, budget_s=None, n=100)
    files = {p.system: p for p in own_predictions(tmp_path)}
    assert set(files["base"].rows) == set(files["finetuned"].rows) and len(files["base"].rows) == 100
    totals = {e["total"] for e in read_events(tmp_path, "eval_progress")}
    assert totals == {100}, "progress counts to the sample's size"
    report = run_report(tmp_path, samples=100)
    rows = {t.name: t for t in report.tenants}
    assert rows["echo"].n == 1 and rows["echo"].population == 4
    assert sum(t.n for t in report.tenants) == 100 and sum(t.population for t in report.tenants) == 780
    md = render_markdown(report)
    assert f"| acme | {rows['acme'].n} of 480 |" in md
    assert "Scored 100 of 780 held-out examples: a stratified random sample" in md and "100 asked for" in md


# --- the intervals widen with fewer examples ----------------------------------------------------------
def write_predictions(run_dir: Path, system: str, accuracy: float, keys: list[tuple[str, str]]) -> None:
    """Predictions for `keys`: each correct with probability `accuracy`, drawn from the key itself, so a
    sample's files hold the very predictions of the whole split's."""
    folder = run_dir / "predictions"
    folder.mkdir(parents=True, exist_ok=True)
    labels = ["A", "B", "C"]
    lines = [json.dumps({"meta": {"system": system}})]
    for tenant, ident in keys:
        rng = random.Random(f"{system}:{tenant}:{ident}")
        gold = labels[int(ident.rsplit("-", 1)[1]) % 3]
        pred = gold if rng.random() < accuracy else rng.choice(labels)
        scores = {label: (0.0 if label == pred else -1.0) for label in labels}
        lines.append(
            json.dumps({"tenant": tenant, "id": ident, "gold": gold, "pred": pred, "scores": scores})
        )
    (folder / f"{system}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("small, large", [(60, 600), (200, 800)])
def test_a_smaller_sample_gives_a_wider_interval_on_the_same_data(
    tmp_path: Path, small: int, large: int
) -> None:
    keys = keys_of({"acme": 300, "bolt": 300, "cora": 200})
    widths = {}
    for n in (small, large):
        run = tmp_path / str(n)
        chosen = [keys[i] for i in draw(keys, n, seed=0).order]
        write_predictions(run, "base", 0.5, chosen)
        write_predictions(run, "finetuned", 0.7, chosen)
        report = build_report(own_predictions(run), samples=400)
        mean = report.mean.deltas["base"]
        widths[n] = mean.high - mean.low
        for t in report.tenants:
            assert t.deltas["base"].high > t.deltas["base"].low
    assert widths[small] > widths[large]


# --- asking for a sample ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag, words",
    [
        (["--examples", "0"], "argument --examples: 0: expected a whole number of at least 1"),
        (["--examples", "ten"], "argument --examples: 'ten': expected a whole number of at least 1"),
        (["--time-budget", "abc"], "argument --time-budget: 'abc': expected a duration such as 90s, 20m"),
        (["--time-budget", "0m"], "argument --time-budget: '0m': expected a finite duration above 0"),
        (["--time-budget", "1h30"], "argument --time-budget: '1h30': expected a duration"),
    ],
)
def test_bad_sample_flags_are_one_line_exit_2(flag: list[str], words: str, tmp_path: Path, capsys) -> None:
    from cockpit.cli import main

    code = main(["eval", "latest", *flag, "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err


def test_durations_read_as_people_write_them() -> None:
    from cockpit.cli.arguments import duration

    cases = {"90": 90, "90s": 90, "20m": 1200, "20 min": 1200, "1.5h": 5400, "1h30m": 5400, ".5h": 1800}
    assert {text: duration(text) for text in cases} == cases


def test_the_command_s_request_overrides_the_profile(tmp_path: Path) -> None:
    """eval.examples in the profile, `cockpit eval --examples` in run.json (eval_request), the process's own
    flag: the later wins; a time budget alike."""
    from cockpit.profiles import load_profile, profile_to_dict
    from cockpit.service.lifecycle import eval_request
    from trainer.evaluation.evaluate import Evaluation

    profile, _ = load_profile("tiny-cpu", ["eval.examples=50", "eval.time_budget_s=600"])
    write_manifest(tmp_path, {"run_id": "r", "profile": profile_to_dict(profile)})
    ev = Evaluation(tmp_path)
    assert (ev.wanted, ev.budget_s) == (50, 600)
    assert eval_request(None, None) is None
    write_manifest(
        tmp_path, {"run_id": "r", "profile": profile_to_dict(profile), "eval_request": eval_request(20)}
    )
    assert (Evaluation(tmp_path).wanted, Evaluation(tmp_path).budget_s) == (20, 600)
    asked = eval_request(20, 90.0)
    write_manifest(tmp_path, {"run_id": "r", "profile": profile_to_dict(profile), "eval_request": asked})
    assert (Evaluation(tmp_path).wanted, Evaluation(tmp_path).budget_s) == (20, 90.0)
    assert (Evaluation(tmp_path, 7, 30.0).wanted, Evaluation(tmp_path, 7, 30.0).budget_s) == (7, 30.0)
