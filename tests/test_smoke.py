"""The main job at this stage: tiny models built, each engine run once inside Ray, everything in MLflow."""

import ray
from mlflow import MlflowClient

from flywheel.smoke import run_smoke, sample_photo


def test_sample_photo_is_square_at_the_zoo_size():
    img = sample_photo(56)
    assert img.size == (56, 56) and img.mode == "RGB"
    assert len(set(img.get_flattened_data())) > 100  # a real photo, not a flat fill


def test_smoke_runs_every_engine_and_logs_outputs(cfg, zoo):
    try:
        result = run_smoke(cfg)
    finally:
        ray.shutdown()
    assert set(result.outputs) == {"judge", "policy", "generator"}
    assert not any(v.startswith("ERROR") for v in result.outputs.values()), result.outputs

    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    parent = client.get_run(result.run_id)
    assert parent.data.tags["flywheel.kind"] == "engine-smoke"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result.run_id}'"
    )
    by_stage = {r.data.tags["flywheel.stage"]: r for r in children}
    assert set(by_stage) == {"judge-engine", "policy-engine", "generator-engine"}
    for stage in ("judge-engine", "policy-engine"):
        run = by_stage[stage]
        arts = {a.path for a in client.list_artifacts(run.info.run_id, "output")}
        assert arts == {"output/answer.txt"}
        assert run.data.tags["flywheel.producer"].startswith("hf:")
        assert run.data.metrics["seconds"] > 0
    gen_arts = {a.path for a in client.list_artifacts(by_stage["generator-engine"].info.run_id, "output")}
    assert gen_arts == {"output/image.png"}
