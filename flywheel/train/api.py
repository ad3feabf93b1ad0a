"""`train()`: one training from a dataset on storage to a registered model version, tracked in MLflow.

Driver side only: it names the run, opens the stage's nested MLflow run, launches the Ray Train job
(flywheel.train.launcher), and registers the export with its lineage. Re-running the same training on the same
data, base and settings is idempotent: the run name is a hash of those, so an interrupted run resumes from its
latest checkpoint, and a finished, registered one is returned as is (pass fresh=True to train again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import mlflow

from flywheel.config import Config, ModelRef
from flywheel.datasets import read_manifest
from flywheel.train import registry
from flywheel.train.config import HOW_NOT_WHAT, TRAININGS
from flywheel.train.heldout_inputs import heldout_inputs, inputs_digest
from flywheel.train.launcher import launch, prune_run
from flywheel.train.worker import TrainJob

log = logging.getLogger(__name__)

CLI_NAMES = {t.replace("_", "-"): t for t in TRAININGS}  # judge-sft -> judge_sft
DATA_KINDS = {"judge_sft": "sft", "judge_dpo": "dpo", "policy_dpo": "dpo", "diffusion_dpo": "image_pref"}
ROLE_OF = {"judge_sft": "judge", "judge_dpo": "judge", "policy_dpo": "policy", "diffusion_dpo": "generator"}


@dataclass
class TrainResult:
    training: str
    run_name: str
    run_key: str
    model_uri: str | None  # models:/<name>/<version>, None when not registered
    mlflow_run_id: str | None
    checkpoint_path: str | None  # the final checkpoint on storage (its export/ is what was registered)
    final: dict = field(default_factory=dict)  # final metrics, step times, final_step, resumed_from
    steps: list[dict] = field(default_factory=list)  # per-step sample ids, every worker
    reused: bool = False  # an identical, already registered training was found and returned


def normalize(training: str) -> str:
    training = CLI_NAMES.get(training, training)
    if training not in TRAININGS:
        raise ValueError(f"unknown training {training!r}; expected one of {', '.join(CLI_NAMES)}")
    return training


def default_base(cfg: Config, training: str) -> str:
    """Where a training starts when no base is given: the configured model, or for judge DPO the newest
    judge version made by judge SFT."""
    if training == "judge_dpo":
        name = cfg.train.registry.judge
        mv = registry.latest_version(cfg, name, "judge_sft")
        if mv is None:
            raise ValueError(f"judge DPO starts from a judge SFT result, but the registry has no '{name}' version "
                             "made by judge-sft: run `flywheel train judge-sft` first or pass --base")
        return registry.describe(mv)
    return getattr(cfg.models, ROLE_OF[training]).path


def base_version(cfg: Config, base: str) -> tuple[str, str]:
    """(pinned reference, version string): aliases are pinned to their version number, so lineage is exact."""
    if registry.is_registry_uri(base):
        mv = registry.get_version(cfg, base)
        return registry.describe(mv), f"{mv.name}/{mv.version}"
    from flywheel.models.versions import checkpoint_version
    from flywheel.models.zoo import resolve_model_path

    return base, checkpoint_version(resolve_model_path(ModelRef(path=base), cfg))


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def heldout_judge(cfg: Config, training: str, settings) -> str | None:
    """The judge that also scores held-out outputs: `champion` is pinned to the champion's version now."""
    h = settings.heldout
    if h is None or h.judge is None or training == "judge_dpo":
        return None
    if h.judge != "champion":
        return h.judge
    from flywheel.gate import champion_of

    ref = champion_of(cfg, cfg.train.registry.judge)
    if ref is None:
        log.info("%s: heldout.judge=champion but no judge is champion yet; no judge curve", training)
    return ref


def heldout_tags(final: dict) -> dict[str, str]:
    """The held-out decision as tags (on the stage run and the registered version)."""
    keys = ("best_step", "target", "best_value", "start_value", "stopped_early", "guard_fired", "refused",
            "reason")
    return {f"flywheel.heldout.{k}": str(final.get(f"heldout.{k}"))[:4900] for k in keys
            if f"heldout.{k}" in final}


