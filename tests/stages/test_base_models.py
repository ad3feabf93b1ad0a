"""The base-model stage: a due build runs in a Ray task with `resources.base_models`, torch pinned to its thread
count, so it gives the same weights as a build in the driver (`flywheel models build`); cached ones are only read.
Small builds of the real base LLaVA (seconds), in a real Ray of 1 CPU."""

import hashlib
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

from flywheel.config import REPO_ROOT, load_config
from flywheel.models.zoo import build_world
from flywheel.stages import base_models

SMALL = ["models.judge.path=zoo:judge", "models.generator.path=zoo:generator",  # only the LLaVA is built
         "world.base_policies.policy.steps=6", "world.base_policies.policy.batch_size=4",
         "world.base_policies.policy.warmup_steps=0", "world.base_policies.eval_items=10",
         "world.base_policies.policy_vision.steps=2", "world.base_policies.policy_vision.batch_size=4",
         "world.base_policies.policy_vision.eval_images=4", "world.base_policies.policy_lookup.steps=2"]


@pytest.fixture(scope="module")
def one_cpu_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    yield
    ray.shutdown()


def _cfg(workdir: Path, *more: str):
    return load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={workdir}", *SMALL, *more])


def _weights(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        tensors = load_file(str(f))
        for k in sorted(tensors):
            h.update(k.encode() + tensors[k].float().numpy().tobytes())
    return h.hexdigest()


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith("seconds")}


def test_a_due_build_runs_in_a_ray_task_and_matches_a_build_in_the_driver(one_cpu_ray, tmp_path, monkeypatch):
    asked = []
    real_remote = ray.remote

    def spy(fn):  # the real task runs; only its options are recorded
        remote = real_remote(fn)
        return type("Spy", (), {"options": lambda self, **o: asked.append(o) or remote.options(**o)})()

    cfg = _cfg(tmp_path / "task")
    monkeypatch.setattr(base_models.ray, "remote", spy)
    built = base_models.run(cfg)
    assert list(built) == ["policy"]
    assert [o["num_cpus"] for o in asked] == [1]  # 2 asked, the largest node has 1: capped, not left waiting
    path, metrics = built["policy"]
    assert (path / ".complete").exists() and metrics["torch_threads"] == 2  # pinned, not the task's 1
    assert metrics["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # e.g. AVX512: kept

    assert base_models.run(cfg) == built and len(asked) == 1  # cached: read in the driver, no task

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a `ray job submit` driver runs (OMP_NUM_THREADS=1)
    try:
        here, here_metrics = build_world(_cfg(tmp_path / "driver"))["policy"]
        assert torch.get_num_threads() == 1  # restored after the build
    finally:
        torch.set_num_threads(threads)
    assert _untimed(here_metrics) == _untimed(metrics) and _weights(here) == _weights(path)

    three = build_world(_cfg(tmp_path / "three", "resources.base_models.num_cpus=3"))["policy"]
    assert three[1]["torch_threads"] == 3 and three[0].name == path.name  # the same folder name: same recipe


def test_nothing_due_starts_no_ray(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    from flywheel.models.zoo import world_path

    cached = world_path(cfg, "policy")
    cached.mkdir(parents=True)
    (cached / ".complete").write_text('{"sft_loss": 0.5}')
    monkeypatch.setattr(base_models, "init_ray", lambda cfg: pytest.fail("Ray started for a cached build"))
    assert base_models.run(cfg) == {"policy": (cached, {"sft_loss": 0.5})}


def test_the_models_stage_run_shows_what_each_base_is_and_how_it_was_built(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    experiment = MlflowClient(uri).create_experiment("base-models")  # not whichever experiment is active
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(experiment_id=experiment) as run:
            base_models.log_to_mlflow({"judge": (tmp_path / "judge-base-x", {
                "perception/accuracy": 0.93, "torch_threads": 2, "torch_cpu_capability": "AVX512",
                "undefined": float("nan")})})
    finally:
        mlflow.set_tracking_uri(None)
    got = MlflowClient(uri).get_run(run.info.run_id).data
    assert got.metrics == {"base.judge.perception/accuracy": 0.93, "base.judge.torch_threads": 2.0}
    assert got.tags["flywheel.base.judge"] == str(tmp_path / "judge-base-x")
    assert got.tags["flywheel.base.judge.torch_cpu_capability"] == "AVX512"
