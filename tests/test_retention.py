"""Retention: old finished iterations' datasets go, unless something kept was made from them, a preference pool
waits for them or the iteration may be resumed (flywheel/retention.py, `flywheel prune`, storage.keep_iterations).
Datasets, records and MLflow runs are real; no Ray, no stage."""

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

import flywheel.iteration as iteration
from flywheel import retention, storage
from flywheel.cli import app
from flywheel.config import Config, load_config
from flywheel.datasets import UpstreamRef, read_dataset, read_manifest
from flywheel.iteration import IterationResult, iteration_dir, paths, run_iteration
from flywheel.iteration_record import IterationRecord
from flywheel.records import write_dataset
from flywheel.track import Tracker
from flywheel.train import registry
from flywheel.train.launcher import run_dir

POLICY = "models:/policy-llava/1"
# iteration -> the Ray Train runs its training stages ran, and whether each was registered. Iteration 4 trained the
# same as iteration 0 once more (a resumed run of the same name).
TRAININGS = {0: {"judge-sft-a": True}, 2: {"judge-sft-b": True, "policy-dpo-c": False},
             4: {"judge-sft-a": True, "judge-sft-d": True}}


def _prompt(n: int, i: int) -> dict:
    return {"task": "iu", "subtask": "iu_color", "query": f"iteration {n}: what colour is shape {i}?", "images": [],
            "reference_images": [], "aspects": ["color_accuracy"], "source": "test", "split": "train"}


def _iteration(cfg, n: int, *, policy=POLICY, decisions=(), finished=True, run_id=None) -> dict[str, str]:
    """Iteration n's record and four datasets: prompts -> curated/sft -> pref-curated/pairs, each made from the one
    before, and labels from the prompts (prompt rows all, so they are quick to write; retention reads only
    manifests)."""
    p = paths(cfg, n)
    up = []
    for name in ("prompts", "curated/sft", "pref-curated/pairs"):
        head, _, rest = name.partition("/")
        uri = storage.join(p[head], rest)
        up = [write_dataset(uri, "prompt", [_prompt(n, i) for i in range(3 + len(up))], config_hash="c",
                            producer=head, upstream=up)]
    write_dataset(p["labels"], "prompt", [_prompt(n, 7)], config_hash="c", producer="labels",
                  upstream=[read_manifest(p["prompts"])])
    IterationRecord(n, "h", {"judge": "models:/judge/1", "policy": policy, "generator": "world:generator"},
                    run_id=run_id, finished=finished,
                    decisions=[{"model": m} for m in ("judge", "policy-sdxl", *decisions)]).save(iteration_dir(cfg, n))
    return p


