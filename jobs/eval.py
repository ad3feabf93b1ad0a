"""Entrypoint for `ray job submit ... -- python jobs/eval.py --data <labeled.jsonl> --judge <ref> [--config ...]`.

Evaluates a judge (models:/judge@champion, models:/judge/3, a checkpoint folder, a hub id, zoo:judge) on a labeled
JSONL set (format: flywheel/evaluate/labeled.py) and prints its metrics to the job's log (`ray job logs <id>`).
The data is read where the job runs: give a storage URI (s3://...), an absolute path on shared storage, or a path
inside the uploaded working directory.
"""

from flywheel.cli import run_as_job

if __name__ == "__main__":
    run_as_job("eval")
