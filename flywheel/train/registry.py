"""The MLflow model registry for trained models: register a training's export as a model version, and load a
version back into a local `from_pretrained` directory or a working engine.

A version's artifacts (the training's `export/`) hold only safetensors and JSON, never pickles:
- `model/`: full weights (a full fine-tune, or LoRA merged into its base) with processor/tokenizer, or for the
  generator a whole StableDiffusionXLPipeline folder - loadable by the engines as is;
- `adapter/`: the LoRA adapter (PEFT `adapter_model.safetensors`, or diffusers' `pytorch_lora_weights.safetensors`
  for the UNet) - present when LoRA was trained;
- `flywheel.json`: the lineage (base model and its version, data manifests, config hashes, steps).
The same lineage is on the version as `flywheel.*` tags, so the registry can be searched by it.

Model references accepted wherever a base model is named: `zoo:<name>`, a local/shared path, a hub id, or
`models:/<name>/<version>` / `models:/<name>@<alias>` for a registered version.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path

from flywheel.config import Config, ModelRef

log = logging.getLogger(__name__)
REGISTRY_PREFIX = "models:/"
EXPORT = "export"
TRAINING_NAMES = {"judge_sft": "judge", "judge_dpo": "judge", "policy_dpo": "policy", "diffusion_dpo": "generator"}


def registered_name(cfg: Config, training: str) -> str:
    return getattr(cfg.train.registry, TRAINING_NAMES[training])


def client(cfg: Config):
    from flywheel import track

    return track.client(cfg)


def parse_uri(uri: str) -> tuple[str, str | None, str | None]:
    """models:/judge/3 -> ("judge", "3", None); models:/judge@champion -> ("judge", None, "champion")."""
    if not uri.startswith(REGISTRY_PREFIX):
        raise ValueError(f"{uri!r} is not a registered-model URI (models:/<name>/<version> or models:/<name>@<alias>)")
    rest = uri[len(REGISTRY_PREFIX):]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, None, alias
    name, _, version = rest.rpartition("/")
    if not name or not version.isdigit():
        raise ValueError(f"{uri!r}: expected models:/<name>/<version> or models:/<name>@<alias>")
    return name, version, None


def get_version(cfg: Config, uri: str):
    name, version, alias = parse_uri(uri)
    c = client(cfg)
    return c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)


def cache_root(cfg: Config) -> Path:
    """Where this node keeps its local copies of registered versions (downloaded, and merged if adapters)."""
    return Path(cfg.run.workdir) / "registry"


def _cache_dir(cfg: Config, mv) -> Path:
    """A version's local copy, named by its number AND the run that logged it: a version number alone names
    another model once the registry is another one (a workdir copied or seeded from another, a reset
    mlflow.db). That happened here: a workdir seeded with another's registry/ trained and evaluated that
    workdir's judge 1 in place of its own, silently."""
    return cache_root(cfg) / mv.name / f"{mv.version}-{mv.run_id}"