@pytest.fixture
def store(tmp_path, request):
    """Iterations 0-5 and the gold sets, on local storage (or, parametrized "s3" or "gcs", in an S3 or a GCS bucket).
    0-4 finished: 2 tried a LLaVA update (its pool ended there), 3 and 4 did not and 5 (unfinished) started from the
    same LLaVA, so their pairs wait in its pool. The gold sets come from iteration 0's prompts, named by a path in a
    bucket the store has moved from: the path below the root matches. Iteration 4's pooled pairs were made from
    iteration 1's pairs. Iteration 2 holds an attempt that never wrote its manifest."""
    bucket = {"s3": "s3_bucket", "gcs": "gcs_bucket"}.get(getattr(request, "param", "local"))
    root = f"{request.getfixturevalue(bucket)}/{tmp_path.name}" if bucket else None
    cfg = load_config(None, [f"run.workdir={tmp_path}/wd", *([f"storage.uri={root}"] if root else [])])
    tracker = Tracker(cfg)
    runs = {}
    for n in range(6):
        with tracker.iteration(n) as run:
            runs[n] = run.info.run_id
            for name, registered in TRAININGS.get(n, {}).items():
                # as an iteration runs them, below their stage's run (judge-sft), or (flywheel train) the iteration's
                with tracker.stage("judge-sft") if n == 2 else contextlib.nullcontext(), \
                        tracker.stage("training", tags={"flywheel.ray_train_run": name}):
                    if registered:
                        mlflow.set_tag("flywheel.model_version", f"models:/x/{n}")
                storage.write_bytes(storage.join(run_dir(cfg, name), "checkpoint_000002", "model.safetensors"),
                                    b"w" * 100)
        _iteration(cfg, n, decisions=("policy-llava",) if n == 2 else (), finished=n < 5, run_id=runs[n])
    first = read_manifest(paths(cfg, 0)["prompts"])
    moved = UpstreamRef(path="s3://old-bucket/iterations/000/prompts", content_hash=first.content_hash)
    write_dataset(storage.join(paths(cfg, 0)["gold"], "id-test/prompts"), "prompt", [_prompt(0, 0)],
                  config_hash="g", producer="gold", upstream=[moved])
    pairs = read_manifest(storage.join(paths(cfg, 1)["pref-curated"], "pairs"))
    write_dataset(storage.join(paths(cfg, 4)["pref-pool"], "pairs"), "prompt", [_prompt(4, 9)], config_hash="p",
                  producer="pool-preferences", upstream=[pairs])
    for n in (2, 4):  # the same rows in both (as the meta-eval's perturbed gold is): iteration 2's is not iteration 4's
        same = write_dataset(storage.join(paths(cfg, n)["meta-eval"], "perturb"), "prompt", [_prompt(0, 1)],
                             config_hash="m", producer="meta-eval")
    write_dataset(storage.join(paths(cfg, 4)["meta-eval"], "judged"), "prompt", [_prompt(4, 1)], config_hash="m",
                  producer="meta-eval", upstream=[same])
    dead = storage.join(paths(cfg, 2)["candidates"])
    storage.write_bytes(storage.join(dead, "part-00000.parquet"), b"half a part")
    storage.write_bytes(storage.join(dead, "_batches", "00000.json"), b"{}")
    return cfg, runs


def _exists(cfg, n: int, name: str) -> bool:
    head, _, rest = name.partition("/")
    return storage.exists(storage.join(paths(cfg, n)[head], rest, "manifest.json"))


@pytest.mark.parametrize("store", ["local", "s3", "gcs"], indirect=True)
def test_old_iterations_lose_only_what_nothing_kept_reads(store):
    cfg, runs = store
    plan = retention.plan_for(cfg, 1)
    assert plan.kept == {4: "one of the newest 1 finished", 5: "unfinished: a resume reads it"}
    going = {n: sorted(f.name for f in fs) for n, fs in plan.pruned.items()}
    assert going == {0: ["curated/sft", "labels", "pref-curated/pairs"],  # its prompts made the gold sets
                     1: ["labels"],  # its pairs were pooled into iteration 4's, and were made from the rest
                     2: ["candidates", "curated/sft", "labels", "meta-eval/perturb", "pref-curated/pairs", "prompts"],
                     3: ["labels"]}  # its pairs wait in iteration 5's pool, with what they were made from
    assert plan.referenced[storage.join(paths(cfg, 3)["pref-curated"], "pairs")] == \
        "waits in the policy's preference pool"
    assert plan.sizes[storage.join(paths(cfg, 2)["candidates"])] == len(b"half a part") + 2
    # only a registered training's checkpoints go (its weights are in MLflow), and not one a kept iteration ran
    assert plan.runs == {0: [], 1: [], 2: [run_dir(cfg, "judge-sft-b")], 3: []}
    assert plan.sizes[run_dir(cfg, "judge-sft-b")] == 100
    assert all(_exists(cfg, 2, name) for name in ("prompts", "curated/sft"))  # planning deletes nothing

    retention.apply(plan)
    for n in range(6):
        for name in ("prompts", "curated/sft", "labels", "pref-curated/pairs"):
            assert _exists(cfg, n, name) == (name not in going.get(n, [])), (n, name)
    assert [storage.exists(run_dir(cfg, r)) for r in ("judge-sft-a", "judge-sft-b", "policy-dpo-c", "judge-sft-d")] \
        == [True, False, True, True]
    it2 = iteration_dir(cfg, 2)
    assert storage.subdirs(it2) == []  # the dead attempt and the emptied curated/, pref-curated/ went too
    assert IterationRecord.load(it2).finished  # the record stays: pools and reports read it
    marker = json.loads(storage.read_bytes(storage.join(it2, retention.MARKER)))
    assert marker["datasets"]["prompts"]["rows"] == 3 and marker["keep_iterations"] == 1
    assert marker["datasets"]["candidates"]["rows"] is None  # never finished: no rows to name
    assert marker["checkpoints"]["judge-sft-b"]["bytes"] == 100
    kept = json.loads(storage.read_bytes(storage.join(iteration_dir(cfg, 0), retention.MARKER)))["kept"]
    assert kept == {"prompts": "made into gold/id-test/prompts"}
    gold, _ = read_dataset(storage.join(paths(cfg, 0)["gold"], "id-test/prompts"))  # still verifies
    assert gold.num_rows == 1 and read_dataset(paths(cfg, 0)["prompts"])[0].num_rows == 3
    assert retention.plan_for(cfg, 1).datasets == 0  # nothing left to prune: a second run deletes nothing
    if storage.is_uri(cfg.storage.uri):
        assert not list(Path(cfg.run.workdir).rglob("manifest.json"))  # all of it was in the bucket


