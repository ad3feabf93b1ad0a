"""Ray Train's settings from the config (and the print patch's switch) reach Ray Train, which reads them from the
driver's environment when a run starts, and do not outlive the start."""

from __future__ import annotations

import os
import signal

import pytest
from ray.train.v2._internal.constants import get_env_vars_to_propagate

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.launcher import driver_env, ray_train_env

from .sessions import kill_session

POLL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
LOCAL = REPO_ROOT / "configs" / "local.yaml"


def test_poll_interval_is_handed_to_ray_train_while_a_run_starts(monkeypatch, tmp_path):
    cfg = load_config(LOCAL, [f"run.workdir={tmp_path}", "ray.train_poll_interval_s=0.3"])
    monkeypatch.delenv(POLL, raising=False)
    with driver_env(ray_train_env(cfg)):
        assert get_env_vars_to_propagate()[POLL] == "0.3"  # what Ray Train passes to its controller and workers
    assert POLL not in os.environ

    monkeypatch.setenv(POLL, "7")  # the config wins while the run starts; the user's own value comes back
    with driver_env(ray_train_env(cfg)):
        assert os.environ[POLL] == "0.3"
    assert os.environ[POLL] == "7"


def test_unset_poll_interval_leaves_ray_train_its_default_or_the_users(tmp_path):
    cfg = load_config(LOCAL, [f"run.workdir={tmp_path}", "ray.train_poll_interval_s=null"])
    assert POLL not in ray_train_env(cfg)


def test_print_patch_is_off_in_the_workers(monkeypatch, tmp_path):
    """Ray Train's print patch logs what libraries print into a captured stdout (dill's disassembly, during
    datasets' fingerprinting, filled every training's log); the workers get it switched off."""
    cfg = load_config(LOCAL, [f"run.workdir={tmp_path}"])
    monkeypatch.delenv("RAY_TRAIN_ENABLE_PRINT_PATCH", raising=False)
    with driver_env(ray_train_env(cfg)):
        assert get_env_vars_to_propagate()["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "0"


def test_workers_no_node_fits_fail_after_the_configured_wait(ray_local):
    """This box has no GPU: the probe that picks the GPU workers' backend asks a GPU node, which never comes."""
    import time

    from flywheel.config import StageResources
    from flywheel.raycluster import ActorsDidNotStart
    from flywheel.train.launcher import torch_config

    t0 = time.monotonic()
    with pytest.raises(ActorsDidNotStart, match=r"training workers: no node with CPU 1, GPU 1 came within 2 s"):
        torch_config(StageResources(num_gpus=1), wait_s=2)
    assert time.monotonic() - t0 < 30
    assert torch_config(StageResources(), wait_s=2).backend is None  # CPU workers: no probe, Ray Train decides


@pytest.mark.timeout(120)  # unbounded, Ray Train retries the placement for ever
def test_a_worker_group_no_cluster_fits_fails_after_the_configured_wait(ray_local, tmp_path):
    """Three 1-CPU workers on this 2-CPU Ray: each fits a node, the group never does. Ray Train would retry the
    placement for ever; with ray.wait_for_actors_s each attempt waits that long, within the run's retry budget."""
    import time

    from flywheel.raycluster import ActorsDidNotStart
    from flywheel.train.launcher import launch
    from flywheel.train.worker import TrainJob

    cfg = load_config(LOCAL, [f"run.workdir={tmp_path}", "ray.wait_for_actors_s=2", "resources.train.actors=3",
                              "resources.train.num_cpus=1", "train.max_failures=1"])
    job = TrainJob(training="judge_sft", config=cfg.model_dump(mode="json"), data="never-read", base="zoo:judge",
                   run_key="k")
    t0 = time.monotonic()
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(ActorsDidNotStart, match=r"3 workers, each with CPU 1, did not find room together within 2 s, "
                                                r"2 times"):
        launch(cfg, job, "never-starts", str(tmp_path / "local"))
    assert time.monotonic() - t0 < 60
    # Ray Train's fit() in the main thread leaves a SIGINT handler of its own behind: Ctrl-C would abort nothing
    assert signal.getsignal(signal.SIGINT) is handler


@pytest.mark.timeout(180)
def test_ctrl_c_during_a_training_stops_the_driver(tmp_path):
    """Ctrl-C while fit() runs raises KeyboardInterrupt in the driver, as at any other point of an iteration (Ray
    Train's own handler would have aborted the run and let the iteration go on to fail or continue), and the
    training stops even if the caller catches it and goes on: no Ray process of the driver's is left.

    The driver is a process of its own (tests/train/interrupt_training.py): a SIGINT sent into this test process
    that missed its moment (fit() ending first on a loaded box) would abort the whole pytest worker."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests" / "train" / "interrupt_training.py"),
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        line = _read_until(proc, lines, "FIT-RUNNING")  # after Ray's start-up, once fit() is under way
        assert line.startswith("FIT-RUNNING"), "".join(lines[-30:])
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # the user's Ctrl-C
        sent = time.monotonic()
        line = _read_until(proc, lines, "INTERRUPTED")
        took = time.monotonic() - sent
        assert line.split() == ["INTERRUPTED", "handler-restored", "ray-ended"], "".join(lines[-30:])
        assert took < 6  # at once (Ray's shut-down included), not when the run ends (~10 s)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            kill_session(proc)  # its Ray's processes too, not only its process group


def _read_until(proc, lines: list[str], marker: str) -> str:
    """The child's next line starting with marker or NOT-INTERRUPTED (its other outcome); every line it read goes
    into lines, for the failure message."""
    for line in proc.stdout:
        lines.append(line)
        if line.startswith((marker, "NOT-INTERRUPTED")):
            return line
    return ""


def test_a_bounded_wait_stays_bounded_when_workers_restart_for_ever(tmp_path):
    from flywheel.train.launcher import failure_config

    bounded = load_config(LOCAL, [f"run.workdir={tmp_path}", "ray.wait_for_actors_s=30"])
    assert failure_config(bounded, 2).controller_failure_limit == 2  # the placement's retries share the budget
    assert failure_config(bounded, -1).controller_failure_limit == 0  # one attempt, not an endless wait
    assert failure_config(load_config(LOCAL, [f"run.workdir={tmp_path}"]), 2).controller_failure_limit == -1
