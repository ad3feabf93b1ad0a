"""The jobs/ entrypoints under `ray job submit --working-dir . -- python jobs/<job>.py ...` against a real local
cluster with token auth: what they write to MLflow, and that the cluster refuses requests without the token."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from labeled_sets import pair, png_b64, point, write_jsonl
from tiny_iteration import TINY

from flywheel.raycluster import free_port


pytestmark = pytest.mark.cluster

JUDGE_STAGES = {"models", "prompts", "gold", "candidates", "labels", "curate-judge", "judge-sft", "meta-eval",
                "gate-judge"}
POLICY_STAGES = {"preference-prompts", "preference-candidates", "preference-labels", "curate-policy"}


def _get(url: str, token: str | None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_cluster_refuses_the_jobs_api_without_its_token(local_ray_cluster):
    url = local_ray_cluster.dashboard_url + "/api/jobs/"
    assert _get(url, None) == 401
    assert _get(url, "not-the-token") in (401, 403)
    assert _get(url, local_ray_cluster.token) == 200
    # and the token is this cluster's own, not the user-wide default other people's clusters read
    default = Path.home() / ".ray" / "auth_token"
    assert not default.exists() or default.read_text().strip() != local_ray_cluster.token


@pytest.fixture(scope="module")
def tiny_iteration_job(local_ray_cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("iteration-job")
    db = work / "tracking" / "mlflow.db"  # not the workdir default: the test names where MLflow must go
    log = work / "submit.log"
    # serve.port: 8000 may be someone else's; a Serve proxy of another Ray there shares it (SO_REUSEPORT) and answers
    # 404 for this job's routes (2026-12-01, with tests running beside this one)
    sid, status = local_ray_cluster.submit(["jobs/iteration.py", "--config", "configs/local.yaml",
                                             f"run.workdir={work}", f"tracking.uri=sqlite:///{db}", *TINY,
                                             f"serve.port={free_port()}"], log, timeout=900)
    return {"work": work, "db": db, "sid": sid, "status": status, "log": log}


def test_iteration_job_records_an_iteration_with_its_stages_in_mlflow(local_ray_cluster, tiny_iteration_job):
    j = tiny_iteration_job
    assert j["status"] == "SUCCEEDED", j["log"].read_text()[-4000:]
    details = local_ray_cluster.client().get_job_info(j["sid"])
    assert details.entrypoint.startswith("python jobs/iteration.py --config configs/local.yaml")
    text = j["log"].read_text()
    # the driver joined this cluster (its GCS, on whichever address of this host), not an embedded Ray of its own
    gcs_port = local_ray_cluster.gcs_address.rsplit(":", 1)[1]
    assert re.search(rf"ray: [\w.:-]+:{gcs_port} \(2\.0 CPUs", text), text[-3000:]
    assert "ray: embedded" not in text
    # every worker process of the job shows our INFO progress (worker_logging, merged into the job's runtime_env)
    assert re.search(r"RayTrainWorker pid=\d+\)\S* INFO flywheel\.train", text), text[-3000:]
    assert re.search(r"ServeReplica:\S+ pid=\d+\)\S* INFO flywheel\.serve\.app: judge replica", text), text[-3000:]

    client = MlflowClient(tracking_uri=f"sqlite:///{j['db']}")
    exp = client.get_experiment_by_name("flywheel-local")
    assert exp is not None, "the job did not write to the tracking URI it was given"
    runs = client.search_runs([exp.experiment_id], max_results=500)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["flywheel.iteration"] == "0" and parent.info.run_name == "iteration-0"
    assert parent.info.status == "FINISHED"
    assert parent.data.params["run.workdir"] == str(j["work"])
    stages = {r.data.tags["flywheel.stage"]: r for r in runs if r.data.tags.get("mlflow.parentRunId")
              == parent.info.run_id and "flywheel.stage" in r.data.tags}
    assert JUDGE_STAGES <= set(stages), sorted(stages)
    assert all(r.info.status == "FINISHED" for r in stages.values()), {k: r.info.status for k, r in stages.items()}
    summary = mlflow.artifacts.load_dict(f"{parent.info.artifact_uri}/summary/summary.json")
    assert {k: r.data.metrics["stage.seconds_total"] for k, r in stages.items()} == pytest.approx(summary["seconds"])
    # the judge against its teacher pair by pair, recomputed from both meta-evals on storage: the pairs only one
    # of them orders right make up the difference of their accuracies on the same gold pairs
    metric = "all/pointwise_ranking/accuracy"
    for split in ("id-test", "ood-test"):
        vs, judge, teacher = (summary["vs_teacher"][split], summary["meta_eval"]["challenger"][split],
                              summary["meta_eval"]["teacher"][split])
        assert vs["metric"] == metric and vs["pairs"] == judge["all/pointwise_ranking/n"] > 0, vs
        assert judge[metric] - teacher[metric] == pytest.approx((vs["better"] - vs["worse"]) / vs["pairs"]), vs
    # datasets went under the workdir the job was given, not into the job's temporary copy of the project
    assert (j["work"] / "data" / "iterations" / "000" / "prompts").is_dir()


# In the default suite, beside the iteration it reuses (~25-45 s more): alone in the slow suite it paid for that
# iteration a second time (~190 s here, more in CI)
def test_eval_job_judges_a_labeled_set_with_the_judge_the_iteration_registered(local_ray_cluster,
                                                                              tiny_iteration_job, tmp_path):
    j = tiny_iteration_job
    assert j["status"] == "SUCCEEDED"
    prompt = {"task": "iu", "subtask": "iu_color", "query": "What colour is the square?", "images": [png_b64("red")]}
    data = write_jsonl(tmp_path / "labeled.jsonl", [point(prompt, "Red.", 5), point(prompt, "Blue.", 1),
                                                    pair(prompt, "Red.", "Blue.", "A")])
    log = tmp_path / "submit.log"
    _, status = local_ray_cluster.submit(["jobs/eval.py", "--data", str(data), "--judge", "models:/judge/1",
                                           "--config", "configs/local.yaml", f"run.workdir={j['work']}",
                                           f"tracking.uri=sqlite:///{j['db']}"], log, timeout=300)
    text = log.read_text()
    assert status == "SUCCEEDED", text[-4000:]
    assert "3 items (0 refused) judged by models:/judge/1" in text, text[-3000:]
    assert "pairwise" in text and "pointwise" in text


@pytest.mark.slow
@pytest.mark.fullrun  # it builds the base models first (~60 min): only `make test-all` runs it
def test_full_iteration_job_at_local_defaults(local_ray_cluster, tmp_path):
    """configs/local.yaml as `make run` uses it (over an hour here, most of it building the base models): every
    stage, each a FINISHED nested run."""
    db = tmp_path / "mlflow.db"
    log = tmp_path / "submit.log"
    # serve.port: the preference stage serves the judge on Serve's proxy; 8000 may be someone else's
    sid, status = local_ray_cluster.submit(["jobs/iteration.py", "--config", "configs/local.yaml",
                                             f"run.workdir={tmp_path}", f"tracking.uri=sqlite:///{db}",
                                             f"serve.port={free_port()}"], log, timeout=3600)
    assert status == "SUCCEEDED", log.read_text()[-4000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("flywheel-local")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.info.status == "FINISHED" and parent.data.tags["flywheel.iteration"] == "0"
    stages = {r.data.tags["flywheel.stage"]: r.info.status for r in runs
              if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id and "flywheel.stage" in r.data.tags}
    assert JUDGE_STAGES <= set(stages) and set(stages.values()) == {"FINISHED"}, stages
    summary = client.download_artifacts(parent.info.run_id, "summary/summary.json", str(tmp_path))
    decisions = json.loads(Path(summary).read_text())["decisions"]
    if decisions[0]["promoted"]:  # the judge passed the gate: the policy half of the iteration ran too
        assert POLICY_STAGES <= set(stages), sorted(stages)
