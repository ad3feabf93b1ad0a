"""Which model the Serve app serves: `serve.model` (or models.judge) resolved ONCE, at deploy time, to a concrete
version, so every replica serves the same weights even if an alias moves while they start.

- `models:/judge@champion` -> the version the alias names now, e.g. `models:/judge/3` (MLflow model registry,
  flywheel/train/registry.py); each replica materializes it with `registry.resolve_base` (a download cached in
  <workdir>/registry, shared storage on a cluster);
- `zoo:judge`, a local/shared folder -> that folder, versioned by its content hash (`zoo:judge@<hash>`);
- a hub id -> itself (with its revision, if pinned).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from flywheel.config import Config, ModelRef


@dataclass(frozen=True)
class ServedModel:
    ref: str  # as configured, e.g. models:/judge@champion
    uri: str  # concrete: models:/judge/3, or a folder / hub id
    version: str  # what every response names as model_version
    run_id: str | None = None  # the MLflow run that produced a registered version

    def to_dict(self) -> dict:
        return asdict(self)


def served_ref(cfg: Config) -> str:
    return cfg.serve.model or cfg.models.judge.path


def resolve_served_model(cfg: Config) -> ServedModel:
    from flywheel.train.registry import get_version, is_registry_uri

    ref = served_ref(cfg)
    if is_registry_uri(ref):
        mv = get_version(cfg, ref)
        uri = f"models:/{mv.name}/{mv.version}"
        return ServedModel(ref=ref, uri=uri, version=uri, run_id=mv.run_id)
    from flywheel.models.versions import checkpoint_version
    from flywheel.models.zoo import resolve_model_path

    path = resolve_model_path(ModelRef(path=ref), cfg)
    if Path(path).is_dir():
        return ServedModel(ref=ref, uri=path, version=f"{ref}@{checkpoint_version(path)}")
    revision = cfg.models.judge.revision if ref == cfg.models.judge.path else None
    return ServedModel(ref=ref, uri=path, version=f"{ref}@{revision}" if revision else ref)


def local_weights(cfg: Config, served: ServedModel) -> str:
    """Inside a replica: what from_pretrained / vLLM loads for the served version."""
    from flywheel.train.registry import is_registry_uri, resolve_base

    return resolve_base(cfg, served.uri) if is_registry_uri(served.uri) else served.uri


def serving_alias(app_name: str) -> str:
    """The registry alias `flywheel serve` pins its registered version with (MLflow allows word characters and -)."""
    return "serving-" + re.sub(r"[^\w-]", "-", app_name)


def pin(cfg: Config, served: ServedModel, app_name: str) -> str | None:
    """Alias the registered version an app serves, so retention (storage.prune_model_versions), which keeps what an
    alias names, never deletes the weights a replica restarting would load; returns the alias (None: not a
    registered version). Deploying the app again moves it."""
    from flywheel.train import registry

    if not registry.is_registry_uri(served.uri):
        return None
    name, version, _ = registry.parse_uri(served.uri)
    alias = serving_alias(app_name)
    registry.client(cfg).set_registered_model_alias(name, alias, version)
    return alias


def unpin(cfg: Config, served: ServedModel, app_name: str) -> None:
    """Remove the app's alias if it still names this version (a later deployment of the app may have moved it)."""
    from flywheel import track
    from flywheel.train import registry

    if not registry.is_registry_uri(served.uri):
        return
    name, version, _ = registry.parse_uri(served.uri)
    # asked anew: the registry answered the pin, maybe hours ago; gone since, MLflow's retries would hold the
    # stopped command for minutes before its warning
    track.check_reachable(cfg.tracking.uri, again=True)
    client, alias = registry.client(cfg), serving_alias(app_name)
    if str(client.get_registered_model(name).aliases.get(alias)) == version:
        client.delete_registered_model_alias(name, alias)
