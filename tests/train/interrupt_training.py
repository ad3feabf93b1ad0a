"""Launch a training that waits for room it never finds, in a process of its own, for the Ctrl-C test: it prints
FIT-RUNNING once fit() runs, then INTERRUPTED when the Ctrl-C (a SIGINT from the test) reached it as
KeyboardInterrupt, and whether the SIGINT handler it had before is back.

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


def main() -> None:
    # a terminal's Ctrl-C raises KeyboardInterrupt; a test runner may have started us with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir = sys.argv[1]
    start_embedded(2, log_to_driver=False)
    # three 1-CPU workers on a 2-CPU Ray: the run waits ~6 s for room (3 s, twice), then fails
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={workdir}", "ray.wait_for_actors_s=3", "resources.train.actors=3",
        "resources.train.num_cpus=1", "train.max_failures=1"])
    job = TrainJob(training="judge_sft", config=cfg.model_dump(mode="json"), data="never-read", base="zoo:judge",
                   run_key="k")
    handler = signal.getsignal(signal.SIGINT)
    threading.Thread(target=announce_fit, daemon=True).start()
    try:
        launch(cfg, job, "interrupted", f"{workdir}/local")
    except KeyboardInterrupt:
        print("INTERRUPTED", "handler-restored" if signal.getsignal(signal.SIGINT) is handler else "handler-lost",
              flush=True)
        sys.exit(130)
    except BaseException as e:
        print("NOT-INTERRUPTED", type(e).__name__, e, flush=True)
        sys.exit(1)
    print("NOT-INTERRUPTED finished", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
