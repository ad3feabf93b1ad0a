"""Downstream evaluation of the policies by the oracle: held-out items, scored against ground truth.

Run inside a Ray task with the candidates stage's resources, so on a cluster the 7B policy lands on a GPU node.
(With real checkpoints and no oracle, the same place would score held-out prompts with the champion judge.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flywheel.config import Config, ModelRef


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


def evaluate_policy_ref(cfg: Config, ref: str) -> Downstream:
    return _remote(_policy, cfg, ref)


def evaluate_generator_ref(cfg: Config, ref: str) -> Downstream:
    return _remote(_generator, cfg, ref)
