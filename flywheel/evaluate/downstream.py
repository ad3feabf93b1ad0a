"""Downstream evaluation of the policies by the oracle: held-out items, scored against ground truth.

Run inside a Ray task with the candidates stage's resources, so on a cluster the 7B policy lands on a GPU node.
(With real checkpoints and no oracle, the same place would score held-out prompts with the champion judge.)

A result is kept under <storage>/downstream-evals/ when the model cannot change under its name (a registered
version, a hash-named zoo or world folder): an unpromoted champion is the "before" of every iteration, and a
promoted one was the "after" of the iteration that promoted it, so each model is evaluated once per eval setting.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field

from flywheel import storage
from flywheel.config import Config, ModelRef

log = logging.getLogger(__name__)
# Part of a kept result's key: bump it when the oracle's scoring of held-out items changes (policy_eval.py,
# check_text.py, check_image.py), so results kept by the older code are not read back.
SCORING_VERSION = 1


@dataclass
class Downstream:
    """A model's oracle metrics on the held-out items, and per item the values some metrics average (in item
    order; every model is asked the same items), so the gate can compare two models item by item."""

    metrics: dict[str, float]
    per_item: dict[str, list[float]] = field(default_factory=dict)


def _policy(cfg: Config, ref: str) -> Downstream:
    from flywheel.engines.hf import HFTextEngine
    from flywheel.models.zoo import resolve_model_path
    from flywheel.worlds.shapes.policy_eval import evaluate_text_policy_items

    gen = cfg.policy.generation.model_copy(update={"temperature": 0.0})  # greedy: the policy's own answer
    engine = HFTextEngine(resolve_model_path(ModelRef(path=ref), cfg), gen)
    return Downstream(*evaluate_text_policy_items(engine, cfg.world.shapes, n=cfg.gate.eval_items,
                                                  seed=cfg.run.seed))


def _generator(cfg: Config, ref: str) -> Downstream:
    from flywheel.engines.diffusion import DiffusersImageEngine
    from flywheel.models.zoo import resolve_model_path
    from flywheel.worlds.shapes.policy_eval import evaluate_generator_items

    engine = DiffusersImageEngine(resolve_model_path(ModelRef(path=ref), cfg), cfg.generator.generation)
    return Downstream(*evaluate_generator_items(engine, cfg.world.shapes, n=cfg.gate.eval_items,
                                                seed=cfg.run.seed))


def _remote(fn, cfg: Config, ref: str) -> Downstream:
    import ray

    from flywheel.raycluster import init_ray, remote_options

    init_ray(cfg)
    return ray.get(ray.remote(fn).options(**remote_options(cfg.resources.candidates)).remote(cfg, ref))


def _identity(cfg: Config, ref: str) -> str | None:
    """What names the model's weights for good, or None when they may change under the same reference (a path,
    a hub id without a revision)."""
    from flywheel.models.zoo import WORLD_PREFIX, ZOO_PREFIX, resolve_model_path
    from flywheel.train.registry import get_version, is_registry_uri

    if is_registry_uri(ref):  # an alias resolves to its version; the source names the training run's artifacts
        return get_version(cfg, ref).source
    if ref.startswith((WORLD_PREFIX, ZOO_PREFIX)):  # the folder's name carries the hash of what built it
        return resolve_model_path(ModelRef(path=ref), cfg)
    return None


def _cached(role: str, fn, cfg: Config, ref: str) -> Downstream:
    model = _identity(cfg, ref)
    if model is None:
        return _remote(fn, cfg, ref)
    setting = cfg.stage_hash(f"downstream-{role}")  # the held-out items and the decoding
    key = hashlib.sha256(f"{SCORING_VERSION}|{setting}|{model}".encode()).hexdigest()[:16]
    uri = storage.join(cfg.storage.uri, "downstream-evals", f"{role}-{key}.json")
    if storage.exists(uri):
        kept = json.loads(storage.read_bytes(uri))
        log.info("%s %s: evaluated earlier on the same items (%s)", role, ref, uri)
        return Downstream(kept["metrics"], kept["per_item"])
    result = _remote(fn, cfg, ref)
    storage.write_bytes(uri, json.dumps({"ref": ref, "model": model, **asdict(result)}).encode())
    return result


def evaluate_policy_ref(cfg: Config, ref: str) -> Downstream:
    return _cached("policy", _policy, cfg, ref)


def evaluate_generator_ref(cfg: Config, ref: str) -> Downstream:
    return _cached("generator", _generator, cfg, ref)
