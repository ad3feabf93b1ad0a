"""What judge SFT's loss path costs per step off a GPU: TRL's fused LM head (which, off a Triton device, projects
every position) against the model's own loss from its labels (flywheel.train.sft.model_loss_trainer, the default
off a GPU), on the same model, rows, seed and threads, measured in one run. Target: ratio <= 0.85 with the same
losses (largest difference over the logged steps <= 1e-4).

Both sides are built by flywheel.train.sft.build_trainer (`bare=True`: plain TRL batches, no Ray) and timed by
the StepTimer the Ray Train workers use: wall time between consecutive optimizer-step ends (data loading,
forward, backward, update), median over the steps after a warm-up. The fused side runs before and after the
model-loss side and its two medians are averaged.

    .venv/bin/python bench/sft_loss_path.py [--steps 60] [--data <curated sft dir>] [--model <checkpoint>]

Without --data it trains on a synthetic SFT set and the zoo judge (measured: 0.0709 against 0.1085 s/step,
ratio 0.65, 10 steps). flywheel.train.sft's 0.28 / 0.21 s were measured on a local run's iteration-0 curated
set and the world judge base (ratio 0.66, 60 steps).
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.worker import StepTimer


class Timer(TrainerCallback):
    def __init__(self):
        self.timer = StepTimer()

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.tick()


def run(cfg, model_path: str, rows: list[dict], steps: int, fused: bool) -> tuple[float, list[float]]:
    """(median s/step, logged losses) of `steps` judge SFT steps on one loss path."""
    from flywheel.train import hf, sft
    from flywheel.train.data import sft_rows, to_hf_dataset

    s = cfg.train.resolved("judge_sft").model_copy(update={"max_steps": steps, "logging_steps": 1})
    dataset = to_hf_dataset(sft_rows(rows, completion_only_loss=bool(s.completion_only_loss)))
    model, processor = hf.load_vlm(model_path)
    timer = Timer()
    with tempfile.TemporaryDirectory() as out:
        trainer = sft.build_trainer(model, processor, dataset, s, out, cfg.run.seed, callbacks=[timer], bare=True,
                                    fused_head=fused)
        trainer.args.save_strategy = "no"
        trainer.remove_callback(PrinterCallback)  # a dict per step; the table below is the output
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return timer.timer.summary()["step_time_median_s"], losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--data", default=None, help="a curated SFT dataset (default: synthetic rows)")
    p.add_argument("--model", default=None, help="judge checkpoint (default: the zoo judge)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from flywheel.models.zoo import build_zoo
    from flywheel.train.data import read_training_data
    from flywheel.train.registry import resolve_base
    from flywheel.train.synthetic import write_synthetic

    workdir = tempfile.mkdtemp(prefix="flywheel-bench-sft-loss-")
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={workdir}", "models.judge.path=zoo:judge"])
    torch.set_num_threads(args.threads)
    if args.model is None:
        build_zoo(cfg)
    model_path = args.model or resolve_base(cfg, cfg.models.judge.path)
    data = args.data or write_synthetic(f"{cfg.storage.uri}/bench/sft", "sft", 16 * (args.steps + 2)).path
    rows = read_training_data(data, "sft").rows
    print(f"{len(rows)} rows from {data}; model {model_path}; {args.steps} steps, {args.threads} thread(s)")

    fused_before, fused_losses = run(cfg, model_path, rows, args.steps, fused=True)
    own, own_losses = run(cfg, model_path, rows, args.steps, fused=False)
    fused_after, _ = run(cfg, model_path, rows, args.steps, fused=True)
    fused = (fused_before + fused_after) / 2
    diff = max(abs(a - b) for a, b in zip(fused_losses, own_losses, strict=True))
    print(f"TRL fused head   {fused:.4f} s/step (before/after {fused_before:.4f}/{fused_after:.4f})")
    print(f"model's own loss {own:.4f} s/step")
    print(f"ratio            {own / fused:.2f}")
    print(f"largest loss difference over {len(own_losses)} logged steps: {diff:.2e}")


if __name__ == "__main__":
    main()
