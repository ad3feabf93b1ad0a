"""Launch a training that waits for room it never finds, in a process of its own, for the Ctrl-C test: it prints
FIT-RUNNING once fit() runs, then INTERRUPTED when the Ctrl-C (a SIGINT from the test) reached it as
KeyboardInterrupt, whether the SIGINT handler it had before is back, and whether the training's Ray processes
are gone while this process goes on (as a notebook would).

    python tests/train/interrupt_training.py <workdir>
"""

import signal
import sys
import threading
import time

from flywheel.config import REPO_ROOT, load_config
from flywheel.raycluster import start_embedded
from flywheel.train.launcher import launch
from flywheel.train.worker import TrainJob


def announce_fit() -> None:
    """FIT-RUNNING once Ray Train's controller for this run is alive (fit() started it and waits on it)."""
    from ray.util.state import list_actors

    while not list_actors(filters=[("class_name", "=", "TrainController"), ("state", "=", "ALIVE")]):
        time.sleep(0.1)
    print("FIT-RUNNING", flush=True)


def ray_ended(wait_s: float = 20) -> bool:
    """Whether Ray is shut down in this process and none of the Ray processes it started (GCS, raylet, the
    training's controller and workers) is left."""
    import psutil
    import ray

    def alive(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # gone between listing and asking
            return False

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not ray.is_initialized() and not any(alive(p) for p in psutil.Process().children(recursive=True)):
            return True
        time.sleep(0.2)
    return False


def main() -> None:
    # a terminal's Ctrl-C raises KeyboardInterrupt; a test runner may have started us with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir = sys.argv[1]
    start_embedded(2, log_to_driver=False)
    # three 1-CPU workers on a 2-CPU Ray: the run waits ~10 s for room (5 s, twice), then fails
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={workdir}", "ray.wait_for_actors_s=5", "resources.train.actors=3",
        "resources.train.num_cpus=1", "train.max_failures=1"])
    job = TrainJob(training="judge_sft", config=cfg.model_dump(mode="json"), data="never-read", base="zoo:judge",
                   run_key="k")
    handler = signal.getsignal(signal.SIGINT)
    threading.Thread(target=announce_fit, daemon=True).start()
    try:
        launch(cfg, job, "interrupted", f"{workdir}/local")
    except KeyboardInterrupt:
        print("INTERRUPTED", "handler-restored" if signal.getsignal(signal.SIGINT) is handler else "handler-lost",
              "ray-ended" if ray_ended() else "ray-left-running", flush=True)
        sys.exit(130)
    except BaseException as e:
        print("NOT-INTERRUPTED", type(e).__name__, e, flush=True)
        sys.exit(1)
    print("NOT-INTERRUPTED finished", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
