"""What Ray Train costs per training step: the step time of the Ray-Train-wrapped judge SFT and policy DPO divided
by the bare TRL step on the same model, data and settings, measured in one run. Target: <= 1.10.

Both sides build their trainer with the same builder (flywheel.train.sft / flywheel.train.dpo); the bare side is
plain TRL (`bare=True`: no sample-id log, NaN guard, MLflow or Ray callbacks) in this process, the wrapped side is
the full `flywheel.train.train()` path: TorchTrainer worker, step log, NaN guard, metrics to MLflow, checkpoints
to storage every `--save-steps`. Step time = wall time between consecutive optimizer-step ends (data loading,
forward, backward, update, logging), median over the steps after a warm-up, measured by the same StepTimer on
both sides, which also use the same threads (one Ray Train worker's resources.train.num_cpus). Two ratios: of
wall time, and of the CPU time the process spends per step (all its threads: MLflow logging and Ray's own
threads count) - the CPU ratio is the one to trust on a box shared with other load, where wall times swing.
The bare side runs before and after the wrapped one and the two medians are averaged. Ray and worker start-up
are not per-step costs and are not in the ratio (the whole run's wall time is printed).

    .venv/bin/python bench/train_overhead.py [--steps 100] [--save-steps 20] [--batch-size 8]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch
from transformers import TrainerCallback

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.worker import StepTimer


class Timer(TrainerCallback):
    """The bare side's clock: the same StepTimer the Ray Train workers use."""

    def __init__(self):
        self.timer = StepTimer()

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.tick()


def bare_step_time(cfg, training: str, data_uri: str, out_dir: str) -> tuple[float, float]:
    """(median wall, median CPU) seconds per step of plain TRL on the same model, data and settings."""
    from flywheel.train import dpo, hf, sft
    from flywheel.train.data import dpo_rows, read_training_data, sft_rows, to_hf_dataset
    from flywheel.train.registry import resolve_base

    s = cfg.train.resolved(training)
    role = {"judge_sft": "judge", "policy_dpo": "policy"}[training]
    model, processor = hf.load_vlm(resolve_base(cfg, getattr(cfg.models, role).path))
    timer = Timer()
    if training == "judge_sft":
        rows = read_training_data(data_uri, "sft").rows
        ds = to_hf_dataset(sft_rows(rows, completion_only_loss=bool(s.completion_only_loss)))
        trainer = sft.build_trainer(model, processor, ds, s, out_dir, cfg.run.seed, callbacks=[timer], bare=True)
    else:
        ds = to_hf_dataset(dpo_rows(read_training_data(data_uri, "dpo").rows))
        trainer = dpo.build_trainer(model, processor, ds, s, out_dir, cfg.run.seed, callbacks=[timer], bare=True)
    trainer.train()
    summary = timer.timer.summary()
    return summary["step_time_median_s"], summary["step_cpu_median_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--save-steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workdir", default=None, help="default: a temporary directory")
    args = p.parse_args()

    from flywheel.models.zoo import build_zoo
    from flywheel.raycluster import init_ray
    from flywheel.train.api import train
    from flywheel.train.synthetic import write_synthetic

    workdir = args.workdir or tempfile.mkdtemp(prefix="flywheel-bench-train-")
    overrides = [f"run.workdir={workdir}", "models.judge.path=zoo:judge",
                 "models.policy.path=zoo:policy", "models.generator.path=zoo:generator",
                 "resources.train.actors=1", "resources.train.num_cpus=1",
                 f"train.batch_size={args.batch_size}", f"train.save_steps={args.save_steps}",
                 "train.logging_steps=1", f"train.judge_sft.max_steps={args.steps}",
                 f"train.policy_dpo.max_steps={args.steps}"]
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", overrides)
    build_zoo(cfg)
    threads = int(cfg.resources.train.num_cpus)
    torch.set_num_threads(threads)  # what one Ray Train worker gets (OMP_NUM_THREADS = its num_cpus)
    data = {"judge_sft": write_synthetic(f"{cfg.storage.uri}/bench/sft", "sft", 8 * args.batch_size).path,
            "policy_dpo": write_synthetic(f"{cfg.storage.uri}/bench/dpo", "dpo", 8 * args.batch_size,
                                          target="policy").path}
    t0 = time.perf_counter()
    init_ray(cfg)
    print(f"ray.init: {time.perf_counter() - t0:.1f} s; {args.steps} steps, batch {args.batch_size}, "
          f"checkpoint every {args.save_steps} steps, {threads} thread(s) on both sides")
    print(f"{'training':<11} {'':>5} {'bare TRL s/step':>15} {'Ray Train s/step':>16} {'ratio':>6}")
    for training in ("judge_sft", "policy_dpo"):
        with tempfile.TemporaryDirectory() as out:
            before = bare_step_time(cfg, training, data[training], out)
        t0 = time.perf_counter()
        result = train(cfg, training, data[training], register=False, fresh=True)
        wall = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as out:
            after = bare_step_time(cfg, training, data[training], out)
        for i, (what, key) in enumerate((("wall", "step_time_median_s"), ("CPU", "step_cpu_median_s"))):
            bare = (before[i] + after[i]) / 2
            wrapped = result.final[key]
            print(f"{training if i == 0 else '':<11} {what:>5} {bare:>15.4f} {wrapped:>16.4f} {wrapped / bare:>6.2f}"
                  f"  (bare before/after {before[i]:.4f}/{after[i]:.4f})")
        print(f"{'':<11} the whole Ray Train run (start-up, {args.steps} steps, checkpoints, export): {wall:.1f} s")


if __name__ == "__main__":
    main()
