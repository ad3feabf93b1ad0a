"""What old iterations' trainings left beside their datasets, for retention (flywheel/retention.py plans and
applies it):
- the Ray Train checkpoints of the trainings they registered (a second copy of the registered weights);
- this node's local copies of the versions they registered (`<workdir>/registry`, registry.materialize);
- with `storage.prune_model_versions`, those registered versions themselves: their weights in MLflow's artifact
  store and their registry entry (and weights an earlier prune failed to delete after their entry went).
Nothing in use goes: a version a kept iteration names (its start models, its gates' challengers and champions) or
an alias points at (champion, lineage); of registered versions, none a gate promoted either (the champions'
history, to roll back to: every one, or the newest storage.keep_promoted).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from flywheel.config import Config
from flywheel.iteration_record import IterationRecord
from flywheel.train import registry

log = logging.getLogger(__name__)
PENDING = "flywheel.weights_pending"  # on a training run while its version's deletion is under way


@dataclass(frozen=True)
class LocalCopy:
    name: str  # the registered model
    version: str
    run_id: str  # the MLflow run that registered it
    path: Path

    def label(self) -> str:
        return f"{self.name}/{self.path.name}"


@dataclass(frozen=True)
class Version:
    name: str
    version: str
    run_id: str  # the training's MLflow run, which keeps its metrics, logs and lineage tags
    source: str  # its weights: the run's export/ artifacts

    def label(self) -> str:
        return f"{self.name}/{self.version}"


def trainings(cfg: Config, records: dict[int, IterationRecord | None]) -> dict[int, dict[str, list[str]]]:
    """iteration -> the Ray Train runs its training stages ran, each with the MLflow runs of it that registered a
    version (none: never registered). A training's MLflow run sits below its stage's (judge-sft), or below the
    iteration's: climbed up to the iteration's run."""
    from flywheel import track

    iteration_of = {r.run_id: n for n, r in records.items() if r is not None and r.run_id}
    client = track.client(cfg)
    exp = client.get_experiment_by_name(cfg.experiment)
    out: dict[int, dict[str, list[str]]] = {n: {} for n in records}
    if exp is None or not iteration_of:
        return out
    parents: dict[str, str | None] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], "tags.`flywheel.ray_train_run` LIKE '%'", max_results=1000,
                                  page_token=token)
        for r in page:
            up = r.data.tags.get("mlflow.parentRunId")
            for _ in range(3):  # training -> stage -> iteration at most
                if up is None or up in iteration_of:
                    break
                if up not in parents:
                    try:
                        parents[up] = client.get_run(up).data.tags.get("mlflow.parentRunId")
                    except Exception:  # noqa: BLE001 - a run deleted from MLflow: its trainings stay unknown
                        parents[up] = None
                up = parents[up]
            if up in iteration_of:
                registered = out[iteration_of[up]].setdefault(r.data.tags["flywheel.ray_train_run"], [])
                if "flywheel.model_version" in r.data.tags:
                    registered.append(r.info.run_id)
        token = page.token
        if not token:
            return out


def local_copies(cfg: Config) -> list[LocalCopy]:
    """The versions copied to this node's <workdir>/registry (registry.materialize names them <version>-<run id>)."""
    root = registry.cache_root(cfg)
    out = []
    for model in sorted(root.iterdir()) if root.is_dir() else []:
        for d in sorted(model.iterdir()) if model.is_dir() else []:
            version, sep, run_id = d.name.partition("-")
            if sep and version.isdigit() and d.is_dir():
                out.append(LocalCopy(model.name, version, run_id, d))
    return out


def versions(cfg: Config) -> list[Version]:
    """Every registered version of the config's judge, policy and generator models."""
    client = registry.client(cfg)
    out = []
    for name in sorted({cfg.train.registry.judge, cfg.train.registry.policy, cfg.train.registry.generator}):
        try:
            found = client.search_model_versions(f"name='{name}'")
        except Exception:  # noqa: BLE001 - no such registered model yet
            continue
        out += [Version(name, str(mv.version), mv.run_id or "", mv.source) for mv in found]
    return sorted(out, key=lambda v: (v.name, int(v.version)))


def in_use(cfg: Config, records: dict[int, IterationRecord | None], kept, names: set[str]) -> set[tuple[str, str]]:
    """(name, version) of what the kept iterations name (start models, their gates' challengers and champions)
    and of what an alias of the registered models `names` points at; every version of a model whose aliases
    cannot be read."""
    client = registry.client(cfg)
    refs = [ref for n in kept if (r := records.get(n)) is not None
            for ref in [*r.start.values(), *_strings(r.decisions)] if registry.is_registry_uri(ref)]
    out = {v for ref in refs if (v := _version_of(client, ref)) is not None}
    for name in sorted(names):
        try:
            aliases = client.get_registered_model(name).aliases
        except Exception as e:  # noqa: BLE001 - unknown here: keep all of it
            log.warning("retention: registered model %s not read (%s): its versions and copies stay", name, e)
            out.add((name, "*"))
            continue
        out |= {(name, str(v)) for v in aliases.values()}
    return out


