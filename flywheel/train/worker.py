"""What every Ray Train worker of every training shares: the job, its settings, the step log, MLflow metrics,
checkpoint resume and the final report.

The step log records, for each optimizer step, the ids of the samples it consumed. It is saved *inside* every
checkpoint and reloaded on resume, so the log of a finished run is exactly the data history of the final weights:
a resumed run must show every step once, in the order an uninterrupted run takes (no skipped or repeated data).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

log = logging.getLogger(__name__)

FINAL_MARKER = "final.json"  # in a checkpoint: this is the finished run's export, not a resumable state
EXPORT_DIR = "export"
ERROR_KEY = "flywheel_error"


@dataclass
class TrainJob:
    """Everything a worker needs, sent from the driver (plain data, so it pickles to any node)."""

    training: str  # judge_sft | judge_dpo | policy_dpo | diffusion_dpo
    config: dict  # the resolved Config, model_dump(mode="json")
    data: str  # dataset URI
    base: str  # model to start from: zoo:<name>, a path, a hub id, or models:/<name>/<version>
    run_key: str
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None  # the stage's nested run; rank 0 logs metrics into it
    lineage: dict = field(default_factory=dict)  # written into the export's flywheel.json
    method: str | None = None  # the update method (DPO trainings): dpo | dpo_sft | bon_sft; None: the configured
    heldout_judge: str | None = None  # the judge that also scores held-out outputs (resolved by the driver)
    heldout_gold: str | None = None  # the text of train.judge_dpo.heldout.gold_file (read by the driver)
    heldout_prompts: list | None = None  # the records of train.<policy>.heldout.prompts_file (read by the driver)

    def to_dict(self) -> dict:
        return asdict(self)


class StepLog:
    """Per-step sample ids of this worker, carried through checkpoints."""

    def __init__(self, rank: int, attempt: str):
        self.rank, self.attempt = rank, attempt
        self.entries: list[dict] = []

    def record(self, step: int, ids: list[str]) -> None:
        if self.entries and self.entries[-1]["step"] == step and self.entries[-1]["attempt"] == self.attempt:
            self.entries[-1]["ids"].extend(ids)  # another micro-batch of the same optimizer step
        else:
            self.entries.append({"step": step, "rank": self.rank, "attempt": self.attempt, "ids": list(ids)})

    def filename(self) -> str:
        return f"steps_rank{self.rank}.jsonl"

    def save(self, directory: str | Path, upto: int | None = None) -> None:
        lines = [json.dumps(e) for e in self.entries if upto is None or e["step"] <= upto]
        Path(directory, self.filename()).write_text("".join(line + "\n" for line in lines))

    def load(self, directory: str | Path, upto: int) -> None:
        """Restore the log of a checkpoint taken at step `upto` (steps after it were never committed)."""
        path = Path(directory, self.filename())
        entries = [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
        self.entries = [e for e in entries if e["step"] <= upto]


class MetricsLogger:
    """Logs metrics to the stage's MLflow run from a background thread (rank 0 only) in one write per second,
    so the tracking store never stretches a training step."""

    FLUSH_S = 1.0

    def __init__(self, tracking_uri: str | None, run_id: str | None):
        self._q: queue.Queue = queue.Queue()
        self._thread = None
        if tracking_uri and run_id:
            from mlflow import MlflowClient

            self._client, self._run_id = MlflowClient(tracking_uri=tracking_uri), run_id
            self._thread = threading.Thread(target=self._loop, name="flywheel-metrics", daemon=True)
            self._thread.start()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._thread is None:
            return
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if clean:
            self._q.put((clean, step, int(time.time() * 1000)))

    def _loop(self) -> None:
        from mlflow.entities import Metric

        done = False
        while not done:
            batch = [self._q.get()]  # block until there is something
            if batch[0] is not None:
                time.sleep(self.FLUSH_S)  # gather what arrives meanwhile: one write per interval, not per step
            while not self._q.empty():
                batch.append(self._q.get())
            done = None in batch
            items = [b for b in batch if b is not None]
            metrics = [Metric(k, v, ts, step) for clean, step, ts in items for k, v in clean.items()]
            try:
                for i in range(0, len(metrics), 900):  # MLflow caps a batch at 1000 metrics
                    self._client.log_batch(self._run_id, metrics=metrics[i:i + 900])
            except Exception as e:  # tracking must never kill a training
                log.warning("metrics logging failed: %s", e)

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=60)
            self._thread = None


class StepTimer:
    """Per optimizer step: wall time between consecutive step ends (data loading, forward, backward, update,
    logging) and the CPU time this process used meanwhile (all its threads: robust to other load on the box)."""

    def __init__(self, warmup: int = 2):
        self.warmup = warmup
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self._last: tuple[float, float] | None = None
        self._seen = 0

    def tick(self) -> float | None:
        now = (time.perf_counter(), time.process_time())
        dt = None if self._last is None else now[0] - self._last[0]
        if dt is not None and self._seen >= self.warmup:
            self.times.append(dt)
            self.cpu_times.append(now[1] - self._last[1])
        self._last = now
        self._seen += 1
        return dt

    def restart(self) -> None:
        """Forget the last tick: time spent since (a held-out evaluation) is no step's."""
        self._last = None

    def summary(self) -> dict[str, float]:
        if not self.times:
            return {}
        return {"step_time_median_s": median(self.times), "step_time_mean_s": sum(self.times) / len(self.times),
                "step_cpu_median_s": median(self.cpu_times), "step_time_count": float(len(self.times))}


