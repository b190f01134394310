"""The NF4 cache (`trainer/weights/nf4_cache.py`, `cockpit/model_cache.py`): the tiny model's checkpoint
loaded twice, the second load from the cache with the same bytes and the same loss; what is refused (stale,
foreign, damaged, misfitting) and rebuilt; a full disk; listing and clearing through the CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from cockpit import cli, model_cache
from cockpit.profiles import load_profile
from cockpit.units import size
from trainer.weights import nf4_cache
from trainer.weights.loader import load_layerwise

CPU = torch.device("cpu")
UNITS = 5  # the tiny model's 4 decoder layers and the rest


@pytest.fixture
def model(tiny_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the tiny model (a test may change its shard) and an empty cache folder."""
    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path / "cache"))
    return Path(shutil.copytree(tiny_dir, tmp_path / "model"))


def load(model_dir: Path, *sets: str, **kwargs: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    profile, _ = load_profile("tiny-cpu", list(sets))
    return load_layerwise(profile, str(model_dir), CPU, None, **kwargs)


def contents(model: torch.nn.Module) -> dict[str, Any]:
    """Every parameter and buffer as bytes, each module's type and bitsandbytes' quantization state."""
    out: dict[str, Any] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        out[name] = (t.dtype, tuple(t.shape), t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())
    for name, m in model.named_modules():
        out[f"module {name}"] = type(m).__name__
        state = getattr(getattr(m, "weight", None), "quant_state", None)
        for key, value in (state.as_dict() if state is not None else {}).items():
            out[f"qstate {name}.{key}"] = value.tolist() if isinstance(value, torch.Tensor) else value
    return out


def loss(model: torch.nn.Module) -> torch.Tensor:
    """The loss of one forward on a fixed batch."""
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss


def caches() -> list[model_cache.CacheInfo]:
    return model_cache.list_caches()


def test_the_second_load_reads_the_cache_and_holds_the_same_bytes(model: Path) -> None:
    first, facts1 = load(model)
    assert facts1["weights"] == "checkpoint" and facts1["checkpoint_tensors_read"] > 0
    assert facts1["nf4_cache"]["units_written"] == UNITS and facts1["nf4_cache"]["units_read"] == 0
    second, facts2 = load(model)
    cache = facts2["nf4_cache"]
    assert facts2["weights"] == "nf4-cache" and facts2["checkpoint_tensors_read"] == 0
    assert cache["units_read"] == UNITS and cache["units_written"] == 0 and "refused" not in cache
    folder = Path(cache["path"])
    assert cache["bytes_read"] == sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    assert cache["bytes_read"] * 4 < (model / "model.safetensors").stat().st_size  # a quarter, or less
    for key in ("linear_4bit", "experts_nf4", "experts_16bit", "unused_checkpoint_tensors"):
        assert facts2[key] == facts1[key], key
    assert contents(second) == contents(first)
    assert torch.equal(loss(second), loss(first))


def test_a_changed_shard_makes_the_cache_stale_refused_removed_and_rebuilt(model: Path) -> None:
    load(model)
    (old,) = caches()
    shard = model / "model.safetensors"
    info = shard.stat()
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))  # rewritten: another mtime
    assert caches()[0].problem == "stale: shard model.safetensors changed mtime"
    _, facts = load(model)
    (reason,) = facts["nf4_cache"]["refused"]
    assert reason.startswith(f"stale: shard model.safetensors changed mtime since cache {old.key} was made")
    assert facts["weights"] == "checkpoint" and facts["nf4_cache"]["units_written"] == UNITS
    (new,) = caches()  # the stale one removed
    assert new.key != old.key and new.problem == "" and new.done == UNITS
    assert load(model)[1]["weights"] == "nf4-cache"


def test_other_settings_make_another_cache_and_a_foreign_unit_is_refused(model: Path) -> None:
    first, _ = load(model)
    _, facts = load(model, 'quantization.quant_type="fp4"')
    assert facts["weights"] == "checkpoint" and facts["nf4_cache"]["units_written"] == UNITS
    (other,) = facts["nf4_cache"]["others"]
    assert "made with quant_type nf4" in other
    both = {c.settings["quant_type"]: c for c in caches()}
    assert set(both) == {"nf4", "fp4"} and both["nf4"].key != both["fp4"].key
    # a unit file of the fp4 cache put in the nf4 cache's place
    name = model_cache.unit_name(0, 4)
    shutil.copy(both["fp4"].folder / name, both["nf4"].folder / name)
    second, facts = load(model)
    assert facts["nf4_cache"]["refused"] == [f"{name}: foreign: made with quant_type fp4"]
    assert facts["nf4_cache"]["units_read"] == UNITS - 1 and facts["nf4_cache"]["units_written"] == 1
    assert contents(second) == contents(first)


