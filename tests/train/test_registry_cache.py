"""A registered version's local copy belongs to that version of THIS registry (a real sqlite MLflow registry)."""

import json
import shutil

import mlflow
import pytest

from flywheel.config import load_config
from flywheel.track import Tracker
from flywheel.train import registry


def _register(cfg, data: str) -> str:
    """A version whose export names its training data (as a training's flywheel.json does)."""
    c = registry.client(cfg)
    try:
        c.create_registered_model("judge")
    except Exception:  # noqa: BLE001 - already there
        pass
    with mlflow.start_run() as run:
        mlflow.log_text(json.dumps({"training": "judge_sft", "data": data}), "export/flywheel.json")
    mv = c.create_model_version("judge", source=f"{run.info.artifact_uri}/export", run_id=run.info.run_id)
    return registry.describe(mv)


@pytest.fixture
def workdir_cfg(tmp_path):
    def make(name: str):
        cfg = load_config(None, [f"run.workdir={tmp_path / name}"])
        Tracker(cfg)  # creates the experiment in the workdir's own store
        mlflow.set_tracking_uri(cfg.tracking.uri)
        return cfg
    return make


def test_a_version_is_downloaded_once_and_read_from_its_copy(workdir_cfg):
    cfg = workdir_cfg("a")
    uri = _register(cfg, "a/sft")
    first = registry.materialize(cfg, uri)
    assert registry.export_meta(first)["data"] == "a/sft"
    assert registry.materialize(cfg, uri) == first  # the copy, not a second download


def test_a_copy_seeded_from_another_workdirs_registry_is_never_taken_for_this_ones(workdir_cfg):
    # workdir a registers and materializes its judge 1; workdir b is seeded with a's registry/ folder (as one
    # seeds a run's base checkpoints), then registers its own judge 1: the same name and number, another model
    a = workdir_cfg("a")
    registry.materialize(a, _register(a, "a/sft"))
    b = workdir_cfg("b")
    shutil.copytree(f"{a.run.workdir}/registry", f"{b.run.workdir}/registry")
    uri = _register(b, "b/sft")
    assert uri == "models:/judge/1"
    assert registry.export_meta(registry.materialize(b, uri))["data"] == "b/sft"
