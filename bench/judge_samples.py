"""Does the judge order gold pairs better when each candidate's rating is averaged over several sampled analyses
than when it is read off its one greedy analysis? (Self-consistency, Wang et al. 2022; G-Eval averages 20
samples.) The tiny judge's misses are drawings whose blur or noise it half sees (`bench/judge_misses.py`): its
greedy analysis says "sharp" of both candidates, though "blurred" may be likelier for one of them. Averaged over
sampled analyses, that likelihood reaches the rating.

The loop's stored meta-eval of the iteration (greedy) is the baseline; the mean of k is the loop's own meta-eval
with judge.samples=k at judge.generation.temperature (flywheel/engines/samples.py: each rating request answered k
times, its score the mean of the samples that parsed; a row no sample parsed stays failed), pointwise and claim
rows only (what the ranking reads), without the perturbation copies. One sample is each row's first sample.

    .venv/bin/python bench/judge_samples.py --run runs/local_claims --iteration 001 --judge models:/judge/2 \
        --config configs/local_claims.yaml [--samples 5] [--temperature 0.7] [--out runs/bench-judge-samples]

--judge: the iteration's challenger, whose greedy meta-eval the iteration stored (`flywheel report` names its
registered version).

Measured (runs/local_claims iteration 1 on an AVX2 box, models:/judge/4, 2026-12-06; docs/results.md "Self-
consistency"): the mean of 20 at temperature 0.7 reads id-test 0.925 against greedy 0.909 (McNemar 31 / 19,
p=0.06) and ood-test 0.756 against 0.665 (24 / 8, p=0.0035); at 1.0, 0.911 (p=0.5) and 0.773 (p=0.0007); the
mean of 5 at 1.0 is below greedy on id-test (0.886). Iteration 0's judge (models:/judge/2), mean of 20 at 0.7:
id-test 0.904 against greedy 0.856 (57 / 19, p=7e-6), ood-test 0.841 against 0.790 (21 / 12, p=0.08). A second
draw of 20 through judge.samples (other seeds): 0.912 / 0.739 and 0.871 / 0.824; both draws' 40 samples together
0.917 / 0.761 and 0.892 / 0.830 (docs/tuning.md, judge.samples). Iteration 3's judge (models:/judge/8, greedy
0.931 / 0.688): 0.925 / 0.739.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import fmean

from flywheel import storage
from flywheel.config import load_config
from flywheel.datasets import read_dataset
from flywheel.evaluate import meta
from flywheel.gate import mcnemar
from flywheel.iteration import paths
from flywheel.raycluster import init_ray

METRIC = "all/pointwise_ranking/accuracy"


def first_sample(rows: list[dict]) -> list[dict]:
    """The rows as one sample would have scored them: each row's first sample's score (parsed["sample_scores"]),
    a row whose first sample did not parse a failure."""
    out = []
    for r in rows:
        parsed = json.loads(r["parsed"]) if isinstance(r.get("parsed"), str) else r.get("parsed")  # as stored
        first = ((parsed or {}).get("sample_scores") or [r.get("score")])[0]
        out.append({**r, "score": first, "parse_error": r["parse_error"] or (None if first is not None
                                                                           else "first sample did not parse")})
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
    out = Path(args.out).resolve() / workdir.name / args.iteration
    scfg = load_config(args.config, [
        f"run.workdir={workdir}", f"storage.uri={out / 'data'}", f"models.judge.path={args.judge}",
        f"judge.samples={args.samples}", f"judge.generation.temperature={args.temperature}",
        "meta_eval.perturbation.enabled=false", "meta_eval.protocols=[pointwise,claims]"])
    uri = str(out / f"k{args.samples}-t{args.temperature:g}")
    init_ray(cfg)
    print(f"meta-eval of {args.judge}, {args.samples} samples at temperature {args.temperature} -> {uri}", flush=True)
    meta.run(scfg, p["gold"], uri)  # skips what is judged

    split_cfg = cfg.world.suites.split
    unseen, ood = set(split_cfg.ood_aspects), set(split_cfg.ood_subtasks)
    print(f"\n{workdir.name} iteration {n}: {args.samples} samples at temperature {args.temperature} ({METRIC})")
    for split in meta.SPLITS:
        if not storage.exists(storage.join(uri, split, "manifest.json")):
            continue
        rows = read_dataset(storage.join(uri, split))[0].to_pylist()
        gold, prompts = meta.read_gold(storage.join(p["gold"], split))
        greedy = meta.stored_outcomes(cfg, p["gold"], p["meta-eval"], f"{split}/{METRIC}")
        mean = meta.pair_outcomes(METRIC, gold, rows, prompts, unseen, ood)
        one = meta.pair_outcomes(METRIC, gold, first_sample(rows), prompts, unseen, ood)
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
