"""Connecting to Ray and turning config resources into Ray options (the only place that reads ray.* config)."""

from __future__ import annotations

import json
import logging
import os
import socket

import ray

from flywheel import worker_logging
from flywheel.config import Config, StageResources

log = logging.getLogger(__name__)

_EMBEDDED_ADDRESS: str | None = None  # the address of the embedded Ray this process started, if any
# The addresses of the embedded Rays this process and its parents started (commas between them), extended by
# start_embedded and inherited by every child process: a RAY_ADDRESS among them names an embedded Ray (maybe shut
# down, maybe a parent's), never a cluster to join. Ray has no shutdown hook to unset RAY_ADDRESS with, so a
# process that ran an embedded Ray (a test session, a user's script) would otherwise hand its child processes an
# address of a GCS that is gone, and ray.init waits for it. All of them, not the last: code that puts an earlier
# RAY_ADDRESS back (a test fixture) must not make it a cluster's.
EMBEDDED_ENV = "FLYWHEEL_EMBEDDED_RAY_ADDRESS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def embedded_ray() -> bool:
    """Whether this process runs the embedded Ray it started (init_ray with `ray.address` null), not a cluster."""
    return (ray.is_initialized() and _EMBEDDED_ADDRESS is not None
            and ray.get_runtime_context().gcs_address == _EMBEDDED_ADDRESS)


def worker_env() -> dict:
    """The job's runtime_env from ray.init: every worker process of the job shows our INFO progress (see
    worker_logging). Ray merges it into a `ray job submit` job's own (its working_dir, pip, ...), and refuses a
    field set in both: a job that brings its own setup hook keeps it, without our worker logs."""
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {}
    if job.get("worker_process_setup_hook"):
        log.info("ray: the job sets its own worker_process_setup_hook (%s); workers' flywheel INFO lines are not "
                 "shown", job["worker_process_setup_hook"])
        return {}
    return {"worker_process_setup_hook": worker_logging.HOOK}


def cluster_address_from_env() -> str | None:
    """RAY_ADDRESS, unless it is one an embedded Ray set (this process's or a parent's; see EMBEDDED_ENV)."""
    env = os.environ.get("RAY_ADDRESS")
    return env if env and env not in os.environ.get(EMBEDDED_ENV, "").split(",") else None


def init_ray(cfg: Config) -> None:
    """Join the configured cluster, or start an embedded Ray when `ray.address` is null. Idempotent."""
    if not ray.is_initialized():
        # A job started by `ray job submit` runs inside the cluster: RAY_ADDRESS is set and must win
        address = cfg.ray.address or cluster_address_from_env()
        if address is not None:
            ray.init(address=address, log_to_driver=True, runtime_env=worker_env())
        else:
            start_embedded(cfg.ray.num_cpus, runtime_env=worker_env())
        log.info("ray: %s (%s CPUs, %s GPUs)", address or "embedded", ray.cluster_resources().get("CPU"),
                 ray.cluster_resources().get("GPU", 0))
    # Ray Data's wait, for every dataset this driver runs from now on: set either way, so that a config without it
    # does not inherit the bound of one this process ran before (a test, a notebook); Ray Data's default waits for
    # ever. (A `from` import: `import ray.data` here would make `ray` local to this function.)
    from ray.data.context import DEFAULT_WAIT_FOR_MIN_ACTORS_S, DataContext

    wait = cfg.ray.wait_for_actors_s
    DataContext.get_current().wait_for_min_actors_s = DEFAULT_WAIT_FOR_MIN_ACTORS_S if wait is None else wait


def start_embedded(num_cpus: int | None, *, log_to_driver: bool = True, runtime_env: dict | None = None) -> None:
    """Start a private Ray that never attaches to another cluster on the box. Its dashboard runs (on a free port)
    and RAY_ADDRESS points at it for every child process: Ray Train's placement-group cleaner asks the state API
    whether a run's controller is alive and kills the run when the answer is "not found", which is what it gets
    with no dashboard, or from another cluster's dashboard."""
    global _EMBEDDED_ADDRESS
    port = free_port()
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    _EMBEDDED_ADDRESS = os.environ["RAY_ADDRESS"] = f"{ray.util.get_node_ip_address()}:{port}"
    os.environ[EMBEDDED_ENV] = ",".join(filter(None, [os.environ.get(EMBEDDED_ENV), _EMBEDDED_ADDRESS]))
    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_port=0,
                 log_to_driver=log_to_driver, runtime_env=runtime_env)
    finally:
        os.environ.pop("RAY_GCS_SERVER_PORT", None)  # only needed to start the GCS; never leak it


class ActorsDidNotStart(RuntimeError):
    """A stage's actors (or a training's workers) did not start within ray.wait_for_actors_s: no node had, or
    freed, what each asks."""


def actor_ask(res: StageResources) -> dict[str, float]:
    """What one actor or worker of a stage asks a node for, as Ray names the resources."""
    ask = {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.resources}
    return {k: v for k, v in ask.items() if v > 0}


def ask_text(ask: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in ask.items())


def warn_if_no_node_fits(who: str, res: StageResources, setting: str = "") -> str | None:
    """Log that `who` ("stage x: each of its actors") would wait for ever on a fixed cluster when no live node has
    what one asks (on an autoscaled one it waits for the node); no_node_fits's answer."""
    ask = actor_ask(res)
    short = no_node_fits(ask)
    if short is not None:
        log.warning("%s asks %s and no live node has that (%s): it waits for a node an autoscaler adds, and on a "
                    "fixed cluster never starts (%sray.wait_for_actors_s makes it fail after that long instead)",
                    who, ask_text(ask), short, f"{setting}; " if setting else "")
    return short


def no_node_fits(ask: dict[str, float]) -> str | None:
    """None if a live node has all of `ask` (in total: it may be busy now); else what the live nodes have of it,
    e.g. "1 node with CPU 2, GPU 0"."""
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    if any(all(node.get(k, 0) >= v for k, v in ask.items()) for node in nodes):
        return None
    kinds: dict[str, int] = {}
    for node in nodes:
        kind = ", ".join(f"{k} {node.get(k, 0):g}" for k in ask)
        kinds[kind] = kinds.get(kind, 0) + 1
    return "; ".join(f"{n} node{'s' if n > 1 else ''} with {kind}" for kind, n in kinds.items()) or "no live node"


def remote_options(res: StageResources) -> dict:
    """Ray task/actor options for one worker of a stage."""
    opts: dict = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus}
    if res.resources:
        opts["resources"] = dict(res.resources)
    return opts
