"""Entrypoint for `ray job submit ... -- python jobs/iteration.py --config configs/<config>.yaml [--iterations N]`.

Runs whole flywheel iterations (flywheel/iteration.py); re-submitting after a failure resumes: every stage skips
work whose output already exists with the same config and inputs.
"""

from flywheel.cli import run_as_job

if __name__ == "__main__":
    run_as_job("run")
