"""End to end: the README's main job, `cockpit run --no-ui` on the built-in tiny profile, for real.

One run per test session, of two epochs instead of the profile's four (160 steps instead of 320: the
same path, half the suite's longest wait; after one epoch the tuned model does not yet beat the base on
every tenant); the tests below read its record.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from cockpit.record import load_manifest, read_events
from tests.conftest import REPO, run_cockpit

pytestmark = pytest.mark.e2e
EPOCHS = 2  # of the profile's 4: what is checked here needs a run that learns, not the whole default


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, asset_cache: Path) -> tuple[Path, str]:
    runs = tmp_path_factory.mktemp("runs")
    args = ["run", "--no-ui", "--runs-dir", str(runs), "--set", f"training.epochs={EPOCHS}"]
    result = run_cockpit(args, asset_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir, result.stdout  # the results: `cockpit run --no-ui > log` keeps them


def test_run_finishes_with_a_complete_manifest(tiny_run: tuple[Path, str]) -> None:
    run_dir, _ = tiny_run
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "finished"
    assert manifest["exit_code"] == 0
    assert manifest["diagnosis"].startswith("finished")
    assert manifest["started_at"] <= manifest["ended_at"]
    for lib in ("torch", "transformers", "peft", "bitsandbytes", "deepspeed"):
        assert manifest["versions"][lib]
    assert manifest["profile"]["name"] == "tiny-cpu"


def test_one_step_event_per_optimizer_step(tiny_run: tuple[Path, str]) -> None:
    run_dir, _ = tiny_run
    steps = [e for e in read_events(run_dir, "step") if e["rank"] == 0]
    max_steps = steps[-1]["max_steps"]
    assert [e["step"] for e in steps] == list(range(1, max_steps + 1))
    for e in steps:
        for field in (
            "loss",
            "learning_rate",
            "grad_norm",
            "tokens_per_s",
            "samples_per_s",
            "rss_mib",
            "epoch",
        ):
            assert e[field] is not None, field
        assert e["tokens_per_s"] > 0


def test_loss_falls_clearly(tiny_run: tuple[Path, str]) -> None:
    run_dir, _ = tiny_run
    losses = [e["loss"] for e in read_events(run_dir, "step") if e["rank"] == 0]
    k = max(1, len(losses) // 10)
    first, last = statistics.fmean(losses[:k]), statistics.fmean(losses[-k:])
    assert last < 0.5 * first, (first, last)


def test_audit_says_linear_layers_and_experts_are_4bit_under_zero3_offload(
    tiny_run: tuple[Path, str],
) -> None:
    run_dir, _ = tiny_run
    (audit,) = read_events(run_dir, "audit")
    assert audit["groups"]["attention"]["params_4bit"] == audit["groups"]["attention"]["params"] > 0
    assert audit["applied"]["zero_stage"] == 3
    assert audit["applied"]["offload_param"] == "cpu" and audit["applied"]["offload_optimizer"] == "cpu"
    assert audit["applied"]["gradient_checkpointing"] is True
    assert all(n > 0 for n in audit["lora_targets"].values())
    assert 0 < audit["params_trainable"] < audit["params_total"]
    experts = audit["groups"]["experts"]
    assert experts["params_4bit"] == experts["params"] > 0, "fused experts packed in NF4"
    assert audit["fraction_4bit"] >= 0.95, "at least 95% of all parameters stored in 4 bit"
    assert audit["applied"]["partitioned_at_load"] is True, "the layer-by-layer loader partitions at load"
    assert audit["fraction_4bit_body"] >= 0.95 and audit["applied"]["params_partitioned"]
    assert audit["warnings"] == []
    (loaded,) = read_events(run_dir, "loaded")
    assert loaded["partitioned_at_load"] and loaded["loader"] == "layerwise"
    assert loaded["nf4_expert_tensors"] == loaded["nf4_expert_tensors_partitioned"] == 24  # 4 layers x 2 x 3
    assert loaded["zero3_leaf_modules"] == ["Qwen3MoeDecoderLayer"]  # the default: whole layers
    assert loaded["lean_lora"] == sum(audit["lora_targets"].values())  # every adapter: the lean forward


def test_load_and_train_phases_and_adapter(tiny_run: tuple[Path, str]) -> None:
    run_dir, _ = tiny_run
    (load_peak,) = read_events(run_dir, "load_peak")
    assert load_peak["rss_peak_mib"] > 0
    phases = [e["phase"] for e in read_events(run_dir, "phase")]
    # the op build comes first where an op is compiled (a new environment), then setup, load and train
    assert [p for p in phases if p != "build"][:3] == ["setup", "load", "train"]
    assert "build" not in phases or phases.index("build") == 0
    adapter = run_dir / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert (adapter / "adapter_model.safetensors").stat().st_size > 10_000


def test_the_adapter_card_says_how_to_use_it_outside_the_cockpit(tiny_run: tuple[Path, str]) -> None:
    run_dir, _ = tiny_run
    adapter = run_dir / "adapter"
    card = (adapter / "README.md").read_text()
    assert "library_name: peft" in card and "PeftModel.from_pretrained(base" in card
    assert f"--enable-lora --lora-modules {run_dir.name}={adapter.resolve()} --max-lora-rank" in card


def test_output_log_holds_what_the_trainer_printed(tiny_run: tuple[Path, str]) -> None:
    run_dir, stdout = tiny_run
    log = (run_dir / "output.log").read_text()
    assert "[cockpit] phase: train" in log and "step 1/" in log
    assert f"run {run_dir.name}: finished" in stdout and str(run_dir) in stdout


def test_finetuned_beats_the_base_on_every_tenant(tiny_run: tuple[Path, str]) -> None:
    run_dir, stdout = tiny_run
    report = json.loads((run_dir / "report.json").read_text())
    assert len(report["tenants"]) >= 5
    for tenant in report["tenants"]:
        tuned, base = tenant["systems"]["finetuned"]["macro_f1"], tenant["systems"]["base"]["macro_f1"]
        assert tuned > base, (tenant["tenant"], tuned, base)
    assert "macro F1 on the held-out split" in stdout, "the headless run prints the comparison on stdout"
    serving = report["serving"]
    assert serving["measured_on"] == "cpu" and serving["batch_tokens_per_s"] > 0 and serving["ttft_ms"] > 0


def test_report_equals_sklearn_on_the_predictions_files(tiny_run: tuple[Path, str]) -> None:
    from sklearn.metrics import f1_score

    run_dir, _ = tiny_run
    report = json.loads((run_dir / "report.json").read_text())
    for system in ("base", "finetuned"):
        lines = (run_dir / "predictions" / f"{system}.jsonl").read_text().splitlines()[1:]
        rows = [json.loads(line) for line in lines]
        for tenant in report["tenants"]:
            mine = [r for r in rows if r["tenant"] == tenant["tenant"]]
            labels = sorted(mine[0]["scores"])
            expected = f1_score(
                [r["gold"] for r in mine], [r["pred"] for r in mine], labels=labels, average="macro"
            )
            assert tenant["systems"][system]["macro_f1"] == pytest.approx(expected)


def test_eval_only_run_compares_several_base_models(tmp_path: Path, asset_cache: Path) -> None:
    """`cockpit eval --profile P --model NAME=PATH`: open models side by side, before any fine-tuning."""
    import sys

    from devtools.faults import Watch, env_for, run_watched

    other = tmp_path / "other-model"
    build = (
        "import sys, pathlib; from trainer.inputs.tiny import build_model; "
        "build_model(pathlib.Path(sys.argv[1]), 1)"
    )
    built = run_watched([sys.executable, "-c", build, str(other)], Watch(), env=env_for(asset_cache))
    assert built.returncode == 0, built.stderr[-2000:]
    runs = tmp_path / "runs"
    # Ten held-out examples a tenant (the default job's 40 are scored by the tests above): the same code.
    profile = tmp_path / "tiny-small-eval.toml"
    text = (REPO / "profiles" / "tiny-cpu.toml").read_text()
    profile.write_text(text.replace("eval_examples_per_tenant = 40", "eval_examples_per_tenant = 10"))
    result = run_cockpit(
        ["eval", "--profile", str(profile), "--model", f"seed1={other}", "--runs-dir", str(runs)], asset_cache
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = list(runs.iterdir())
    manifest = load_manifest(run_dir)
    assert manifest["mode"] == "eval" and manifest["status"] == "finished"
    report = json.loads((run_dir / "report.json").read_text())
    assert sorted(report["systems"]) == ["base", "seed1"]
    assert all(set(t["systems"]) == {"base", "seed1"} for t in report["tenants"])
    assert "| tenant |" in result.stdout, "the report is printed"


def test_evaluating_the_ended_run_again_on_a_sample(tiny_run: tuple[Path, str], asset_cache: Path) -> None:
    """`cockpit eval RUN --examples 12`: a new supervisor attempt on the record (the run keeps its
    training's status), scoring a stratified sample of 12 of the 200 held-out examples (5 tenants of 40),
    the same for the base and the tuned model; progress counts to 12; the report says 12 of 200, each
    tenant's n of 40, and names the vllm command for the adapter."""
    from cockpit.predictions import own_predictions

    run_dir, _ = tiny_run
    training = load_manifest(run_dir)["training"]
    result = run_cockpit(["eval", str(run_dir), "--examples", "12"], asset_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| tenant |" in result.stdout, "the report is printed"
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "finished" and manifest["exit_code"] == 0
    assert manifest["training"] == training and training["diagnosis"].startswith("finished at step")
    assert manifest["evaluation"]["status"] == "finished"
    assert manifest["diagnosis"] == f"{training['diagnosis']}; {manifest['evaluation']['summary']}"
    assert [e["stage"] for e in read_events(run_dir, "launch")] == ["train", "eval", "eval"]
    assert manifest["eval_request"] == {"examples": 12}
    files = {p.system: p for p in own_predictions(run_dir)}
    assert set(files["base"].rows) == set(files["finetuned"].rows) and len(files["base"].rows) == 12
    per_tenant = {t: sum(1 for k in files["base"].rows if k[0] == t) for t, _ in files["base"].rows}
    assert len(per_tenant) == 5 and set(per_tenant.values()) <= {2, 3}, per_tenant
    events = list(read_events(run_dir))
    last_begin = max(i for i, e in enumerate(events) if e["kind"] == "eval_begin")
    assert events[last_begin]["examples"] == 12 and events[last_begin]["population"] == 200
    totals = {e["total"] for e in events[last_begin:] if e["kind"] == "eval_progress"}
    assert totals == {12}
    report = json.loads((run_dir / "report.json").read_text())
    assert report["sample"]["scored"] == 12 and report["sample"]["by"] == ["examples"]
    assert all(t["population"] == 40 for t in report["tenants"])
    assert "Scored 12 of 200 held-out examples" in result.stdout
    assert "--max-lora-rank 32" in report["production"]["command"], "the tiny profile's r"
    assert report["production"]["command"] in result.stdout


def test_validation_loss_is_in_the_record_and_falls(
    tiny_run: tuple[Path, str], asset_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `validation.eval_steps` (40 on the tiny profile), from step 0 to the last: each tenant's loss
    on its held-out sample, folded into the loss chart's curve. The run's adapter is the one of lowest
    validation loss: the record says which step, and scoring the saved adapter on the same sample again
    gives that loss."""
    from cockpit.record.playback import Playback

    run_dir, _ = tiny_run
    vals = read_events(run_dir, "val_loss")
    max_steps = [e for e in read_events(run_dir, "step") if e["rank"] == 0][-1]["max_steps"]
    assert [e["step"] for e in vals] == sorted({*range(0, max_steps + 1, 40), max_steps})
    for e in vals:
        assert len(e["tenant_loss"]) == 5 and e["examples"] == 30 and e["split"] == "eval"
        assert e["loss"] == pytest.approx(statistics.fmean(e["tenant_loss"].values()), abs=1e-4)
    assert vals[-1]["loss"] < 0.5 * vals[0]["loss"], (vals[0]["loss"], vals[-1]["loss"])
    pb = Playback(run_dir, live=False)
    pb.load()
    pb.command("end")
    pb.tick()
    assert len(pb.series.val_loss) == len(vals) and len(pb.series.val_tenant_loss) == 5

    # The best adapter: every new lowest loss after step 0 was kept, the lowest is the run's adapter.
    trained = [e for e in vals if e["step"] > 0]
    lowest = [e for i, e in enumerate(trained) if all(e["loss"] < d["loss"] for d in trained[:i])]
    kept = [e for e in read_events(run_dir, "best_adapter") if e["rank"] == 0]
    assert [(e["step"], e["val_loss"]) for e in kept] == [(e["step"], e["loss"]) for e in lowest]
    assert all((e["path"] is None) == (e["step"] == max_steps) for e in kept), "the last step's: no copy"
    (adapter,) = [e for e in read_events(run_dir, "adapter") if e["rank"] == 0]
    best = min(trained, key=lambda e: e["loss"])  # the first of equals
    assert (adapter["step"], adapter["val_loss"], adapter["last_step"]) == (
        best["step"],
        best["loss"],
        max_steps,
    )
    assert not (run_dir / "adapter-best").exists()
    assert (run_dir / "adapter-last").exists() == (best["step"] != max_steps)
    assert pb.view.adapter_words().startswith(f"step {best['step']}'s (validation loss {best['loss']:.4f}")
    monkeypatch.setenv("COCKPIT_CACHE", str(asset_cache))
    assert adapter_val_loss(run_dir, run_dir / "adapter") == pytest.approx(best["loss"], rel=1e-3)


def adapter_val_loss(run_dir: Path, adapter: Path) -> float:
    """The validation loss of `adapter` on the run's validation sample, as the trainer computes it, here
    in one process with no DeepSpeed (the evaluation's way of loading the base model)."""
    import torch
    from transformers import AutoTokenizer

    from cockpit.cache import cache_root
    from cockpit.profiles import parse_profile
    from trainer import model as model_mod
    from trainer.evaluation.evaluate import load_finetuned
    from trainer.evaluation.validation import group_sums, tenant_losses, validation_batches
    from trainer.inputs.assets import resolve_assets
    from trainer.inputs.data import prepare_data
    from trainer.inputs.packing import PackedCollator

    profile = parse_profile(load_manifest(run_dir)["profile"], "run.json")
    t, per_tenant = profile.training, profile.validation.examples_per_tenant
    model_dir, data_file = resolve_assets(profile)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prepared = prepare_data(
        tokenizer, data_file, profile.data, t.seq_len, per_tenant, cache_root() / "datasets"
    )
    tenants = list(dict.fromkeys(prepared.val_tenants))
    collator = PackedCollator(tokenizer.pad_token_id, doc_lens=t.attention == "varlen")
    groups = [tenants.index(name) for name in prepared.val_tenants]
    batches = validation_batches(prepared.val.rows, groups, t.seq_len, t.micro_batch_size, collator)
    base = model_mod.load_base(profile, model_dir, spread=True)
    chunked = bool(model_mod.configure_training(profile, base).get("chunked_loss"))
    totals = group_sums(load_finetuned(base, adapter), batches, len(tenants), torch.device("cpu"), chunked)
    return statistics.fmean(tenant_losses(totals, tenants).values())


def test_every_format_trains_on_the_run_s_very_rows(
    tiny_run: tuple[Path, str], asset_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One data set, four formats: the tiny tenants as Parquet, CSV and a save_to_disk folder give the rows
    the JSONL run trained on, in its order (so its first batch and first-step loss), up to the first batch."""
    from transformers import AutoTokenizer

    from cockpit.profiles import load_profile
    from tests.test_data_formats import write_formats
    from trainer.inputs import tiny
    from trainer.inputs.data import load_examples, prepare_data, rows_fingerprint
    from trainer.inputs.packing import PackedCollator, pack_rows

    run_dir, _ = tiny_run
    (data,) = read_events(run_dir, "data")
    (first, *_) = [e for e in read_events(run_dir, "step") if e["rank"] == 0]
    assert data["format"] == "jsonl" and data["tokenize_cache"] in ("built", "reused") and first["loss"] > 0
    monkeypatch.setenv("COCKPIT_CACHE", str(asset_cache))
    tokenizer = AutoTokenizer.from_pretrained(tiny.model_path(seed=0))
    profile, _ = load_profile("tiny-cpu")
    t = profile.training
    examples = load_examples(Path(data["source"]), profile.data).examples
    files = write_formats(examples, tmp_path / "formats")
    batches = {}
    for fmt in ("jsonl", "parquet", "csv", "arrow"):
        prepared = prepare_data(tokenizer, files[fmt], profile.data, t.seq_len, 0, tmp_path / "cache")
        rows = pack_rows(prepared.train.rows, t.seq_len, seed=t.seed)
        assert rows_fingerprint(rows) == data["rows_sha256"], fmt
        batches[fmt] = PackedCollator(tokenizer.pad_token_id, doc_lens=True)(rows[: t.micro_batch_size])
    for fmt, batch in batches.items():
        assert all(batch[k].equal(batches["jsonl"][k]) for k in ("input_ids", "labels", "position_ids")), fmt
