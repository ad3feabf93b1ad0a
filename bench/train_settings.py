"""Two settings of one VLM training side by side, in one run (these machines are noisy): the same bare TRL training
(judge SFT, or policy DPO) on the same model, rows and seed under config overrides A and B. Prints each side's
median and mean step time and their ratios (B / A, lower is faster), the share of each batch's tokens that are not
padding, what the vision feature cache did, and, when both sides draw their rows in the same order, the largest
difference between their per-step losses.

    .venv/bin/python bench/train_settings.py --workdir runs/local --training judge_sft --steps 300 \
        --a train.image_feature_cache_mb=0 --b train.image_feature_cache_mb=1024
    .venv/bin/python bench/train_settings.py --a train.judge_sft.micro_batches=1 --b train.judge_sft.micro_batches=4

The rows are iteration 000's curated SFT set (judge_sft) or its policy preference pairs (policy_dpo) in <workdir>.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import TrainerCallback


class Clock(TrainerCallback):
    """Optimizer-step ends, logged losses, and the real (non-padding) share of the tokens each forward sees."""

    def __init__(self):
        self.stamps, self.losses, self.real, self.padded = [], [], 0, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])

    def count(self, module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            self.real += int(mask.sum())
            self.padded += mask.numel()


def run(cfg, training: str, data_uri: str, steps: int) -> dict:
    from flywheel.train import dpo, hf, sft
    from flywheel.train.data import dpo_rows, read_training_data, sft_rows, to_hf_dataset
    from flywheel.train.registry import resolve_base

    s = cfg.train.resolved(training).model_copy(update={"max_steps": steps, "logging_steps": 1})
    role = {"judge_sft": "judge", "policy_dpo": "policy"}[training]
    model, processor = hf.load_vlm(resolve_base(cfg, getattr(cfg.models, role).path))
    clock = Clock()
    model.register_forward_pre_hook(clock.count, with_kwargs=True)
    with tempfile.TemporaryDirectory() as out:
        if training == "judge_sft":
            ds = to_hf_dataset(sft_rows(read_training_data(data_uri, "sft").rows,
                                        completion_only_loss=bool(s.completion_only_loss)))
            trainer = sft.build_trainer(model, processor, ds, s, out, cfg.run.seed, callbacks=[clock], bare=True)
        else:
            ds = to_hf_dataset(dpo_rows(read_training_data(data_uri, "dpo").rows))
            trainer = dpo.build_trainer(model, processor, ds, s, out, cfg.run.seed, callbacks=[clock], bare=True)
        trainer.train()
    cache = next((m._image_feature_cache for m in model.modules() if hasattr(m, "_image_feature_cache")), None)
    gaps = [b - a for a, b in zip(clock.stamps[5:], clock.stamps[6:])]  # after a warm-up
    return {"step": statistics.median(gaps), "mean": statistics.fmean(gaps), "losses": clock.losses,
            "real": clock.real / max(1, clock.padded),
            "cache": "off" if cache is None else f"{cache.hits / max(1, cache.hits + cache.misses):.0%} hits"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="runs/local")
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--training", choices=["judge_sft", "policy_dpo"], default="judge_sft")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--a", nargs="*", default=[], help="Config overrides of side A.")
    ap.add_argument("--b", nargs="*", default=[], help="Config overrides of side B.")
    args = ap.parse_args()
    from flywheel.config import load_config

    sides = {}
    for name, overrides in (("A", args.a), ("B", args.b)):
        cfg = load_config(args.config, [f"run.workdir={args.workdir}", *overrides])
        torch.set_num_threads(int(cfg.resources.train.num_cpus))
        sub = {"judge_sft": "curated/sft", "policy_dpo": "pref-curated/dpo"}[args.training]
        sides[name] = run(cfg, args.training, f"{args.workdir}/data/iterations/000/{sub}", args.steps)
    a, b = sides["A"], sides["B"]
    gap = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    print(f"{args.training}, {args.steps} steps")
    for name, overrides in (("A", args.a), ("B", args.b)):
        side = sides[name]
        print(f"  {name} {' '.join(overrides) or '(config)'}: median step {side['step']:.3f} s (mean "
              f"{side['mean']:.3f}), "
              f"real tokens {side['real']:.2f}, vision cache {side['cache']}")
    print(f"  ratio B/A {b['step'] / a['step']:.2f} (means {b['mean'] / a['mean']:.2f}); "
          f"largest per-step loss difference {gap:.2e} "
          "(meaningful only if both sides draw rows in the same order)")


if __name__ == "__main__":
    main()
