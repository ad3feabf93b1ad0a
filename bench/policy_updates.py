"""Policy updates with held-out early stopping and the guard (issue 8), made reproducible: DPO vs best-of-N SFT
(flywheel/train/updates.py) on the oracle world's base policies, trained on oracle-labelled pairs of their own
samples, with the held-out curves the training records.

- Pairs: the base policy samples `--samples` outputs per item at the flywheel's own sampling settings
  (policy.generation: temperature 1, top_k 0; generator.generation: 10 steps, guidance 1), the oracle grades
  them, and the best and the worst form a pair (ties dropped). LLaVA items are captions (where the base's taught
  habit, naming an absent object, shows) plus colour / count / existence questions; SDXL items are draw prompts
  of the three kinds (single, binding, relation). Both come from a seed stream that neither the gate nor the
  held-out evaluation uses. The pairs are cached in the workdir.
- Runs: `flywheel.train.train` through Ray Train, as the iteration runs them, with configs/local.yaml's
  held-out settings (target, patience, guard); only the step count is the bench's (--llava-steps/--sdxl-steps).
  `--overopt` adds one deliberately over-optimising DPO per policy (LLaVA beta 0.1 / lr 1e-3, SDXL beta 500 /
  lr 1e-4), where the guard should fire (LLaVA at lr 5e-4 only drifted down within 150 steps: refused for no
  gain, guard quiet). For SDXL, a share of the pairs (`--sdxl-heldout-pairs`, by prompt) is never trained on and
  the Diffusion-DPO implicit reward accuracy / margin on it is a curve beside the oracle's
  (flywheel/train/heldout_pairs.py; a curve, never the stopping signal).
- Printed: per run the held-out curve (step -> target, guarded measures [, held-out pair accuracy / margin]),
  the best step, the kept score against the starting policy (the best state is exported; a refused update
  keeps the start), whether the guard fired and why, and seconds; then one summary line per run.

    .venv/bin/python bench/policy_updates.py [--policy llava|sdxl|both] [--methods dpo,bon_sft] [--overopt]
        [--llava-steps 150] [--sdxl-steps 150] [--llava-captions 320] [--sdxl-prompts 96]
        [--models-from /path/to/a/workdir/models] [--workdir runs/bench-policy-updates] [--set KEY=VALUE ...]

Default (both policies; dpo and bon_sft; 150 steps each; ~400 LLaVA pairs from 320 captions + 3 x 40 questions,
~96 SDXL pairs from 96 prompts, 20% of them held out): 23 min on the 2-core box under a load average of 9-11, 9 of
them sampling the SDXL pairs; with the pairs cached, ~12 min. `--overopt` alone (`--methods "" --overopt`): ~2 min.

The tables go to stdout; Ray's worker logs (training progress, each held-out evaluation) to stderr. The base
policies (world:policy, world:generator) are built and cached under <workdir>/models on first use (tens of
minutes); `--models-from` copies an existing cache (another workdir's models/ folder) in first.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

from flywheel.config import REPO_ROOT, load_config

PAIR_STREAM = 1  # pair sources: neither the gate's nor the held-out evaluation's seed stream (policy_eval)
OVEROPT = {"llava": ["train.policy_dpo.beta=0.1", "train.policy_dpo.lr=1e-3"],
           "sdxl": ["train.diffusion_dpo.beta=500", "train.diffusion_dpo.lr=1e-4"]}
TRAINING = {"llava": "policy_dpo", "sdxl": "diffusion_dpo"}
LLAVA_PAIRS_VERSION = 2  # 2: `others` items of each question type (1 took 3 x others colour items first)
BASE_MODEL = {"llava": "policy", "sdxl": "generator"}  # config.models.<name> of each benched policy
METHODS = {"llava": ("dpo", "dpo_sft", "bon_sft"), "sdxl": ("dpo", "bon_sft")}


# ------------------------------------------------------------------------------------------- pairs
def _cached(uri: str, key: str) -> bool:
    from flywheel.datasets import MissingManifest, read_manifest

    try:
        return read_manifest(uri).config_hash == key
    except MissingManifest:
        return False


def llava_items(world, captions: int, others: int, seed: int) -> list:
    """The LLaVA pair items: `captions` caption items, then `others` of each question type (fewer when the pool
    of 4 x max(captions, others) items, the 4 types in turn, has fewer)."""
    from flywheel.worlds.shapes.policy_eval import text_items

    pool = text_items(world, 4 * max(captions, others), seed=seed, stream=PAIR_STREAM)
    by_type = {t: [it for it in pool if it[3]["type"] == t] for t in ("caption", "colour", "count", "existence")}
    return by_type["caption"][:captions] + [it for t in ("colour", "count", "existence") for it in by_type[t][:others]]


def llava_pairs(cfg, captions: int, others: int, samples: int) -> tuple[str, float]:
    """(dataset uri, seconds): pairs from the base LLaVA's own samples, graded by the oracle's checker."""
    from flywheel.datasets import write_dataset
    from flywheel.engines.hf import HFTextEngine
    from flywheel.images import to_png_bytes
    from flywheel.models.zoo import resolve_model_path
    from flywheel.worlds.shapes.policy_eval import check_answer as oracle_check  # the held-out scorer's check
    from flywheel.worlds.shapes.policy_eval import text_requests
    from flywheel.worlds.shapes.render import render

    path = resolve_model_path(cfg.models.policy, cfg)
    key = hashlib.sha256(json.dumps([path, captions, others, samples, cfg.run.seed, LLAVA_PAIRS_VERSION,
                                     cfg.policy.generation.model_dump()]).encode()).hexdigest()[:16]
    uri = f"{cfg.storage.uri}/bench/llava-pairs"
    if _cached(uri, key):
        return uri, 0.0
    t0 = time.perf_counter()
    world = cfg.world.shapes
    items = llava_items(world, captions, others, cfg.run.seed)
    engine = HFTextEngine(path, cfg.policy.generation)
    outs = [[r.text or "" for r in engine.generate(text_requests(items, world), seed=k)] for k in range(samples)]
    rows = []
    for i, (subtask, scene, question, meta) in enumerate(items):
        grades = []
        for k in range(samples):
            check = oracle_check(meta, outs[k][i], scene)
            grades.append((-1.0 if check.unparseable else float(check.correct), -k))  # unreadable is worst
        (best, kb), (worst, kw) = max(grades), min(grades)
        good, bad = outs[-kb][i], outs[-kw][i]
        if best <= worst or good == bad:
            continue
        user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        rows.append({"target": "policy", "images": [to_png_bytes(render(scene, world.image_size))],
                     "prompt": json.dumps(user),
                     "chosen": json.dumps([{"role": "assistant", "content": [{"type": "text", "text": good}]}]),
                     "rejected": json.dumps([{"role": "assistant", "content": [{"type": "text", "text": bad}]}]),
                     "chosen_score": best, "rejected_score": worst, "margin": best - worst, "subtask": subtask,
                     "meta": {"type": meta["type"]}})
    write_dataset(uri, "dpo", rows, config_hash=key, producer="bench-policy-updates")
    return uri, time.perf_counter() - t0


def sdxl_pairs(cfg, prompts: int, samples: int) -> tuple[str, float]:
    """(dataset uri, seconds): pairs from the base SDXL's own images, scored by the oracle (score_10)."""
    from flywheel.datasets import write_dataset
    from flywheel.engines.diffusion import DiffusersImageEngine
    from flywheel.images import to_png_bytes
    from flywheel.models.zoo import resolve_model_path
    from flywheel.worlds.shapes.check_image import check_image
    from flywheel.worlds.shapes.policy_eval import generator_items, image_requests
    from flywheel.worlds.shapes.spec import describe_spec

    path = resolve_model_path(cfg.models.generator, cfg)
    key = hashlib.sha256(json.dumps([path, prompts, samples, cfg.run.seed,
                                     cfg.generator.generation.model_dump()]).encode()).hexdigest()[:16]
    uri = f"{cfg.storage.uri}/bench/sdxl-pairs"
    if _cached(uri, key):
        return uri, 0.0
    t0 = time.perf_counter()
    world = cfg.world.shapes
    specs = generator_items(world, prompts, seed=cfg.run.seed, kinds=("single", "binding", "relation"),
                            stream=PAIR_STREAM)
    engine = DiffusersImageEngine(path, cfg.generator.generation)
    images = [engine.generate(image_requests(specs, seed=100 + k)) for k in range(samples)]  # distinct seeds
    rows = []
    for i, spec in enumerate(specs):
        scored = [(check_image(images[k][i].image, spec, world).score_10, -k) for k in range(samples)]
        (best, kb), (worst, kw) = max(scored), min(scored)
        if best <= worst:
            continue
        rows.append({"prompt": describe_spec(spec), "chosen": [to_png_bytes(images[-kb][i].image)],
                     "rejected": [to_png_bytes(images[-kw][i].image)], "chosen_score": best,
                     "rejected_score": worst, "margin": best - worst, "judge": "oracle"})
    write_dataset(uri, "image_pref", rows, config_hash=key, producer="bench-policy-updates")
    return uri, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------- runs
