"""The training process: profile in (from the run's `run.json`), run record out.

Launched once per rank by `python -m deepspeed.launcher.runner ... --module trainer --run-dir DIR` (each
rank under its guard, `cockpit.service.guard`). Runs the recipe (`trainer.recipe`), or with
`--rehearse-layers` one rehearsal depth (`trainer.rehearsal`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.recipe import Recipe
from trainer.rehearsal import Depth, Rehearsal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="the run directory (holds run.json)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument(
        "--rehearse-layers", type=int, help="a rehearsal: the architecture sliced to N layers, random weights"
    )
    parser.add_argument("--rehearse-steps", type=int, default=6, help="steps of a rehearsal depth")
    parser.add_argument(
        "--step-offset", type=int, default=0, help="steps of the rehearsal depths before this one"
    )
    parser.add_argument(
        "--rehearse-eval-tokens",
        type=int,
        default=0,
        help="a rehearsal depth: time evaluation on the slice after its steps, thinking N tokens (0: not)",
    )
    args, _unknown = parser.parse_known_args(argv)  # the launcher may append --local_rank
    if args.rehearse_layers is None:
        recipe = Recipe(args.run_dir, args.resume)
    else:
        depth = Depth(args.rehearse_layers, args.rehearse_steps, args.step_offset, args.rehearse_eval_tokens)
        recipe = Rehearsal(args.run_dir, args.resume, depth)
    return recipe.run()


if __name__ == "__main__":
    sys.exit(main())
