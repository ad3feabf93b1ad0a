"""A weight average of a run's judges (a "soup", WARM's weight-averaged reward models), meta-evaluated on the run's
gold and compared pair by pair with each judge that went into it.

The loop trains each round's judge from the last one, so successive judges lie close together in weight space,
where averaging them is known to keep what each learnt and smooth what each got wrong by chance (Ramé et al.,
WARM, 2024; Wortsman et al., model soups, 2022). The judges ranked id-test gold ±0.03 apart from round to round
on the same rows: is their average better than either?

    .venv/bin/python bench/judge_soup.py --workdir runs/clw --config configs/local_claims.yaml \
        --judges models:/judge/6,models:/judge/8 --iterations 002,003 [--weights 0.5,0.5] [--out runs/soup]

With --ensemble no model is built or run: each judge's stored ratings of the gold (its iteration's meta-eval)
are averaged item by item, an ensemble of predictions, which a soup's weights approximate at one judge's cost.
It answers in seconds whether averaging the judges helps at all (mind that a mean of ratings ties less often
than one judge's, and a tie counts wrong).

--judges names registered versions (`flywheel report` lists each iteration's) or export folders;
--iterations, one per judge, names the iteration whose stored meta-eval is that judge's, for the paired test
(the gate's one-sided McNemar, soup better than that judge). Only floating-point tensors are averaged; every
other tensor, and every file that is not weights (config, processor, tokenizer), must be the first judge's.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def average(dirs: list[Path], weights: list[float], out: Path) -> None:
    """Write at `out` the checkpoint whose floating-point weights are the weighted mean of `dirs`' (same
    architecture: same safetensors files, keys and shapes), with the first checkpoint's other files. Written by
    hand: model soups are a few lines over safetensors, and no maintained library here averages HF checkpoints."""
    import torch
    from safetensors.torch import load_file, save_file

    if len(dirs) != len(weights) or not dirs:
        raise ValueError(f"{len(dirs)} checkpoints and {len(weights)} weights: give one weight per checkpoint")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights {weights}: non-negative, with a positive sum")
    shares = [w / sum(weights) for w in weights]
    files = sorted(p.name for p in dirs[0].glob("*.safetensors"))
    if not files:
        raise ValueError(f"{dirs[0]}: no .safetensors files")
    for d in dirs[1:]:
        if sorted(p.name for p in d.glob("*.safetensors")) != files:
            raise ValueError(f"{d}: weight files differ from {dirs[0]}'s ({files}): not the same architecture")
    out.mkdir(parents=True, exist_ok=True)
    for f in dirs[0].iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    for name in files:
        tensors = [load_file(str(d / name)) for d in dirs]
        mixed = {}
        for key, first in tensors[0].items():
            for d, t in zip(dirs[1:], tensors[1:]):
                if key not in t or t[key].shape != first.shape:
                    raise ValueError(f"{d / name}: {key} missing or shaped otherwise than in {dirs[0]}")
            if first.is_floating_point():
                acc = sum(s * t[key].to(torch.float64) for s, t in zip(shares, tensors))
                mixed[key] = acc.to(first.dtype).contiguous()
            else:
                mixed[key] = first.clone()
        save_file(mixed, str(out / name), metadata={"format": "pt"})


def ensemble_rows(tables: list[list[dict]]) -> list[dict]:
    """The first judge's judged rows with each rating the mean of the judges' parsed ratings of the same request
    (item, order, claim): a request only some judges parsed takes theirs, one none parsed stays a parse failure."""
    from flywheel.evaluate.meta import item_key
    from flywheel.judge import claims

    def key(r: dict) -> tuple:
        return item_key(r), r["protocol"], r["order"], claims.header(r.get("raw_output"))

    scores: dict[tuple, list[float]] = {}
    for table in tables:
        for r in table:
            if r["parse_error"] is None and r["score"] is not None:
                scores.setdefault(key(r), []).append(float(r["score"]))
    out = []
    for r in tables[0]:
        got = scores.get(key(r))
        out.append({**r, "score": sum(got) / len(got), "parse_error": None} if got else r)
    return out


def ensemble_outcomes(cfg, iterations: list[int], metric: str) -> dict[str, bool]:
    """Per gold pair (`<split>/<per-pair accuracy>`): is the mean rating of the iterations' judges right?"""
    from flywheel import storage
    from flywheel.datasets import read_dataset
    from flywheel.evaluate import meta
    from flywheel.evaluate.metric_names import split_of
    from flywheel.iteration import paths

    split, name = split_of(metric)
    tables = [read_dataset(storage.join(paths(cfg, it)["meta-eval"], split))[0].to_pylist() for it in iterations]
    gold, prompts = meta.read_gold(storage.join(paths(cfg, 0)["gold"], split))
    s = cfg.world.suites.split
    return meta.pair_outcomes(name, gold, ensemble_rows(tables), prompts, set(s.ood_aspects), set(s.ood_subtasks))