def promoted(records: dict[int, IterationRecord | None], keep: int | None = None) -> set[tuple[str, str]]:
    """(name, version) of the challengers gates promoted, the champions' history to roll back to: every one, or
    with `keep` (storage.keep_promoted) the newest `keep` of each model."""
    history: dict[str, list[str]] = {}
    for n in sorted(n for n, r in records.items() if r is not None):
        for d in records[n].decisions:
            if d.get("promoted") and registry.is_registry_uri(str(d.get("challenger", ""))):
                name, version = registry.parse_uri(d["challenger"])[:2]
                history.setdefault(name, []).append(version)
    return {(name, v) for name, vs in history.items() for v in list(dict.fromkeys(reversed(vs)))[:keep]}


def wanted(version: tuple[str, str], keep: set[tuple[str, str]]) -> bool:
    return version in keep or (version[0], "*") in keep


def delete_version(cfg: Config, v: Version) -> None:
    """The version out of the registry first (a version without weights would be found and fail to load), then its
    weights; its training run stays, tagged. The run is tagged flywheel.weights_pending before: if the weights'
    deletion then fails (a store down), a later prune finds them (orphaned) and deletes them."""
    client = registry.client(cfg)
    try:
        client.set_tag(v.run_id, PENDING, json.dumps({"name": v.name, "version": v.version, "source": v.source}))
        pending = True
    except Exception as e:  # noqa: BLE001 - a run deleted from MLflow: nothing to find a failure by
        log.warning("retention: run %s not tagged: %s", v.run_id, e)
        pending = False
    client.delete_model_version(v.name, v.version)
    delete_weights(cfg, v, pending)


def delete_weights(cfg: Config, v: Version, pending: bool = True) -> None:
    """A deleted version's weights from MLflow's artifact store; its training run's tags say so (`pending`: the
    run carries flywheel.weights_pending, removed now)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    get_artifact_repository(v.source).delete_artifacts()
    client = registry.client(cfg)
    try:
        client.set_tag(v.run_id, "flywheel.weights_pruned", f"version {v.version} of {v.name} and its weights "
                       "deleted by retention (storage.prune_model_versions)")
    except Exception as e:  # noqa: BLE001 - a run deleted from MLflow: the version went all the same
        log.warning("retention: run %s not tagged: %s", v.run_id, e)
        return
    if pending:
        client.delete_tag(v.run_id, PENDING)


def orphaned(cfg: Config) -> list[Version]:
    """Versions an earlier prune deleted from the registry and whose weights it failed to delete: their training
    runs are still tagged flywheel.weights_pending and the registry no longer has them (one it still has is a
    deletion that failed before it began)."""
    from flywheel import track

    client = track.client(cfg)
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is None:
        return []
    out, models = [], registry.client(cfg)
    # a deletion that failed halfway: a handful at most, one page
    for r in client.search_runs([exp.experiment_id], f"tags.`{PENDING}` LIKE '%'", max_results=1000):
        d = json.loads(r.data.tags[PENDING])
        if not _registered(models, d["name"], d["version"]):
            out.append(Version(d["name"], d["version"], r.info.run_id, d["source"]))
    return sorted(out, key=lambda v: (v.name, int(v.version)))


def _registered(models, name: str, version: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        models.get_model_version(name, version)
        return True
    except MlflowException as e:  # RESOURCE_DOES_NOT_EXIST; anything else (a registry down) is raised
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return False


def artifact_bytes(source: str) -> int:
    """The bytes under an artifact URI (a version's weights), listed through MLflow."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo, todo, total = get_artifact_repository(source), [None], 0
    while todo:
        for f in repo.list_artifacts(todo.pop()):
            if f.is_dir:
                todo.append(f.path)
            else:
                total += f.file_size or 0
    return total


def _version_of(client, ref: str) -> tuple[str, str] | None:
    try:
        name, version, alias = registry.parse_uri(ref)
        return name, version or str(client.get_model_version_by_alias(name, alias).version)
    except Exception:  # noqa: BLE001 - not a version reference, or an alias no longer set: names nothing
        return None


def _strings(value) -> list[str]:
    """Every string in a nest of dicts and lists (a gate decision's model references)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []
