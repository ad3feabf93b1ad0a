"""The flywheel on a simulated multi-node Ray cluster: a private head plus worker nodes on this machine, each with a
few logical CPUs, 2 logical GPUs and custom resources naming what it is for (cluster/local_nodes.py), every worker
node with its own /tmp, HOME and working directory (a private mount namespace), so only the storage URI is shared.

The job (tests/cluster/multinode_job.py, through `ray job submit` and the Jobs SDK) runs the judge half of an
iteration: models, prompts, candidates, labels (the teacher, Ray Data), curation, judge SFT (Ray Train, 2 workers),
the SFT judge on Ray Serve answering a request (served as an iteration serves it, its app's owner
actor held by the driver). Placement is by config alone (resources.* overrides below):

    head  1 CPU                     the job driver, Serve's and Train's controllers
    w1    2 CPU 2 GPU {labeling: 1, train: 2}       one labeling actor, both Train workers
    w2    2 CPU 2 GPU {labeling: 1, serve: 1}       one labeling actor, the Serve replica

test_placement_follows_the_config: where each stage ran, every record exactly once, nothing written node-locally.
test_a_lost_node_mid_labeling_and_mid_training_is_survived: a worker node SIGKILLed while labeling runs and again
while training runs (each replaced by a fresh node with the same resources, as KubeRay or the autoscaler would):
both stages finish, the labels are identical to the undisturbed run's, training resumes from its checkpoint with
every step once, and MLflow records the restarts.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tiny_iteration import ZOO_MODELS

from flywheel.config import REPO_ROOT
from flywheel.raycluster import free_port

from cluster_helpers import ClusterClient, local_cluster, ray_daemons
import local_nodes  # noqa: E402  (on the path through cluster_helpers)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NODES = {  # name -> (CPUs, GPUs, custom resources)
    "w1": (2, 2, {"labeling": 1, "train": 2}),
    "w2": (2, 2, {"labeling": 1, "serve": 1}),
}
PLACEMENT = ["resources.labeling={actors: 2, num_cpus: 1, num_gpus: 1, resources: {labeling: 1}}",
             "resources.train={actors: 2, num_cpus: 1, num_gpus: 1, resources: {train: 1}}",
             "resources.serve={actors: 1, num_cpus: 1, num_gpus: 1, resources: {serve: 1}}",
             "resources.candidates={actors: 1, num_cpus: 1}"]
TINY = [*ZOO_MODELS, "world.suites.prompts_per_subtask=4",
        "candidates.samples_per_prompt=2", "judgments.samples_per_item=1", "judgments.batch_size=2",
        "generator.generation.num_inference_steps=2", "policy.generation.max_new_tokens=8",
        "judge.generation.max_new_tokens=16", "train.judge_sft.epochs=1"]
# Each labeling batch is paced (tests/cluster/multinode_job.py): the oracle labels a batch in milliseconds, and one
# actor would finish the stage before the other had started.
PLACEMENT_PACE_S = 0.5
LABEL_PACE_S = 2.0  # per labeling batch in the node-loss run: the stage lasts long enough to kill a node in it
NODELOSS_STEPS, NODELOSS_SAVE = 40, 4


class MultiNodeCluster(ClusterClient):
    def __init__(self, info: dict, shared: Path):
        super().__init__(info)
        self.shared = shared  # outside /tmp: what every node sees (the storage, the workdir, MLflow)
        self.serve_port = free_port()
        self.nodes: dict[str, local_nodes.LocalNode] = {}
        self.lost: list[local_nodes.LocalNode] = []

    def add(self, name: str, like: str | None = None) -> local_nodes.LocalNode:
        cpus, gpus, res = NODES[like or name]
        self.nodes[name] = local_nodes.add_node(self.info, name, num_cpus=cpus, num_gpus=gpus, resources=res)
        return self.nodes[name]

    def lose(self, name: str) -> list[int]:
        node = self.nodes.pop(name)
        self.lost.append(node)
        return local_nodes.kill_node(node)

    def overrides(self) -> list[str]:
        s = self.shared
        # One Serve port for every job: Serve outlives a job, and its proxy keeps the port it first started with.
        return [f"run.workdir={s}/work", f"storage.uri={s}/storage", f"tracking.uri=sqlite:///{s}/mlflow.db",
                f"tracking.artifact_location={s}/mlartifacts", f"serve.port={self.serve_port}", *TINY, *PLACEMENT]


@pytest.fixture(scope="module")
def cluster(request):
    foreign_before = ray_daemons()
    root = Path(tempfile.mkdtemp(prefix="fwm", dir="/tmp"))
    # The shared "network storage" must not be under /tmp: that is node-local on the worker nodes.
    shared = Path(tempfile.mkdtemp(prefix="flywheel-multinode-", dir="/var/tmp"))
    failed_before = request.session.testsfailed
    t0 = time.time()
    try:
        info = local_cluster.start(root, num_cpus=1)
        c = MultiNodeCluster(info, shared)
        for name in NODES:
            c.add(name)
        print(f"multi-node cluster up in {time.time() - t0:.0f} s ({root}); private /tmp per node: "
              f"{all(n.private_tmp for n in c.nodes.values())}; shared storage {shared}")
        yield c
    finally:
        ours = {p.pid for p in local_cluster.cluster_processes(root)}
        local_cluster.stop(root)
        left = local_cluster.cluster_processes(root)
        foreign_killed = {pid: cmd for pid, cmd in foreign_before.items() if pid in ours}
        assert not left, f"processes of the test cluster survived its stop: {[p.pid for p in left]}"
        assert not foreign_killed, f"the stop touched processes of another cluster: {foreign_killed}"
        if request.session.testsfailed == failed_before:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(shared, ignore_errors=True)
        else:
            print(f"kept for inspection: {root} (Ray logs, per-node /tmp) and {shared} (storage, MLflow)")


def _job_args(cluster: MultiNodeCluster, tag: str, extra: list[str], *flags: str) -> list[str]:
    return ["tests/cluster/multinode_job.py", "--config", "configs/local.yaml", "--report",
            str(cluster.shared / f"report-{tag}.json"), "--tag", tag, *flags, *cluster.overrides(), *extra]


def _stage_runs(db: Path, parent_run: str) -> dict:
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    parent = client.get_run(parent_run)
    runs = client.search_runs([parent.info.experiment_id], max_results=500)
    children = {r.info.run_id: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_run}
    grandchildren = {r.info.run_id: r for r in runs if r.data.tags.get("mlflow.parentRunId") in children}
    return {r.data.tags["flywheel.stage"]: r for r in [*children.values(), *grandchildren.values()]
            if "flywheel.stage" in r.data.tags} | {"_parent": parent}


def _reference_judgment_ids(cluster: MultiNodeCluster) -> Counter:
    """The labels computed here, in this process, without Ray: the oracle teacher over the same prompts and
    candidates, batch by batch as the stage cuts them."""
    from flywheel.config import load_config
    from flywheel.datasets import read_rows
    from flywheel.records import validate
    from flywheel.stages.judgments import JudgmentsCore

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", cluster.overrides())
    base = f"{cfg.storage.uri}/multinode"
    core = JudgmentsCore(cfg, candidates_uri=f"{base}/candidates", role="teacher")
    prompts = read_rows(f"{base}/prompts-train", "prompt")
    ids: Counter = Counter()
    b = cfg.judgments.batch_size
    for i in range(0, len(prompts), b):
        valid, _ = validate("judgment", core(prompts[i:i + b]).rows, cfg.limits)
        ids.update(r["judgment_id"] for r in valid)
    return ids


def _node_local_outputs(cluster: MultiNodeCluster) -> list[str]:
    """Flywheel outputs (datasets, checkpoints, model weights, MLflow stores) found in a worker node's private
    /tmp, HOME or cwd: anything there was written where the other nodes cannot read it. Two kinds of file there
    are a process's own and fine: the job's copy of the repo (runtime_resources), and a Train worker's scratch
    (flywheel-<training>-r<rank>-*: TRL's checkpoint-N folders, copied to storage when reported; a killed node
    leaves its scratch behind)."""
    names = {"manifest.json", "data.parquet", "journal.jsonl", "model.safetensors", "adapter_model.safetensors",
             "mlflow.db", "final.json"}
    found = []
    for node in [*cluster.nodes.values(), *cluster.lost]:
        for p in node.host_dir.rglob("*"):
            own = "runtime_resources" in p.parts or any(re.match(r"flywheel-\w+-r\d+-", d) for d in p.parts)
            if (p.name in names or re.fullmatch(r"part-\d+\.parquet", p.name)) and not own:
                found.append(str(p))
    return found


@pytest.fixture(scope="module")
def placement_run(cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("placement") / "submit.log"
    t0 = time.time()
    args = _job_args(cluster, "placement", ["train.max_steps=4"], "--pace-s", str(PLACEMENT_PACE_S))
    sid, status = cluster.submit(args, log, timeout=1500, prefix="multinode")
    seconds = time.time() - t0
    assert status == "SUCCEEDED", log.read_text()[-5000:]
    report = json.loads((cluster.shared / "report-placement.json").read_text())
    print(f"placement job: {seconds:.0f} s; stages {json.dumps({k: round(v) for k, v in report['seconds'].items()})}")
    return report


def test_placement_follows_the_config(cluster, placement_run):
    r = placement_run
    w1, w2 = cluster.nodes["w1"].node_id, cluster.nodes["w2"].node_id
    head = next(n for n, d in r["nodes"].items() if "node:__internal_head__" in d["resources"])
    assert r["driver_node"] == head  # `ray job submit` put the driver on the head

    # labels: one actor on each node offering `labeling` (never the head), every prompt through exactly once
    placement = r["labels"]["placement"]
    assert set(placement) == {w1, w2}, placement
    assert all(p["batches"] >= 1 and len(p["actors"]) == 1 for p in placement.values()), placement
    from flywheel.datasets import read_manifest, read_rows

    storage = cluster.shared / "storage" / "multinode"
    n_prompts = read_manifest(str(storage / "prompts-train")).row_count
    assert r["labels"]["rows_in"] == sum(p["rows_in"] for p in placement.values()) == n_prompts
    got = Counter(row["judgment_id"] for row in read_rows(str(storage / "placement" / "labels"), "judgment"))
    assert max(got.values()) == 1 and got == _reference_judgment_ids(cluster)  # none lost, none twice

    # Train: both workers on the node offering `train`; Serve: its replica on the node offering `serve`
    assert set(n for e in r["train"]["journal"] for n in e.get("worker_nodes") or []) == {w1}
    assert len({e["rank"] for e in r["train"]["steps"]}) == 2  # two DDP ranks (gloo: the GPUs are logical)
    assert r["serve"]["replica_nodes"] == [w2]
    # the app's owner (flywheel/serve/orphans.py) on the driver's node: lost with w2, it would leave the live
    # driver's app to the next sweep
    assert r["serve"]["owner_nodes"] == [head]
    answer = r["serve"]["answer"]
    assert answer["status"] == 200 and answer["model_version"] == r["train"]["model_uri"]

    # MLflow says the same, and nothing was written where another node could not read it
    runs = _stage_runs(cluster.shared / "mlflow.db", r["mlflow_parent"])
    labels = runs["labels"]
    assert labels.data.metrics["ray.nodes"] == 2 and labels.data.metrics["ray.actor_restarts"] == 0
    sft = runs["judge-sft"] if "flywheel.ray_train.worker_nodes" in runs["judge-sft"].data.tags else \
        next(x for x in runs.values() if "flywheel.ray_train.worker_nodes" in x.data.tags)
    assert sft.data.tags["flywheel.ray_train.worker_nodes"] == w1
    assert sft.data.metrics["ray_train.failures"] == 0
    assert all(x.info.status == "FINISHED" for x in runs.values()), {k: x.info.status for k, x in runs.items()}
    assert _node_local_outputs(cluster) == []


def _markers(progress: Path) -> list[str]:
    return [p.name for p in progress.iterdir()] if progress.is_dir() else []


def _wait(what: str, check, timeout: float, client, sid: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        status = client.get_job_status(sid).value
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            pytest.fail(f"the job ended ({status}) before {what}:\n{client.get_job_logs(sid)[-4000:]}")
        time.sleep(0.5)
    client.stop_job(sid)
    pytest.fail(f"timed out waiting for {what}")


def test_a_lost_node_mid_labeling_and_mid_training_is_survived(cluster, placement_run):
    """After the placement run (whose prompts and candidates this run reuses, and whose labels it must equal)."""
    client = cluster.client()
    tag = "nodeloss"
    args = _job_args(cluster, tag, [f"train.max_steps={NODELOSS_STEPS}", f"train.save_steps={NODELOSS_SAVE}"],
                     "--pace-s", str(LABEL_PACE_S))
    t0 = time.time()
    sid = client.submit_job(entrypoint=" ".join(["python", *[json.dumps(a) if " " in a else a for a in args]]),
                            runtime_env={"working_dir": str(REPO_ROOT)}, submission_id=f"multinode-{tag}-"
                            f"{uuid.uuid4().hex[:6]}")
    events = {}
    try:
        storage = cluster.shared / "storage"
        from flywheel.datasets import read_manifest

        n_batches = -(-read_manifest(str(storage / "multinode" / "prompts-train")).row_count // 2)
        # 1. labeling: once w2's actor has finished a batch (and most are still to do), w2 is lost
        progress = storage / "multinode" / tag / "progress" / "labels"
        w2 = cluster.nodes["w2"].node_id
        _wait("a labeling batch done on w2", lambda: any(m.startswith(w2) for m in _markers(progress)), 900,
              client, sid)
        done = len(_markers(progress))
        assert done < n_batches - 2, f"labeling was nearly over ({done}/{n_batches}) before the kill"
        events["labels_killed_at"] = time.time() - t0
        cluster.lose("w2")
        cluster.add("w3", like="w2")  # the replacement node KubeRay or the autoscaler would start
        events["labels_batches_before_kill"] = done

        # 2. training: once a checkpoint is committed, w1 (both Train workers) is lost
        journal = storage / "checkpoints" / f"judge-sft-{tag}" / "journal.jsonl"

        def checkpointed():
            return journal.is_file() and any(json.loads(x).get("checkpoint") for x in journal.read_text().splitlines()
                                             if x.strip())

        _wait("a training checkpoint", checkpointed, 900, client, sid)
        step = max(json.loads(x).get("step") or 0 for x in journal.read_text().splitlines() if x.strip())
        assert step < NODELOSS_STEPS, "training had finished before the kill"
        events["train_killed_at"], events["train_step_at_kill"] = time.time() - t0, step
        cluster.lose("w1")
        cluster.add("w4", like="w1")

        status = cluster.wait_for_job(sid, 1200)
        events["total_s"] = time.time() - t0
        logs = client.get_job_logs(sid)
        assert status == "SUCCEEDED", logs[-5000:]
    except BaseException:
        client.stop_job(sid)
        raise
    print(f"node-loss job: {json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in events.items()})}")
    r = json.loads((cluster.shared / f"report-{tag}.json").read_text())
    lost_w2, lost_w1 = (n.node_id for n in cluster.lost[-2:])
    w3, w4 = cluster.nodes["w3"].node_id, cluster.nodes["w4"].node_id

    # labels: the lost node's actor was restarted on its replacement; the result equals the undisturbed run's
    placement = r["labels"]["placement"]
    assert lost_w2 in placement and w3 in placement, placement
    assert r["labels"]["actor_restarts"] >= 1
    assert r["labels"]["content_hash"] == placement_run["labels"]["content_hash"]
    assert r["labels"]["rows_in"] == placement_run["labels"]["rows_in"]

    # training: Ray Train restarted the worker group on the replacement and resumed from the checkpoint
    train = r["train"]
    failures = [e for e in train["journal"] if "worker_errors" in e]
    assert failures, train["journal"]
    assert train["final"]["resumed_from"] is not None and train["final"]["resumed_from"] <= NODELOSS_STEPS
    nodes = {n for e in train["journal"] for n in e.get("worker_nodes") or []}
    assert nodes == {lost_w1, w4}, nodes
    for rank in (0, 1):  # every optimizer step exactly once per rank, in order: nothing skipped, nothing repeated
        assert [e["step"] for e in train["steps"] if e["rank"] == rank] == list(range(1, NODELOSS_STEPS + 1))
    assert r["serve"]["answer"]["status"] == 200 and r["serve"]["replica_nodes"] == [w3]

    # and MLflow records what happened
    runs = _stage_runs(cluster.shared / "mlflow.db", r["mlflow_parent"])
    assert runs["labels"].data.metrics["ray.actor_restarts"] >= 1
    sft = next(x for x in runs.values() if "flywheel.ray_train.failures" in x.data.tags)
    assert sft.data.metrics["ray_train.failures"] >= 1
    assert sft.data.tags["flywheel.ray_train.resumed_from"] == str(train["final"]["resumed_from"])
    assert all(x.info.status == "FINISHED" for x in runs.values())
    assert _node_local_outputs(cluster) == []
