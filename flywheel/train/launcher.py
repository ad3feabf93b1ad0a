"""The one Ray Train launcher every training goes through (judge SFT, judge DPO, policy DPO, Diffusion-DPO).

- Workers: `TorchTrainer` with `ScalingConfig` from `resources.train` (actors = workers; CPUs, GPUs and custom
  resources per worker). On CPU the workers run DDP over gloo; on GPUs over NCCL.
- Storage: checkpoints go to `<storage.uri>/checkpoints/<run name>` (local folder or shared URI).
- Resume: Ray Train keeps a snapshot of the reported checkpoints next to them; launching the same run name again
  (the default: the name is a hash of training, settings, base model and data) hands the latest checkpoint to
  the workers, which restore weights, optimizer, scheduler, RNG and the step/sample log from it and skip exactly
  the batches it had consumed. A crashed worker group is restarted the same way, up to `train.max_failures`
  times (FailureConfig).
- A non-finite loss is not a failure to retry: workers report it, stop, and the launcher raises
  NonFiniteLossError.
- A journal (`journal.jsonl` in the run folder, written by a controller-side callback) lists every committed
  checkpoint; a finished run's final checkpoint holds its export (`export/`, safetensors) and `final.json`.
- Ctrl-C: the driver waits on `fit()` run in a thread of its own (`fit_interruptibly`), so Ctrl-C raises
  KeyboardInterrupt in the driver during a training as at any other point of an iteration, and the run stops
  with the driver's Ray session even if the caller goes on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flywheel import storage
from flywheel.config import Config, StageResources
from flywheel.train.errors import NonFiniteLossError
from flywheel.train.worker import ERROR_KEY, EXPORT_DIR, FINAL_MARKER, TrainJob

log = logging.getLogger(__name__)
JOURNAL = "journal.jsonl"
START_TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


def checkpoint_root(cfg: Config) -> str:
    return storage.join(cfg.storage.uri, "checkpoints")


def storage_args(cfg: Config) -> dict:
    """RunConfig's storage: the filesystem flywheel/storage.py resolves, not Ray's own resolution of the URI (which
    knows no GCS emulator and would hang asking Google's metadata server for credentials)."""
    fs, root = storage.resolve(checkpoint_root(cfg))
    return {"storage_path": root, "storage_filesystem": fs}


def checkpoint_uri(cfg: Config, path: str) -> str:
    """A checkpoint's storage URI from Ray Train's path inside the filesystem (s3://b/x for b/x)."""
    root = storage_args(cfg)["storage_path"]
    return checkpoint_root(cfg) + path[len(root):] if path.startswith(root) else path


def run_dir(cfg: Config, run_name: str) -> str:
    return storage.join(checkpoint_root(cfg), run_name)


def prune_run(cfg: Config, run_name: str, keep: str) -> list[str]:
    """Delete a finished run's checkpoints but `keep` (its final one): Ray Train keeps the last keep_checkpoints + 1
    to resume the run, which a registered training never is (the registry's copy is reused). Returns what went."""
    kept = storage.name(keep)
    gone = [d for d in storage.subdirs(run_dir(cfg, run_name)) if d.startswith("checkpoint_") and d != kept]
    for d in gone:
        storage.remove_dir(storage.join(run_dir(cfg, run_name), d))
    return gone


def read_journal(cfg: Config, run_name: str) -> list[dict]:
    path = storage.join(run_dir(cfg, run_name), JOURNAL)
    if not storage.exists(path):
        return []
    return [json.loads(line) for line in storage.read_bytes(path).decode().splitlines() if line.strip()]


def _journal_callback(journal_path: str):
    """A Ray Train controller callback appending each committed checkpoint (and worker errors) to the journal."""
    from ray.train.v2.api.callback import UserCallback

    class Journal(UserCallback):
        def _append(self, entry: dict) -> None:
            old = storage.read_bytes(journal_path) if storage.exists(journal_path) else b""
            storage.write_bytes(journal_path, old + (json.dumps(entry, default=str) + "\n").encode())

        def after_report(self, run_context, metrics, checkpoint):
            m = metrics[0] if metrics else {}
            if checkpoint is not None or ERROR_KEY in m:
                self._append({"time": time.time(), "step": m.get("step"), "final": bool(m.get("flywheel_final")),
                              "worker_pids": [w.get("worker_pid") for w in metrics],
                              "worker_nodes": [w.get("worker_node") for w in metrics],
                              "checkpoint": checkpoint.path if checkpoint is not None else None,
                              "error": m.get(ERROR_KEY), "message": m.get("flywheel_error_message")})

        def after_exception(self, run_context, worker_exceptions):
            self._append({"time": time.time(), "worker_errors": {str(k): repr(v)[:500]
                                                                 for k, v in worker_exceptions.items()}})

    return Journal()


def scaling_config(res: StageResources):
    from ray.train import ScalingConfig

    per_worker = {"CPU": res.num_cpus, **res.resources}
    if res.num_gpus:
        per_worker["GPU"] = res.num_gpus
    return ScalingConfig(num_workers=res.actors, use_gpu=res.num_gpus > 0, resources_per_worker=per_worker)


def torch_config(res: StageResources, wait_s: float | None = None):
    """The process-group backend: Ray Train's default (NCCL when workers hold GPUs, else gloo), except gloo when the
    GPUs the workers get are logical only (a CPU box offering `--num-gpus`, as the simulated cluster does): NCCL
    cannot start without CUDA. A probe task with the workers' own resources asks a node of their kind, so a
    CPU-only head never decides for the GPU nodes. It waits for such a node at most `wait_s` seconds (None: for
    ever, as under an autoscaler)."""
    import ray
    from ray.train.torch import TorchConfig

    if not res.num_gpus:
        return TorchConfig()
    from flywheel.raycluster import ActorsDidNotStart, actor_ask, ask_text, remote_options

    @ray.remote(max_retries=3)
    def cuda_available() -> bool:
        import torch

        return torch.cuda.is_available()

    probe = cuda_available.options(**remote_options(res)).remote()
    try:
        cuda = ray.get(probe, timeout=wait_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(probe, force=True)
        raise ActorsDidNotStart(f"training workers: no node with {ask_text(actor_ask(res))} came within {wait_s:g} s "
                                "(ray.wait_for_actors_s)") from None
    return TorchConfig() if cuda else TorchConfig(backend="gloo")


def ray_train_env(cfg: Config) -> dict[str, str]:
    """Ray Train's settings for a run (the configured controller poll, the print patch off), as the environment
    variables Ray Train reads."""
    # Ray Train's print patch also logs what a library prints into a captured stdout: datasets' fingerprinting
    # has dill disassemble a function into a StringIO, and that bytecode landed in every training's log. The
    # workers' prints still reach the driver and the worker logs through Ray's own stdout capture.
    env = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
    if cfg.ray.train_poll_interval_s is not None:
        env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(cfg.ray.train_poll_interval_s)
    if cfg.ray.wait_for_actors_s is not None:  # how long one attempt waits for the worker group's placement group
        env[START_TIMEOUT] = str(cfg.ray.wait_for_actors_s)
    return env


def failure_config(cfg: Config, max_failures: int):
    """Ray Train retries a worker group that did not start (its placement group not ready within
    RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s by default) without limit: on a fixed cluster that no node group
    fits, for ever. With ray.wait_for_actors_s those retries share the worker restarts' budget."""
    from ray.train import FailureConfig

    if cfg.ray.wait_for_actors_s is None:
        return FailureConfig(max_failures=max_failures)
    # max_failures -1 (restart workers for ever) must not make the wait endless again: one attempt then
    return FailureConfig(max_failures=max_failures, controller_failure_limit=max(max_failures, 0))


def did_not_start(cfg: Config, failure: Exception, max_failures: int) -> Exception | None:
    """ActorsDidNotStart for a fit() that gave up on starting its worker group (None for any other failure)."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
    from ray.train.v2.api.exceptions import ControllerError

    from flywheel.raycluster import ActorsDidNotStart, actor_ask, ask_text

    if not (isinstance(failure, ControllerError)
            and isinstance(failure.controller_failure, WorkerGroupStartupTimeoutError)):
        return None
    res = cfg.resources.train
    attempts = "" if max_failures < 1 else f", {max_failures + 1} times"  # as failure_config counts them
    return ActorsDidNotStart(f"training workers: {res.actors} workers, each with {ask_text(actor_ask(res))}, did not "
                             f"find room together within {cfg.ray.wait_for_actors_s:g} s{attempts} "
                             "(ray.wait_for_actors_s; train.<training>.max_failures)")


@contextmanager
def driver_env(env: dict[str, str]):
    """Set `env` in this (driver) process for the duration of a `fit()`, then restore what was there: Ray Train
    reads its settings from the driver's environment when `fit()` starts the controller, and hands them on to
    the controller and the workers."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fit_interruptibly(trainer, poll_s: float = 0.2):
    """`trainer.fit()`, with Ctrl-C raising KeyboardInterrupt in the driver meanwhile.

    Called from the main thread, Ray Train's fit() installs a SIGINT handler of its own (abort this run) and never
    puts the previous one back: after an iteration's first training, Ctrl-C aborted an already finished run and
    the iteration went on, and a third Ctrl-C exited with status 0. Off the main thread it installs none (as under
    Ray Tune), so fit runs in a thread here and the main thread waits on it, where KeyboardInterrupt arrives as
    anywhere else. The run then ends with this process's Ray session (end_ray_session_on_interrupt); the next
    launch resumes from its last committed checkpoint."""
    out: dict = {}

    def fit() -> None:
        try:
            out["result"] = trainer.fit()
        except BaseException as e:  # handed to the waiting thread, which raises it
            out["error"] = e

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)  # daemon: Ctrl-C need not wait
    thread.start()
    try:
        while thread.is_alive():
            thread.join(poll_s)
    except KeyboardInterrupt:
        end_ray_session_on_interrupt()
        raise
    if "error" in out:
        raise out["error"]
    return out["result"]


def end_ray_session_on_interrupt() -> None:
    """Stop the interrupted run by ending this process's Ray session: Ray ends a driver's actors with it, Ray
    Train's controller and workers among them (an embedded Ray goes down whole).

    Why not abort the run alone: its controller is an actor without a name, made inside fit(), so there is no
    handle to call `abort` on (Ray Train's own SIGINT handler holds one, and runs only in the main thread). A
    process that exits after Ctrl-C loses nothing by this; one that goes on (a notebook, a caller catching
    KeyboardInterrupt) would otherwise leave the training running on the cluster's CPUs or GPUs. flywheel joins or
    starts Ray again at its next call."""
    import ray

    if ray.is_initialized():
        log.warning("Ctrl-C during a training: ending this process's Ray session, which stops the run; launching "
                    "it again resumes from its last checkpoint")
        ray.shutdown()


def worker_main(job: dict) -> None:
    """The function every Ray Train worker runs: dispatch to the training, handle the guard's stop."""
    import torch

    from flywheel.train.worker import WorkerContext

    ctx = WorkerContext(job)
    # Ray sets OMP_NUM_THREADS from the worker's CPUs; torch must follow it, or threads oversubscribe the node.
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    # A worker holding GPUs gets ACCELERATE_TORCH_DEVICE=cuda:<i> from Ray Train, which reads Ray's GPU ids, not
    # whether CUDA exists: logical GPUs (a CPU node offering --num-gpus) would send the model to CUDA and fail.
    if not torch.cuda.is_available() and os.environ.get("ACCELERATE_TORCH_DEVICE", "").startswith("cuda"):
        os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    try:
        if ctx.restored_final():  # launched again after it finished: hand back the same export
            ctx.report_existing_final()
            return
        if ctx.job.training == "diffusion_dpo":
            from flywheel.train.diffusion_loop import worker
        elif ctx.job.training == "judge_sft":
            from flywheel.train.sft import worker
        else:
            from flywheel.train.dpo import worker
        worker(ctx)
    except NonFiniteLossError as e:  # the diffusion loop raises it directly; the TRL path reports it itself
        ctx.report_error(e, e.step)
    finally:
        ctx.cleanup()


@dataclass
class LaunchResult:
    run_name: str
    checkpoint_path: str  # the final checkpoint on storage
    export_dir: str  # a local copy of its export/ folder
    final: dict  # final.json: last metrics, step times, final step, resumed_from
    steps: list[dict] = field(default_factory=list)  # the step/sample log of every worker, in step order
    failures: int = 0  # worker-group failures Ray Train restarted from a checkpoint in this launch (journal)
    worker_nodes: list[str] = field(default_factory=list)  # nodes the workers reported from, in first-seen order


def launch(cfg: Config, job: TrainJob, run_name: str, local_dir: str) -> LaunchResult:
    """Run one training through Ray Train and return its final checkpoint (downloaded to local_dir)."""
    from ray.train import CheckpointConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from flywheel.raycluster import init_ray, warn_if_no_node_fits

    init_ray(cfg)
    warn_if_no_node_fits(f"{job.training}: each Ray Train worker", cfg.resources.train, "resources.train")
    s = cfg.train.resolved(job.training)
    storage.makedirs(run_dir(cfg, run_name))
    trainer = TorchTrainer(
        worker_main,
        train_loop_config=job.to_dict(),
        scaling_config=scaling_config(cfg.resources.train),
        torch_config=torch_config(cfg.resources.train, cfg.ray.wait_for_actors_s),
        run_config=RunConfig(
            name=run_name,
            **storage_args(cfg),
            failure_config=failure_config(cfg, s.max_failures),
            # +1: the final export is a checkpoint too and must not push out the last resumable one
            checkpoint_config=CheckpointConfig(num_to_keep=s.keep_checkpoints + 1),
            callbacks=[_journal_callback(storage.join(run_dir(cfg, run_name), JOURNAL))],
        ),
    )
    seen = len(read_journal(cfg, run_name))
    failure: Exception | None = None
    try:
        with driver_env(ray_train_env(cfg)):
            result = fit_interruptibly(trainer)
        checkpoint = result.checkpoint
    except Exception as e:  # see below: the journal may show the run had in fact finished or stopped cleanly
        failure, checkpoint = e, None
    # Ray Train keeps only metrics reported with a checkpoint: a worker's stop report is read from the journal.
    # The journal also settles a race in Ray Train's teardown, where a worker group that has just finished is
    # reported as failed: what the workers committed is what counts.
    entries = read_journal(cfg, run_name)[seen:]
    for entry in entries:
        if entry.get("error") == NonFiniteLossError.__name__:
            raise NonFiniteLossError(int(entry.get("step") or -1), None, message=str(entry.get("message")))
        if entry.get("error"):
            raise RuntimeError(f"training {run_name} failed: {entry.get('message')}")
    if failure is not None:
        finals = [e for e in entries if e.get("final") and e.get("checkpoint")]
        if not finals:
            if (stuck := did_not_start(cfg, failure, s.max_failures)) is not None:
                raise stuck from failure
            raise failure
        from ray.train import Checkpoint

        log.warning("Ray Train reported %s after the run's final checkpoint was committed; using that checkpoint",
                    type(failure).__name__)
        checkpoint = Checkpoint(path=finals[-1]["checkpoint"], filesystem=storage_args(cfg)["storage_filesystem"])
    if checkpoint is None:
        raise RuntimeError(f"training {run_name} finished without a checkpoint")
    target = os.path.join(local_dir, "final")
    checkpoint.to_directory(target)
    if not os.path.exists(os.path.join(target, FINAL_MARKER)):
        raise RuntimeError(f"training {run_name}: the last checkpoint is not a final export ({checkpoint.path})")
    steps = []
    for f in sorted(Path(target).glob("steps_rank*.jsonl")):
        steps += [json.loads(line) for line in f.read_text().splitlines() if line]
    steps.sort(key=lambda e: (e["step"], e["rank"]))
    final = json.loads(Path(target, FINAL_MARKER).read_text())
    nodes = list(dict.fromkeys(n for e in entries for n in e.get("worker_nodes") or [] if n))
    failures = sum(1 for e in entries if "worker_errors" in e)
    if failures:
        log.warning("training %s: %d worker-group failure(s), restarted from the latest checkpoint (resumed from "
                    "step %s)", run_name, failures, final.get("resumed_from"))
    return LaunchResult(run_name, checkpoint_uri(cfg, checkpoint.path), os.path.join(target, EXPORT_DIR), final, steps,
                        failures, nodes)
