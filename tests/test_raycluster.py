"""Logs from inside Ray workers: a worker's root logger is Python's default (WARNING, no handler), so the package's
INFO progress lines (a base model's build steps, a training's held-out evaluations) are lost unless the worker sets
its logging up. init_ray makes Ray do that in every worker process of the job (worker_logging.setup as the
job's worker_process_setup_hook). Ray forwards a worker's stderr to the driver."""

import json
import logging
import os
import subprocess
import sys

import pytest
import ray

from flywheel import raycluster
from flywheel.raycluster import init_ray, worker_env


@pytest.fixture(scope="module")
def flywheel_ray(cfg):
    assert not ray.is_initialized()
    # init_ray points RAY_ADDRESS at its embedded Ray and remembers it as its own: both restored afterwards, or a
    # later test's init_ray would take an address an earlier embedded Ray left behind for a cluster to join
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(raycluster, "_EMBEDDED_ADDRESS", raycluster._EMBEDDED_ADDRESS)
        for name in ("RAY_ADDRESS", raycluster.EMBEDDED_ENV):
            mp.setenv(name, "")  # tracked, so that leaving removes the address init_ray sets
            mp.delenv(name)
        init_ray(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": None, "num_cpus": 1})}))
        yield
        ray.shutdown()


def test_every_worker_of_a_flywheel_ray_shows_info_lines_once(flywheel_ray):
    def _flywheel_logging() -> tuple[int, int]:  # defined here: Ray ships it by value (tests are no package)
        """In a worker: a `flywheel` logger's effective level and how many handlers a line of it reaches."""
        logger = logging.getLogger("flywheel.stages.base_models")
        handlers, node = 0, logger
        while node is not None:
            handlers += len(node.handlers)
            node = node.parent if node.propagate else None
        return logger.getEffectiveLevel(), handlers

    task = ray.remote(num_cpus=0)(_flywheel_logging)
    assert ray.get(task.remote()) == (logging.INFO, 1)  # without the hook: (WARNING, 0), every INFO line dropped
    assert ray.get(task.remote()) == (logging.INFO, 1)  # a reused worker process: still one handler, no repeats

    @ray.remote(num_cpus=0)
    class Actor:  # Ray Data's actors, Ray Train's workers and Serve's replicas are actors like this one
        def level(self):
            return _flywheel_logging()

    assert ray.get(Actor.remote().level.remote()) == (logging.INFO, 1)


def test_an_embedded_rays_address_reaches_its_workers_but_never_makes_a_child_join_it(flywheel_ray):
    """Ray Train's placement-group cleaner (a worker) finds its dashboard through RAY_ADDRESS, so the embedded Ray's
    workers need it; a child process that inherits it (a test's `flywheel run`, once failed in CI with "Failed to
    connect to Ray cluster" after an earlier test's embedded Ray was shut down) must start its own Ray instead."""
    gcs = ray.get_runtime_context().gcs_address
    assert os.environ["RAY_ADDRESS"] == os.environ[raycluster.EMBEDDED_ENV] == gcs
    assert ray.get(ray.remote(lambda: os.environ.get("RAY_ADDRESS")).remote()) == gcs
    assert raycluster.cluster_address_from_env() is None
    child = subprocess.run([sys.executable, "-c", "from flywheel.raycluster import cluster_address_from_env as f; "
                            "print(f())"], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "None"


def test_a_cluster_address_in_the_environment_is_joined(monkeypatch):
    # two embedded Rays were started (a parent's, then this process's)
    monkeypatch.setenv(raycluster.EMBEDDED_ENV, "10.0.0.1:6379,10.0.0.1:7000")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # a cluster's (a `ray job submit` job's), not the embedded
    assert raycluster.cluster_address_from_env() == "10.0.0.2:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:7000")
    assert raycluster.cluster_address_from_env() is None
    # an earlier embedded Ray's address put back (a test fixture restoring RAY_ADDRESS alone) is no cluster either:
    # taken for one, it made the smoke test wait for a gone GCS
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert raycluster.cluster_address_from_env() is None


def test_the_scheduler_never_takes_an_embedded_rays_address_for_a_cluster(monkeypatch):
    from flywheel.schedule import ScheduleError, make_client

    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.setenv(raycluster.EMBEDDED_ENV, "10.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with pytest.raises(ScheduleError, match="no cluster"):
        make_client(None)


def test_worker_logging_setup_writes_each_line_once_to_stderr():
    # in a child process: it changes the process's `flywheel` logger, which this test process must keep as is
    # a root handler set up afterwards (as a library might) prints no line twice; others' INFO stays quiet
    code = ("import logging; from flywheel.worker_logging import setup; setup(); setup(); "
            "logging.basicConfig(level=logging.WARNING); logging.getLogger('flywheel.x').info('step 3/10'); "
            "logging.getLogger('transformers').info('not ours')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err.splitlines() == ["INFO flywheel.x: step 3/10"]


def test_a_submitted_job_keeps_its_own_setup_hook(monkeypatch, caplog):
    # Ray merges ray.init's runtime_env into the submitted job's and refuses a field set in both
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x"}}))
    assert worker_env() == {"worker_process_setup_hook": "flywheel.worker_logging.setup"}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {"working_dir": "gcs://_ray_pkg_x", "worker_process_setup_hook": "theirs.setup"}}))
    with caplog.at_level(logging.INFO, logger="flywheel.raycluster"):
        assert worker_env() == {}
    assert "theirs.setup" in caplog.text


@pytest.mark.parametrize("preset, expected", [(None, 300), ("77", 77)])
def test_ray_waits_longer_for_its_dashboard_unless_the_user_says(preset, expected):
    # Ray's own default, 60 s, failed ray.init on a loaded 2-core box. The check reads Ray's constant in a fresh
    # interpreter, so it fails if Ray renames the variable or flywheel stops setting it before ray is imported.
    env = {k: v for k, v in os.environ.items() if k != "RAY_DASHBOARD_STARTUP_TIMEOUT_S"}
    if preset is not None:
        env["RAY_DASHBOARD_STARTUP_TIMEOUT_S"] = preset
    code = "import flywheel.raycluster, ray._private.ray_constants as c; print(c.RAY_DASHBOARD_STARTUP_TIMEOUT_S)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert int(out.split()[-1]) == expected
