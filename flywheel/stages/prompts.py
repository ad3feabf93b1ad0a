"""Prompts: the oracle world's task suites plus any user sources, aspects selected, written as one dataset.

Generation is cheap and sequential (the suites are seeded streams), so it runs in the driver; every later
stage is sharded by Ray Data.
"""

from __future__ import annotations

import logging
import time

from flywheel.aspects import AspectTree
from flywheel.config import Config
from flywheel.datasets import Manifest, MissingManifest, read_dataset, read_manifest, write_dataset
from flywheel.sources import read_source
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
    for spec in cfg.prompts.sources:
        got, bad = read_source(spec.model_dump(exclude_none=True), tree)
        log.info("prompts: %d rows from %s (%d quarantined)", len(got), spec.path, len(bad))
        rows.extend(got)
        quarantined.extend(bad)
    return rows, quarantined


def run(cfg: Config, output_uri: str, tracker=None, iteration: int = 0) -> StageResult:
    """The iteration's prompts: oracle-world suites drawn fresh for each iteration (test splits stay stable)
    plus the configured sources."""
    stage_hash = cfg.stage_hash("prompts") + (f"/{iteration}" if iteration else "")
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
    """Fresh prompts for the policies' preference data (cfg.preferences), drawn from a seed of their own."""
    from flywheel.worlds.shapes.suites import generate

    p = cfg.preferences
    stage_hash = f"fresh:{seed}:{cfg.stage_hash('preferences')}"
    done = _skip(output_uri, stage_hash, [])
    if done is not None:
        log.info("stage preference-prompts: %s is up to date; skipped", output_uri)
        return done
    rows = list(generate(p.suites(), cfg.world.shapes, AspectTree.load(), seed))
    m = write_dataset(output_uri, "prompt", rows, config_hash=stage_hash, producer="preference-prompts",
                      limits=cfg.limits)
    log.info("stage preference-prompts: %d prompts → %s", m.row_count, output_uri)
    if tracker is not None:
        tracker.log_manifest(m)
    return m