def train(cfg: Config, training: str, data: str, *, base: str | None = None, tracker=None, iteration: int = 0,
          register: bool = True, fresh: bool = False, run_name: str | None = None,
          method: str | None = None) -> TrainResult:
    """Train `training` (judge_sft | judge_dpo | policy_dpo | diffusion_dpo, or the CLI's dashed names) on the
    dataset at `data`, through Ray Train, and register the result. `method` picks the update method of a
    preference training (dpo | dpo_sft | bon_sft; default: the first configured). With held-out evaluation on,
    the export is the best held-out state, and `final` carries the decision (`heldout.refused`, `.reason`):
    a refused update is still registered (for inspection) but must not be promoted. Raises NonFiniteLossError
    (nothing registered) if the loss diverges."""
    from flywheel.track import Tracker, code_version, flatten

    training = normalize(training)
    manifest = read_manifest(data)
    if manifest.kind != DATA_KINDS[training]:
        raise ValueError(f"{training} trains on '{DATA_KINDS[training]}' datasets; {data} holds '{manifest.kind}'")
    base, base_ver = base_version(cfg, base or default_base(cfg, training))
    settings = cfg.train.resolved(training, method)
    judge_ref = heldout_judge(cfg, training, settings)
    what = settings.model_dump(mode="json", exclude=HOW_NOT_WHAT)
    keyed = {"training": training, "settings": what, "base": base,
             "base_version": base_ver, "data": manifest.content_hash, "seed": cfg.run.seed,
             "workers": cfg.resources.train.actors}
    if judge_ref is not None:
        keyed["heldout_judge"] = judge_ref
    held = heldout_inputs(cfg, training, settings, judge_ref)  # the probe's files, read here: workers may be elsewhere
    if held:
        keyed["heldout_inputs"] = inputs_digest(held)
    run_key = _hash(keyed)
    name = run_name or f"{training.replace('_', '-')}-{settings.method + '-' if settings.method else ''}{run_key}"
    if fresh:
        name += time.strftime("-%Y%m%d-%H%M%S")
    reg_name = registry.registered_name(cfg, training)
    if register and not fresh and run_name is None:
        existing = registry.find_version(cfg, reg_name, run_key)
        if existing is not None:
            log.info("%s: identical training already registered as %s", training, registry.describe(existing))
            return TrainResult(training, name, run_key, registry.describe(existing), existing.run_id,
                               existing.tags.get("flywheel.checkpoint"), reused=True)

    lineage = {"training": training, "base_model": base, "base_model_version": base_ver, "data": data,
               "data_content_hash": manifest.content_hash, "data_kind": manifest.kind,
               "data_rows": manifest.row_count, "data_upstream": [u.model_dump() for u in manifest.upstream],
               "config_hash": cfg.hash(), "train_config_hash": _hash(what),
               "run_key": run_key, "run_name": name, "code_version": code_version(), "method": settings.method}
    tracker = tracker or Tracker(cfg)
    with ExitStack() as stack:
        if tracker.parent is None:
            stack.enter_context(tracker.iteration(iteration, run_name=f"train-{training.replace('_', '-')}",
                                                  tags={"flywheel.standalone_training": training}))
        run = stack.enter_context(tracker.stage(training.replace("_", "-"), tags={
            "flywheel.run_key": run_key, "flywheel.base_model": base, "flywheel.ray_train_run": name,
            "flywheel.method": str(settings.method)}))
        params = flatten(settings.model_dump(mode="json"), "settings.")
        mlflow.log_params({k: v[:500] for k, v in params.items()})
        tracker.log_manifest(manifest)
        job = TrainJob(training=training, config=cfg.model_dump(mode="json"), data=data, base=base,
                       run_key=run_key, tracking_uri=cfg.tracking.uri, mlflow_run_id=run.info.run_id,
                       lineage=lineage, method=settings.method, heldout_judge=judge_ref, **held)
        with tempfile.TemporaryDirectory(prefix="flywheel-train-") as tmp:
            res = launch(cfg, job, name, tmp)
            numeric = {f"final.{k}": float(v) for k, v in res.final.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            mlflow.log_metrics(numeric)
            # what Ray Train went through: worker-group failures it restarted from a checkpoint, and where it ran
            mlflow.log_metrics({"ray_train.failures": res.failures, "ray_train.nodes": len(res.worker_nodes)})
            mlflow.set_tags({"flywheel.ray_train.failures": str(res.failures),
                             "flywheel.ray_train.worker_nodes": ",".join(res.worker_nodes)[:4900],
                             "flywheel.ray_train.resumed_from": str(res.final.get("resumed_from"))})
            mlflow.log_text("".join(json.dumps(e) + "\n" for e in res.steps), "training/steps.jsonl")
            mlflow.log_dict(res.final, "training/final.json")
            if "heldout.best_step" in res.final:
                mlflow.log_dict(res.final.get("heldout.curves", []), "training/heldout_curves.json")
                mlflow.set_tags(heldout_tags(res.final))
            model_uri = None
            if register:
                meta = registry.export_meta(res.export_dir)
                tags = {f"flywheel.{k}": (v if isinstance(v, str) else json.dumps(v, default=str))[:4900]
                        for k, v in lineage.items()}
                tags.update({"flywheel.format": meta.get("format", ""), "flywheel.adapter_base":
                             meta.get("adapter_base", ""), "flywheel.final_step": str(res.final.get("final_step")),
                             "flywheel.checkpoint": res.checkpoint_path, "flywheel.mlflow_run": run.info.run_id})
                tags.update(heldout_tags(res.final))
                mv = registry.register(cfg, training, res.export_dir, run.info.run_id, tags)
                model_uri = registry.describe(mv)
                mlflow.set_tag("flywheel.model_version", model_uri)
                if cfg.train.prune_registered and run_name is None and res.checkpoint_path:
                    gone = prune_run(cfg, name, keep=res.checkpoint_path)
                    log.info("%s: registered as %s; %d earlier checkpoints of run %s deleted (the final one stays: "
                             "%s)", training, model_uri, len(gone), name, res.checkpoint_path)
        return TrainResult(training, name, run_key, model_uri, run.info.run_id, res.checkpoint_path, res.final,
                           res.steps)
