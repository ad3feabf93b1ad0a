"""Replay a pooled LLaVA update outside the loop: the same pool, other training seeds, or only its confident pairs.

The loop makes one update decision per pool, so one promotion against one refusal says little about the labels.
This trains LLaVA DPO again from the pool's start policy on a finished iteration's pooled pairs
(<workdir>/data/iterations/<n>/pref-pool/dpo), through `flywheel.train.train` as the iteration does, with
`train.seed` set per run, and scores each result on the gate's items (the loop's run.seed, so the same 120).

    .venv/bin/python bench/pool_replay.py --pool runs/t7/data/iterations/003/pref-pool/dpo --seeds 1,2,3
        [--min-margin 2] [--base world:policy] [--workdir runs/bench-pool-replay] [--models-from runs/t7/models]
        [--set train.policy_dpo.methods=[dpo_sft] ...]

Measured 2026-11-26 (docs/results.md, runs/t6 vs runs/t7), seeds 1 / 2 / 3, held-out best and gate accuracy:
- runs/t7 iteration 3 (iterations 0-2 ranked again by iteration 3's judge, 317 pairs): 0.552 / 0.552 / 0.552,
  gate 0.508 / 0.508 / 0.517 (the loop's seed 0: 0.562, 0.525, promoted);
- runs/t6 iteration 3 (each iteration's pairs as its own judge ranked them, 305 pairs): held-out 0.500 in all
  three, refused (gate: the start's 0.450; the loop's seed 0: refused too);
- runs/t7 iteration 3 with --min-margin 2 (215 of 317 pairs), seed 0: held-out 0.510, gate 0.442.
- runs/t7 iteration 3 with an SFT term on the chosen answers (`--set 'train.policy_dpo.methods=[dpo_sft]'
  --set train.policy_dpo.heldout.on_guard=keep_best`), seed 0: the same as DPO alone, held-out 0.500 -> 0.562
  (step 125), gate 0.450 -> 0.525; the guard did not fire.
About 70 s per run on the 2-core box.
"""
from __future__ import annotations

import argparse
import os
import shutil

from flywheel.config import load_config
from flywheel.datasets import read_rows, write_dataset
from flywheel.evaluate.downstream import evaluate_policy_ref
from flywheel.track import Tracker
from flywheel.train.api import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", required=True, help="a pooled dpo dataset, e.g. <workdir>/data/iterations/3/...")
    ap.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    ap.add_argument("--min-margin", type=float, default=None, help="keep only pairs with at least this margin")
    ap.add_argument("--base", default="world:policy", help="the policy the pool's update started from")
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--workdir", default="runs/bench-pool-replay")
    ap.add_argument("--models-from", default=None, help="copy this models/ cache into the workdir first")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="a config override for every training run, e.g. train.policy_dpo.methods=[dpo_sft]")
    a = ap.parse_args()
    workdir = os.path.abspath(a.workdir)  # Ray Train workers run elsewhere: every path absolute
    if a.models_from and not os.path.exists(f"{workdir}/models"):
        shutil.copytree(a.models_from, f"{workdir}/models")
    cfg = load_config(a.config, [f"run.workdir={workdir}"])
    data = os.path.abspath(a.pool)
    if a.min_margin is not None:
        rows = [r for r in read_rows(data) if r["margin"] >= a.min_margin]
        data = f"{workdir}/data/pool-margin-{a.min_margin:g}"
        write_dataset(data, "dpo", rows, config_hash="bench", producer="bench/pool_replay.py")
        print(f"{len(rows)} pairs with margin >= {a.min_margin:g}")
    start = evaluate_policy_ref(cfg, a.base).metrics["accuracy"]
    for seed in [int(s) for s in a.seeds.split(",")]:
        c = load_config(a.config, [f"run.workdir={workdir}", f"train.seed={seed}", *a.sets])
        res = train(c, "policy_dpo", data, base=a.base, tracker=Tracker(c), iteration=0)
        f = res.final
        gate = start if f.get("heldout.refused") else evaluate_policy_ref(cfg, res.model_uri).metrics["accuracy"]
        print(f"seed {seed}: held-out {f.get('heldout.start_value'):.3f} -> best {f.get('heldout.best_value'):.3f}"
              f" (step {f.get('heldout.best_step')}), {'refused' if f.get('heldout.refused') else 'kept'}; "
              f"gate accuracy {start:.3f} -> {gate:.3f}")


if __name__ == "__main__":
    main()
