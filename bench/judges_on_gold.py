"""Judges from one or more runs, and their noisy teacher, meta-evaluated on one gold set larger than a run's, then
compared pair by pair. A run's own gold (world.gold.prompts_per_subtask 4, ~200 id-test pairs) moves by about
+-0.03, so two configs a few points apart cannot be told apart on it; this builds a gold set of --gold-prompts
prompts per sub-task and split from a prompts dataset (the oracle labels it, deterministic for the seed) and
re-judges each named judge on it with the same meta-eval code the loop runs.

Pick the prompts from a run whose held-out prompts none of the judges trained on: runs of one seed share their
prompts' splits (a run with more prompts per sub-task holds the other's as a prefix), so the larger run's
iteration-0 prompts serve both.

    .venv/bin/python bench/judges_on_gold.py --config configs/local_claims.yaml \
        --prompts runs/clb5/data/iterations/000/prompts --gold-prompts 12 \
        --judge a0=runs/cla:models:/judge/2 --judge b0=runs/clb5:models:/judge/2 [--judge NAME=WORKDIR:REF ...]
        [--metric all/pointwise_ranking/accuracy] [--out runs/bench-judges-gold] [--set key=value ...]

Each judge's judged rows land in <out>/<gold-prompts>/<name>; a second run skips what is judged already (the
meta-eval's manifests). The report: each judge's accuracy per split on the pairs every judge was scored on, then
McNemar's one-sided test of each judge against each one named after it (b / c: pairs only the first / only the
second got right).
"""
from __future__ import annotations

import argparse
from itertools import combinations
from pathlib import Path

from flywheel.config import load_config
from flywheel.evaluate import meta
from flywheel.gate import mcnemar
from flywheel.raycluster import init_ray
from flywheel.stages import gold

SPLITS = ("id-test", "ood-test")


def parse_judge(spec: str) -> tuple[str, str, str]:
    """NAME=WORKDIR:REF -> (name, workdir, model ref); the ref may hold colons (models:/judge/2)."""
    name, sep, rest = spec.partition("=")
    workdir, sep2, ref = rest.partition(":")
    if not (sep and sep2 and name and workdir and ref):
        raise SystemExit(f"--judge {spec!r}: expected NAME=WORKDIR:REF, e.g. a0=runs/cla:models:/judge/2")
    return name, workdir, ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/local.yaml", help="the runs' config (meta-eval, world, teacher)")
    ap.add_argument("--prompts", required=True, help="a prompts dataset whose held-out splits the gold is drawn from")
    ap.add_argument("--gold-prompts", type=int, required=True, help="prompts per sub-task and split in the gold")
    ap.add_argument("--judge", action="append", required=True, help="NAME=WORKDIR:REF, REF a models:/ URI or path")
    ap.add_argument("--no-teacher", action="store_true", help="leave the run's noisy teacher out")
    ap.add_argument("--metric", default="all/pointwise_ranking/accuracy", help="a per-pair accuracy, no split")
    ap.add_argument("--out", default="runs/bench-judges-gold")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides for every judge, e.g. "
                    "meta_eval.perturbation.enabled=false")
    args = ap.parse_args()

    judges = [parse_judge(s) for s in args.judge]
    if len({n for n, _, _ in judges}) != len(judges) or "teacher" in {n for n, _, _ in judges}:
        raise SystemExit("--judge names must be distinct and not 'teacher'")
    out = Path(args.out).resolve() / str(args.gold_prompts)
    gold_uri = str(out / "gold")
    base = load_config(args.config, [*args.set, f"run.workdir={Path(judges[0][1]).resolve()}"])
    base.world.gold.prompts_per_subtask = args.gold_prompts
    init_ray(base)
    gold.run(base, str(Path(args.prompts).resolve()), gold_uri)  # skipped when built

    outcomes: dict[str, dict[str, dict[str, bool]]] = {}
    runs = [*judges] + ([] if args.no_teacher else [("teacher", judges[0][1], "")])
    for name, workdir, ref in runs:
        over = [f"run.workdir={Path(workdir).resolve()}", f"storage.uri={out / name / 'data'}"]
        cfg = load_config(args.config, [*args.set, *over, *([f"models.judge.path={ref}"] if ref else [])])
        meta_uri = str(out / name / "meta")
        print(f"meta-eval of {name} ({ref or 'the config teacher'}) -> {meta_uri}", flush=True)
        meta.run(cfg, gold_uri, meta_uri, role="teacher" if name == "teacher" else "judge")  # skips what is judged
        outcomes[name] = {s: meta.stored_outcomes(cfg, gold_uri, meta_uri, f"{s}/{args.metric}") for s in SPLITS}

    print(f"\ngold: {args.gold_prompts} prompts per sub-task and split from {args.prompts}; metric {args.metric}")
    for split, r in compare(outcomes).items():
        print(f"\n{split}: {r['n']} pairs every judge was scored on")
        for n, acc in r["accuracy"].items():
            print(f"  {n:12s} {acc:.3f}")
        for (a, b), (better, worse, p) in r["mcnemar"].items():
            print(f"  {a} vs {b}: {better} / {worse}, p={p:.3g}")


def compare(outcomes: dict[str, dict[str, dict[str, bool]]]) -> dict[str, dict]:
    """Judge -> split -> gold pair -> right, to split -> {n, accuracy: judge -> accuracy on the pairs every judge
    was scored on, mcnemar: (a, b) -> (pairs only a got right, only b, one-sided p of a over b)}."""
    names = list(outcomes)
    out = {}
    for split in SPLITS:
        shared = set.intersection(*(set(outcomes[n][split]) for n in names))
        out[split] = {"n": len(shared),
                      "accuracy": {n: sum(outcomes[n][split][k] for k in shared) / max(len(shared), 1)
                                   for n in names},
                      "mcnemar": {(a, b): mcnemar({k: outcomes[a][split][k] for k in shared},
                                                  {k: outcomes[b][split][k] for k in shared})
                                  for a, b in combinations(names, 2)}}
    return out


if __name__ == "__main__":
    main()
