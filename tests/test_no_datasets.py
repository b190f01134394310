"""The GPU machine that runs the speed benchmarks has no `datasets` (nor pyarrow): the trainer's modules
and its random-token path (a rehearsal of the story's model, as `benchmarks/step_speed.py` runs it, or of
the tiny profile, whose data is there but cannot be read without `datasets`) must never import them.
`datasets` is imported only where a data file is read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from devtools.faults import Watch, env_for, run_watched

# Run first in a fresh interpreter: `datasets` and `pyarrow` cannot be found or imported, as on a machine
# where they are not installed (Transformers then never asks for them either).
BLOCK = """
import importlib.util, sys
BLOCKED = ("datasets", "pyarrow")
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):
    return None if name.split(".")[0] in BLOCKED else _find_spec(name, package)
importlib.util.find_spec = find_spec
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on this machine)")
        return None
sys.meta_path.insert(0, Block())
"""

REHEARSAL = """
from pathlib import Path
try:
    import datasets  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the block did not hold")
import trainer.__main__, trainer.inputs.data, trainer.evaluation.validation, trainer.callbacks
import trainer.model, trainer.layers.loss
import trainer.evaluation.eval_timing, trainer.evaluation.evaluate  # a rehearsal depth times evaluation too
from transformers import Trainer  # noqa: F401
from cockpit.plan.run_length import data_size
from cockpit.profiles import load_profile
from cockpit.record import EventWriter
from trainer.rehearsal import Depth, Rehearsal

profile, _ = load_profile("qwen3-235b-a22b-thinking-4xh100")
recipe = Rehearsal.__new__(Rehearsal)  # the record-free part of a rehearsal depth's setup
recipe.profile, recipe.depth, recipe.rank, recipe.prepared = profile, Depth(1, 6), 0, None
recipe.events = EventWriter(Path(sys.argv[1]) / "events.jsonl", rank=0)
rows, _tokenizer = recipe.train_rows(recipe.model_dir(), None)
assert rows
assert data_size(profile) is not None  # the plan's count from the profile's assumption
# The tiny profile's rehearsal has its data and tokenizer here, but no `datasets`: random tokens too.
tiny, _ = load_profile("tiny-cpu")
recipe.profile = tiny
rows, tokenizer = recipe.train_rows(recipe.model_dir(), None)
assert rows and tokenizer is not None
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("datasets", "pyarrow"))
assert not loaded, loaded
print("ok", len(rows))
"""


@pytest.mark.e2e  # a real rehearsal run
def test_the_random_token_rehearsal_needs_no_datasets(tmp_path: Path, asset_cache: Path) -> None:
    done = run_watched(
        [sys.executable, "-c", BLOCK + "import sys\n" + REHEARSAL, str(tmp_path)],
        Watch(record=tmp_path),
        env=env_for(asset_cache),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("ok"), done.stdout
    sources = [e["source"] for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())]
    assert len(sources) == 2 and all(s.startswith("random tokens") for s in sources), sources


def test_reading_a_data_file_says_datasets_is_missing(tmp_path: Path, asset_cache: Path) -> None:
    """The block is real: reading a file without `datasets` fails (and `cockpit plan` counts nothing)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"user": "u", "gold": "g"}\n')
    script = BLOCK + (
        "import sys\nfrom pathlib import Path\nfrom cockpit.data import read_table\n"
        "try:\n    read_table(Path(sys.argv[1]))\nexcept ModuleNotFoundError:\n    print('missing')\n"
    )
    done = run_watched([sys.executable, "-c", script, str(data)], Watch(), env=env_for(asset_cache))
    assert done.stdout.strip() == "missing", done.stderr[-2000:]