def test_a_pool_that_an_update_consumed_frees_its_iterations(store):
    cfg, _ = store
    _iteration(cfg, 5, decisions=("policy-llava",))  # iteration 5 finished and tried its update
    plan = retention.plan_for(cfg, 1)
    assert plan.kept == {5: "one of the newest 1 finished"}
    assert sorted(plan.pruned) == [0, 1, 2, 3, 4]
    assert sorted(f.name for f in plan.pruned[4]) == ["curated/sft", "labels", "meta-eval/judged", "meta-eval/perturb",
                                                      "pref-curated/pairs", "pref-pool/pairs", "prompts"]
    assert len(plan.pruned[1]) == 4  # iteration 4's pool went, so nothing reads iteration 1's pairs any more


def test_an_unreadable_manifest_stops_the_prune_before_anything_goes(store):
    cfg, _ = store
    storage.write_bytes(storage.join(paths(cfg, 4)["prompts"], "manifest.json"), b"{not json")
    with pytest.raises(retention.UnreadableManifest, match=r"iterations/004/prompts"):
        retention.prune(cfg, 1)
    assert _exists(cfg, 2, "prompts")


def test_pruning_a_workdir_never_run_deletes_nothing_and_makes_no_tracking_store(tmp_path):
    over = [f"run.workdir={tmp_path}/wd"]
    for args in (["--keep", "1"], ["--keep", "1", "--yes"], ["--keep", "1", "--json"]):
        r = CliRunner().invoke(app, ["prune", *args, *over])
        assert r.exit_code == 0 and "0 datasets" in r.output or json.loads(r.output)["pruned"] == {}, r.output
    assert not (tmp_path / "wd" / "mlflow.db").exists()  # asking MLflow would have created it


@pytest.mark.parametrize("store", ["local", "s3", "gcs"], indirect=True)
def test_prune_command_shows_the_plan_then_deletes_and_data_and_mlflow_say_so(store):
    cfg, runs = store
    over = [f"run.workdir={cfg.run.workdir}", f"storage.uri={cfg.storage.uri}"]
    r = CliRunner().invoke(app, ["prune", *over])
    assert r.exit_code == 2 and "--keep N" in r.output
    r = CliRunner().invoke(app, ["prune", "--keep", "1", *over])
    assert r.exit_code == 0, r.output
    assert "11 datasets, 1 training checkpoint runs, 0 local model copies and 0 registered model versions" in \
        r.output and "would be deleted (--yes" in r.output
    assert "pool" in r.output and "prompts (made into gold/id-test/prompts)" in r.output
    assert _exists(cfg, 2, "prompts")
    r = CliRunner().invoke(app, ["prune", "--keep", "1", "--json", *over])
    shown = json.loads(r.output)
    assert shown["deleted"] is False and shown["kept"] == {"4": "one of the newest 1 finished",
                                                           "5": "unfinished: a resume reads it"}
    assert shown["pruned"]["2"]["checkpoint_runs"] == ["judge-sft-b"] and len(shown["pruned"]["2"]["datasets"]) == 6
    assert shown["bytes"] == sum(v["bytes"] for v in shown["pruned"].values())
    r = CliRunner().invoke(app, ["prune", "--keep", "1", "--yes", *over])
    assert r.exit_code == 0 and "11 datasets, 1 training" in r.output and " deleted;" in r.output, r.output
    assert not _exists(cfg, 2, "prompts")
    r = CliRunner().invoke(app, ["data", "--iteration", "2", *over], terminal_width=250)
    assert r.exit_code == 0 and r.output.count("pruned 20") >= 4, r.output  # prompts, candidates, curated, pref-cur.
    r = CliRunner().invoke(app, ["data", "--iteration", "2", "--dataset", "curated/sft", *over], terminal_width=250)
    assert r.exit_code == 2 and "iteration 2's was deleted by retention at 20" in r.output, r.output
    tags = MlflowClient(cfg.tracking.uri).get_run(runs[2]).data.tags
    assert "6 datasets, 1 training checkpoint runs, 0 local model copies and 0 registered model versions deleted" \
        in tags["flywheel.pruned"]
    assert "keep_iterations 1" in tags["flywheel.pruned"]
    assert "flywheel.pruned" not in MlflowClient(cfg.tracking.uri).get_run(runs[4]).data.tags


