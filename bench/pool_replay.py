"""Replay a pooled policy update outside the loop: the same pool, other training seeds, only its confident pairs
or one sub-task's, its samples ranked by the oracle instead of the judge, or perfect question pairs added.

The loop makes one update decision per pool, so one promotion against one refusal says little about the labels.
This trains the update again from the pool's start model on a finished iteration's pooled pairs
(<workdir>/data/iterations/<n>/pref-pool/dpo: LLaVA DPO; .../image_pref: SDXL Diffusion-DPO), through
`flywheel.train.train` as the iteration does, with `train.seed` set per run, and scores each result on the
gate's items (the loop's run.seed and gate.eval_items: 120 items before 2026-11-27, so the numbers below; 480
since). `--oracle` keeps every pair the oracle world decides and orders it as the oracle does (ties dropped): what
the same samples give with perfect labels.

    .venv/bin/python bench/pool_replay.py --pool runs/t7/data/iterations/003/pref-pool/dpo --seeds 1,2,3
        [--pool another pool of the same kind ...] [--min-margin 2] [--oracle] [--base world:policy]
        [--workdir runs/bench-pool-replay] [--models-from runs/t7/models] [--set train.policy_dpo.methods=[dpo_sft] ...]
        [--subtask iu_existence ...] [--perfect iu_existence:1000 ...]   (--perfect alone needs no --pool)
        [--sampled 16:1:480]   (K:P:N: the start policy's own K samples on N fresh items, up to P right-over-wrong
                                pairs per item by the oracle; alone it needs no --pool)
        [--eval run.seed=7 --eval gate.eval_items=240]   (score on fresh items, not the gate's: for tuning)

Measured 2026-11-26 (docs/results.md, runs/t6 vs runs/t7), seeds 1 / 2 / 3, held-out best and gate accuracy:
- runs/t7 iteration 3 (iterations 0-2 ranked again by iteration 3's judge, 317 pairs): 0.552 / 0.552 / 0.552,
  gate 0.508 / 0.508 / 0.517 (the loop's seed 0: 0.562, 0.525, promoted);
- runs/t6 iteration 3 (each iteration's pairs as its own judge ranked them, 305 pairs): held-out 0.500 in all
  three, refused (gate: the start's 0.450; the loop's seed 0: refused too);
- runs/t7 iteration 3 with --min-margin 2 (215 of 317 pairs), seed 0: held-out 0.510, gate 0.442.
- runs/t7 iteration 3 with an SFT term on the chosen answers (`--set 'train.policy_dpo.methods=[dpo_sft]'
  --set train.policy_dpo.heldout.on_guard=keep_best`), seed 0: the same as DPO alone, held-out 0.500 -> 0.562
  (step 125), gate 0.450 -> 0.525; the guard did not fire.
- SDXL, runs/t7 iteration 4's pool (iterations 0-4, 397 pairs; in the loop the held-out check refused it, 5.23 ->
  5.02-5.15): with `--oracle` (390 pairs decided, 120 of them reversed), seed 0: held-out 5.230 -> 5.461 (step
  100), gate score10 4.586 -> 4.819, Wilcoxon 61 better / 53 worse, p=0.104; seed 1: 5.230 -> 5.323 (step 50),
  gate 4.586 -> 4.677, 56 / 57, p=0.422; seed 0 with train.diffusion_dpo.max_steps=250: the best state stays
  step 100's (5.422-5.440 after it). The 87 image pairs of runs/t7's nine iterations with a margin >= 2 (90%
  right by the oracle): held-out 5.230 -> 4.911 / 4.955 at steps 50 / 100, refused (it fits them: implicit
  reward accuracy on its held-out pairs 0.96). Both of runs/t7's SDXL pools as the judges ranked them (`--pool
  .../004/pref-pool/image_pref --pool .../008/pref-pool/image_pref`, 713 pairs), seeds 0 / 1: held-out 5.230 ->
  5.367 / 5.365 (step 50), gate 4.586 -> 4.624 / 4.735, Wilcoxon p=0.627 / 0.256.
- Existence and runs/t9's pool with an SFT term (`--perfect iu_existence:1000`, `--set
  'train.policy_dpo.methods=[dpo_sft]' --set train.policy_dpo.lr=1e-3`, ...): tables in docs/results.md, "An SFT
  term on the chosen answers". DPO alone never moved existence; dpo_sft at lr 1e-3 took runs/t9's pool to gate
  0.650 / 0.658 / 0.667 (seeds 0-2) where DPO at 1e-4 gave 0.625.
- runs/t10 iteration 4's pool (351 pairs; in the loop gate 0.558 -> 0.650) on 240 fresh items (`--eval
  run.seed=7 --eval gate.eval_items=240`), seeds 0 / 1 / 2, from 0.521: the loop's setting 0.608 / 0.592 / 0.608;
  sft_weight 2 0.592 / 0.592 / 0.596; sft_weight 0.5 0.575 / 0.600 / 0.596; lr 5e-4 0.596 / 0.592 / 0.596; beta
  0.1 0.600 / 0.600 / 0.596; `--oracle` (331 pairs decided, 46 reversed) 0.600 / 0.608 / 0.604. A plateau: the
  judge's ranking is as good as the oracle's here, and no training knob moves it.
- `--sampled` (2026-11-27, docs/results.md "The LLaVA's samples hold more than its update learns"), from runs/fr2's
  base LLaVA (gate 0.592), seeds 0 / 1 / 2: 16:1:480 (315 pairs) refused by the guard / 0.658 / 0.675; 4:1:900
  (333 pairs) 0.658 / 0.658 / refused by the guard. Count stays at 0.600 in every run. The same models on the
  480 items the gate scores now, from 0.562: 0.662-0.683 (+10 to +12), docs/results.md.
About 70 s per LLaVA run and 60-110 s per SDXL run on the 2-core box (1,000 perfect pairs: ~3 minutes).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil

import numpy as np

from flywheel.config import ModelRef, load_config
from flywheel.curate.pairs import assistant, policy_user_message
from flywheel.datasets import iter_dataset_rows, read_manifest, read_rows, write_dataset
from flywheel.evaluate.downstream import evaluate_generator_ref, evaluate_policy_ref
from flywheel.gate import paired_items
from flywheel.images import to_png_bytes
from flywheel.models.zoo import resolve_model_path
from flywheel.track import Tracker
from flywheel.train.api import train
from flywheel.worlds.shapes.pair_check import NoGroundTruth, oracle_value
from flywheel.worlds.shapes.policy_data import posed_answer
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import sample_scene
from flywheel.worlds.shapes.suites import iu_question
from flywheel.worlds.shapes.vocab import PALETTES

# pool kind -> (training, start model, gate evaluation, its metric)
KINDS = {"dpo": ("policy_dpo", "world:policy", evaluate_policy_ref, "accuracy"),
         "image_pref": ("diffusion_dpo", "world:generator", evaluate_generator_ref, "score10")}


def order_by(rows: list[dict], value) -> tuple[list[dict], int]:
    """(the pairs `value` decides, chosen = the sample it values higher; how many were reversed). `value` maps a
    row and one of its source ids (chosen, rejected) to a number, or raises NoGroundTruth: that pair is dropped,
    as is a tie."""
    out, swapped = [], 0
    for r in rows:
        try:
            a, b = (value(r, i) for i in r["source_ids"])
        except NoGroundTruth:
            continue
        if a < b:
            swapped += 1
            r = {**r, "chosen": r["rejected"], "rejected": r["chosen"], "chosen_score": r["rejected_score"],
                 "rejected_score": r["chosen_score"], "source_ids": r["source_ids"][::-1]}
        if a != b:
            out.append(r)
    return out, swapped


def oracle_ranked(rows: list[dict], pool: str, world) -> list[dict]:
    """order_by the oracle world's value of each sample. Prompts and candidates are read from every iteration of
    the pool's workdir."""
    iterations = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(pool))))
    ids = {i for r in rows for i in r["source_ids"]}
    prompts, cands = {}, {}
    for it in sorted(glob.glob(f"{iterations}/*/pref-candidates")):
        prompts |= {r["prompt_id"]: r for r in iter_dataset_rows(f"{os.path.dirname(it)}/pref-prompts")}
        cands |= {r["candidate_id"]: r for r in iter_dataset_rows(it) if r["candidate_id"] in ids}
    # an image pair names its prompt; a text (dpo) pair does not, its candidates do
    out, swapped = order_by(rows, lambda r, i: oracle_value(prompts[cands[i]["prompt_id"]], cands[i], world))
    print(f"oracle: {len(out)} of {len(rows)} pairs decided, {swapped} of them reversed")
    return out


