"""Gold meta-eval sets: per split, deliberately varied outputs for the suites' prompts, labelled by the noiseless
oracle (the teacher at error rate 0), written as datasets with manifests.

Layout under the output URI, one folder per split (train, id-test, ood-test):
  <split>/prompts     the prompt records used (an oracle-world subset of the prompts dataset)
  <split>/candidates  their varied outputs (producer "gold:<variant>", meta.variant: correct, wrong_colour, ...)
  <split>/judgments   the gold: judge "oracle:shapes@v1-e0-...", sample_k 0, one row per item -
                      pointwise: every output with its gold rating (score 1-5) and analysis;
                      pairwise: pairs of outputs with the gold winner (verdict A or B in the AB frame of
                      candidate_ids; ties excluded), overall quality with the query, each pair in one order
                      (`order` AB or BA, the oracle's answer for that order), the orders chosen so that the
                      output shown first wins half the time;
                      other protocols in `world.gold.protocols` (decomposed: 0-10 overall, rubric: fraction met).
Everything is deterministic for (run.seed, world config, prompts). Small, so it runs in the driver without Ray.

A split named in `meta_eval.gold_files` takes its gold from that file instead: human labels in `flywheel eval
--data`'s JSONL format (flywheel/evaluate/labeled.py), judged by "labeled:<file name>", in the same layout, so
meta-eval and the judge's gate score against them. Its refused lines are quarantined with their line numbers.
The stage is redone when a file's contents change.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flywheel import storage
from flywheel.config import Config, JudgmentsConfig
from flywheel.datasets import Manifest, MissingManifest, read_dataset, read_manifest, write_dataset
from flywheel.engines.base import TextEngine
from flywheel.evaluate.labeled import gold_rows, parse_labeled, require_items
from flywheel.records import with_ids
from flywheel.sources import files_digest
from flywheel.stages.judgments import JudgmentsCore, judgment_stats
from flywheel.worlds.shapes.assessment import NoGroundTruth, load_meta
from flywheel.worlds.shapes.gold import gold_candidates

log = logging.getLogger(__name__)
PARTS = ("prompts", "candidates", "judgments")
KIND = {"prompts": "prompt", "candidates": "candidate", "judgments": "judgment"}


@dataclass
class GoldSet:
    prompts: list[dict] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)
    judgments: list[dict] = field(default_factory=list)
    quarantined: list[dict] = field(default_factory=list)


def _is_oracle(p: dict) -> bool:
    try:
        load_meta(p)
        return True
    except NoGroundTruth:
        return False


def pick_prompts(prompts: list[dict], split: str, per_subtask: int) -> list[dict]:
    """The first `per_subtask` oracle prompts of each sub-task in the split, in dataset order."""
    taken: dict[str, int] = defaultdict(int)
    out = []
    for p in prompts:
        if p.get("split") != split or not _is_oracle(p) or taken[p["subtask"]] >= per_subtask:
            continue
        taken[p["subtask"]] += 1
        out.append(p)
    return out


def splits(cfg: Config) -> list[str]:
    """The gold splits: world.gold.splits, then those only meta_eval.gold_files names."""
    return list(dict.fromkeys([*cfg.world.gold.splits, *cfg.meta_eval.gold_files]))


def labeled_gold(path: str, split: str) -> GoldSet:
    """A split's gold from a labeled JSONL file (module docstring)."""
    try:
        text = storage.read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"meta_eval.gold_files.{split}: no file at {path}") from None
    items, refused = parse_labeled(text, split)
    require_items(items, refused, f"meta_eval.gold_files.{split}: {path}")
    gp, gc, gj = gold_rows(items, f"labeled:{storage.name(path)}")
    lines = text.splitlines()
    bad = []
    for reason in refused:  # "line <n>: ...": kept raw with its reason
        n = int(reason.split(":", 1)[0].removeprefix("line "))
        bad.append({"kind": "judgment", "index": n, "reason": reason, "field": "", "raw": lines[n - 1]})
    return GoldSet(gp, gc, gj, bad)


def build_gold(cfg: Config, prompts: list[dict], engine: TextEngine | None = None) -> dict[str, GoldSet]:
    """The gold set of every split (pure: no storage, no Ray)."""
    from flywheel.engines.oracle import gold_engine

    g = cfg.world.gold
    engine = engine or gold_engine(cfg.world.shapes, seed=cfg.run.seed)
    prompts = with_ids("prompt", prompts)
    jcfg = JudgmentsConfig(protocols=g.protocols, samples_per_item=1, pairwise_aspects="overall",
                           pairwise_orders=["AB", "BA"], max_pairs_per_prompt=None, rubric_item_calls="all")
    out = {}
    for split in splits(cfg):
        if split in cfg.meta_eval.gold_files:
            out[split] = labeled_gold(cfg.meta_eval.gold_files[split], split)
            continue
        chosen = pick_prompts(prompts, split, g.prompts_per_subtask)
        if not chosen:  # an empty gold would leave meta-eval nothing to score and the gate's metric undefined
            raise ValueError(f"gold {split}: no oracle-world prompt of that split to build gold from (prompts."
                             f"oracle_world is {cfg.prompts.oracle_world}); name a labelled file in "
                             f"meta_eval.gold_files.{split}, or leave {split} out of world.gold.splits")
        cands = with_ids("candidate", [c for p in chosen
                                       for c in gold_candidates(p, g, cfg.world.shapes, cfg.run.seed)])
        core = JudgmentsCore(cfg, cands, engine=engine, judgments=jcfg)
        res = core(chosen)
        failed = [r for r in res.rows if r.get("parse_error")]
        if failed:  # the oracle's answers always parse: a failure here is a bug, never gold
            raise RuntimeError(f"gold {split}: {len(failed)} oracle answers failed to parse, e.g. "
                               f"{failed[0]['parse_error']}")
        out[split] = GoldSet(chosen, cands, _keep_pairs(res.rows, g.max_pairs_per_prompt, cfg.run.seed),
                             res.quarantined)
    return out