def _training_run(cfg, name: str, iteration_run: str) -> str:
    """The MLflow run of Ray Train run `name` below iteration_run (as the store made it)."""
    client = MlflowClient(cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.experiment).experiment_id
    found = [r for r in client.search_runs([exp], f"tags.`flywheel.ray_train_run` = '{name}'")
             if _below(client, r, iteration_run)]
    assert len(found) == 1, name
    return found[0].info.run_id


def _below(client, run, top: str) -> bool:
    while run is not None:
        if run.info.run_id == top:
            return True
        up = run.data.tags.get("mlflow.parentRunId")
        run = client.get_run(up) if up else None
    return False


@pytest.fixture
def versions(store, tmp_path):
    """Registered versions of "judge", each with its weights (export/, 1,000 bytes) on its training's run and a
    local copy in <workdir>/registry: 1 by iteration 0 (every iteration's start model); 2, 3, 4, 7, 8 and 9 by
    iteration 2 (3 named by kept iteration 4's gate, 4 the champion, 7 promoted by iteration 2's gate, 9 the
    lineage head, 8 registered from 9's run: the same weights); 5 by kept iteration 4; 6 by a run outside the
    iterations (`flywheel train` by hand). A folder of another registry's version 2 sits beside them."""
    cfg, runs = store
    client = MlflowClient(cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.experiment).experiment_id

    def training_run(n: int, name: str) -> str:  # a registered training below iteration n's run
        return client.create_run(exp, tags={"mlflow.parentRunId": runs[n], "flywheel.ray_train_run": name,
                                            "flywheel.model_version": "models:/judge/?"}).info.run_id

    with mlflow.start_run() as manual:
        pass
    shared = training_run(2, "judge-dpo-9")
    made_by = {1: _training_run(cfg, "judge-sft-a", runs[0]), 5: _training_run(cfg, "judge-sft-d", runs[4]),
               6: manual.info.run_id, 8: shared, 9: shared}
    made_by |= {v: training_run(2, f"judge-dpo-{v}") for v in (2, 3, 4, 7)}
    weights = tmp_path / "export"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"w" * 1000)
    client.create_registered_model("judge")
    root = registry.cache_root(cfg)
    copies = {"stale": root / "judge" / "2-0123abcd"}  # version 2 of another registry (a copied workdir)
    for v in sorted(made_by):
        run_id = made_by[v]
        client.log_artifacts(run_id, str(weights), "export")
        source = f"{client.get_run(run_id).info.artifact_uri}/export"
        assert int(client.create_model_version("judge", source=source, run_id=run_id).version) == v
        copies[v] = root / "judge" / f"{v}-{run_id}"
    for d in copies.values():
        (d / "merged").mkdir(parents=True)
        (d / "merged" / "model.safetensors").write_bytes(b"w" * 1000)
    client.set_registered_model_alias("judge", "champion", "4")
    client.set_registered_model_alias("judge", "lineage", "9")
    for n, decision in ((4, {"model": "judge", "challenger": "models:/judge/5", "champion": "models:/judge/3"}),
                        (2, {"model": "judge", "challenger": "models:/judge/7", "promoted": True})):
        record = IterationRecord.load(iteration_dir(cfg, n))
        record.decisions.append(decision)
        record.save(iteration_dir(cfg, n))
    return cfg, runs, made_by, copies


