"""Run a training's worker function in this process: a stand-in for Ray Train's worker context
(flywheel.train.worker.WorkerContext) that keeps reported checkpoints in folders and records the metrics the
worker would send to MLflow. TRL, PEFT, diffusers and the models are the real ones; the Ray Train launcher itself
is exercised in test_trainings.py and test_policy_updates.py's guard test."""

from __future__ import annotations

import shutil
from pathlib import Path


class RecordedMetrics:
    def __init__(self):
        self.entries: list[tuple[int, dict]] = []

    def log(self, metrics: dict, step: int) -> None:
        self.entries.append((step, dict(metrics)))

    def history(self, key: str) -> dict[int, float]:
        return {step: m[key] for step, m in self.entries if key in m}

    def keys(self) -> set[str]:
        return {k for _, m in self.entries for k in m}

    def close(self) -> None:
        pass


class LocalContext:
    def __init__(self, cfg, training: str, data: str, base: str, local_dir: str, restore: str | None = None,
                 method: str | None = None, heldout_judge: str | None = None, heldout_prompts: list | None = None):
        from flywheel.train.worker import StepLog, StepTimer, TrainJob

        self.cfg, self.settings = cfg, cfg.train.resolved(training, method)
        self.job = TrainJob(training=training, config={}, data=data, base=base, run_key="test", method=method,
                            heldout_judge=heldout_judge, heldout_prompts=heldout_prompts)
        self.seed, self.rank, self.world, self.is_main = cfg.run.seed, 0, 1, True
        self.steps, self.metrics, self.timer = StepLog(0, Path(local_dir).name), RecordedMetrics(), StepTimer()
        self.local_dir, self._restore, self.resumed_from = local_dir, restore, None
        self.checkpoints: dict[int, str] = {}
        self.final: tuple | None = None  # (export dir, final metrics, final step)

    def base_path(self) -> str:
        return self.job.base

    def restore_dir(self) -> str | None:
        return self._restore

    def report_checkpoint(self, directory, step, metrics, steps_dir=None) -> None:
        self.steps.save(steps_dir or directory, upto=step)
        keep = Path(self.local_dir) / f"kept-{step}"
        shutil.copytree(directory, keep)
        self.checkpoints[step] = str(keep)

    def report_final(self, export, metrics, step) -> None:
        kept = Path(self.local_dir) / "final-export"
        if export is not None:
            shutil.move(export, kept)
        self.final = (str(kept), metrics, step)

    def report_error(self, error, step) -> None:
        raise error