def run_one(cfg, policy: str, method: str, data: str, name: str) -> dict:
    from flywheel.train.api import train

    t0 = time.perf_counter()
    res = train(cfg, TRAINING[policy], data, method=method, register=False, fresh=True, run_name=name)
    s = cfg.train.resolved(TRAINING[policy], method)
    return {"name": name, "policy": policy, "method": method, "seconds": time.perf_counter() - t0,
            "beta": s.beta, "lr": s.lr, "steps": s.max_steps, "guarded": sorted({*s.heldout.max_drop,
                                                                                 *s.heldout.max_rise}),
            "final": {k: v for k, v in res.final.items() if isinstance(v, (int, float, str, list, type(None)))}}


# ------------------------------------------------------------------------------------------- report
def _f(x) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def print_run(r: dict) -> None:
    f = r["final"]
    target = f["heldout.target"]
    cols = [target, *[m for m in r["guarded"] if m != target]]
    if r["policy"] == "sdxl":
        cols += ["pairs/implicit_acc", "pairs/margin"]
    print(f"\n== {r['name']}: {r['policy']} {r['method']} (beta {r['beta']:g}, lr {r['lr']:g}, "
          f"{r['steps']} steps planned) - {r['seconds']:.0f} s")
    print("  step " + " ".join(f"{c:>18}" for c in cols))
    for c in f["heldout.curves"]:
        mark = " best" if c["step"] == f["heldout.best_step"] else ""
        print(f"  {c['step']:>4} " + " ".join(f"{_f(c.get(k)):>18}" for k in cols) + mark)
    start, best = f["heldout.start_value"], f["heldout.best_value"]
    last = f["heldout.curves"][-1].get(target)
    kept = start if f["heldout.refused"] else best
    print(f"  best step {f['heldout.best_step']}; {target}: start {_f(start)}, best {_f(best)}, last {_f(last)} "
          f"(step {f.get('final_step')}); kept {_f(kept)} ({kept - start:+.3f} vs start)")
    print(f"  guard fired: {f['heldout.guard_fired']}; refused: {f['heldout.refused']}; "
          f"reason: {f['heldout.reason']}")