def _publish(tmp: Path, final: Path) -> None:
    """Move a fully written folder into place; if another worker won the race, keep theirs."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def materialize(cfg: Config, uri: str) -> Path:
    """The export folder of a registered version, downloaded once into <workdir>/registry/<name>/<version>-<run
    id>."""
    import mlflow

    mv = get_version(cfg, uri)
    final = _cache_dir(cfg, mv) / EXPORT
    if final.is_dir():  # a download appears there only when complete (see _publish)
        return final
    tmp = final.parent / f".tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    got = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(tmp),
                                              tracking_uri=cfg.tracking.uri)
    _publish(Path(got), final)
    shutil.rmtree(tmp, ignore_errors=True)
    return final


def export_meta(export: str | Path) -> dict:
    return json.loads(Path(export, "flywheel.json").read_text())


def resolve_base(cfg: Config, ref: str) -> str:
    """What from_pretrained takes for a model reference; a registered version is materialized (and, if it was
    stored as an adapter only, merged into its base once and cached)."""
    from flywheel.models.zoo import resolve_model_path

    if not ref.startswith(REGISTRY_PREFIX):
        return resolve_model_path(ModelRef(path=ref), cfg)
    export = materialize(cfg, ref)
    if (export / "model").is_dir():
        return str(export / "model")
    merged = export.parent / "merged"
    if not merged.is_dir():
        meta = export_meta(export)
        tmp = export.parent / f".merge-{uuid.uuid4().hex[:8]}"
        _merge_adapter(cfg, meta, export / "adapter", tmp)
        _publish(tmp, merged)
    return str(merged)


def _merge_adapter(cfg: Config, meta: dict, adapter: Path, out: Path) -> None:
    base = resolve_base(cfg, meta["adapter_base"])
    if meta["training"] == "diffusion_dpo":
        from flywheel.train.diffusion_dpo import merge_lora_into_pipeline

        merge_lora_into_pipeline(base, adapter, out)
        return
    from peft import PeftModel

    from flywheel.train.hf import load_vlm

    model, processor = load_vlm(base)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out)
    processor.save_pretrained(out)


def find_version(cfg: Config, name: str, run_key: str):
    """An existing version trained by the same run key (same training, settings, base and data), if any."""
    c = client(cfg)
    try:
        found = c.search_model_versions(f"name='{name}' and tags.`flywheel.run_key`='{run_key}'")
    except Exception:  # no such registered model yet
        return None
    return max(found, key=lambda v: int(v.version)) if found else None


def latest_version(cfg: Config, name: str, training: str | None = None):
    """The newest version of a registered model (optionally only those made by one training)."""
    c = client(cfg)
    query = f"name='{name}'" + (f" and tags.`flywheel.training`='{training}'" if training else "")
    try:
        found = c.search_model_versions(query)
    except Exception:
        return None
    return max(found, key=lambda v: int(v.version)) if found else None


def register(cfg: Config, training: str, export_dir: str | Path, run_id: str, tags: dict[str, str]):
    """Log the export as artifacts of the stage run and register it as a new version."""
    from mlflow.exceptions import MlflowException

    export_dir = Path(export_dir)
    bad = [p.name for p in export_dir.rglob("*") if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".pickle")]
    if bad:
        raise ValueError(f"refusing to register pickled files {bad}: weights must be safetensors")
    c = client(cfg)
    c.log_artifacts(run_id, str(export_dir), artifact_path=EXPORT)
    name = registered_name(cfg, training)
    try:
        c.create_registered_model(name, description=f"flywheel: trained by {training} and its siblings")
    except MlflowException as e:
        if "already exists" not in str(e).lower() and "RESOURCE_ALREADY_EXISTS" not in str(e):
            raise
    source = f"{c.get_run(run_id).info.artifact_uri}/{EXPORT}"
    mv = c.create_model_version(name, source=source, run_id=run_id, tags={k: str(v) for k, v in tags.items()})
    log.info("registered %s version %s (%s)", name, mv.version, source)
    return mv


def local_path(cfg: Config, uri: str) -> str:
    """A local from_pretrained directory of a registered version (alias of resolve_base)."""
    return resolve_base(cfg, uri)


def load_engine(cfg: Config, uri: str):
    """A working engine for a registered version: HFTextEngine for the judge/policy, DiffusersImageEngine for
    the generator. `uri` is models:/<name>/<version> or models:/<name>@<alias>."""
    path = resolve_base(cfg, uri)
    mv = get_version(cfg, uri)
    training = mv.tags.get("flywheel.training", "")
    if training == "diffusion_dpo":
        from flywheel.engines.diffusion import DiffusersImageEngine

        return DiffusersImageEngine(path, cfg.generator.generation)
    from flywheel.engines.hf import HFTextEngine

    role = "policy" if training == "policy_dpo" else "judge"
    return HFTextEngine(path, getattr(cfg, role).generation)


def is_registry_uri(ref: str) -> bool:
    return ref.startswith(REGISTRY_PREFIX)


def describe(mv) -> str:
    return f"{REGISTRY_PREFIX}{mv.name}/{mv.version}"


__all__ = ["cache_root", "client", "describe", "export_meta", "find_version", "get_version", "is_registry_uri",
           "latest_version", "load_engine", "local_path", "materialize", "parse_uri", "register", "registered_name",
           "resolve_base"]
