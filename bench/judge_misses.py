"""Where a judge loses gold pairs: per sub-task, the gold pairs it orders wrong by what their two candidates are
(the oracle world's gold variants: correct, blur, extra, wrong_colour, ...), beside its noisy teacher's on the
same pairs. Points the next experiment at what the judge cannot yet see, rather than at its overall accuracy.

The outcomes are the gate's per-pair ones (flywheel.evaluate.meta.stored_outcomes), recomputed from the stored
meta-eval of each iteration and of the teacher (which sits beside the gold); a variant pair reads "better >
worse" by gold's verdict. Gold a user labelled (meta_eval.gold_files) has no variants: its pairs read "? > ?".

    .venv/bin/python bench/judge_misses.py --run runs/clw --iterations 003 [--config configs/local_claims.yaml]
        [--split id-test] [--metric all/pointwise_ranking/accuracy] [--all] [--claims]

Measured 2026-11-30 (runs/clw iteration 3, the 0.906 judge; its teacher 0.916 on the same 202 id-test pairs): the
judge's 19 misses are 8 of 24 two-object drawings (ig_attribute_binding: a correct drawing under one with an
extra object 2, under a noisy one 2, under a blurred one 1, under a wrong shape 1; a blurred one under an extra
object and under a wrong shape 1 each), 6 of 24 draw-and-describe answers, 2 captions, 2 scene descriptions and 1
single object; the teacher's 17 are 6 captions, 3 descriptions, 3 counts, 2 draw-and-describe, 1 each of the
rest. What the judge misses and the teacher does not is in the drawings: noise, blur and extra objects.

Measured 2026-12-06 (runs/local_claims iteration 1, the 0.920 judge on 784 id-test pairs, its teacher 0.940): the
judge is wrong on 63, the teacher on 47. By variant (judge / teacher wrong of n pairs with it): swapped 15 / 7 of
42 (captions and scene descriptions: correct > swapped 6 of 8 wrong), blur 12 / 3 of 82, noise 6 / 2 of 70, while
extra 19 / 20, missing 14 / 11 and wrong colour 11 / 12 are level. The judge's excess is spatial relations and
degraded drawings, not the claims the teacher is noisy on.

Measured 2026-12-07 with --claims (runs/s1x iteration 0, seed 1, the 0.899 judge; captions 0.714): of 90 gold
caption claims that state a relation the text states word for word, the judge rates 81 absent ("The text does not
place ..."; the teacher 11), and of 101 object claims in another colour or shape it misrates 63 (the teacher 7);
scene descriptions 39 of 76 and 63 of 96. Nearly every misrated check comes with an analysis that misreads the
text (370 of 371), not a rating that contradicts its own analysis.
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from flywheel import storage
from flywheel.config import Config, load_config
from flywheel.datasets import read_dataset
from flywheel.evaluate import meta
from flywheel.iteration import paths
from flywheel.judge import claims
from flywheel.worlds.shapes.claims import read_claim
from flywheel.worlds.shapes.gold import variant_of


def pair_kinds(cfg: Config, split: str) -> dict[str, tuple[str, str, str]]:
    """Gold judgment id -> (sub-task, the better candidate's variant, the worse one's) of the split's pairs."""
    base = storage.join(paths(cfg, 0)["gold"], split)
    gold, prompts = meta.read_gold(base)
    cands = {c["candidate_id"]: c for c in read_dataset(storage.join(base, "candidates"))[0].to_pylist()}
    out = {}
    for g in gold:
        if g["protocol"] == "pairwise" and g["verdict"] in ("A", "B"):
            a, b = (variant_of(cands[c]) or "?" for c in g["candidate_ids"])
            better, worse = (a, b) if g["verdict"] == "A" else (b, a)
            out[g["judgment_id"]] = (prompts[g["prompt_id"]].get("subtask") or "?", better, worse)
    return out


def outcomes(cfg: Config, output_uri: str, metric: str, who: str) -> dict[str, bool]:
    try:
        return meta.stored_outcomes(cfg, paths(cfg, 0)["gold"], output_uri, metric)
    except meta.OutcomesUnavailable as e:
        raise SystemExit(f"{who}: {e}") from None


def misses(kinds: dict[str, tuple[str, str, str]], judge: dict[str, bool], teacher: dict[str, bool]) -> dict:
    """(sub-task, better, worse) -> {"n", "judge", "teacher"}: the pairs of that kind both scored, and how many of
    them each got wrong (every key present, 0 included)."""
    table: dict[tuple, Counter] = defaultdict(Counter)
    for key in judge.keys() & teacher.keys() & kinds.keys():
        row = table[kinds[key]]
        row["n"] += 1
        row["judge"] += not judge[key]
        row["teacher"] += not teacher[key]
    return {k: dict(v) for k, v in sorted(table.items())}


