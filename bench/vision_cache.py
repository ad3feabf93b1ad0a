"""What the per-image vision feature cache (flywheel/models/vision_cache.py) saves on a VLM training: the same
bare TRL training (judge SFT, or policy DPO) with the cache off and on, in one run, on the same model, rows and
seed. Prints each side's median step time, their ratio (on / off, lower is better), the cache's hit rate, and the
largest difference between the two sides' per-step losses (the cache must not change what is learnt).

    .venv/bin/python bench/vision_cache.py --workdir runs/local [--training judge_sft] [--steps 150]

The rows are iteration 000's curated SFT set (judge_sft) or its preference pairs (policy_dpo) in <workdir>.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import TrainerCallback


class Clock(TrainerCallback):
    def __init__(self):
        self.stamps, self.losses = [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def run(cfg, training: str, data_uri: str, steps: int, cache_mb: int) -> tuple[float, list[float], str]:
    from flywheel.train import dpo, hf, sft
    from flywheel.train.data import dpo_rows, read_training_data, sft_rows, to_hf_dataset
    from flywheel.train.registry import resolve_base

    s = cfg.train.resolved(training).model_copy(update={"image_feature_cache_mb": cache_mb, "max_steps": steps,
                                                         "logging_steps": 1})
    role = {"judge_sft": "judge", "policy_dpo": "policy"}[training]
    model, processor = hf.load_vlm(resolve_base(cfg, getattr(cfg.models, role).path))
    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        if training == "judge_sft":
            ds = to_hf_dataset(sft_rows(read_training_data(data_uri, "sft").rows,
                                        completion_only_loss=bool(s.completion_only_loss)))
            trainer = sft.build_trainer(model, processor, ds, s, out, cfg.run.seed, callbacks=[clock], bare=True)
        else:
            ds = to_hf_dataset(dpo_rows(read_training_data(data_uri, "dpo").rows))
            trainer = dpo.build_trainer(model, processor, ds, s, out, cfg.run.seed, callbacks=[clock], bare=True)
        trainer.train()
    cache = getattr(next((m for m in model.modules() if hasattr(m, "_image_feature_cache")), None),
                    "_image_feature_cache", None)
    hit = "off" if cache is None else (f"hits {cache.hits}, misses {cache.misses} "
                                       f"({cache.hits / max(1, cache.hits + cache.misses):.0%}), "
                                       f"{cache.bytes / 2**20:.1f} MB")
    gaps = [b - a for a, b in zip(clock.stamps[5:], clock.stamps[6:])]  # after a warm-up
    return statistics.median(gaps), clock.losses, hit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="runs/local")
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--training", choices=["judge_sft", "policy_dpo"], default="judge_sft")
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    from flywheel.config import load_config

    cfg = load_config(args.config, [f"run.workdir={args.workdir}"])
    threads = int(cfg.resources.train.num_cpus)
    torch.set_num_threads(threads)
    sub = {"judge_sft": "curated/sft", "policy_dpo": "pref-curated/dpo"}[args.training]
    data = f"{args.workdir}/data/iterations/000/{sub}"
    off, losses_off, _ = run(cfg, args.training, data, args.steps, 0)
    on, losses_on, hit = run(cfg, args.training, data, args.steps, cfg.train.image_feature_cache_mb)
    gap = max(abs(a - b) for a, b in zip(losses_off, losses_on))
    print(f"{args.training}, {args.steps} steps, {threads} threads: median step off {off:.3f} s, on {on:.3f} s, "
          f"ratio on/off {on / off:.2f}; cache {hit}; largest per-step loss difference {gap:.2e}")


if __name__ == "__main__":
    main()
