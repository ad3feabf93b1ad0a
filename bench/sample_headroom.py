"""How many right answers the LLaVA's own samples hold at each sampling temperature: the ceiling of what preference
pairs drawn from them can teach. The preference stage samples at the policy's temperature
(preferences.policy_temperature, unset: policy.generation.temperature, 1.0 locally).

For held-out items of every question type (a stream neither the gate nor training uses), draws K samples per item
at each temperature and checks each with the oracle. Prints, per question type: the greedy answer's accuracy, the
samples' mean accuracy, the share of items with a right sample among K (pass@K), and the share with a right *and*
a wrong one: the items that give a right-over-wrong preference pair.

    .venv/bin/python bench/sample_headroom.py --set run.workdir=runs/fr2 [--temperatures 0.7,1.0,1.3,1.6]
        [--samples 4] [--items 240] [--policy world:policy]

The policy is resolved in run.workdir's model cache (a world: base is built there first if it is not cached).

Measured 2026-11-27 on runs/fr2's base (table in docs/results.md, "The LLaVA's samples hold more than its update
learns"): greedy 0.604; pass@4 0.721 / 0.750 / 0.742 / 0.642 at T 0.7 / 1.0 / 1.3 / 1.6; pass@16 0.842 at T 1.0
(captions 0.400, count 1.000). Perfect pairs from such samples (bench/pool_replay.py --sampled) gain +10 to +12 on
the gate's 480 items and never move count: the samples hold more than the update learns.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from flywheel.config import ModelRef, load_config
from flywheel.engines.hf import HFTextEngine
from flywheel.models.zoo import resolve_model_path
from flywheel.worlds.shapes import policy_eval as pe

STREAM = 7933  # held-out items of this bench alone (policy_eval's gate and early-stopping streams are 7919, 7927)


def rights(items: list, results: list) -> list[float]:
    return pe.score_text_items(items, results)[1]


def summarise(items: list, greedy: list[float], samples: list[list[float]]) -> dict[str, dict[str, float]]:
    """Per question type and overall: greedy, mean, pass@K and mixed (a right and a wrong sample) shares."""
    per: dict[str, list[tuple[float, list[float]]]] = defaultdict(list)
    for (_, _, _, q), g, s in zip(items, greedy, zip(*samples, strict=True), strict=True):
        per[q["type"]].append((g, list(s)))
        per["all"].append((g, list(s)))
    return {t: {"greedy": float(np.mean([g for g, _ in rows])),
                "mean": float(np.mean([np.mean(s) for _, s in rows])),
                "pass": float(np.mean([max(s) for _, s in rows])),
                "mixed": float(np.mean([max(s) > min(s) for _, s in rows])),
                "n": float(len(rows))} for t, rows in sorted(per.items())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--set", action="append", default=[], help="config override, e.g. run.workdir=runs/fr2")
    ap.add_argument("--policy", default="world:policy")
    ap.add_argument("--temperatures", default="0.7,1.0,1.3,1.6")
    ap.add_argument("--samples", type=int, default=4, help="K samples per item and temperature")
    ap.add_argument("--items", type=int, default=240)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    cfg = load_config(a.config, a.set)
    world = cfg.world.shapes
    path = resolve_model_path(ModelRef(path=a.policy), cfg)
    items = pe.text_items(world, a.items, a.seed, STREAM)
    requests = pe.text_requests(items, world)
    greedy_engine = HFTextEngine(path, cfg.policy.generation.model_copy(update={"temperature": 0.0}))
    greedy = rights(items, greedy_engine.generate(requests, seed=a.seed))
    del greedy_engine
    print(f"policy {a.policy} ({path}); {a.items} items, {a.samples} samples each")
    print(f"{'T':>4} {'type':<10} {'greedy':>7} {'mean':>7} {'pass@K':>7} {'mixed':>7} {'n':>5} {'s':>6}")
    for t_index, temperature in enumerate(float(t) for t in a.temperatures.split(",")):
        engine = HFTextEngine(path, cfg.policy.generation.model_copy(update={"temperature": temperature}))
        t0 = time.time()
        samples = [rights(items, engine.generate(requests, seed=a.seed + 1000 * (k + 1) + t_index))
                   for k in range(a.samples)]
        took = time.time() - t0
        for kind, m in summarise(items, greedy, samples).items():
            print(f"{temperature:>4.1f} {kind:<10} {m['greedy']:>7.3f} {m['mean']:>7.3f} {m['pass']:>7.3f} "
                  f"{m['mixed']:>7.3f} {m['n']:>5.0f} {took:>6.0f}")
        del engine


if __name__ == "__main__":
    main()