def print_summary(results: list[dict]) -> None:
    print(f"\n{'run':<22} {'target':<9} {'start':>6} {'best':>6} {'@step':>5} {'last':>6} {'kept':>6} "
          f"{'Δkept':>6} {'steps':>5} {'guard':>5} {'refused':>7} {'pairs acc 0/best/end':>21} {'s':>5}  reason")
    for r in results:
        f = r["final"]
        start, best = f["heldout.start_value"], f["heldout.best_value"]
        kept = start if f["heldout.refused"] else best
        curves = f["heldout.curves"]
        acc = "-"
        if curves and "pairs/implicit_acc" in curves[0]:
            at_best = next(c for c in curves if c["step"] == f["heldout.best_step"])
            acc = "/".join(f"{c['pairs/implicit_acc']:.2f}" for c in (curves[0], at_best, curves[-1]))
        print(f"{r['name']:<22} {f['heldout.target']:<9} {start:>6.3f} {best:>6.3f} {f['heldout.best_step']:>5} "
              f"{curves[-1][f['heldout.target']]:>6.3f} {kept:>6.3f} {kept - start:>+6.3f} {f.get('final_step'):>5} "
              f"{str(f['heldout.guard_fired']):>5} {str(f['heldout.refused']):>7} {acc:>21} {r['seconds']:>5.0f}  "
              f"{f['heldout.reason'] or '-'}")


