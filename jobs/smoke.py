"""Entrypoint for `ray job submit ... -- python jobs/smoke.py --config configs/<config>.yaml [key=value ...]`.

Builds the tiny models (when the config uses zoo: checkpoints) and runs each engine once, logged to MLflow.
"""

from flywheel.cli import run_as_job

if __name__ == "__main__":
    run_as_job("smoke")
