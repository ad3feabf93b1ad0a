"""An iteration pins its start models and skips itself once finished; a resumed iteration reopens its MLflow run.
(The whole kill-and-resume run is tests/iteration/test_resume.py, marked slow.)"""

import json

import mlflow
import pytest
from mlflow import MlflowClient

from flywheel import gate, storage
from flywheel.config import load_config
from flywheel.iteration import run_iteration, start_record
from flywheel.iteration_record import IterationRecord
from flywheel.track import Tracker
from flywheel.train import registry


@pytest.fixture
def cfg(tmp_path):
    c = load_config(None, [f"run.workdir={tmp_path}"])
    Tracker(c)  # creates the experiment in the configured store
    return c


def _iteration_dir(cfg, n=0):
    return storage.join(cfg.storage.uri, "iterations", f"{n:03d}")


def _champion_judge(cfg):
    """A registered judge version made champion: what a finished iteration's gate leaves behind."""
    c = registry.client(cfg)
    c.create_registered_model("judge")
    with mlflow.start_run() as run:
        mlflow.log_text("weights would be here", "export/flywheel.json")
    mv = c.create_model_version("judge", source=f"{run.info.artifact_uri}/export", run_id=run.info.run_id)
    ref = registry.describe(mv)
    assert gate.decide(cfg, ref, 0.6, "acc", 0.0, baseline=("world:judge", 0.2)).promoted
    return ref


def test_a_new_iteration_starts_from_the_champions_and_a_resumed_one_from_its_pinned_start(cfg):
    fresh = start_record(cfg, 0)
    assert fresh.start == {"judge": "world:judge", "policy": "world:policy", "generator": "world:generator"}
    assert not fresh.finished and fresh.config_hash == cfg.hash()
    fresh.save(_iteration_dir(cfg))  # the iteration began ...
    champion = _champion_judge(cfg)  # ... and its judge gate promoted its own judge before the driver died
    assert start_record(cfg, 1).start["judge"] == champion  # the next iteration starts from it
    assert start_record(cfg, 0).start["judge"] == "world:judge"  # the resumed one still from what it began with


def test_a_finished_iteration_is_skipped_whole(cfg, caplog):
    IterationRecord(0, "another-config", {"judge": "world:judge", "policy": "p", "generator": "g"}, run_id="r0",
                    finished=True, decisions=[{"model": "judge", "promoted": True}]).save(_iteration_dir(cfg))
    with caplog.at_level("INFO"):
        res = run_iteration(cfg, 0)  # no Ray, no stage: it returns before anything runs
    assert res.skipped and res.run_id == "r0" and res.decisions == [{"model": "judge", "promoted": True}]
    assert res.models["judge_start"] == "world:judge"
    assert "finished earlier" in caplog.text and "--start 1" in caplog.text
    assert "finished with config another-config" in caplog.text  # a changed config is named, not silently run
    runs = MlflowClient(cfg.tracking.uri).search_runs([Tracker(cfg).experiment_id])
    assert runs == []


def test_a_finished_iteration_reports_its_stage_seconds_and_the_first_iteration_left_to_run(cfg, caplog):
    for n in (0, 1):
        IterationRecord(n, cfg.hash(), {"judge": "j", "policy": "p", "generator": "g"}, run_id=f"r{n}",
                        finished=True).save(_iteration_dir(cfg, n))
    storage.write_bytes(storage.join(_iteration_dir(cfg), "stage-seconds.json"),
                        json.dumps({"finished": {"judge-sft": 272.0}, "unfinished": {}}).encode())
    with caplog.at_level("INFO"):
        res = run_iteration(cfg, 0)
    assert res.skipped and res.seconds == {"judge-sft": 272.0}
    assert "The next one to run is --start 2" in caplog.text  # iteration 1 finished too


def test_an_unreadable_record_names_its_file(cfg):
    storage.write_bytes(IterationRecord.uri(_iteration_dir(cfg)), b'{"iteration": 0, "star')
    with pytest.raises(ValueError, match=r"iterations/000/iteration.json: unreadable iteration record"):
        start_record(cfg, 0)


def test_a_resumed_iteration_reopens_its_run_and_ends_the_killed_stage_runs(cfg):
    tracker = Tracker(cfg)
    client = MlflowClient(cfg.tracking.uri)
    with tracker.iteration(0) as first:
        with tracker.stage("prompts"):
            pass
    killed = client.create_run(tracker.experiment_id, run_name="labels",  # left RUNNING by a killed driver
                               tags={"mlflow.parentRunId": first.info.run_id}).info.run_id
    with tracker.iteration(0, resume_run_id=first.info.run_id) as again:
        with tracker.stage("labels"):
            mlflow.log_metric("rows_out", 3)
    assert again.info.run_id == first.info.run_id
    assert client.get_run(killed).info.status == "KILLED"
    assert client.get_run(first.info.run_id).info.status == "FINISHED"
    children = client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{first.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == ["labels", "labels", "prompts"]

    # with another config its params cannot be rewritten: a new run that names the one it resumes
    other = load_config(None, [f"run.workdir={cfg.run.workdir}", "train.lr=3e-4"])
    with Tracker(other).iteration(0, resume_run_id=first.info.run_id) as new:
        pass
    assert new.info.run_id != first.info.run_id
    assert client.get_run(new.info.run_id).data.tags["flywheel.resumes_run"] == first.info.run_id