PERFECT_SUBTASKS = ("iu_color", "iu_count", "iu_existence")  # one right answer each; a caption has many


def perfect_pairs(world, subtask: str, n: int, seed: int = 12345) -> list[dict]:
    """`n` pool rows of one question sub-task (iu_color, iu_count, iu_existence) on fresh scenes: the right answer
    chosen over a wrong one. Not the policy's samples: what a pool of this sub-task could teach at best."""
    rng, rows = np.random.default_rng(seed), []
    while len(rows) < n:
        scene = sample_scene(rng, config=world)
        posed = iu_question(subtask, scene, rng, PALETTES[world.palette], world.shapes)
        if posed is None:
            continue
        question, right, q = posed
        wrong = posed_answer(q, False, rng, world)[0]
        image = to_png_bytes(render(scene, world.image_size))
        rows.append({"target": "policy", "images": [image],
                     "prompt": policy_user_message({"images": [image], "query": question}),
                     "chosen": assistant(right), "rejected": assistant(wrong), "chosen_score": 1.0,
                     "rejected_score": 0.0, "margin": 1.0, "protocol": None, "subtask": subtask, "source_ids": [],
                     "meta": {"labels": "oracle", "question": q}})
    return rows


SAMPLED_STREAM = 7937  # fresh items of --sampled (policy_eval's gate and early-stopping streams are 7919, 7927)