def test_local_copies_of_versions_pruned_iterations_registered_go_unless_something_kept_names_them(versions):
    """<workdir>/registry holds the versions this node downloaded (and merged): a whole model each. Those the
    pruned iterations registered go, but not one a kept iteration starts from or names in its gates, one an alias
    points at, one a kept iteration registered, one no iteration registered, or a folder of another registry."""
    cfg, runs, made_by, copies = versions
    plan = retention.plan_for(cfg, 1)
    going = [copies[v] for v in (2, 7, 8)]  # 7: promoted once, but nothing uses it now; 8: unused
    assert {n: [c.path for c in cs] for n, cs in plan.copies.items()} == {0: [], 1: [], 2: going, 3: []}
    assert plan.sizes[str(copies[2])] == 1000 and plan.model_copies == 3 and plan.model_versions == 0
    assert retention.plan_json(plan)["pruned"][2]["model_copies"] == [f"judge/{v}-{made_by[v]}" for v in (2, 7, 8)]
    assert copies[2].exists()  # planning deletes nothing

    retention.prune(cfg, 1)
    assert {k for k, d in copies.items() if d.exists()} == {1, 3, 4, 5, 6, 9, "stale"}
    marker = json.loads(storage.read_bytes(storage.join(iteration_dir(cfg, 2), retention.MARKER)))
    assert marker["model_copies"][f"judge/2-{made_by[2]}"]["bytes"] == 1000
    client = MlflowClient(cfg.tracking.uri)
    assert "3 local model copies" in client.get_run(runs[2]).data.tags["flywheel.pruned"]
    assert len(client.search_model_versions("name='judge'")) == 9  # the registered versions stay
    assert retention.plan_for(cfg, 1).model_copies == 0


def test_registered_versions_go_with_storage_prune_model_versions_unless_used_promoted_or_sharing_weights(versions):
    """storage.prune_model_versions: a version pruned iterations made goes from the registry and its weights from
    MLflow's artifact store, its training run stays (tagged); on the local copies' terms, and never one a gate
    promoted, nor one whose weights another version points at."""
    _, runs, made_by, copies = versions
    cfg = load_config(None, [f"run.workdir={copies[1].parents[2]}", "storage.prune_model_versions=true"])
    client = MlflowClient(cfg.tracking.uri)
    plan = retention.plan_for(cfg, 1)
    assert {n: [v.label() for v in vs] for n, vs in plan.versions.items()} == {0: [], 1: [], 2: ["judge/2"], 3: []}
    source = client.get_model_version("judge", "2").source
    assert plan.sizes[source] == 1000 and plan.bytes_of(2) >= 3 * 1000

    retention.prune(cfg, 1)
    assert sorted(int(v.version) for v in client.search_model_versions("name='judge'")) == [1, 3, 4, 5, 6, 7, 8, 9]
    assert client.list_artifacts(made_by[2], "export") == []  # its weights went
    assert [f.path for f in client.list_artifacts(made_by[7], "export")] == ["export/model.safetensors"]
    trained = client.get_run(made_by[2])  # the training run stays, with its lineage
    assert "deleted by retention" in trained.data.tags["flywheel.weights_pruned"]
    marker = json.loads(storage.read_bytes(storage.join(iteration_dir(cfg, 2), retention.MARKER)))
    assert marker["model_versions"]["judge/2"] == {"source": source, "run_id": made_by[2], "bytes": 1000,
                                                   "pruned_at": marker["pruned_at"]}
    assert "1 registered model versions deleted" in client.get_run(runs[2]).data.tags["flywheel.pruned"]
    assert retention.plan_for(cfg, 1).model_versions == 0