class WorkerContext:
    """The job as seen from one Ray Train worker."""

    def __init__(self, job: dict):
        import ray.train

        from flywheel.config import Config

        self.job = TrainJob(**job)
        self.cfg = Config.model_validate(self.job.config)
        self.settings = self.cfg.train.resolved(self.job.training, self.job.method)
        self.seed = self.settings.seed if self.settings.seed is not None else self.cfg.run.seed
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        if self.world == 1:
            # Alone, there is nothing to synchronise: hide the launcher's rank variables so accelerate does not
            # wrap the model in DistributedDataParallel (which TRL sets to search for unused parameters on
            # every step, a large share of a small model's step time).
            for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
                os.environ.pop(var, None)
        self.attempt = uuid.uuid4().hex[:8]
        self.steps = StepLog(self.rank, self.attempt)
        self.metrics = MetricsLogger(self.job.tracking_uri, self.job.mlflow_run_id) if self.rank == 0 else \
            MetricsLogger(None, None)
        self.timer = StepTimer()
        self.local_dir = tempfile.mkdtemp(prefix=f"flywheel-{self.job.training}-r{self.rank}-")
        self.resumed_from: int | None = None
        self._restore: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def base_path(self) -> str:
        """A local from_pretrained directory (or hub id) for the job's base model."""
        from flywheel.train.registry import resolve_base

        return resolve_base(self.cfg, self.job.base)

    def restore_dir(self) -> str | None:
        """A local copy of the latest checkpoint Ray Train reported for this run (None for a fresh start);
        downloaded once per worker."""
        import ray.train

        if self._restore is None:
            ckpt = ray.train.get_checkpoint()
            if ckpt is None:
                self._restore = ""
            else:
                self._restore = os.path.join(self.local_dir, "restore")
                shutil.rmtree(self._restore, ignore_errors=True)
                ckpt.to_directory(self._restore)
        return self._restore or None

    def restored_final(self) -> bool:
        """The run had already finished: its latest checkpoint is the final export."""
        d = self.restore_dir()
        return d is not None and os.path.exists(os.path.join(d, FINAL_MARKER))

    def report_checkpoint(self, directory: str, step: int, metrics: dict, steps_dir: str | None = None) -> None:
        """Report a checkpoint directory (every rank calls this, with its own files) plus metrics; the step log
        is saved into it first (into `steps_dir` inside it, if given)."""
        import ray.train
        from ray.train import Checkpoint

        self.steps.save(steps_dir or directory, upto=step)
        # worker_node: where this rank ran (the launcher's journal records it: placement by config, node loss)
        ray.train.report({**metrics, "step": step, "worker_pid": os.getpid(),
                          "worker_node": ray.get_runtime_context().get_node_id()},
                         checkpoint=Checkpoint.from_directory(directory))

    def report_final(self, export: str | None, metrics: dict, step: int) -> None:
        """The finished run: rank 0's checkpoint holds the export (weights/adapters as safetensors) and the step
        logs; other ranks add their step logs."""
        d = tempfile.mkdtemp(prefix="final-", dir=self.local_dir)
        if export is not None:
            shutil.move(export, os.path.join(d, EXPORT_DIR))
        summary = {**metrics, **self.timer.summary(), "final_step": step, "resumed_from": self.resumed_from,
                   "attempt": self.attempt, "workers": self.world}
        if self.is_main:
            Path(d, FINAL_MARKER).write_text(json.dumps(summary, indent=1, default=str))
        self.metrics.log({k: v for k, v in summary.items() if k.startswith("step_time")}, step)
        self.metrics.close()
        self.report_checkpoint(d, step, {**summary, "flywheel_final": 1})

    def report_existing_final(self) -> None:
        """Launched again after the run had finished: report the same final checkpoint (export and logs)."""
        d = self.restore_dir()
        final = json.loads(Path(d, FINAL_MARKER).read_text())
        step = int(final.get("final_step", 0))
        self.steps.load(d, upto=step)
        self.metrics.close()
        self.report_checkpoint(d, step, {**final, "flywheel_final": 1})

    def report_error(self, error: Exception, step: int) -> None:
        import ray.train

        self.metrics.close()
        ray.train.report({ERROR_KEY: type(error).__name__, "flywheel_error_message": str(error), "step": step})

    def cleanup(self) -> None:
        shutil.rmtree(self.local_dir, ignore_errors=True)
