"""The job tests/cluster/test_multinode.py submits to its simulated multi-node cluster (`ray job submit -- python
tests/cluster/multinode_job.py ...`): the judge half of an iteration on the real stages — models, prompts,
candidates, labels (the teacher on Ray Data), curation, judge SFT (Ray Train), the SFT judge on Ray Serve answering
one request — each a nested MLflow run, then a report (JSON) of where everything ran.

    python tests/cluster/multinode_job.py --config configs/local.yaml --report R.json --tag T [--pace-s S]
        key=value ...

Prompts and candidates go to <storage>/multinode/ (shared by every tag: a second job skips them); labels, curated
data and progress markers to <storage>/multinode/<tag>/. With --pace-s each labeling batch takes at least that long
(so that the stage outlasts the actors' start: the oracle labels a batch in milliseconds) and leaves a marker file
<tag>/progress/labels/<node id>-<pid>-<n> when done, so the test can kill a node while the stage runs. The
training's Ray Train run is named judge-sft-<tag> (its journal is where the test watches the checkpoints; a named
run is trained even when an identical training is registered).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import urllib.request
import uuid

from flywheel import storage


class PacedCore:
    """The stage's own core, each batch stretched to at least `pace_s` and marked done on shared storage (a
    test instrument: the rows are the core's, untouched)."""

    def __init__(self, core, pace_s: float, progress_uri: str):
        import ray

        self.core, self.pace_s, self.progress_uri = core, pace_s, progress_uri
        self.tag = f"{ray.get_runtime_context().get_node_id()}-{os.getpid()}"

    def __call__(self, rows):
        t0 = time.perf_counter()
        out = self.core(rows)
        time.sleep(max(0.0, self.pace_s - (time.perf_counter() - t0)))
        storage.write_bytes(storage.join(self.progress_uri, f"{self.tag}-{uuid.uuid4().hex[:8]}"),
                            json.dumps({"rows": len(rows), "time": time.time()}).encode())
        return out


def _labels(cfg, paths: dict, tag: str, pace_s: float, tracker):
    from flywheel.stages import judgments
    from flywheel.stages.judgments import JudgmentsCore
    from flywheel.stages.runner import run_stage

    if not pace_s:
        return judgments.run(cfg, paths["prompts-train"], paths["candidates"], paths["labels"], "teacher", tracker)
    progress = storage.join(paths["tag"], "progress", "labels")
    candidates_uri = paths["candidates"]
    result = run_stage(  # what judgments.run does, with the core paced
        "judgments-teacher", inputs=[paths["prompts-train"], candidates_uri], output=paths["labels"],
        kind="judgment", core_factory=lambda: PacedCore(JudgmentsCore(cfg, candidates_uri=candidates_uri,
                                                                      role="teacher"), pace_s, progress),
        resources=cfg.resources.labeling, batch_size=cfg.judgments.batch_size,
        stage_hash=judgments.stage_hash(cfg, "teacher"), limits=cfg.limits, tracker=tracker)
    if not result.skipped:
        from flywheel.datasets import read_rows

        judgments.log_stats(judgments.judgment_stats(read_rows(paths["labels"], "judgment")))
    return result


def _alive_actor_nodes(*filters: tuple[str, str, str]) -> list[str]:
    from ray.util.state import list_actors

    actors = list_actors(filters=[*filters, ("state", "=", "ALIVE")], raise_on_missing_output=False)
    return sorted(a.node_id for a in actors)


def _replica_nodes(app_name: str) -> list[str]:
    from flywheel.serve.app import DEPLOYMENT

    return _alive_actor_nodes(("class_name", "=", f"ServeReplica:{app_name}:{DEPLOYMENT}"))


def _owner_nodes(app_name: str) -> list[str]:
    from flywheel.serve.orphans import NAMESPACE, owner_name

    return _alive_actor_nodes(("name", "=", owner_name(app_name)), ("ray_namespace", "=", NAMESPACE))


