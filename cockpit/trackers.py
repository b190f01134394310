"""`training.report_to`: the HF Trainer's trackers a run also reports to, and whether each can run here.

The names are the Trainer's (`transformers.integrations.INTEGRATION_TO_CALLBACK`); a plain string is taken
as the Trainer takes it ("none": no tracker, any other name: a list of one). A tracker whose package is
missing fails in the Trainer's constructor, after the model has loaded: `tracker_problems` asks the
Trainer's own availability checks before anything starts (`cockpit.profiles.check_runnable`, which `run`
and `doctor` call). Transformers is imported only when a tracker is named.
"""

from __future__ import annotations

import logging
import warnings
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

Tracker = Literal[
    "all", "azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub", "dvclive", "flyte", "kubeflow",
    "mlflow", "neptune", "swanlab", "tensorboard", "trackio", "wandb",
]  # fmt: skip

# Each tracker: the Trainer's check that it can run (in transformers.integrations.integration_utils),
# and what it needs when it cannot.
AVAILABLE: dict[str, tuple[str, str]] = {
    "azure_ml": ("is_azureml_available", "the `azureml-core` package"),
    "clearml": ("is_clearml_available", "the `clearml` package"),
    "codecarbon": ("is_codecarbon_available", "the `codecarbon` package"),
    "comet_ml": ("is_comet_available", "the `comet-ml` package (recent enough) and COMET_API_KEY"),
    "dagshub": ("is_dagshub_available", "the `dagshub` and `mlflow` packages"),
    "dvclive": ("is_dvclive_available", "the `dvclive` package"),
    "flyte": ("is_flytekit_available", "the `flytekit` package"),
    "kubeflow": ("is_kubeflow_available", "KUBEFLOW_TRAINER_SERVER_URL (set inside a Kubeflow TrainJob)"),
    "mlflow": ("is_mlflow_available", "the `mlflow` package (and DISABLE_MLFLOW_INTEGRATION unset)"),
    "neptune": ("is_neptune_available", "the `neptune` package"),
    "swanlab": ("is_swanlab_available", "the `swanlab` package"),
    "tensorboard": ("is_tensorboard_available", "the `tensorboard` package"),
    "trackio": ("is_trackio_available", "the `trackio` package"),
    "wandb": ("is_wandb_available", "the `wandb` package"),
}


def as_list(value: Any) -> Any:
    """`report_to` as the Trainer reads it: "none" (alone or in a list) is none, a name a list of one."""
    if isinstance(value, str):
        value = [] if value == "none" else [value]
    if value == ["none"]:
        return []
    return value


Trackers = Annotated[list[Tracker], BeforeValidator(as_list)]


def tracker_problems(report_to: list[str]) -> list[str]:
    """One problem for each tracker the Trainer could not start here (`all` takes those installed)."""
    named = [name for name in report_to if name in AVAILABLE]
    if not named:
        return []
    logging.disable(logging.WARNING)  # the libraries transformers loads talk as they import (bitsandbytes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers.integrations import integration_utils
    finally:
        logging.disable(logging.NOTSET)
    missing = [name for name in named if not getattr(integration_utils, AVAILABLE[name][0])()]
    return [
        f"training.report_to: {name} needs {AVAILABLE[name][1]}, not here (install it, or leave {name} out)"
        for name in missing
    ]