@pytest.mark.parametrize("keep_promoted", [None, 1, 2])
def test_storage_keep_promoted_bounds_the_champions_history(versions, keep_promoted):
    """The versions gates promoted stay for a roll-back, each a whole model: storage.keep_promoted keeps the newest
    of each model. Promoted in order: 7 (iteration 2), then 5 (kept iteration 4, so it stays whatever the bound)."""
    _, _, made_by, copies = versions
    cfg = load_config(None, [f"run.workdir={copies[1].parents[2]}", "storage.prune_model_versions=true",
                             f"storage.keep_promoted={'null' if keep_promoted is None else keep_promoted}"])
    record = IterationRecord.load(iteration_dir(cfg, 4))
    record.decisions.append({"model": "judge", "challenger": "models:/judge/5", "promoted": True})
    record.save(iteration_dir(cfg, 4))
    going = {"judge/2"} if keep_promoted != 1 else {"judge/2", "judge/7"}
    assert {v.label() for vs in retention.plan_for(cfg, 1).versions.values() for v in vs} == going

    retention.prune(cfg, 1)
    client = MlflowClient(cfg.tracking.uri)
    assert (client.list_artifacts(made_by[7], "export") == []) == (keep_promoted == 1)
    assert {f"judge/{v.version}" for v in client.search_model_versions("name='judge'")}.isdisjoint(going)


def test_weights_a_failed_prune_left_behind_go_with_the_next(versions, monkeypatch):
    """The registry entry goes before the weights: if deleting the weights then fails (the artifact store down:
    faked, as it cannot fail here), they are not lost track of; the next prune deletes them."""
    _, _, made_by, copies = versions
    cfg = load_config(None, [f"run.workdir={copies[1].parents[2]}", "storage.prune_model_versions=true"])
    client = MlflowClient(cfg.tracking.uri)
    source = _orphan_judge_2(cfg, client, made_by, monkeypatch)

    three = client.get_model_version("judge", "3")  # a deletion that failed before its registry entry went
    client.set_tag(made_by[3], "flywheel.weights_pending",
                   json.dumps({"name": "judge", "version": "3", "source": three.source}))
    off = load_config(None, [f"run.workdir={copies[1].parents[2]}"])  # and if prune_model_versions is off since
    plan = retention.plan_for(off, 1)
    assert [(v.label(), v.source) for v in plan.orphans] == [("judge/2", source)]
    assert plan.deletes and plan.model_versions == 0 and plan.bytes >= 1000
    assert retention.plan_json(plan)["orphaned_weights"] == ["judge/2"]
    retention.prune(off, 1)
    assert client.list_artifacts(made_by[2], "export") == []
    tags = client.get_run(made_by[2]).data.tags
    assert "deleted by retention" in tags["flywheel.weights_pruned"] and "flywheel.weights_pending" not in tags
    assert retention.plan_for(cfg, 1).orphans == []
    for kept in (3, 7):  # a registered version's weights are never orphans
        assert [f.path for f in client.list_artifacts(made_by[kept], "export")] == ["export/model.safetensors"]


def _orphan_judge_2(cfg: Config, client: MlflowClient, made_by: dict, monkeypatch) -> str:
    """A prune whose deletion of judge/2's weights fails (the artifact store down: faked, as it cannot fail here)
    after the version left the registry; returns the weights' URI."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    source = client.get_model_version("judge", "2").source

    def down(self, artifact_path=None):
        raise OSError("artifact store unavailable")

    with monkeypatch.context() as m:
        m.setattr(LocalArtifactRepository, "delete_artifacts", down)
        with pytest.raises(OSError, match="unavailable"):
            retention.prune(cfg, 1)
    assert "2" not in {v.version for v in client.search_model_versions("name='judge'")}
    assert [f.path for f in client.list_artifacts(made_by[2], "export")] == ["export/model.safetensors"]
    return source


def test_a_registry_that_cannot_answer_is_no_proof_of_an_orphan(versions, monkeypatch):
    """Whether a pending version is still registered is asked of the registry; an answer other than "no such
    version" (the registry down: faked, as it cannot fail here) stops the prune before anything goes, never takes the
    weights for orphans."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    _, _, made_by, copies = versions
    cfg = load_config(None, [f"run.workdir={copies[1].parents[2]}", "storage.prune_model_versions=true"])
    client = MlflowClient(cfg.tracking.uri)
    _orphan_judge_2(cfg, client, made_by, monkeypatch)

    def down(self, name, version):
        raise MlflowException("registry unavailable", error_code=TEMPORARILY_UNAVAILABLE)

    monkeypatch.setattr(MlflowClient, "get_model_version", down)
    with pytest.raises(MlflowException, match="registry unavailable"):
        retention.prune(cfg, 1)
    assert [f.path for f in client.list_artifacts(made_by[2], "export")] == ["export/model.safetensors"]
    assert _exists(cfg, 0, "prompts")  # nothing else went either
    monkeypatch.undo()
    assert [v.label() for v in retention.plan_for(cfg, 1).orphans] == ["judge/2"]


