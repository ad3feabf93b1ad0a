"""Curate: judgments → the judge's SFT and DPO sets (and kept judgments, judge pairs), or policy judgments →
policy preference pairs and their DPO / Diffusion-DPO training rows.

Curation is global (an item's k samples, score buckets across the whole set), so it runs in the driver over the
whole dataset rather than sharded; its steps are pure functions in flywheel/curate/. Every filter's retention is
logged to the stage's MLflow run.
"""

from __future__ import annotations

import logging
import time

from flywheel import storage
from flywheel.config import Config
from flywheel.curate import metrics
from flywheel.curate.pipeline import curate_judge_data, curate_policy_data
from flywheel.datasets import Manifest, MissingManifest, read_dataset, read_manifest, write_dataset
from flywheel.worlds.shapes.claims import claim_kind  # the world's reading of a claim (curate.claim_balance)

log = logging.getLogger(__name__)

JUDGE_OUTPUTS = {"sft": "sft", "dpo": "dpo", "pairs": "pair", "kept": "judgment"}
POLICY_OUTPUTS = {"dpo": "dpo", "image_pref": "image_pref", "pairs": "pair"}


def _fresh(outputs: dict[str, str], stage_hash: str, upstream: list[Manifest]) -> dict[str, Manifest] | None:
    found = {}
    for name, uri in outputs.items():
        try:
            m = read_manifest(uri)
        except MissingManifest:
            return None
        if m.config_hash != stage_hash or [u.content_hash for u in m.upstream] != [u.content_hash for u in upstream]:
            return None
        found[name] = m
    return found


def _run(name: str, cfg: Config, inputs: dict[str, str], output_uri: str, kinds: dict[str, str], curate_fn,
         tracker) -> dict[str, Manifest]:
    stage_hash = cfg.stage_hash("curate")
    tables = {k: read_dataset(uri) for k, uri in inputs.items()}
    upstream = [m for _, m in tables.values()]
    outputs = {k: storage.join(output_uri, k) for k in kinds}
    done = _fresh(outputs, stage_hash, upstream)
    if done is not None:
        log.info("stage %s: %s is up to date; skipped", name, output_uri)
        return done
    t0 = time.perf_counter()
    rows = {k: t.to_pylist() for k, (t, _) in tables.items()}
    result = curate_fn(rows)
    manifests = {k: write_dataset(outputs[k], kind, getattr(result, k), config_hash=stage_hash, producer=name,
                                  upstream=upstream, limits=cfg.limits) for k, kind in kinds.items()}
    seconds = time.perf_counter() - t0
    for rep in result.reports:
        log.info("stage %s: %-24s %6d → %6d  %s", name, rep.name, rep.rows_in, rep.rows_out, dict(rep.dropped))
    log.info("stage %s: %s, %.1f s → %s", name,
             ", ".join(f"{k} {m.row_count}" for k, m in manifests.items()), seconds, output_uri)
    if tracker is not None:
        import mlflow

        mlflow.log_metrics(metrics(result.reports) | {"seconds": seconds} |
                           {f"rows_out.{k}": m.row_count for k, m in manifests.items()})
        from flywheel.review import log_gallery, log_samples

        for k, m in manifests.items():
            tracker.log_manifest(m)
            log_samples(getattr(result, k), kinds[k], f"{name}-{k}")
        if name == "curate-policy":
            log_gallery(result.pairs, {r["prompt_id"]: r for r in rows["prompts"]},
                        {r["candidate_id"]: r for r in rows["candidates"]}, rows["judgments"])
    return manifests


def run_judge(cfg: Config, judgments_uri: str, prompts_uri: str, candidates_uri: str, output_uri: str,
              tracker=None) -> dict[str, Manifest]:
    """Teacher judgments → judge SFT set (incl. the decomposed protocol's six sample kinds) and judge DPO set."""

    def curate(rows):
        return curate_judge_data(rows["judgments"], rows["prompts"], rows["candidates"], cfg.curate,
                                 style=cfg.judge.prompt_style, claim_kind=claim_kind)

    inputs = {"judgments": judgments_uri, "prompts": prompts_uri, "candidates": candidates_uri}
    return _run("curate-judge", cfg, inputs, output_uri, JUDGE_OUTPUTS, curate, tracker)


def run_policy(cfg: Config, judgments_uri: str, prompts_uri: str, candidates_uri: str, output_uri: str,
               tracker=None) -> dict[str, Manifest]:
    """The served judge's judgments of policy samples → best-vs-worst pairs → DPO and Diffusion-DPO rows."""

    def curate(rows):
        return curate_policy_data(rows["candidates"], rows["judgments"], rows["prompts"], cfg.curate)

    inputs = {"judgments": judgments_uri, "prompts": prompts_uri, "candidates": candidates_uri}
    return _run("curate-policy", cfg, inputs, output_uri, POLICY_OUTPUTS, curate, tracker)