def _judge_once(url: str, prompt: dict, candidate: dict) -> dict:
    import base64

    def b64(images):
        return [base64.b64encode(b).decode() for b in images or []]

    body = {"items": [{"prompt": {"task": prompt["task"], "subtask": prompt.get("subtask"),
                                  "query": prompt.get("query"), "images": b64(prompt.get("images"))},
                       "candidate": {"candidate_id": candidate["candidate_id"],
                                     "output_text": candidate.get("output_text"),
                                     "output_images": b64(candidate.get("output_images"))}}]}
    req = urllib.request.Request(url + "/v1/judge/pointwise", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return {"status": r.status, **json.loads(r.read())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--report", required=True, help="Where the JSON report goes (a path every node sees).")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--pace-s", type=float, default=0.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import ray

    from flywheel.config import load_config
    from flywheel.datasets import read_rows
    from flywheel.models.zoo import build_zoo
    from flywheel.raycluster import init_ray
    from flywheel.preferences import served_judge
    from flywheel.stages import candidates, curate, prompts
    from flywheel.track import Tracker
    from flywheel.train.api import train
    from flywheel.train.launcher import read_journal

    cfg = load_config(args.config, args.overrides)
    init_ray(cfg)
    shared = storage.join(cfg.storage.uri, "multinode")
    tag_dir = storage.join(shared, args.tag)
    paths = {"prompts": storage.join(shared, "prompts"), "prompts-train": storage.join(shared, "prompts-train"),
             "candidates": storage.join(shared, "candidates"), "tag": tag_dir,
             "labels": storage.join(tag_dir, "labels"), "curated": storage.join(tag_dir, "curated")}
    report: dict = {"tag": args.tag, "driver_node": ray.get_runtime_context().get_node_id(), "seconds": {}}
    tracker = Tracker(cfg)
    with tracker.iteration(0, run_name=f"multinode-{args.tag}") as parent:
        report["mlflow_parent"] = parent.info.run_id

        def timed(name, fn):
            t0 = time.perf_counter()
            with tracker.stage(name) as run:
                out = fn()
            report["seconds"][name] = time.perf_counter() - t0
            report.setdefault("mlflow_stages", {})[name] = run.info.run_id
            return out

        timed("models", lambda: build_zoo(cfg))
        timed("prompts", lambda: (prompts.run(cfg, paths["prompts"], tracker),
                                  prompts.run_split(cfg, paths["prompts"], paths["prompts-train"])))
        timed("candidates", lambda: candidates.run(cfg, paths["prompts-train"], paths["candidates"], tracker))
        labels = timed("labels", lambda: _labels(cfg, paths, args.tag, args.pace_s, tracker))
        report["labels"] = {"rows_in": labels.rows_in, "rows_out": labels.manifest.row_count,
                            "content_hash": labels.manifest.content_hash, "placement": labels.placement,
                            "actor_restarts": labels.actor_restarts, "skipped": labels.skipped}
        timed("curate-judge", lambda: curate.run_judge(cfg, paths["labels"], paths["prompts-train"],
                                                       paths["candidates"], paths["curated"], tracker))
        run_name = f"judge-sft-{args.tag}"
        sft = timed("judge-sft", lambda: train(cfg, "judge_sft", storage.join(paths["curated"], "sft"),
                                               tracker=tracker, run_name=run_name))
        report["train"] = {"run_name": sft.run_name, "model_uri": sft.model_uri, "final": sft.final,
                           "steps": sft.steps, "journal": read_journal(cfg, sft.run_name),
                           "mlflow_run": sft.mlflow_run_id}

        def served():
            # as an iteration serves its judge for preference labels: with the app's owner held by this driver
            with served_judge(cfg, sft.model_uri) as deployed:
                p = read_rows(paths["prompts-train"], "prompt")[0]
                cand = next(x for x in read_rows(paths["candidates"], "candidate") if x["prompt_id"] == p["prompt_id"])
                answer = _judge_once(deployed.url, p, cand)
                return {"url": deployed.url, "version": deployed.served.version,
                        "replica_nodes": _replica_nodes(deployed.app_name),
                        "owner_nodes": _owner_nodes(deployed.app_name), "answer": answer}

        report["serve"] = timed("serve", served)
    report["nodes"] = {n["NodeID"]: {"alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()}
    storage.write_bytes(args.report, json.dumps(report, indent=1, default=str).encode())
    print(f"multinode job {args.tag}: report at {args.report}")


if __name__ == "__main__":
    main()
