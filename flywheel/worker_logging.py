"""The package's INFO logs from every Ray worker process of a flywheel job: init_ray names `setup` as the job's
`worker_process_setup_hook`, so Ray runs it in each task, actor, Ray Data actor, Ray Train worker and Serve replica
before their code. A worker's root logger is Python's default (WARNING, no handler): without it a base model's
build steps, a training's held-out evaluations and a replica's load line never reach the driver (Ray forwards a
worker's stderr to it, prefixed with the task's name and pid).

Standard library only: every worker of the job imports this module when it starts."""

from __future__ import annotations

import logging

HOOK = f"{__name__}.setup"  # the runtime_env value: a module path, so workers import it rather than unpickle it


def setup() -> None:
    """Give the `flywheel` logger INFO level and a stderr handler. Only ours, so libraries stay as quiet as they
    were; it does not propagate, so a root logger set up later cannot print a line twice. Idempotent."""
    logger = logging.getLogger("flywheel")
    if any(getattr(h, "flywheel_worker", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.flywheel_worker = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
