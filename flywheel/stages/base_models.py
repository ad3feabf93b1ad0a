"""The iteration's first stage: the oracle world's base models (`world:judge`, `world:policy`,
`world:generator`), built once and cached (models/zoo.py build_world is the core).

A build that is due runs in one Ray task with `resources.base_models`, not in the driver: under `ray job submit`
the driver gets one torch thread from Ray (OMP_NUM_THREADS=1), and on a cluster it sits on the head node, which
should not train for an hour. Cached models are only read, in the driver, without a task.
"""
from __future__ import annotations

import logging
from pathlib import Path

import ray

from flywheel.config import Config
from flywheel.models.zoo import build_world, build_zoo, world_built, world_models, zoo_root
from flywheel.raycluster import init_ray, remote_options

log = logging.getLogger(__name__)


def run(cfg: Config) -> dict[str, tuple[Path, dict]]:
    """name -> (folder, build metrics) of each base model the config uses, building those not cached."""
    build_zoo(cfg)  # random initialisation: seconds, and needed before any build
    due = [m for m in world_models(cfg) if not world_built(cfg, m)]
    if not due:
        return build_world(cfg)
    init_ray(cfg)
    opts = remote_options(cfg.resources.base_models)
    cpus = ray.cluster_resources().get("CPU", 0)
    if opts["num_cpus"] > cpus:  # a task asking for more than the cluster has would wait forever
        log.warning("base models: resources.base_models.num_cpus %s > the cluster's %s CPUs; the task takes %s "
                    "(torch still runs %d threads: the same build)", opts["num_cpus"], cpus, cpus,
                    max(1, int(cfg.resources.base_models.num_cpus)))
        opts["num_cpus"] = cpus
    log.info("base models: building %s in a Ray task (%s CPUs) into %s", ", ".join(due), opts["num_cpus"],
             zoo_root(cfg))
    return ray.get(ray.remote(build_world).options(**opts).remote(cfg))