def test_prune_is_refused_while_an_iteration_runs(store):
    """A driver holding the workdir (another process, as a running iteration does) may be reading what would go."""
    cfg, _ = store
    hold = "import sys, time; from flywheel.workdir_lock import holding\n" \
           "with holding(sys.argv[1], 'iteration 6'):\n    print('held', flush=True); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", hold, cfg.run.workdir], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        r = CliRunner().invoke(app, ["prune", "--keep", "1", "--yes", f"run.workdir={cfg.run.workdir}"])
        assert r.exit_code == 2 and "in use by another flywheel run" in r.output and "iteration 6" in r.output, \
            r.output
        assert _exists(cfg, 2, "prompts")
    finally:
        proc.kill()
        proc.wait()


def test_an_iteration_that_finishes_prunes_with_storage_keep_iterations(store, monkeypatch):
    cfg, _ = store
    cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"keep_iterations": 2})})

    def finish(c, n, tracker):  # stands in for the stages (tested apart): iteration 5 finishes, its update tried
        _iteration(c, n, decisions=("policy-llava",))
        return IterationResult(n, "r")

    monkeypatch.setattr(iteration, "_run_iteration", finish)
    run_iteration(cfg, 5)
    assert not _exists(cfg, 3, "prompts") and _exists(cfg, 4, "prompts") and _exists(cfg, 5, "prompts")
    monkeypatch.setattr(iteration, "_run_iteration", lambda c, n, t: IterationResult(n, "r", skipped=True))
    storage.write_bytes(storage.join(paths(cfg, 3)["prompts"], "x"), b"")  # a skipped iteration prunes nothing
    run_iteration(cfg, 5)
    assert storage.exists(storage.join(paths(cfg, 3)["prompts"], "x"))


def test_a_prune_that_fails_after_an_iteration_leaves_its_result_and_says_so(store, monkeypatch, caplog):
    cfg, runs = store
    cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"keep_iterations": 1})})
    storage.write_bytes(storage.join(paths(cfg, 0)["prompts"], "manifest.json"), b"{not json")

    def finish(c, n, tracker):  # stands in for the stages, as above
        _iteration(c, n, decisions=("policy-llava",), run_id=runs[5])
        return IterationResult(n, runs[5])

    monkeypatch.setattr(iteration, "_run_iteration", finish)
    with caplog.at_level("ERROR"):
        res = run_iteration(cfg, 5)
    assert res.iteration == 5 and "retention after iteration 5 failed" in caplog.text
    assert _exists(cfg, 2, "prompts")  # nothing went
    tag = MlflowClient(cfg.tracking.uri).get_run(runs[5]).data.tags["flywheel.retention_failed"]
    assert tag.startswith("UnreadableManifest:") and "iterations/000/prompts" in tag


def test_a_plan_that_deletes_versions_is_not_applied_without_their_registry(versions):
    """apply(plan) alone cannot reach the registry its versions are in: refused before anything goes."""
    _, _, made_by, copies = versions
    cfg = load_config(None, [f"run.workdir={copies[1].parents[2]}", "storage.prune_model_versions=true"])
    plan = retention.plan_for(cfg, 1)
    assert plan.model_versions == 1
    with pytest.raises(ValueError, match=r"apply\(plan, cfg\)"):
        retention.apply(plan)
    assert copies[2].exists() and _exists(cfg, 2, "prompts")