def _keep_pairs(rows: list[dict], limit: int, seed: int) -> list[dict]:
    """Pairwise gold: ties dropped, at most `limit` pairs per prompt (a seeded choice), each pair kept in ONE of
    its two judged orders, chosen so that the candidate shown first wins exactly as often as the one shown
    second (a gold set without a position bias to reward); other protocols' rows unchanged."""
    out = [r for r in rows if r["protocol"] != "pairwise"]
    pairs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["protocol"] == "pairwise" and r["verdict"] in ("A", "B"):
            pairs[(r["prompt_id"], tuple(r["candidate_ids"]), r.get("aspect"))][r["order"]] = r
    by_prompt: dict[str, list[tuple]] = defaultdict(list)
    for key, orders in pairs.items():
        if set(orders) == {"AB", "BA"}:
            by_prompt[key[0]].append(key)
    chosen = []
    for pid in sorted(by_prompt):
        keys = by_prompt[pid]
        h = hashlib.sha256(f"gold-pairs:{seed}:{pid}".encode()).digest()
        perm = np.random.default_rng(int.from_bytes(h[:8], "big")).permutation(len(keys))
        chosen += [keys[i] for i in sorted(perm[:limit])]
    for n, key in enumerate(chosen):
        first_wins = n % 2 == 0
        orders = pairs[key]
        # AB shows A first: the first shown wins when the verdict is A; BA shows B first: when it is B
        pick = "AB" if (orders["AB"]["verdict"] == "A") == first_wins else "BA"
        out.append(orders[pick])
    return out


def _stage_hash(cfg: Config) -> str:
    """The config's gold hash; with gold files, also their contents (a file edited in place redoes the stage)."""
    h = cfg.stage_hash("gold")
    files = cfg.meta_eval.gold_files
    if not files:
        return h
    digests = {split: files_digest([path]) for split, path in sorted(files.items())}  # a missing one: build names it
    return hashlib.sha256(json.dumps([h, digests]).encode()).hexdigest()[:16]


def _up_to_date(output_uri: str, split: str, stage_hash: str, upstream: Manifest) -> dict[str, Manifest] | None:
    got = {}
    for part in PARTS:
        try:
            m = read_manifest(storage.join(output_uri, split, part))
        except MissingManifest:
            return None
        if m.config_hash != stage_hash or [u.content_hash for u in m.upstream][:1] != [upstream.content_hash]:
            return None
        got[part] = m
    return got


def run(cfg: Config, prompts_uri: str, output_uri: str, tracker: Any = None) -> dict[str, dict[str, Manifest]]:
    """Write the gold sets of `world.gold.splits` under output_uri (see the module docstring); returns
    split -> {"prompts", "candidates", "judgments"} manifests. Skips when every manifest records the same
    config hash and prompts dataset."""
    table, upstream = read_dataset(prompts_uri, "prompt")
    h = _stage_hash(cfg)
    done = {s: _up_to_date(output_uri, s, h, upstream) for s in splits(cfg)}
    if all(v is not None for v in done.values()):
        log.info("stage gold: %s is up to date; skipped", output_uri)
        return done  # type: ignore[return-value]
    t0 = time.perf_counter()
    sets = build_gold(cfg, table.to_pylist())
    manifests: dict[str, dict[str, Manifest]] = {}
    metrics: dict[str, float] = {}
    for split, gs in sets.items():
        base = storage.join(output_uri, split)
        mp = write_dataset(storage.join(base, "prompts"), "prompt", gs.prompts, config_hash=h, producer="gold",
                           upstream=[upstream], limits=cfg.limits)
        mc = write_dataset(storage.join(base, "candidates"), "candidate", gs.candidates, config_hash=h,
                           producer="gold", upstream=[upstream, mp], limits=cfg.limits)
        mj = write_dataset(storage.join(base, "judgments"), "judgment", gs.judgments, config_hash=h,
                           producer="gold", upstream=[upstream, mp, mc], limits=cfg.limits,
                           quarantined=gs.quarantined)
        manifests[split] = {"prompts": mp, "candidates": mc, "judgments": mj}
        stats = judgment_stats(gs.judgments)
        metrics.update({f"{split}.prompts": mp.row_count, f"{split}.candidates": mc.row_count,
                        f"{split}.pointwise_items": stats["by_protocol"].get("pointwise", {}).get("judgments", 0),
                        f"{split}.pairwise_items": stats["by_protocol"].get("pairwise", {}).get("judgments", 0)})
        log.info("stage gold %s: %d prompts, %d outputs, %d gold judgments", split, mp.row_count, mc.row_count,
                 mj.row_count)
    if tracker is not None:
        import mlflow

        mlflow.log_metrics({**metrics, "seconds": time.perf_counter() - t0})
        for ms in manifests.values():
            for m in ms.values():
                tracker.log_manifest(m)
    return manifests
