"""A model registered in MLflow the way the training plane registers its exports, for tests that serve or rank with
a registered version (`models:/<name>/<version>`)."""
from __future__ import annotations

import json
import os
import shutil

import mlflow

from flywheel.config import Config
from flywheel.track import Tracker
from flywheel.train import registry


def register_judge(cfg: Config, judge_dir: str, alias: str | None = "champion", tag: str = "export") -> str:
    """Register the judge folder `judge_dir` as a new version of cfg.train.registry.judge (as judge_sft's export)
    and point `alias` at it; returns `models:/<name>/<version>`."""
    export = os.path.join(cfg.run.workdir, f"{tag}-export")
    shutil.rmtree(export, ignore_errors=True)
    shutil.copytree(judge_dir, os.path.join(export, "model"), ignore=shutil.ignore_patterns(".*"))
    with open(os.path.join(export, "flywheel.json"), "w") as f:
        json.dump({"training": "judge_sft", "base": "zoo:judge"}, f)
    with mlflow.start_run(experiment_id=Tracker(cfg).experiment_id, run_name=f"{tag}-register") as run:
        mv = registry.register(cfg, "judge_sft", export, run.info.run_id, {"flywheel.training": "judge_sft"})
    if alias:
        registry.client(cfg).set_registered_model_alias(mv.name, alias, mv.version)
    return registry.describe(mv)