def ensemble(cfg, iterations: list[int], metric: str) -> None:
    """Print the score ensemble of the iterations' judges against each of them, per split."""
    from compare_judges import SPLITS, compare, outcomes

    from flywheel import storage
    from flywheel.iteration import paths

    for split in SPLITS:
        if storage.exists(storage.join(paths(cfg, 0)["gold"], split)):
            mixed = ensemble_outcomes(cfg, iterations, f"{split}/{metric}")
            for it in iterations:
                _row(f"{split} vs {it:03d}", compare(mixed, outcomes(cfg, it, f"{split}/{metric}")))


def _row(label: str, r: dict) -> None:
    print(f"{label:24} {r['n']:4d} {r['a']:6.3f} {r['b']:6.3f} {r['better']:10d} {r['worse']:11d} {r['p']:9.2g}")


HEAD = f"{'':24} {'n':>4} {'mixed':>6} {'judge':>6} {'mixed only':>10} {'judge only':>11} {'p':>9}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="The run's workdir (its registry, gold and meta-evals).")
    ap.add_argument("--config", default="configs/local.yaml", help="The run's config (its meta-eval protocols).")
    ap.add_argument("--judges", help="Comma-separated models:/judge/<version> URIs or export folders.")
    ap.add_argument("--ensemble", action="store_true", help="Average the iterations' stored ratings instead.")
    ap.add_argument("--iterations", required=True, help="Comma-separated: the iteration that meta-evaluated each.")
    ap.add_argument("--weights", help="Comma-separated, one per judge (default equal).")
    ap.add_argument("--metric", default="all/pointwise_ranking/accuracy", help="A per-pair accuracy, no split.")
    ap.add_argument("--set", nargs="*", default=[], help="Config overrides the meta-evaluation reads.")
    ap.add_argument("--out", default="runs/bench-judge-soup")
    args = ap.parse_args()

    from compare_judges import SPLITS, compare, outcomes
    from judge_learning import evaluate

    from flywheel.config import load_config
    from flywheel.evaluate import meta
    from flywheel.iteration import paths
    from flywheel.train import registry

    work, out = Path(args.workdir).resolve(), Path(args.out).resolve()
    cfg = load_config(args.config, [f"run.workdir={work}", *args.set])
    iterations = [int(i) for i in args.iterations.split(",")]
    if args.ensemble:
        print(f"{args.metric}: the mean rating of iterations {args.iterations}' judges against each, McNemar "
              f"one-sided (mixed better)\n{HEAD}")
        return ensemble(cfg, iterations, args.metric)
    if not args.judges:
        raise SystemExit("--judges: which judges to average (or --ensemble)")
    refs = args.judges.split(",")
    if len(iterations) != len(refs):
        raise SystemExit(f"--judges names {len(refs)} judges, --iterations {len(iterations)}: one each")
    dirs = [Path(registry.local_path(cfg, r) if registry.is_registry_uri(r) else r).resolve() for r in refs]
    weights = [float(w) for w in args.weights.split(",")] if args.weights else [1.0] * len(dirs)
    if (out / "model").exists():
        shutil.rmtree(out / "model")
    if (out / "data").exists():  # a meta-eval of another soup would be taken as up to date
        shutil.rmtree(out / "data")
    average(dirs, weights, out / "model")
    print(f"soup of {', '.join(refs)} (weights {weights}) -> {out / 'model'}", flush=True)
    evaluate(argparse.Namespace(config=args.config, set=args.set, gold_prompts=None), work, out)

    print(f"\n{args.metric}: the soup (mixed) against each judge, McNemar one-sided (mixed better)\n{HEAD}")
    for split in SPLITS:
        metric = f"{split}/{args.metric}"
        soup = meta.stored_outcomes(cfg, paths(cfg, 0)["gold"], str(out / "data" / "meta"), metric)
        for ref, it in zip(refs, iterations):
            _row(f"{split} vs {it:03d}", compare(soup, outcomes(cfg, it, metric)))


if __name__ == "__main__":
    main()
