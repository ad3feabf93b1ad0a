"""What the loss path costs per step off a GPU, measured in one run on the same model, rows, seed and threads.

- `--training judge_sft`: TRL's fused LM head (which, off a Triton device, projects every position) against the
  model's own loss from its labels (flywheel.train.sft.model_loss_trainer, the default off a GPU).
- `--training judge_dpo`: TRL's fused LM head as it ships against the same head projecting only the completion
  positions (flywheel.train.dpo.labelled_positions_only, the default).

Target: ratio <= 0.85 with the same losses (largest difference over the logged steps <= 1e-4).

Both sides are built by the training's own build_trainer (`bare=True`: plain TRL batches, no Ray) and timed by
the StepTimer the Ray Train workers use: wall time between consecutive optimizer-step ends (data loading,
forward, backward, update), median over the steps after a warm-up. TRL's side runs before and after ours and its
two medians are averaged.

    .venv/bin/python bench/loss_paths.py [--training judge_sft|judge_dpo] [--steps 60] [--data <curated dir>]
        [--model <checkpoint>]

Measured with synthetic rows and the zoo judge (10 steps): judge_sft 0.0709 against 0.1085 s/step, ratio 0.65;
judge_dpo 0.1387 against 0.1827, ratio 0.76. On a local run's iteration-0 curated sets and the world judge base:
judge_sft 0.1948 against 0.2935 s/step, ratio 0.66 (60 steps); judge_dpo 0.5090 against 0.7057, ratio 0.72
(40 steps). Both with loss differences <= 1e-6 (judge_dpo: 0).
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.worker import StepTimer

KINDS = {"judge_sft": "sft", "judge_dpo": "dpo"}


class Timer(TrainerCallback):
    def __init__(self):
        self.timer = StepTimer()

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.tick()


def run(cfg, training: str, model_path: str, rows: list[dict], steps: int, trl_path: bool) -> tuple[float, list]:
    """(median s/step, logged losses) of `steps` steps on TRL's loss path or ours."""
    from flywheel.train import dpo, hf, sft
    from flywheel.train.data import dpo_rows, sft_rows, to_hf_dataset

    s = cfg.train.resolved(training).model_copy(update={"max_steps": steps, "logging_steps": 1, "heldout": None})
    model, processor = hf.load_vlm(model_path)
    timer = Timer()
    with tempfile.TemporaryDirectory() as out:
        if training == "judge_sft":
            dataset = to_hf_dataset(sft_rows(rows, completion_only_loss=bool(s.completion_only_loss)))
            trainer = sft.build_trainer(model, processor, dataset, s, out, cfg.run.seed, callbacks=[timer],
                                        bare=True, fused_head=trl_path)
        else:
            trainer = dpo.build_trainer(model, processor, to_hf_dataset(dpo_rows(rows)), s, out, cfg.run.seed,
                                        callbacks=[timer], bare=True, compact_head=not trl_path)
        trainer.args.save_strategy = "no"
        trainer.remove_callback(PrinterCallback)  # a dict per step; the table below is the output
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return timer.timer.summary()["step_time_median_s"], losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--training", choices=sorted(KINDS), default="judge_sft")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--data", default=None, help="a curated dataset of the training's kind (default: synthetic)")
    p.add_argument("--model", default=None, help="judge checkpoint (default: the zoo judge)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from flywheel.models.zoo import build_zoo
    from flywheel.train.data import read_training_data
    from flywheel.train.registry import resolve_base
    from flywheel.train.synthetic import write_synthetic

    kind = KINDS[args.training]
    workdir = tempfile.mkdtemp(prefix="flywheel-bench-loss-")
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={workdir}", "models.judge.path=zoo:judge"])
    torch.set_num_threads(args.threads)
    if args.model is None:
        build_zoo(cfg)
    model_path = args.model or resolve_base(cfg, cfg.models.judge.path)
    batch = cfg.train.resolved(args.training).batch_size
    data = args.data or write_synthetic(f"{cfg.storage.uri}/bench/{kind}", kind, batch * (args.steps + 2)).path
    rows = read_training_data(data, kind).rows
    print(f"{args.training}: {len(rows)} rows from {data}; model {model_path}; {args.steps} steps, "
          f"{args.threads} thread(s)")

    trl_before, trl_losses = run(cfg, args.training, model_path, rows, args.steps, trl_path=True)
    ours, our_losses = run(cfg, args.training, model_path, rows, args.steps, trl_path=False)
    trl_after, _ = run(cfg, args.training, model_path, rows, args.steps, trl_path=True)
    trl = (trl_before + trl_after) / 2
    diff = max(abs(a - b) for a, b in zip(trl_losses, our_losses, strict=True))
    ours_name = "model's own loss" if args.training == "judge_sft" else "completion positions only"
    print(f"{'TRL as shipped':26s} {trl:.4f} s/step (before/after {trl_before:.4f}/{trl_after:.4f})")
    print(f"{ours_name:26s} {ours:.4f} s/step")
    print(f"{'ratio':26s} {ours / trl:.2f}")
    print(f"largest loss difference over {len(our_losses)} logged steps: {diff:.2e}")


if __name__ == "__main__":
    main()
