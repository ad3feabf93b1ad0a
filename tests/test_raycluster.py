"""Logs from inside Ray tasks: a worker's root logger is Python's default (WARNING, no handler), so the package's
INFO progress lines (a base model's build steps, a training's held-out evaluations) are lost unless the task sets
its logging up (raycluster.worker_logging / logged). Ray forwards a worker's stderr to the driver."""

import logging
import subprocess
import sys

import pytest
import ray

from flywheel.raycluster import logged


@pytest.fixture(scope="module")
def one_cpu_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_a_logged_task_shows_info_lines_once_and_a_bare_one_does_not(one_cpu_ray):
    def _flywheel_logging() -> tuple[int, int]:  # defined here: Ray ships it by value (tests are no package)
        """Inside a task: a `flywheel` logger's effective level and how many handlers a line of it reaches."""
        logger = logging.getLogger("flywheel.stages.base_models")
        handlers, node = 0, logger
        while node is not None:
            handlers += len(node.handlers)
            node = node.parent if node.propagate else None
        return logger.getEffectiveLevel(), handlers

    bare = ray.get(ray.remote(num_cpus=0)(_flywheel_logging).remote())
    assert bare[0] == logging.WARNING  # the default this guards against: INFO dropped
    task = ray.remote(num_cpus=0)(logged(_flywheel_logging))
    assert ray.get(task.remote()) == (logging.INFO, 1)
    assert ray.get(task.remote()) == (logging.INFO, 1)  # a reused worker process: still one handler, no repeats
    assert logged(_flywheel_logging).__name__ == "_flywheel_logging"  # Ray names the task after it


def test_worker_logging_writes_each_line_once_to_stderr():
    # in a child process: it changes the process's `flywheel` logger, which this test process must keep as is
    # a root handler set up afterwards (as a library might) prints no line twice; others' INFO stays quiet
    code = ("import logging; from flywheel.raycluster import worker_logging; worker_logging(); worker_logging(); "
            "logging.basicConfig(level=logging.WARNING); logging.getLogger('flywheel.x').info('step 3/10'); "
            "logging.getLogger('transformers').info('not ours')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err.splitlines() == ["INFO flywheel.x: step 3/10"]
