"""The iteration's first stage: the oracle world's base models (`world:judge`, `world:policy`,
`world:generator`), built once and cached (models/zoo.py build_world is the core).

A build that is due runs in one Ray task with `resources.base_models`, not in the driver: under `ray job submit`
the driver gets one torch thread from Ray (OMP_NUM_THREADS=1), and on a cluster it sits on the head node, which
should not train for an hour. Cached models are only read, in the driver, without a task.
"""
from __future__ import annotations

import logging
from pathlib import Path

import mlflow
import ray

from flywheel.config import Config
from flywheel.models.zoo import build_world, world_built, world_models, zoo_root
from flywheel.raycluster import init_ray, remote_options

log = logging.getLogger(__name__)


def run(cfg: Config) -> dict[str, tuple[Path, dict]]:
    """name -> (folder, build metrics) of each base model the config uses, building those not cached."""
    due = [m for m in world_models(cfg) if not world_built(cfg, m)]
    if not due:
        return build_world(cfg)  # the zoo (random initialisation, seconds) if need be, and the cached bases read
    init_ray(cfg)
    opts = remote_options(cfg.resources.base_models)
    # A task must fit on one node: asking more than the largest has would wait forever on a fixed cluster. A
    # cluster of 0-CPU nodes (a head that runs nothing, workers still to come) keeps the ask for its autoscaler.
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=0)
    if 0 < largest < opts["num_cpus"]:
        log.warning("base models: resources.base_models.num_cpus %s > the largest node's %s CPUs; the task takes "
                    "%s (torch still runs %d threads: the same build)", opts["num_cpus"], largest, largest,
                    max(1, int(cfg.resources.base_models.num_cpus)))
        opts["num_cpus"] = largest
    log.info("base models: building %s in a Ray task (%s CPUs) into %s", ", ".join(due), opts["num_cpus"],
             zoo_root(cfg))
    return ray.get(ray.remote(build_world).options(**opts).remote(cfg))


def log_to_mlflow(built: dict[str, tuple[Path, dict]]) -> None:
    """On the active (models stage) run: each base model's folder and build metrics, so a reviewer sees in MLflow
    what the loop started from (e.g. the judge base's perception accuracy) and how it was built (threads, CPU)."""
    for name, (path, metrics) in built.items():
        mlflow.set_tags({f"flywheel.base.{name}": str(path)} |
                        {f"flywheel.base.{name}.{k}": str(v) for k, v in metrics.items() if isinstance(v, str)})
        mlflow.log_metrics({f"base.{name}.{k}": float(v) for k, v in metrics.items()
                            if isinstance(v, int | float) and not isinstance(v, bool) and v == v})
