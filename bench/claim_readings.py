"""Other ways to read a description's claim checks into one score, on a run's stored meta-evals (no judge runs):
each way's accuracy on the gold pairs of descriptions, and McNemar's discordant pairs against the default.

The default (flywheel/judge/claims.py) is 1 + 4 x the mean credit of all its claims, the response's (checked
against the reference: is it right?) and the reference's (checked against the response: is anything missed?)
together. Read here: each side alone, the lower of the two sides' means (`min`), their F1, and blends of the
default with the judge's own pointwise rating of the whole description (`blend<w>`: w x claims + (1-w) x rating).

    .venv/bin/python bench/claim_readings.py --workdir runs/claims --iterations 000,001,002,003,004,005

Measured 2026-11-29 (id-test, the 46 gold pairs of captions and scene descriptions per iteration; in brackets
the pairs only the reading / only the default got right, pooled over the iterations):
- runs/claims iterations 0-5: default 0.674 / 0.761 / 0.826 / 0.848 / 0.804 / 0.848. `min` 0.783 / 0.826 / 0.848
  / 0.804 / 0.804 / 0.848 (10 / 3, p=0.046); `f1` (2 / 3); precision alone (10 / 31), recall alone (18 / 60);
  blends with the pointwise rating worse (w 0.75: 12 / 14; 0.5: 14 / 41; 0.25: 20 / 60).
- runs/flip2 iterations 0-1 (the flip teacher, whose judge's claim checks are worse): default 0.413 / 0.587;
  `min` (24 / 20, p=0.33); blends better there (w 0.5: 0.543 / 0.696, 23 / 12, p=0.045).
No reading beats the default on both runs: `min` leads on runs/claims' early iterations (34 / 23 over both runs,
p=0.092), a blend helps only where the claim checks are poor. The default stays.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable

from scipy import stats

from flywheel.datasets import read_dataset
from flywheel.evaluate import meta
from flywheel.judge import claims


def _mean(v: list[float | None]) -> float | None:
    return None if not v or any(x is None for x in v) else sum(v) / len(v)


def _both(f: Callable[[float, float], float]) -> Callable[[dict], float | None]:
    def read(sides: dict) -> float | None:
        p, r = _mean(sides[claims.PRECISION]), _mean(sides[claims.RECALL])
        return None if p is None or r is None else f(p, r)
    return read


READINGS: dict[str, Callable[[dict], float | None]] = {
    "default": lambda s: _mean(s[claims.PRECISION] + s[claims.RECALL]),
    "precision": lambda s: _mean(s[claims.PRECISION]),
    "recall": lambda s: _mean(s[claims.RECALL]),
    "min": _both(min),
    "f1": _both(lambda p, r: 0.0 if p + r == 0 else 2 * p * r / (p + r)),
}
BLENDS = (0.25, 0.5, 0.75)


def outcomes(gold: list[dict], judged: list[dict]) -> dict[str, dict[str, bool]]:
    """reading -> gold pair id -> right, over the overall gold pairs whose two candidates both have claim rows.
    A candidate with an unparsed claim (or an unparsed rating, for a blend) has no score: its pair is wrong."""
    sides: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for j in judged:
        if j["protocol"] == claims.NAME:
            ok = j["parse_error"] is None and j["score"] is not None
            side = (claims.header(j["raw_output"]) or "").split(" claim")[0]
            credit = claims.credit(float(j["score"])) if ok else None
            sides[(j["prompt_id"], j["candidate_ids"][0])][side].append(credit)
    rating = {(j["prompt_id"], j["candidate_ids"][0]): j["score"] if j["parse_error"] is None else None
              for j in judged if j["protocol"] == "pointwise" and j["aspect"] is None}
    out: dict[str, dict[str, bool]] = defaultdict(dict)
    for g in gold:
        keys = [(g["prompt_id"], c) for c in g["candidate_ids"]]
        if g["protocol"] != "pairwise" or g["aspect"] is not None or not all(k in sides for k in keys):
            continue
        # a candidate with an unparsed claim is unscored by every reading (as meta-eval fails it), not read around it
        whole = [all(c is not None for v in sides[k].values() for c in v) for k in keys]
        scores = {name: [read(sides[k]) if ok else None for k, ok in zip(keys, whole)]
                  for name, read in READINGS.items()}
        for w in BLENDS:  # on the rating's 1-5 scale: 1 + 4 x credit
            scores[f"blend{w}"] = [None if c is None or rating.get(k) is None else w * (1 + 4 * c) + (1 - w) * rating[k]
                                   for c, k in zip(scores["default"], keys)]
        for name, (a, b) in scores.items():
            out[name][g["judgment_id"]] = (a is not None and b is not None
                                           and ("A" if a > b else "B" if b > a else "tie") == g["verdict"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--iterations", required=True, help="comma-separated, e.g. 000,001")
    ap.add_argument("--split", default="id-test")
    args = ap.parse_args()
    gold, _ = meta.read_gold(f"{args.workdir}/data/gold/{args.split}")
    pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for it in args.iterations.split(","):
        judged = read_dataset(f"{args.workdir}/data/iterations/{it}/meta-eval/{args.split}")[0].to_pylist()
        res = outcomes(gold, judged)
        base = res["default"]
        cells = []
        for name, got in res.items():
            better = sum(got[k] and not base[k] for k in got)
            worse = sum(base[k] and not got[k] for k in got)
            pooled[name][0] += better
            pooled[name][1] += worse
            cells.append(f"{name} {sum(got.values()) / max(len(got), 1):.3f} ({better}/{worse})")
        print(f"{args.workdir} {it} {args.split} n={len(base)}: " + "  ".join(cells))
    for name, (better, worse) in pooled.items():
        p = stats.binomtest(better, better + worse, 0.5, alternative="greater").pvalue if better + worse else 1.0
        print(f"pooled {name}: better on {better}, worse on {worse} (one-sided p={p:.2g})")


if __name__ == "__main__":
    main()