# ------------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", choices=("llava", "sdxl", "both"), default="both")
    p.add_argument("--methods", default="dpo,bon_sft",
                   help="comma-separated: dpo, dpo_sft (LLaVA only), bon_sft; empty: only the --overopt runs")
    p.add_argument("--overopt", action="store_true", help="add an over-optimising DPO run per policy")
    p.add_argument("--llava-steps", type=int, default=150)
    p.add_argument("--sdxl-steps", type=int, default=150)
    p.add_argument("--llava-captions", type=int, default=320, help="caption items (pairs are mostly captions)")
    p.add_argument("--llava-others", type=int, default=40, help="items per other question type")
    p.add_argument("--sdxl-prompts", type=int, default=96)
    p.add_argument("--samples", type=int, default=4, help="samples per item; a pair is the best vs the worst")
    p.add_argument("--sdxl-heldout-pairs", type=float, default=0.2,
                   help="share of the SDXL pairs held out of training (by prompt) for the implicit reward curve")
    p.add_argument("--workdir", default=str(REPO_ROOT / "runs" / "bench-policy-updates"))
    p.add_argument("--models-from", default=None, help="a workdir's models/ folder to copy cached models from")
    p.add_argument("--threads", type=int, default=2, help="torch threads for sampling and per training worker")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="a config override for every training run, e.g. train.policy_dpo.lr=2e-4 (repeatable)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")

    import torch

    from flywheel.datasets import read_manifest
    from flywheel.models.zoo import build_world
    from flywheel.raycluster import init_ray

    t_all = time.perf_counter()
    workdir = Path(args.workdir).resolve()
    if args.models_from:
        for src in Path(args.models_from).iterdir():
            if (src / ".complete").exists() and not (workdir / "models" / src.name).exists():
                shutil.copytree(src, workdir / "models" / src.name)
    overrides = [f"run.workdir={workdir}", "resources.train.actors=1", f"resources.train.num_cpus={args.threads}",
                 "train.max_failures=0", "train.save_steps=100000", "train.logging_steps=5",
                 f"train.policy_dpo.max_steps={args.llava_steps}", f"train.diffusion_dpo.max_steps={args.sdxl_steps}",
                 f"train.diffusion_dpo.heldout.pairs_fraction={args.sdxl_heldout_pairs}",
                 "train.diffusion_dpo.heldout.pairs_noise_draws=8", *args.sets]
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", overrides)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    policies = ("llava", "sdxl") if args.policy == "both" else (args.policy,)
    build_world(cfg, only=[BASE_MODEL[p] for p in policies])  # only the benched base policies; cached: a no-op
    print(f"workdir {workdir}; base policies ready in {time.perf_counter() - t0:.0f} s"
          + (f"; overrides: {' '.join(args.sets)}" if args.sets else ""))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    data = {}
    for policy in policies:
        if policy == "llava":
            uri, secs = llava_pairs(cfg, args.llava_captions, args.llava_others, args.samples)
        else:
            uri, secs = sdxl_pairs(cfg, args.sdxl_prompts, args.samples)
        n = read_manifest(uri).row_count
        print(f"{policy}: {n} oracle-labelled pairs from its own samples ({'cached' if not secs else f'{secs:.0f} s'})")
        data[policy] = uri
    init_ray(cfg)
    plan = [(policy, m, []) for policy in policies for m in methods if m in METHODS[policy]]
    if args.overopt:
        plan += [(policy, "dpo", OVEROPT[policy]) for policy in policies]
    results = []
    out_dir = workdir / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for policy, method, extra in plan:
        name = f"{policy}-{method}{'-overopt' if extra else ''}"
        run_cfg = load_config(REPO_ROOT / "configs" / "local.yaml", overrides + extra)
        r = run_one(run_cfg, policy, method, data[policy], f"{name}-{stamp}")
        r["name"] = name
        results.append(r)
        (out_dir / f"{name}-{stamp}.json").write_text(json.dumps(r, indent=1, default=str))
        print_run(r)
    print_summary(results)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s; results in {out_dir}; MLflow: sqlite:///{workdir}/mlflow.db")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
