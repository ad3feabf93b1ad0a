"""Serve apps that live only as long as the driver that deployed them.

A Serve app outlives its driver: the Serve controller keeps it until someone deletes it. An iteration's preference
app is deleted when its labels are done, but a driver killed mid-labelling leaves it holding its replica (a GPU on
a cluster), and a later deployment can wait on those resources forever. So a driver joined to a cluster starts a
tiny actor beside each such app, on its own node. Ray fate-shares a non-detached actor with the driver that created
it, so when the driver dies the actor's name goes away. An app matching the pattern whose owner name is gone was
left by a dead driver, and the next sweep (before the next deployment) deletes it; so are apps older than this
scheme, which have no owner. An embedded Ray dies with its driver, apps and all: no owner is needed there.
"""

from __future__ import annotations

import functools
import logging
import re
import time

log = logging.getLogger(__name__)
NAMESPACE = "flywheel-serve-owners"  # fixed: drivers in other namespaces must find each other's owners


def owner_name(app_name: str) -> str:
    return f"{app_name}-owner"


def owner_alive(app_name: str) -> bool:
    import ray

    try:
        ray.get_actor(owner_name(app_name), namespace=NAMESPACE)
    except ValueError:  # Ray's "no such actor": never created, or gone with its driver
        return False
    return True


def remove_orphans(pattern: re.Pattern) -> list[str]:
    """Delete every Serve app whose whole name matches `pattern` and whose owner is gone; returns their names.
    Ray frees a dead driver's actors within seconds (a Ray client's after its reconnect grace period, ~30 s):
    a sweep sooner than that keeps the app, and the next one deletes it."""
    from ray import serve

    gone = [name for name in serve.status().applications if pattern.fullmatch(name) and not owner_alive(name)]
    for name in gone:
        log.warning("Serve app %s was left by a driver that is gone: deleting it", name)
        serve.delete(name)
    return gone


# (Ray's GCS address, this connection's job id, app name) -> the owner this driver holds. The handle must stay
# referenced: Ray collects an unreferenced actor.
_HELD: dict[tuple[str, str, str], object] = {}


def hold_owner(app_name: str, retry_s: float = 10.0) -> None:
    """Start `app_name`'s owner in this driver, before deploying the app, so another driver never sees the app
    without it. The owner lives as long as the driver, not the deployment: a name freed by ray.kill is released
    asynchronously, and the next deployment of the same app (seconds later) could find it still taken. It runs on
    the driver's node: an owner lost with another node would leave a live driver's app to the next sweep."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    context = ray.get_runtime_context()
    key = (context.gcs_address, context.get_job_id(), app_name)
    if key in _HELD and _answers(_HELD[key]):
        return
    here = NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False)
    deadline = time.monotonic() + retry_s
    while True:
        try:
            owner = _owner_class().options(name=owner_name(app_name), namespace=NAMESPACE, lifetime=None,
                                           scheduling_strategy=here).remote()
            ray.get(owner.ready.remote())
            break
        # Ray refuses a taken name (ActorAlreadyExistsError, a ValueError), or, when two drivers race for it, fails
        # the loser's creation (an actor error)
        except (ValueError, ray.exceptions.RayActorError) as e:
            if time.monotonic() < deadline:  # a driver that just ended (this process's last ray.init) frees it soon
                time.sleep(0.5)
                continue
            raise RuntimeError(f"Serve app {app_name} belongs to another live driver (its owner "
                               f"{owner_name(app_name)!r} exists in namespace {NAMESPACE!r}): one driver per app"
                               ) from e
    _HELD[key] = owner


def _answers(owner) -> bool:
    import ray

    try:
        return ray.get(owner.ready.remote(), timeout=30)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


@functools.cache
def _owner_class():
    import ray

    @ray.remote(num_cpus=0)
    class ServeAppOwner:
        def ready(self) -> bool:
            return True

    return ServeAppOwner