def sampled_pairs(cfg, base: str, k: int, per_item: int, n_items: int, seed: int = 4242) -> list[dict]:
    """Pool rows from the start policy's own samples on `n_items` fresh items of every question type (captions
    too), ordered by the oracle: `k` samples per item at the preference stage's temperature, and up to `per_item`
    pairs per item of a distinct right answer over a distinct wrong one (paired in draw order). What a pool would
    hold with perfect labels and k samples per prompt (the loop draws preferences.samples_per_prompt)."""
    from flywheel.engines.hf import HFTextEngine
    from flywheel.preferences import sampling_config
    from flywheel.worlds.shapes import policy_eval as pe

    world = cfg.world.shapes
    items = pe.text_items(world, n_items, seed, SAMPLED_STREAM)
    engine = HFTextEngine(resolve_model_path(ModelRef(path=base), cfg), sampling_config(cfg).policy.generation)
    requests = pe.text_requests(items, world)
    draws = [engine.generate(requests, seed=seed + 1000 * (j + 1)) for j in range(k)]
    del engine
    rows, mixed = [], 0
    for i, (subtask, scene, question, q) in enumerate(items):
        right, wrong = [], []
        for text in dict.fromkeys((d[i].text or "").strip() for d in draws if d[i].ok):
            check = pe.check_answer(q, text, scene)
            (right if not check.unparseable and check.correct == 1.0 else wrong).append(text)
        mixed += bool(right and wrong)
        image = to_png_bytes(render(scene, world.image_size))
        for good, bad in list(zip(right, wrong))[:per_item]:
            rows.append({"target": "policy", "images": [image],
                         "prompt": policy_user_message({"images": [image], "query": question}),
                         "chosen": assistant(good), "rejected": assistant(bad), "chosen_score": 1.0,
                         "rejected_score": 0.0, "margin": 1.0, "protocol": None, "subtask": subtask,
                         "source_ids": [], "meta": {"labels": "oracle-sampled"}})
    print(f"sampled: {n_items} items x {k} samples, {mixed} with a right and a wrong answer, {len(rows)} pairs")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", action="append", default=[], help="a pooled dataset, <workdir>/data/iterations/"
                    "<n>/pref-pool/<kind>; repeat it to train on several pools of one kind at once")
    ap.add_argument("--perfect", action="append", default=[], metavar="SUBTASK:N", help="add N perfect pairs of "
                    "a question sub-task (right answer over a wrong one, fresh scenes), e.g. iu_existence:1000")
    ap.add_argument("--sampled", default=None, metavar="K:P:N", help="pairs from the start policy's own samples "
                    "on N fresh items, K per item, up to P right-over-wrong pairs per item, by the oracle")
    ap.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    ap.add_argument("--min-margin", type=float, default=None, help="keep only pairs with at least this margin")
    ap.add_argument("--subtask", action="append", default=None, help="keep only this sub-task's pairs (repeatable)")
    ap.add_argument("--oracle", action="store_true", help="order the pairs as the oracle does (ties dropped)")
    ap.add_argument("--base", default=None, help="the model the pool's update started from (default: the "
                    "world's base policy or generator)")
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--workdir", default="runs/bench-pool-replay")
    ap.add_argument("--models-from", default=None, help="copy this models/ cache into the workdir first")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="a config override for every training run, e.g. train.policy_dpo.methods=[dpo_sft]")
    ap.add_argument("--eval", action="append", default=[], metavar="KEY=VALUE", dest="eval_sets",
                    help="a config override for the evaluation only, e.g. run.seed=7 gate.eval_items=240: score "
                    "on other items than the gate's, so a setting chosen by them is still tested fresh by the gate's")
    a = ap.parse_args(argv)
    workdir = os.path.abspath(a.workdir)  # Ray Train workers run elsewhere: every path absolute
    if a.models_from and not os.path.exists(f"{workdir}/models"):
        shutil.copytree(a.models_from, f"{workdir}/models")
    cfg = load_config(a.config, [f"run.workdir={workdir}"])
    eval_cfg = load_config(a.config, [f"run.workdir={workdir}", *a.eval_sets])
    pools = [os.path.abspath(p) for p in a.pool]
    kinds = {read_manifest(p).kind for p in pools} | ({"dpo"} if a.perfect or a.sampled else set())
    if len(kinds) != 1:
        raise SystemExit(f"--pool / --perfect: pairs of one kind only, got {sorted(kinds) or 'none'}")
    kind, data = kinds.pop(), (pools or [None])[0]
    if a.oracle and not pools:
        raise SystemExit("--oracle orders pooled samples: give a --pool")
    training, base, evaluate, metric = KINDS[kind]
    base = a.base or base
    if a.min_margin is not None or a.oracle or a.subtask or a.perfect or a.sampled or len(pools) > 1:
        rows = [r for p in pools for r in read_rows(p) if (a.min_margin is None or r["margin"] >= a.min_margin)
                and (not a.subtask or r["subtask"] in a.subtask)]
        rows = oracle_ranked(rows, data, cfg.world.shapes) if a.oracle else rows
        for spec in a.perfect:
            subtask, _, n = spec.partition(":")
            if subtask not in PERFECT_SUBTASKS or not n.isdigit():
                raise SystemExit(f"--perfect {spec!r}: expected SUBTASK:N with SUBTASK one of {PERFECT_SUBTASKS}")
            rows += perfect_pairs(cfg.world.shapes, subtask, int(n))
        if a.sampled:
            if not re.fullmatch(r"[1-9]\d*:[1-9]\d*:[1-9]\d*", a.sampled):
                raise SystemExit(f"--sampled {a.sampled!r}: expected K:P:N, three positive integers")
            k, per_item, n_items = (int(x) for x in a.sampled.split(":"))
            rows += sampled_pairs(cfg, base, k, per_item, n_items)
        data = (f"{workdir}/data/pool-{kind}-margin-{a.min_margin or 0:g}{'-oracle' if a.oracle else ''}"
                + "".join(f"-{s}" for s in [*(a.subtask or ()), *a.perfect]).replace(":", "")
                + (f"-sampled{a.sampled.replace(':', 'x')}" if a.sampled else ""))
        write_dataset(data, kind, rows, config_hash="bench", producer="bench/pool_replay.py")
        print(f"{len(rows)} pairs" + (f" with margin >= {a.min_margin:g}" if a.min_margin is not None else ""))
    # the start model by its folder: with another run.seed the world's name would resolve to another base
    start_ref = resolve_model_path(ModelRef(path=base), cfg) if a.eval_sets else base
    start = evaluate(eval_cfg, start_ref)
    scored_on = "items " + " ".join(a.eval_sets) if a.eval_sets else "gate"
    for seed in [int(s) for s in a.seeds.split(",")]:
        c = load_config(a.config, [f"run.workdir={workdir}", f"train.seed={seed}", *a.sets])
        res = train(c, training, data, base=base, tracker=Tracker(c), iteration=0)
        f = res.final
        line = (f"seed {seed}: " + (f"the same training as {res.model_uri} (reused)" if res.reused else
                f"held-out {f['heldout.start_value']:.3f} -> best {f['heldout.best_value']:.3f} (step "
                f"{f['heldout.best_step']}), {'refused' if f['heldout.refused'] else 'kept'}") +
                f"; {scored_on} {metric} {start.metrics[metric]:.3f} -> ")
        if f.get("heldout.refused"):
            print(line + f"{start.metrics[metric]:.3f} (the start kept)")
            continue
        after = evaluate(eval_cfg, res.model_uri)
        test, better, worse, p = paired_items(after.per_item[metric], start.per_item[metric])  # the gate's test
        print(line + f"{after.metrics[metric]:.3f}, {test} {better} better / {worse} worse, p={p:.3f}")
        print("  by kind: " + ", ".join(f"{k} {start.metrics[k]:.3f} -> {v:.3f}" for k, v in after.metrics.items()
                                        if k.startswith(f"{metric}/") or k == "caption_hallucination_rate"))


if __name__ == "__main__":
    main()
