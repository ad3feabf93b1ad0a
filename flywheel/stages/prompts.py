"""Prompts: the oracle world's task suites plus any user sources, aspects selected, written as one dataset.

Generation is cheap and sequential (the suites are seeded streams), so it runs in the driver; every later
stage is sharded by Ray Data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from flywheel.aspects import AspectTree
from flywheel.config import Config
from flywheel.datasets import Manifest, MissingManifest, read_dataset, read_manifest, write_dataset
from flywheel.records import with_ids
from flywheel.sources import files_digest, read_sources
from flywheel.stages.runner import StageResult

log = logging.getLogger(__name__)


def draw_seed(seed: int, iteration: int) -> int:
    """The oracle suites' seed of an iteration: iteration 0 draws with run.seed, each later one fresh prompts."""
    return seed if iteration == 0 else seed * 1000 + iteration


def build_prompts(cfg: Config, tree: AspectTree | None = None, iteration: int = 0) -> tuple[list[dict], list[dict]]:
    from flywheel.worlds.shapes.suites import generate

    tree = tree or AspectTree.load()
    rows: list[dict] = []
    quarantined: list[dict] = []
    if cfg.prompts.oracle_world:
        rows.extend(generate(cfg.world.suites, cfg.world.shapes, tree, draw_seed(cfg.run.seed, iteration),
                             split_seed=cfg.run.seed))
    got, bad = read_sources([s.model_dump(exclude_none=True) for s in cfg.prompts.sources], tree)
    return rows + got, quarantined + bad


def run(cfg: Config, output_uri: str, tracker=None, iteration: int = 0) -> StageResult:
    """The iteration's prompts: oracle-world suites drawn fresh for each iteration (test splits stay stable)
    plus the configured sources."""
    stage_hash = cfg.stage_hash("prompts") + (f"/{iteration}" if iteration else "")
    if cfg.prompts.sources:  # a file edited in place is read again
        stage_hash += "/" + files_digest([s.path for s in cfg.prompts.sources])
    try:
        m = read_manifest(output_uri)
        if m.config_hash == stage_hash:
            log.info("stage prompts: %s is up to date (%d rows); skipped", output_uri, m.row_count)
            return StageResult(m, skipped=True, rows_in=m.row_count, seconds=0.0)
    except MissingManifest:
        pass
    t0 = time.perf_counter()
    rows, quarantined = build_prompts(cfg, iteration=iteration)
    manifest = write_dataset(output_uri, "prompt", rows, config_hash=stage_hash, producer="prompts",
                             limits=cfg.limits, quarantined=quarantined)
    seconds = time.perf_counter() - t0
    log.info("stage prompts: %d rows, %d quarantined, %.1f s → %s", manifest.row_count, manifest.quarantined,
             seconds, output_uri)
    if tracker is not None:
        import mlflow

        from flywheel.review import log_samples

        mlflow.log_metrics({"rows_out": manifest.row_count, "quarantined": manifest.quarantined, "seconds": seconds})
        tracker.log_manifest(manifest)
        log_samples(rows, "prompt", "prompts")
    return StageResult(manifest, skipped=False, rows_in=len(rows) + len(quarantined), seconds=seconds)


def _skip(output_uri: str, stage_hash: str, upstream: list) -> Manifest | None:
    try:
        m = read_manifest(output_uri)
    except MissingManifest:
        return None
    same_inputs = [u.content_hash for u in m.upstream] == [u.content_hash for u in upstream]
    return m if m.config_hash == stage_hash and same_inputs else None


def run_split(cfg: Config, prompts_uri: str, output_uri: str, splits: tuple[str, ...] = ("train",)) -> Manifest:
    """The prompts of some splits as their own dataset (the judge is trained on train prompts only)."""
    table, upstream = read_dataset(prompts_uri, "prompt")
    stage_hash = f"split:{','.join(splits)}"
    done = _skip(output_uri, stage_hash, [upstream])
    if done is not None:
        return done
    rows = [r for r in table.to_pylist() if r["split"] in splits]
    return write_dataset(output_uri, "prompt", rows, config_hash=stage_hash, producer="prompts-split",
                         upstream=[upstream], limits=cfg.limits)


def run_fresh(cfg: Config, output_uri: str, seed: int, tracker=None) -> Manifest:
    """Fresh prompts for the policies' preference data (cfg.preferences), drawn from a seed of their own: from
    the oracle world's suites, or from preferences.sources (draw_sources)."""
    from flywheel.worlds.shapes.suites import generate

    p = cfg.preferences
    stage_hash = f"fresh:{seed}:{cfg.stage_hash('preferences')}"
    if p.sources:
        stage_hash += ":" + files_digest([s.path for s in p.sources])
    done = _skip(output_uri, stage_hash, [])
    if done is not None:
        log.info("stage preference-prompts: %s is up to date; skipped", output_uri)
        return done
    if p.sources:
        rows, quarantined = draw_sources(cfg, "train", seed)
    else:
        rows, quarantined = list(generate(p.suites(), cfg.world.shapes, AspectTree.load(), seed)), []
    m = write_dataset(output_uri, "prompt", rows, config_hash=stage_hash, producer="preference-prompts",
                      limits=cfg.limits, quarantined=quarantined)
    log.info("stage preference-prompts: %d prompts → %s", m.row_count, output_uri)
    if tracker is not None:
        tracker.log_manifest(m)
    return m


def draw_sources(cfg: Config, split: str, seed: int, counts: Callable[[str, str], int] | None = None
                 ) -> tuple[list[dict], list[dict]]:
    """Prompts of preferences.sources in `split` (their `split` field): per sub-task of preferences.subtasks,
    `counts(subtask, task)` of them (default preferences.count), a seeded draw (all it has when it has fewer),
    in sub-task order; and the files' quarantined rows. A sub-task with no prompt there is an error naming it."""
    p = cfg.preferences
    rows, quarantined = read_sources([s.model_dump(exclude_none=True) for s in p.sources], AspectTree.load())
    by_subtask: dict[str, list[dict]] = {s: [] for s in p.subtasks}
    for r in with_ids("prompt", rows):
        if r.get("split") == split and r.get("subtask") in by_subtask:
            by_subtask[r["subtask"]].append(r)
    missing = [s for s, got in by_subtask.items() if not got]
    if missing:
        raise ValueError(f"preferences.subtasks {missing}: no {split}-split prompt of that sub-task in "
                         f"preferences.sources ({', '.join(s.path for s in p.sources)})")
    counts = counts or p.count
    out = []
    for k, (subtask, got) in enumerate(by_subtask.items()):
        got = sorted({r["prompt_id"]: r for r in got}.values(), key=lambda r: r["prompt_id"])  # repeats once
        n = counts(subtask, got[0]["task"])
        if n < 1:
            raise ValueError(f"preferences.prompts_per_subtask gives {subtask} no prompt (nor its task)")
        take = np.random.default_rng([seed, k]).permutation(len(got))[:n]
        out += [got[i] for i in sorted(take)]
    log.info("%s prompts from preferences.sources: %d of %d sub-tasks' %d", split, len(out), len(by_subtask),
             sum(len(g) for g in by_subtask.values()))
    return out, quarantined
