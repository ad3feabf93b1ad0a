"""Does the judge order gold pairs better when each candidate's rating is averaged over several sampled analyses
than when it is read off its one greedy analysis? (Self-consistency, Wang et al. 2022; G-Eval averages 20
samples.) The tiny judge's misses are drawings whose blur or noise it half sees (`bench/judge_misses.py`): its
greedy analysis says "sharp" of both candidates, though "blurred" may be likelier for one of them. Averaged over
sampled analyses, that likelihood reaches the rating.

The loop's stored meta-eval of the iteration (greedy) is the baseline; each sample is the same meta-eval code with
judge.generation.temperature and a sampling seed of its own, pointwise and claim rows only (what the ranking
reads), without the perturbation copies. A row's score is the mean of its parsed samples' scores; a row no sample
parsed stays failed.

    .venv/bin/python bench/judge_samples.py --run runs/local_claims --iteration 001 --judge models:/judge/2 \
        --config configs/local_claims.yaml [--samples 5] [--temperature 0.7] [--out runs/bench-judge-samples]

--judge: the iteration's challenger, whose greedy meta-eval the iteration stored (`flywheel report` names its
registered version).

Measured (runs/local_claims iteration 1 on an AVX2 box, models:/judge/4, 2026-12-06; docs/results.md "Self-
consistency"): the mean of 20 at temperature 0.7 reads id-test 0.925 against greedy 0.909 (McNemar 31 / 19,
p=0.06) and ood-test 0.756 against 0.665 (24 / 8, p=0.0035); at 1.0, 0.911 (p=0.5) and 0.773 (p=0.0007); the
mean of 5 at 1.0 is below greedy on id-test (0.886). Iteration 0's judge (models:/judge/2), mean of 20 at 0.7:
id-test 0.904 against greedy 0.856 (57 / 19, p=7e-6), ood-test 0.841 against 0.790 (21 / 12, p=0.08).
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from functools import partial
from pathlib import Path
from statistics import fmean

from flywheel import storage
from flywheel.config import load_config
from flywheel.datasets import read_dataset
from flywheel.engines import make_text_engine
from flywheel.evaluate import meta
from flywheel.gate import mcnemar
from flywheel.iteration import paths
from flywheel.judge import claims
from flywheel.raycluster import init_ray

METRIC = "all/pointwise_ranking/accuracy"


def row_key(row: dict) -> tuple:
    """What a judged row answers, the same in every sample: its item, order, and for a claim check its claim."""
    claim = claims.header(row.get("raw_output")) if row["protocol"] == claims.NAME else None
    return meta.item_key(row) + (row["order"], row["protocol"], claim)


def averaged(samples: list[list[dict]]) -> list[dict]:
    """Each judged row once, its score the mean over the samples that parsed it; a row no sample parsed keeps the
    first sample's parse error (never a made-up score). Rows are keyed by row_key; the first sample's row is kept
    for the rest of its fields."""
    scores: dict[tuple, list[float]] = defaultdict(list)
    first: dict[tuple, dict] = {}
    for rows in samples:
        for r in rows:
            k = row_key(r)
            first.setdefault(k, r)
            if r["parse_error"] is None and r.get("score") is not None:
                scores[k].append(float(r["score"]))
    out = []
    for k, r in first.items():
        if scores[k]:
            r = {**r, "score": fmean(scores[k]), "parse_error": None}
        out.append(r)
    return out


def by_subtask(keys: list[str], greedy: dict[str, bool], mean: dict[str, bool], gold: list[dict],
               prompts: dict[str, dict]) -> dict[str, tuple[list[bool], list[bool]]]:
    """Sub-task -> the greedy and mean-of-k outcomes of its gold pairs (keyed by gold judgment id): where sampling
    gains or loses pairs."""
    subtask = {g["judgment_id"]: prompts[g["prompt_id"]]["subtask"] for g in gold}
    out: dict[str, tuple[list[bool], list[bool]]] = defaultdict(lambda: ([], []))
    for k in keys:
        g, m = out[subtask[k]]
        g.append(greedy[k])
        m.append(mean[k])
    return dict(out)


class Reseeded:
    """A text engine whose every call samples from seeds of its own: meta-eval calls generate() with the default
    seed, so each sample would otherwise draw the same analyses."""

    def __init__(self, engine, offset: int):
        self.engine, self.offset = engine, offset
        self.name, self.version = engine.name, engine.version

    def generate(self, requests, seed: int = 0):
        return self.engine.generate(requests, seed=seed + self.offset)


def reseeded_judge(cfg, offset: int) -> Reseeded:
    return Reseeded(make_text_engine(cfg, "judge"), offset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="the workdir whose iteration's judge and gold are read")
    ap.add_argument("--iteration", default="000", help="the iteration whose challenger's greedy meta-eval is read")
    ap.add_argument("--judge", required=True, help="that challenger: a models:/ URI or a path")
    ap.add_argument("--config", default="configs/local_claims.yaml")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--out", default="runs/bench-judge-samples")
    args = ap.parse_args()

    workdir = Path(args.run).resolve()
    cfg = load_config(args.config, [f"run.workdir={workdir}"])
    n = int(args.iteration)
    p = paths(cfg, n)
    judge = args.judge
    out = Path(args.out).resolve() / workdir.name / args.iteration
    init_ray(cfg)
    judged: dict[str, list[list[dict]]] = defaultdict(list)
    for s in range(args.samples):
        over = [f"run.workdir={workdir}", f"storage.uri={out / 'data'}", f"models.judge.path={judge}",
                f"judge.generation.temperature={args.temperature}",
                "meta_eval.perturbation.enabled=false", "meta_eval.protocols=[pointwise,claims]"]
        scfg = load_config(args.config, over)
        uri = str(out / f"sample-{s}")
        print(f"sample {s}: meta-eval of {judge} at temperature {args.temperature} -> {uri}", flush=True)
        factory = partial(reseeded_judge, scfg, 1_000_000 * (s + 1))
        meta.run(scfg, p["gold"], uri, engine_factory=factory)  # skips what is judged
        for split in meta.SPLITS:
            if storage.exists(storage.join(uri, split, "manifest.json")):
                judged[split].append(read_dataset(storage.join(uri, split))[0].to_pylist())

    split_cfg = cfg.world.suites.split
    unseen, ood = set(split_cfg.ood_aspects), set(split_cfg.ood_subtasks)
    print(f"\n{workdir.name} iteration {n}: {args.samples} samples at temperature {args.temperature} ({METRIC})")
    for split, samples in judged.items():
        gold, prompts = meta.read_gold(storage.join(p["gold"], split))
        greedy = meta.stored_outcomes(cfg, p["gold"], p["meta-eval"], f"{split}/{METRIC}")
        mean = meta.pair_outcomes(METRIC, gold, averaged(samples), prompts, unseen, ood)
        one = meta.pair_outcomes(METRIC, gold, samples[0], prompts, unseen, ood)
        keys = sorted(set(greedy) & set(mean))
        better, worse, pv = mcnemar(mean, greedy)  # on the pairs both were scored on (keys)
        print(f"  {split} ({len(keys)} pairs): greedy {fmean(greedy[k] for k in keys):.3f}, one sample "
              f"{fmean(one.get(k, False) for k in keys):.3f}, mean of {args.samples} "
              f"{fmean(mean[k] for k in keys):.3f} (McNemar mean over greedy {better} / {worse}, p={pv:.3g})")
        try:  # the teacher the iteration measured on the same gold: how far the mean of k still is from it
            teacher = meta.stored_outcomes(cfg, p["gold"], p["meta-eval-teacher"], f"{split}/{METRIC}")
        except meta.OutcomesUnavailable as e:
            print(f"    (no teacher to compare with: {e})")
        else:
            tk = teacher.keys() & mean.keys()
            better, worse, pv = mcnemar(mean, teacher)
            print(f"    teacher {fmean(teacher[k] for k in tk):.3f} on {len(tk)} pairs (McNemar mean of "
                  f"{args.samples} over the teacher {better} / {worse}, p={pv:.3g})")
        for subtask, (g, m) in sorted(by_subtask(keys, greedy, mean, gold, prompts).items()):
            print(f"    {subtask} ({len(g)}): greedy {fmean(g):.3f}, mean of {args.samples} {fmean(m):.3f}")


if __name__ == "__main__":
    main()
