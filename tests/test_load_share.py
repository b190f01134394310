"""Each rank loads only its share (`trainer.weights.load_share`): who builds which unit, and on two CPU ranks
(gloo) the model loaded shared equals the model every rank built itself, byte for byte."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.faults import Watch, communicate_watched
from trainer.inputs import tiny
from trainer.weights.load_share import Share
from trainer.weights.loader import _unit_of

REPO = Path(__file__).resolve().parent.parent


def test_units_go_round_robin_in_rounds_of_one_a_rank():
    shares = [Share(rank, 3) for rank in range(3)]
    assert [list(r) for r in shares[0].rounds(8)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    for units in shares[0].rounds(8):  # each rank builds at most one unit a round
        assert sorted(shares[0].owner(u) for u in units) == list(range(len(units)))
    mine = [[u for u in range(8) if s.mine(u)] for s in shares]
    assert mine == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert Share(0, 1).mine(5) and list(Share(0, 1).rounds(2)) == [range(0, 1), range(1, 2)]


def test_checkpoint_tensors_belong_to_their_layer_or_the_rest():
    assert _unit_of("model.layers.12.mlp.experts.3.up_proj.weight", "model.layers", 40) == 12
    assert _unit_of("model.layers.0.input_layernorm.weight", "model.layers", 40) == 0
    assert _unit_of("model.embed_tokens.weight", "model.layers", 40) == 40
    assert _unit_of("lm_head.weight", "model.layers", 40) == 40
    assert _unit_of("model.layers_extra.1.weight", "model.layers", 40) == 40


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """tests/load_share_ranks.py on two CPU ranks: the tiny model loaded the old way and shared."""
    tmp = tmp_path_factory.mktemp("load-share")
    tiny.model_path(0)  # built (or found in the cache) once, before two ranks look for it
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    script = str(REPO / "tests" / "load_share_ranks.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outputs = [communicate_watched(p, Watch())[0] for p in procs]
    results = {r: tmp / f"result-rank{r}.json" for r in (0, 1)}
    assert all(p.is_file() for p in results.values()), "\n".join(o[-3000:] for o in outputs)
    return {r: json.loads(p.read_text()) for r, p in results.items()}


LOADS = ["plain", "zero3", "random"]  # no ZeRO; ZeRO-3; a rehearsal's 3 random layers under ZeRO-3


@pytest.mark.e2e  # two real ranks load the tiny model three ways: a minute on two cores
@pytest.mark.parametrize("load", LOADS)
def test_shared_load_equals_every_rank_loading_everything(two_ranks, load):
    layers = 3 if load == "random" else 4
    for rank, result in two_ranks.items():
        r = result[load]
        assert r["different"] == [], f"rank {rank}: {r['different'][:10]}"
        # What was compared: every parameter (or this rank's ZeRO-3 partition of it), buffer and the
        # bitsandbytes quantization state of every Linear4bit, 4 a layer (4 tensors each with double
        # quantization: scales, their scales, two code books).
        assert r["qstate_tensors"] == layers * 4 * 4 and r["tensors"] > r["qstate_tensors"]
        assert r["params"] > 0 and r["partitioned"] == (0 if load == "plain" else r["params"])
        old, new = r["old_facts"], r["new_facts"]
        for key in ("layers", "linear_4bit", "experts_nf4", "experts_16bit", "unused_checkpoint_tensors"):
            assert old[key] == new[key], key  # the model-wide facts are the same
        assert "load_share" not in old


@pytest.mark.e2e
@pytest.mark.parametrize("load", LOADS)
def test_each_rank_reads_and_quantizes_only_its_share(two_ranks, load):
    facts = {rank: result[load]["new_facts"] for rank, result in two_ranks.items()}
    old = {rank: result[load]["old_facts"] for rank, result in two_ranks.items()}
    total = old[0]["checkpoint_tensors_read"]
    assert old[1]["checkpoint_tensors_read"] == total  # the old way: every rank reads everything
    shares = {rank: f["load_share"] for rank, f in facts.items()}
    mine = {0: [0, 2], 1: [1, 3]} if load != "random" else {0: [0, 2], 1: [1]}
    assert {rank: s["layers"] for rank, s in shares.items()} == mine
    # The rest (embeddings, norm, head) is unit 4 (rank 0) of 4 layers, unit 3 (rank 1) of 3.
    assert [s["rest"] for s in shares.values()] == ([True, False] if load != "random" else [False, True])
    read = [f["checkpoint_tensors_read"] for f in facts.values()]
    assert sum(read) == total and all(0 < n < total for n in read)  # disjoint shares, nothing twice
    for key in ("linear_4bit", "experts_nf4"):
        per_layer = old[0][key] // old[0]["layers"]
        assert [s[key] for s in shares.values()] == [per_layer * len(mine[r]) for r in (0, 1)]


@pytest.mark.e2e
def test_each_rank_caches_its_units_and_reads_them_back(two_ranks):
    """The NF4 cache on two ranks: each writes the units it built, the next load reads them from there,
    and the model is the same, byte for byte, as when every rank built everything."""
    mine = {0: 3, 1: 2}  # layers 0 and 2 and the rest; layers 1 and 3
    for rank, result in two_ranks.items():
        r = result["cached"]
        assert r["different"] == [], f"rank {rank}: {r['different'][:10]}"
        first, second = r["first_facts"], r["second_facts"]
        assert first["weights"] == "checkpoint" and first["nf4_cache"]["units_written"] == mine[rank]
        assert second["weights"] == "nf4-cache" and second["nf4_cache"]["units_read"] == mine[rank]
        assert second["checkpoint_tensors_read"] == 0 and second["nf4_cache"]["units_written"] == 0
        assert first["nf4_cache"]["path"] == second["nf4_cache"]["path"]