def test_a_model_whose_aliases_cannot_be_read_keeps_every_copy(versions, monkeypatch, caplog):
    """Which versions an alias names is unknown (the registry fails the read: faked, as a registry server down): none
    of that model's copies may go."""
    cfg, _, _, copies = versions
    monkeypatch.setattr(MlflowClient, "get_registered_model", lambda self, name: 1 / 0)
    plan = retention.plan_for(cfg, 1)
    assert plan.model_copies == 0 and plan.datasets > 0
    assert "registered model judge not read" in caplog.text


def test_a_version_flywheel_serve_serves_is_pinned_against_retention(versions):
    """`flywheel serve` of a registered version aliases it (serving-<app>) while the app serves it: a replica that
    restarts loads its weights again, so neither the version nor its local copy may go; unpinned, they go as before.
    Unpinning leaves an alias a later deployment of the app moved to another version."""
    from flywheel.serve.model import ServedModel, pin, unpin

    _, _, _, copies = versions
    cfg = load_config(None, [f"run.workdir={copies[1].parents[2]}", "storage.prune_model_versions=true"])
    client = MlflowClient(cfg.tracking.uri)
    served = {v: ServedModel(ref=f"models:/judge/{v}", uri=f"models:/judge/{v}", version=f"models:/judge/{v}")
              for v in (2, 8)}
    assert pin(cfg, served[2], "by hand") == "serving-by-hand"
    assert str(client.get_model_version_by_alias("judge", "serving-by-hand").version) == "2"
    plan = retention.plan_for(cfg, 1)
    assert plan.versions[2] == [] and copies[2] not in [c.path for c in plan.copies[2]]
    assert copies[8] in [c.path for c in plan.copies[2]]  # the unpinned one still goes

    assert pin(cfg, served[8], "by hand") == "serving-by-hand"  # the app deployed again, with 8: the alias moves
    unpin(cfg, served[2], "by hand")  # the first deployment's end: 8's alias stays
    assert str(client.get_model_version_by_alias("judge", "serving-by-hand").version) == "8"
    unpin(cfg, served[8], "by hand")
    assert "serving-by-hand" not in client.get_registered_model("judge").aliases
    assert [v.label() for v in retention.plan_for(cfg, 1).versions[2]] == ["judge/2"]
    assert pin(cfg, ServedModel(ref="zoo:judge", uri="/some/folder", version="zoo:judge@x"), "by hand") is None


def test_flywheel_serve_warns_when_the_registry_cannot_pin_or_unpin(versions, monkeypatch):
    """The app is up (pin) or already down (unpin) when the registry is written: a registry that refuses the write (a
    real one: nothing listens at the tracking URI) is a warning that names what retention no longer protects or what
    alias is left, never a failed command; with the registry up, the same calls pin and unpin."""
    import io

    from rich.console import Console

    from flywheel.serve.cli import pin_or_warn, unpin_or_warn
    from flywheel.serve.model import ServedModel

    _, _, _, copies = versions
    workdir = copies[1].parents[2]
    served = ServedModel(ref="models:/judge/2", uri="models:/judge/2", version="models:/judge/2")
    out = io.StringIO()
    console = Console(file=out, width=400)

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    down = load_config(None, [f"run.workdir={workdir}", "tracking.uri=http://127.0.0.1:1"])
    assert pin_or_warn(down, served, "by hand", console) is None
    assert "not pinned in the registry" in out.getvalue() and "may delete this version's weights" in out.getvalue()
    unpin_or_warn(down, served, "by hand", console)
    assert "'serving-by-hand' on models:/judge/2 was not removed" in out.getvalue()

    cfg = load_config(None, [f"run.workdir={workdir}"])
    assert pin_or_warn(cfg, served, "by hand", console) == "serving-by-hand"
    assert "pinned:  registry alias 'serving-by-hand'" in out.getvalue()
    assert str(MlflowClient(cfg.tracking.uri).get_model_version_by_alias("judge", "serving-by-hand").version) == "2"
    unpin_or_warn(cfg, served, "by hand", console)
    assert "serving-by-hand" not in MlflowClient(cfg.tracking.uri).get_registered_model("judge").aliases
