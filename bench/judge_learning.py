"""What the tiny judge learns from a flywheel run's curated SFT rows, outside the loop: train a judge (bare TRL
SFTTrainer, the flywheel's judge-SFT settings unless overridden) on chosen iterations / tasks, optionally from a
base that can see (`world:judge`: the zoo judge after perception SFT on the world's captions and questions), then
meta-evaluate it on the run's gold: ranking accuracy per task and Minos' image-swap check (does the judge look at
images at all?).

    .venv/bin/python bench/judge_learning.py --workdir runs/local [--iterations 000] [--tasks all|ig,iu]
        [--steps 1258] [--batch-size 16] [--lr 5e-4] [--base zoo|world]
        [--set world.base_policies.judge.pretrain.steps=1500 ...] [--gold-prompts 16] [--caption-checks 2000]

--gold-prompts N meta-evaluates on a larger gold set than the run's (N prompts per sub-task and split from the run's
iteration-0 prompts, built once under runs/bench-gold-<N>): the run's ~23 pairs per sub-task move by +-0.2.

Measured 2026-11-22 on the 3-iteration proof's data (issue 7's note): iteration 0's rows, 1,258 steps x 16 ->
id-test ranking 0.163 from the zoo judge, 0.213 after 1,500 pretraining steps; image generation stays at 0.

Measured 2026-11-27 with --caption-checks 2000 (runs/hx2's rows, whose caption analyses look every mention up by
its colour; --base runs/jcc-base, bench/judge_caption_check.py's checkpoint; judge.generation.max_new_tokens=256):
the SFT'd judge still answers the check bench's held-out rows 0.725 (0.71 before SFT; 0.000 after SFT without
them), but its captions rank 0.479 (0.543 without the rows, runs/fr3's own wording 0.670) and the look-ups in its
analyses agree with its own lead 712 times in 1,923 (852 in 1,581 without): keeping the look-up in the mix did
not carry it into the analyses.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

KEYS = ["all/pointwise_ranking/accuracy", "task/ig/pointwise_ranking/accuracy", "task/iu/pointwise_ranking/accuracy",
        "task/nlg/pointwise_ranking/accuracy", "task/itig/pointwise_ranking/accuracy", "all/pointwise/pearson",
        "all/pairwise/accuracy", "perturb/image_swap/input/unperturbed/pointwise/pearson",
        "perturb/image_swap/input/pointwise/pearson", "perturb/image_swap/output/unperturbed/pointwise/pearson",
        "perturb/image_swap/output/pointwise/pearson"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="A flywheel run's workdir (its data/ and gold are read).")
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--iterations", default="000", help="Comma-separated iterations whose curated SFT rows train.")
    ap.add_argument("--tasks", default="all", help="all, or comma-separated tasks (nlg, iu, ig, itig).")
    ap.add_argument("--steps", type=int, default=1258)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--base", default="zoo", help="zoo: the random judge; world: the perceiving base (built and "
                    "cached in the workdir); or a checkpoint's folder (e.g. bench/judge_caption_check.py --save).")
    ap.add_argument("--seed", type=int, default=None, help="Training seed (data order); default run.seed. Two "
                    "seeds of the same setting show how much one training varies.")
    ap.add_argument("--set", nargs="*", default=[], help="Config overrides, e.g. of world.base_policies.judge or "
                    "judge.generation (the meta-evaluation reads them too).")
    ap.add_argument("--gold-prompts", type=int, default=None, help="Meta-evaluate on a gold set of this many prompts "
                    "per sub-task and split (built once from the run's iteration-0 prompts) instead of the run's.")
    ap.add_argument("--caption-checks", type=int, default=0, help="Add this many rows of bench/judge_caption_check.py "
                    "(--key colour, the teacher's words) to the SFT rows: does the look-up, kept in the mix, carry "
                    "into the analyses that use it?")
    ap.add_argument("--out", default="runs/bench-judge-learning")
    ap.add_argument("--stage", choices=["all", "train", "eval"], default="all",
                    help="train: stop after saving <out>/model (no Ray); eval: meta-evaluate an existing <out>/model.")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # a base build's phases
    torch.set_num_threads(2)

    from flywheel.config import load_config
    from flywheel.models.zoo import build_world
    from flywheel.train.data import read_training_data

    work, out = Path(args.workdir).resolve(), Path(args.out).resolve()
    # build_world builds every world model the config names: its own judge (from --base) and the policies
    judge = f"{args.base}:judge" if args.base in ("zoo", "world") else str(Path(args.base).resolve())
    cfg = load_config(args.config, [f"run.workdir={work}", f"models.judge.path={judge}", *args.set])
    tasks = None if args.tasks == "all" else set(args.tasks.split(","))
    rows = [r for it in args.iterations.split(",")
            for r in read_training_data(str(work / "data" / "iterations" / it / "curated" / "sft"), "sft").rows
            if tasks is None or r["task"] in tasks]
    print(f"{len(rows)} SFT rows from iterations {args.iterations}, tasks {args.tasks}", flush=True)
    if args.stage != "eval":
        extra = caption_check_rows(cfg, args.caption_checks) if args.caption_checks else []
        t0 = time.perf_counter()
        build_world(cfg)  # cached
        print(f"base {cfg.models.judge.path} ready in {time.perf_counter() - t0:.0f} s", flush=True)
        train_judge(cfg, rows + extra, args, out)
    if args.stage != "train":
        evaluate(args, work, out)


def caption_check_rows(cfg, n: int) -> list[dict]:
    """n rows of bench/judge_caption_check.py in the curated SFT rows' format (its held-out rows use another
    seed), so the judge SFT's own row conversion takes them with the run's rows."""
    import numpy as np
    from judge_caption_check import check_row

    from flywheel.images import to_png_bytes

    rng, out = np.random.default_rng(cfg.run.seed), []
    for i in range(n):
        row, _ = check_row(rng, cfg.world.shapes, "colour", "teacher")
        out.append({"sft_id": f"caption-check-{i}", "images": [to_png_bytes(im) for im in row["images"]],
                    "messages": json.dumps(row["prompt"] + row["completion"])})
    print(f"{n} caption-check rows added", flush=True)
    return out


def train_judge(cfg, rows: list[dict], args, out: Path) -> None:
    from flywheel.models.zoo import resolve_model_path
    from flywheel.train import hf
    from flywheel.train.data import sft_rows, to_hf_dataset
    from flywheel.train.sft import build_trainer

    base = resolve_model_path(cfg.models.judge, cfg)
    model, processor = hf.load_vlm(base)
    settings = cfg.train.resolved("judge_sft").model_copy(update={
        "max_steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "save_steps": 10**9,
        "logging_steps": max(args.steps // 10, 1)})
    trainer = build_trainer(model, processor, to_hf_dataset(sft_rows(rows)).shuffle(seed=0), settings,
                            str(out / "trl"), cfg.run.seed if args.seed is None else args.seed, bare=True)
    t0 = time.perf_counter()
    trainer.train()
    print(f"trained {args.steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    trainer.model.save_pretrained(out / "model")
    processor.save_pretrained(out / "model")


def evaluate(args, work: Path, out: Path) -> None:
    from flywheel.config import load_config
    from flywheel.evaluate import meta
    from flywheel.evaluate.metric_names import SUBTASK, per_subtask
    from flywheel.raycluster import init_ray
    from flywheel.stages import gold

    ecfg = load_config(args.config, [*args.set, f"run.workdir={work}", f"models.judge.path={out / 'model'}",
                                     f"storage.uri={out / 'data'}"])
    init_ray(ecfg)
    gold_uri = str(work / "data" / "gold")
    if args.gold_prompts:
        gold_uri = str(Path(f"runs/bench-gold-{args.gold_prompts}").resolve())
        gcfg = ecfg.model_copy(deep=True)
        gcfg.world.gold.prompts_per_subtask = args.gold_prompts
        gold.run(gcfg, str(work / "data" / "iterations" / "000" / "prompts"), gold_uri)  # skipped when built
    results = meta.run(ecfg, gold_uri, str(out / "data" / "meta"))
    summary = {split: {k: round(m.get(k, float("nan")), 3) for k in KEYS}
               | {f"{SUBTASK}{s}/pointwise_ranking/accuracy": round(v, 3)
                  for s, v in sorted(per_subtask(m, "pointwise_ranking/accuracy").items())}
               for split, m in results.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for split, m in summary.items():
        print(f"\n{split}")
        for k, v in m.items():
            print(f"  {k:58s} {v:.3f}")


if __name__ == "__main__":
    main()