def test_a_truncated_or_misplaced_unit_is_refused_and_rebuilt(model: Path) -> None:
    first, _ = load(model)
    folder = caches()[0].folder
    unit = folder / model_cache.unit_name(1, 4)
    with unit.open("r+b") as f:
        f.truncate(unit.stat().st_size // 2)  # a crash mid-write would leave no such file: a damaged disk
    shutil.copy(folder / model_cache.REST, folder / model_cache.unit_name(2, 4))
    second, facts = load(model)
    truncated, misplaced = facts["nf4_cache"]["refused"]
    assert truncated.startswith("layer-00001.safetensors unreadable (SafetensorError:")
    assert misplaced == "layer-00002.safetensors: holds unit 4, not 2"
    assert facts["nf4_cache"]["units_read"] == UNITS - 2 and facts["nf4_cache"]["units_written"] == 2
    assert contents(second) == contents(first)
    assert load(model)[1]["weights"] == "nf4-cache"  # rebuilt


def test_a_killed_writer_s_half_written_unit_is_removed(model: Path) -> None:
    """A rank killed while it wrote a unit leaves its temporary file; the next load on this host removes
    it where its writer is gone, and leaves a live writer's and another host's alone."""
    import socket

    load(model)
    folder = caches()[0].folder
    host = socket.gethostname()
    dead = folder / f".layer-00001.safetensors.{host}.{2**22 + 12345}.tmp"  # past any pid of this host
    alive = folder / f".layer-00002.safetensors.{host}.{os.getpid()}.tmp"
    other = folder / ".layer-00003.safetensors.another-host.1.tmp"
    for tmp in (dead, alive, other):
        tmp.write_bytes(b"half a unit")
    load(model)
    assert not dead.exists() and alive.exists() and other.exists()


def test_a_unit_that_does_not_fit_the_model_is_refused(model: Path) -> None:
    """The model changed under a unit file of the right key (another transformers): nothing is
    half-made, the unit comes from the checkpoint."""
    first, _ = load(model)
    layer = first.model.layers[0]
    manifest = nf4_cache.manifest_of(layer, CPU)
    assert nf4_cache.manifest_from_text(nf4_cache.manifest_text(manifest)) == manifest
    with torch.device("meta"):
        fresh = type(first)(first.config)
    assert nf4_cache.misfit(fresh.model.layers[0], manifest) is None
    assert nf4_cache.misfit(fresh.model.layers[0].mlp, manifest).startswith("the model has no")
    assert nf4_cache.misfit(fresh, manifest) is not None


def test_a_full_disk_skips_writing_with_its_reason(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nf4_cache, "MARGIN_BYTES", 2**62)
    _, facts = load(model)
    reason = facts["nf4_cache"]["not_written"]
    assert reason.startswith("not written from layer-00000.safetensors on: ") and "stay free" in reason
    assert facts["nf4_cache"]["units_written"] == 0 and caches()[0].done == 0
    assert facts["weights"] == "checkpoint"


def test_off_in_the_profile_and_never_for_random_weights(model: Path) -> None:
    _, facts = load(model, "quantization.cache=false")
    assert facts["nf4_cache"] == {"off": "quantization.cache = false"}
    _, facts = load(model, random_layers=2)
    assert facts["weights"] == "random" and "nf4_cache" not in facts
    assert caches() == []


def test_the_fingerprint_names_hub_blobs_and_says_what_changed(tmp_path: Path) -> None:
    sha = "ab" * 32
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    header = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (blobs / sha).write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    (snapshot / "model.safetensors").symlink_to(blobs / sha)
    assert model_cache.fingerprint(snapshot) == {"model.safetensors": {"sha256": sha}}
    local = tmp_path / "local"
    local.mkdir()
    shutil.copy(blobs / sha, local / "model.safetensors")
    before = model_cache.fingerprint(local)
    assert set(before["model.safetensors"]) == {"size", "mtime_ns", "header_sha256"}
    with (local / "model.safetensors").open("ab") as f:
        f.write(b"more")
    assert model_cache.changes(before, model_cache.fingerprint(local)) == (
        "shard model.safetensors changed size/mtime"
    )
    assert model_cache.changes(before, {}) == "model.safetensors is gone"


def test_caches_no_load_here_would_read_are_listed_as_such_and_cleared_as_stale(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load(model)
    (info,) = caches()
    manifest = json.loads((info.folder / model_cache.MANIFEST).read_text())
    manifest["settings"]["bitsandbytes"] = "0.0.1"  # another environment's
    (info.folder / model_cache.MANIFEST).write_text(json.dumps(manifest))
    here = model_cache.bitsandbytes_version()
    assert caches()[0].problem == f"made with bitsandbytes 0.0.1, {here} here"
    capsys.readouterr()
    assert cli.main(["ls", "--caches"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(f"(made with bitsandbytes 0.0.1, {here} here)")
    assert cli.main(["ls", "--clear-cache", "stale"]) == 0 and caches() == []
    assert capsys.readouterr().out.splitlines()[-1] == f"removed 1 NF4 cache, {size(info.bytes)} freed"


def test_ls_and_doctor_list_and_clear_caches(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    load(model)
    load(model, 'quantization.quant_type="fp4"')
    capsys.readouterr()
    assert cli.main(["ls", "--caches"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = caches()
    assert len(lines) == 3 and lines[-1] == model_cache.summary(listed)
    total = sum(c.bytes for c in listed)
    assert size(total) in lines[-1] and all(f"5/5 units  {size(c.bytes)}" in "".join(lines) for c in listed)
    assert {line.split()[0] for line in lines[:2]} == {c.key for c in listed}
    fp4 = next(c for c in listed if c.settings["quant_type"] == "fp4")
    assert cli.main(["ls", "--clear-cache", fp4.key[:6]]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"removed 1 NF4 cache, {size(fp4.bytes)} freed"
    assert [c.settings["quant_type"] for c in caches()] == ["nf4"]
    assert cli.main(["ls", "--clear-cache", "nope"]) == 2
    assert "'nope': no NF4 cache of that key" in capsys.readouterr().err
    # the doctor shows them (one line each under its own), and clears them
    runs = ["--runs-dir", str(model.parent / "runs")]
    assert cli.main(["doctor", "--format", "json", *runs]) in (0, 1)
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "NF4 cache"]
    assert check["reason"].startswith("1 NF4 cache, ") and len(check["facts"]["lines"]) == 1
    assert cli.main(["doctor", "--clear-cache", *runs]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith("removed ") and f"ok   NF4 cache: no NF4 cache in {model_cache.caches_dir()}" in out
    assert caches() == []


@pytest.mark.e2e  # the load benchmark, two real loads of a checkpoint on disk
def test_the_benchmark_runs_on_the_cpu(
    tiny_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/load_cache.py on the tiny profile: a checkpoint on disk loaded twice, the second time
    from the cache, with the same losses."""
    from benchmarks import load_cache

    monkeypatch.setenv("COCKPIT_CACHE", str(Path(tiny_dir).parent))  # the tiny model's config from there
    out = tmp_path / "results"
    args = [
        "--profile",
        "tiny-cpu",
        "--layers",
        "2",
        "--steps",
        "2",
        "--dir",
        str(tmp_path / "w"),
        "--out",
        str(out),
    ]
    assert load_cache.main(args) == 0
    result = json.loads((out / "load_cache_cpu.json").read_text())
    first, second = result["rows"]
    assert first["weights"] == "checkpoint" and first["units_written"] == 3 and first["units_read"] == 0
    assert (
        second["weights"] == "nf4-cache"
        and second["units_read"] == 3
        and second["checkpoint_tensors_read"] == 0
    )
    assert second["cache_bytes_read"] == first["cache_bytes_written"] > 0
    assert len(first["losses"]) == 2 and first["losses"] == second["losses"] and result["same_losses"]
    assert "| second: the cache |" in (out / "load_cache_cpu.md").read_text()
    assert not (tmp_path / "w" / "checkpoint").exists()  # removed without --keep
