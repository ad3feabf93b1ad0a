"""Two runs' judges on the same gold pairs, pair by pair: per iteration and pooled, each split's accuracy and the
gate's paired test (McNemar, one-sided: is A better than B?). An A/B of a config change across whole loop runs,
e.g. a judge base built another way, where the iteration's own gate only compares a judge to its champion.

The outcomes are recomputed from each iteration's stored meta-eval (flywheel.evaluate.meta.stored_outcomes, as
the gate does). The two runs are paired by what each gold pair is (its prompt, candidates, protocol, aspect and
gold label), not by its id: a gold id names the model that labelled the run (a teacher change renames every
pair), so runs of one seed and world.gold pair up across teachers. Runs that share no gold pair (another seed)
are refused by name. Pooled rows stack (iteration, pair) outcomes: they are not independent
draws (the same gold each iteration), so read their p as a summary, not a test of its own.

    .venv/bin/python bench/compare_judges.py --a runs/fb --b runs/fr3 --iterations 001,002,003,004
        [--b-iterations ...] [--config configs/local.yaml] [--metric all/pointwise_ranking/accuracy]
        [--b-metric all/pairwise_balanced/accuracy]

With --b-metric, B's outcomes are another metric's, on the pairs both score: one run against itself compares
two ways of reading the same judge (--a runs/X --b runs/X --metric all/pairwise_balanced/accuracy --b-metric
all/pairwise/accuracy).

Measured 2026-11-27 (A: runs/fb, the judge base with world.base_policies.judge.see_blur; B: runs/fr3, without;
iterations 1-4 of each): id-test pooled 0.800 vs 0.791, A better on 86 pairs, worse on 79 (p=0.32); ood-test
0.795 vs 0.562, 56 / 15 (p=5.2e-07). Iteration 0 alone: id-test 0.683 vs 0.812, 21 / 47. Seed 1 (runs/s1b vs
runs/s1n, the same bases, iterations 000,001,002): id-test 0.756 vs 0.765, 65 / 71; ood-test 0.765 vs 0.689, 31 / 21
(p=0.11).

Measured 2026-11-29 across teachers (A: runs/flip2, the flip teacher; B: runs/claims, the jitter teacher; the same
seed, bases and claims overrides; iterations 000,001), all 202 id-test and 44 ood-test pairs paired: id-test 0.733
vs 0.762 (25 / 31) and 0.797 vs 0.797 (22 / 22); ood-test 0.659 vs 0.500 (11 / 4, p=0.059) and 0.659 vs 0.682.
"""
from __future__ import annotations

import argparse

from flywheel import storage
from flywheel.config import Config, load_config
from flywheel.evaluate import meta
from flywheel.gate import mcnemar
from flywheel.iteration import paths

SPLITS = ("id-test", "ood-test")


def gold_pairs(cfg: Config, split: str) -> dict[str, tuple]:
    """A run's gold judgment id -> what that gold item is: (prompt, candidates, protocol, aspect, gold label)."""
    gold, _ = meta.read_gold(storage.join(paths(cfg, 0)["gold"], split))
    return {g["judgment_id"]: (*meta.item_key(g), g["verdict"], g["score"]) for g in gold}


def outcomes(cfg: Config, iteration: int, metric: str) -> dict[str, bool]:
    p = paths(cfg, iteration)
    try:
        return meta.stored_outcomes(cfg, p["gold"], p["meta-eval"], metric)
    except meta.OutcomesUnavailable as e:  # e.g. an iteration the run has not meta-evaluated
        raise SystemExit(f"{cfg.run.workdir}, iteration {iteration}: {e}") from None


def compare(a: dict, b: dict) -> dict:
    """Accuracies of two judges' outcomes on their shared pairs, and McNemar's test of A over B."""
    shared = a.keys() & b.keys()
    better, worse, p = mcnemar(a, b)
    return {"n": len(shared), "a": sum(a[k] for k in shared) / max(len(shared), 1),
            "b": sum(b[k] for k in shared) / max(len(shared), 1), "better": better, "worse": worse, "p": p}


def run(cfg_a: Config, cfg_b: Config, iters_a: list[int], iters_b: list[int], name: str,
        splits: tuple[str, ...] = SPLITS, name_b: str | None = None) -> list[tuple[str, dict]]:
    """Rows (label, compare()) per split: one per iteration pair, then the pooled one. name_b: B's per-pair
    accuracy when it is not A's (e.g. one judge's balanced pairwise verdicts against its pointwise ranking)."""
    if len(iters_a) != len(iters_b):
        raise SystemExit(f"--iterations names {len(iters_a)} iterations of A, --b-iterations {len(iters_b)} of B")
    rows = []
    for split in splits:
        pairs_a, pairs_b = gold_pairs(cfg_a, split), gold_pairs(cfg_b, split)
        if not set(pairs_a.values()) & set(pairs_b.values()):
            raise SystemExit(f"the runs' {split} gold shares no pair ({cfg_a.run.workdir} vs {cfg_b.run.workdir}): "
                             "compare runs of one seed and world.gold")
        metric, metric_b = f"{split}/{name}", f"{split}/{name_b or name}"
        pool_a, pool_b = {}, {}
        for ia, ib in zip(iters_a, iters_b):
            oa = {pairs_a[k]: v for k, v in outcomes(cfg_a, ia, metric).items()}
            ob = {pairs_b[k]: v for k, v in outcomes(cfg_b, ib, metric_b).items()}
            rows.append((f"{split} {ia:03d} vs {ib:03d}", compare(oa, ob)))
            pool_a |= {(ia, ib, k): v for k, v in oa.items()}
            pool_b |= {(ia, ib, k): v for k, v in ob.items()}
        rows.append((f"{split} pooled", compare(pool_a, pool_b)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="run A's workdir (run.workdir)")
    ap.add_argument("--b", required=True, help="run B's workdir")
    ap.add_argument("--iterations", required=True, help="A's iterations, comma-separated (e.g. 001,002)")
    ap.add_argument("--b-iterations", help="B's iterations, paired in order with A's (default: the same)")
    ap.add_argument("--config", default="configs/local.yaml", help="the runs' config (its split's ood sets)")
    ap.add_argument("--metric", default="all/pointwise_ranking/accuracy", help="a per-pair accuracy, no split")
    ap.add_argument("--b-metric", help="B's per-pair accuracy, if not --metric (compared on the pairs both score)")
    ap.add_argument("--splits", default=",".join(SPLITS), help="meta-eval splits, comma-separated")
    args = ap.parse_args()
    cfg_a = load_config(args.config, [f"run.workdir={args.a}"])
    cfg_b = load_config(args.config, [f"run.workdir={args.b}"])
    iters_a = [int(i) for i in args.iterations.split(",")]
    iters_b = [int(i) for i in (args.b_iterations or args.iterations).split(",")]
    metrics = args.metric if not args.b_metric else f"A {args.metric}, B {args.b_metric}"
    print(f"A: {args.a}  B: {args.b}  {metrics}; McNemar one-sided, A better than B")
    print(f"{'':24} {'n':>4} {'A':>6} {'B':>6} {'A only':>7} {'B only':>7} {'p':>9}")
    splits = tuple(args.splits.split(","))
    for label, r in run(cfg_a, cfg_b, iters_a, iters_b, args.metric, splits, args.b_metric):
        print(f"{label:24} {r['n']:4d} {r['a']:6.3f} {r['b']:6.3f} {r['better']:7d} {r['worse']:7d} {r['p']:9.2g}")


if __name__ == "__main__":
    main()