def by_variant(rows: dict) -> dict[str, dict]:
    """variant -> {"n", "judge", "teacher"} over every sub-task's pairs with that variant on either side (correct
    left out): what the judge cannot see, in one line, most judge misses first. A pair of two variants counts
    under both."""
    out: dict[str, Counter] = defaultdict(Counter)
    for (_, better, worse), r in rows.items():
        for v in {better, worse} - {"correct"}:
            out[v].update(r)
    return {v: dict(c) for v, c in sorted(out.items(), key=lambda kv: (-kv[1]["judge"], kv[0]))}


def claim_misses(gold: list[dict], prompts: dict[str, dict], judged: dict[str, list[dict]]) -> dict:
    """(sub-task, claim kind, gold rating) -> {"n", <who>: wrong} over the split's gold claim checks, for each
    judged row set in `judged` (who -> meta-eval rows): a check is right when its rating rounds to gold's. A check
    a row set lacks or failed to parse counts wrong. Where a description's ranking is lost: which claims the
    judge misreads (an object in another colour, a relation the text states)."""
    def key(row: dict) -> tuple:
        return row["prompt_id"], row["candidate_ids"][0], claims.header(row.get("raw_output"))

    rated = {who: {key(r): r["score"] for r in rows if r["protocol"] == claims.NAME} for who, rows in judged.items()}
    table: dict[tuple, Counter] = defaultdict(Counter)
    for g in gold:
        if g["protocol"] != claims.NAME or g["score"] is None:
            continue
        words = claims.header(g["raw_output"]).split(" claim: ", 1)[1]
        row = table[(prompts[g["prompt_id"]].get("subtask") or "?", read_claim(words).kind, int(g["score"]))]
        row["n"] += 1
        for who, scores in rated.items():
            s = scores.get(key(g))
            row[who] += s is None or round(s) != g["score"]
    return {k: {"n": v["n"], **{who: v[who] for who in judged}} for k, v in sorted(table.items())}


def print_claim_misses(cfg: Config, split: str, it: int) -> None:
    gold, prompts = meta.read_gold(storage.join(paths(cfg, 0)["gold"], split))
    bases = {"judge": paths(cfg, it)["meta-eval"], "teacher": paths(cfg, 0)["meta-eval-teacher"]}
    judged = {who: read_dataset(storage.join(base, split))[0].to_pylist() for who, base in bases.items()}
    rows = claim_misses(gold, prompts, judged)
    print(f"  claim checks of {split} (gold rating: 5 stated, 3 another count, 2 another colour or shape, 1 absent)")
    print(f"  {'sub-task':28} {'claim':9} {'gold':>4} {'n':>4} {'judge':>6} {'teacher':>8}")
    for (subtask, kind, rating), r in rows.items():
        print(f"  {subtask:28} {kind:9} {rating:4d} {r['n']:4d} {r['judge']:6d} {r['teacher']:8d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="the run's workdir (run.workdir)")
    ap.add_argument("--iterations", required=True, help="iterations, comma-separated (e.g. 002,003)")
    ap.add_argument("--config", default="configs/local.yaml", help="the run's config (its split's ood sets)")
    ap.add_argument("--split", default="id-test", help="a meta-eval split")
    ap.add_argument("--metric", default="all/pointwise_ranking/accuracy", help="a per-pair accuracy, no split")
    ap.add_argument("--all", action="store_true", help="list the kinds of pair neither gets wrong too")
    ap.add_argument("--claims", action="store_true", help="also the gold claim checks each gets wrong, by "
                    "sub-task, claim kind and gold rating (where meta-eval asked claims)")
    args = ap.parse_args()
    cfg = load_config(args.config, [f"run.workdir={args.run}"])
    metric = f"{args.split}/{args.metric}"
    kinds = pair_kinds(cfg, args.split)
    teacher = outcomes(cfg, paths(cfg, 0)["meta-eval-teacher"], metric, "the teacher")
    for it in (int(i) for i in args.iterations.split(",")):
        judge = outcomes(cfg, paths(cfg, it)["meta-eval"], metric, f"{args.run}, iteration {it}")
        rows = misses(kinds, judge, teacher)
        n = sum(r["n"] for r in rows.values())
        wrong_j, wrong_t = (sum(r[w] for r in rows.values()) for w in ("judge", "teacher"))
        print(f"{args.run} iteration {it:03d}, {metric}: judge wrong on {wrong_j} of {n} pairs, teacher on {wrong_t}")
        print(f"  {'sub-task':28} {'better > worse':28} {'n':>3} {'judge':>6} {'teacher':>8}")
        for (subtask, better, worse), r in rows.items():
            if args.all or r["judge"] or r["teacher"]:
                print(f"  {subtask:28} {better + ' > ' + worse:28} {r['n']:3d} {r['judge']:6d} {r['teacher']:8d}")
        print("  by variant (judge / teacher wrong of n pairs with it): " + ", ".join(
            f"{v} {r['judge']} / {r['teacher']} of {r['n']}" for v, r in by_variant(rows).items()))
        if args.claims:
            print_claim_misses(cfg, args.split, it)


if __name__ == "__main__":
    main()
