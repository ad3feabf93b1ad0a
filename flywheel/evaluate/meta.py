"""Judge meta-evaluation: a judge re-judges exactly the gold items of each split; its judgments are scored
against the gold (flywheel/evaluate/metrics.py).

Reported apart, as FRABench does: in-distribution (id-test), task generalization (ood-test items on unseen
sub-tasks judged on seen aspects or overall) and aspect generalization (ood-test items on an unseen aspect);
and per task category. Pairwise gold items are re-judged in both orders, so accuracy requires a verdict that
survives the swap and the position-bias rate is measured. The judging runs as a Ray Data stage (one pure core
over the gold judgment rows), so a 7B judge is placed on GPU actors like any labeling stage.

Then Minos' perturbation checks (flywheel/evaluate/perturbation.py, `meta_eval.perturbation`): perturbed copies
of sampled pointwise gold items (images swapped between items; 25% of a response's word spans replaced) are
written under <output>/perturb/<split>/ and re-judged by one more stage of the same core; their metrics join the
split's as "perturb/...".
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from flywheel import storage
from flywheel.config import Config
from flywheel.datasets import ManifestMismatch, read_dataset, read_manifest, write_dataset
from flywheel.engines import TextRequest, make_text_engine
from flywheel.evaluate import metric_names, perturbation
from flywheel.evaluate.metrics import PairItem, PointItem, pair_correct, pairwise_metrics, pointwise_metrics
from flywheel.judge import pairwise, pointwise
from flywheel.records import config_hash
from flywheel.stages.runner import CoreOutput, run_stage
from flywheel.worlds.shapes.teacher import make_context  # ground truth for the oracle; models ignore it

log = logging.getLogger(__name__)
SPLITS = ("id-test", "ood-test")


class MetaEvalCore:
    """Gold judgment rows in → the judge's judgment rows for the same items (pointwise once, pairwise AB and BA)."""

    def __init__(self, cfg: Config, prompts_uri: str, candidates_uri: str, engine=None, role: str = "judge"):
        self.engine = engine or make_text_engine(cfg, role)
        self.prompts = {r["prompt_id"]: r for r in read_dataset(prompts_uri, "prompt")[0].to_pylist()}
        self.candidates = {r["candidate_id"]: r for r in read_dataset(candidates_uri, "candidate")[0].to_pylist()}
        self.judge = f"{self.engine.name}@{self.engine.version}"
        self.style = cfg.judge.prompt_style
        self.readout = cfg.judge.rating_readout
        self.protocols = set(cfg.meta_eval.protocols)

    def __call__(self, gold_rows: list[dict]) -> CoreOutput:
        jobs: list[tuple[dict, str | None, TextRequest]] = []
        for g in gold_rows:
            prompt = self.prompts[g["prompt_id"]]
            cands = [self.candidates[c] for c in g["candidate_ids"]]
            if g["protocol"] == "pointwise" and "pointwise" in self.protocols:
                req = pointwise.build(prompt, cands[0], style=self.style)
                req.context = make_context("pointwise", prompt, cands)
                jobs.append((g, None, req))
            elif g["protocol"] == "pairwise" and "pairwise" in self.protocols:
                for order, req in pairwise.build_both(prompt, cands[0], cands[1], g["aspect"],
                                                                   style=self.style).items():
                    shown = cands if order == "AB" else cands[::-1]
                    req.context = make_context("pairwise", prompt, shown, aspect=g["aspect"], order=order)
                    jobs.append((g, order, req))
        results = self.engine.generate([r for _, _, r in jobs])
        out = CoreOutput()
        for (g, order, _), res in zip(jobs, results, strict=True):
            if not res.ok:
                out.quarantined.append({"kind": "judgment", "index": 0, "reason": f"judge: {res.error}",
                                        "field": "raw_output", "raw": {"gold": g["judgment_id"], "order": order}})
                continue
            if order is None:
                fields = pointwise.result_fields(res, self.readout)
            else:
                fields = pairwise.to_judgment_fields(pairwise.parse(res.text), order)
            out.rows.append({"prompt_id": g["prompt_id"], "candidate_ids": g["candidate_ids"], "judge": self.judge,
                             "protocol": g["protocol"], "aspect": g["aspect"], "order": order, "sample_k": 0,
                             "raw_output": res.text, **fields})
        return out


def _key(row: dict) -> tuple:
    return row["prompt_id"], tuple(row["candidate_ids"]), row["protocol"], row["aspect"]


Slices = dict[str, tuple[list[PointItem], list[PairItem], list[PairItem]]]  # name -> (points, pairs, ranked)


def _slices(gold: list[dict], judged: list[dict], prompts: dict[str, dict], unseen_aspects: set[str],
            ood_subtasks: set[str], protocols: tuple[str, ...]) -> Slices:
    """The scored items of each slice (all, per task category, per generalization), keyed by gold judgment id:
    one code path for the metrics and for the per-pair outcomes a paired gate test compares."""
    by_key: dict[tuple, dict[str | None, dict]] = defaultdict(dict)
    for j in judged:
        by_key[_key(j)][j["order"]] = j
    rating = {(j["prompt_id"], j["candidate_ids"][0]): j["score"] if j["parse_error"] is None else None
              for j in judged if j["protocol"] == "pointwise" and j["aspect"] is None}
    slices: Slices = defaultdict(lambda: ([], [], []))
    for g in gold:
        p = prompts[g["prompt_id"]]
        names = ["all", f"task/{p['task']}"]
        if p["subtask"] in ood_subtasks:
            names.append("aspect_generalization" if g["aspect"] in unseen_aspects else "task_generalization")
        mine = by_key.get(_key(g), {})
        key = g["judgment_id"]
        for name in names:
            points, pairs, ranked = slices[name]
            if g["protocol"] == "pointwise" and g["score"] is not None and "pointwise" in protocols:
                got = mine.get(None)
                points.append(PointItem(key, g["score"], got["score"] if got and got["parse_error"] is None else None))
            elif g["protocol"] == "pairwise" and g["verdict"] in ("A", "B"):
                ab, ba = mine.get("AB"), mine.get("BA")
                if "pairwise" in protocols:
                    pairs.append(PairItem(key, g["verdict"], ab["verdict"] if ab and not ab["parse_error"] else None,
                                          ba["verdict"] if ba and not ba["parse_error"] else None))
                if g["aspect"] is None and "pointwise" in protocols:
                    a, b = (rating.get((g["prompt_id"], c)) for c in g["candidate_ids"])
                    verdict = None if a is None or b is None else "A" if a > b else "B" if b > a else "tie"
                    ranked.append(PairItem(key, g["verdict"], verdict))
    return slices


def score_split(gold: list[dict], judged: list[dict], prompts: dict[str, dict], unseen_aspects: set[str],
                ood_subtasks: set[str], protocols: tuple[str, ...] = ("pointwise", "pairwise")) -> dict[str, float]:
    """Metrics of one split's judge judgments vs its gold, overall, per task category and per generalization.

    Besides the pairwise protocol's accuracy, `<slice>/pointwise_ranking/accuracy` scores each overall gold pair
    by the judge's two pointwise ratings (higher wins; equal ratings or a failed parse count wrong): the way the
    flywheel's preference stage uses the judge, so it predicts the quality of the pairs it makes. `protocols`:
    those the judge was asked in (meta_eval.protocols); a protocol left out has no metrics, not zeros."""
    out: dict[str, float] = {}
    for name, (points, pairs, ranked) in sorted(_slices(gold, judged, prompts, unseen_aspects, ood_subtasks,
                                                        protocols).items()):
        if points:
            out |= {f"{name}/pointwise/{k}": v for k, v in pointwise_metrics(points).items()}
        if pairs:
            out |= {f"{name}/pairwise/{k}": v for k, v in pairwise_metrics(pairs).items()}
        if ranked:
            m = pairwise_metrics(ranked)
            out |= {f"{name}/pointwise_ranking/{k}": m[k] for k in ("n", "accuracy", "parse_failure_rate")}
    return out


def pair_outcomes(name: str, gold: list[dict], judged: list[dict], prompts: dict[str, dict],
                  unseen_aspects: set[str], ood_subtasks: set[str]) -> dict[str, bool]:
    """Gold judgment id -> whether the judge got that pair right, for one split's per-pair accuracy `name` (as
    score_split names it, e.g. `all/pointwise_ranking/accuracy`, `task/iu/pairwise/accuracy`): the metric is
    the mean of these outcomes."""
    parsed = metric_names.per_pair_accuracy(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a per-pair accuracy (<slice>/{{{'|'.join(metric_names.PER_PAIR)}}}"
                         "/accuracy)")
    slice_name, protocol = parsed
    # both protocols: the metric exists only if its own was asked, and asking another changes none of its items
    slices = _slices(gold, judged, prompts, unseen_aspects, ood_subtasks, ("pointwise", "pairwise"))
    _, pairs, ranked = slices.get(slice_name, ([], [], []))
    return {i.key: pair_correct(i) for i in (pairs if protocol == "pairwise" else ranked)}


class OutcomesUnavailable(LookupError):
    """A judge's per-pair outcomes cannot be recomputed from storage; the message says why."""


def _inputs(gold_base: str) -> list[str]:
    """A split's meta-eval stage inputs, in the order its output's manifest records them as upstream."""
    return [storage.join(gold_base, part) for part in ("judgments", "prompts", "candidates")]


def _gold(gold_base: str) -> tuple[list[dict], dict[str, dict]]:
    """A split's gold items meta-eval scores (pointwise and pairwise) and its prompts by id."""
    gold = [g for g in read_dataset(storage.join(gold_base, "judgments"))[0].to_pylist()
            if g["protocol"] in ("pointwise", "pairwise")]
    prompts = {r["prompt_id"]: r for r in read_dataset(storage.join(gold_base, "prompts"))[0].to_pylist()}
    return gold, prompts


def stored_outcomes(cfg: Config, gold_uri: str, output_uri: str, metric: str) -> dict[str, bool]:
    """pair_outcomes of `metric` (`<split>/<name>`, as gate.judge_metric) for the judge whose meta-eval wrote
    its judged rows under `output_uri`, recomputed from storage against the gold under `gold_uri`. Raises
    OutcomesUnavailable when the rows are gone or the gold is no longer the one they were judged against."""
    split, name = metric_names.split_of(metric)
    base, judged_uri = storage.join(gold_uri, split), storage.join(output_uri, split)
    try:
        table, manifest = read_dataset(judged_uri)
        gold_hashes = [read_manifest(uri).content_hash for uri in _inputs(base)]
        if [u.content_hash for u in manifest.upstream] != gold_hashes:
            raise OutcomesUnavailable(f"the gold at {base} changed since {judged_uri} was judged")
        gold, prompts = _gold(base)
    except (FileNotFoundError, ManifestMismatch) as e:  # FileNotFoundError covers a missing manifest
        raise OutcomesUnavailable(f"cannot read the meta-eval at {judged_uri}: {e}") from e
    s = cfg.world.suites.split
    return pair_outcomes(name, gold, table.to_pylist(), prompts, set(s.ood_aspects), set(s.ood_subtasks))


def _scores(gold: list[dict], judged: list[dict]) -> dict[str, float | None]:
    """Gold judgment id -> the judge's pointwise score of that item (None: unparsed, or not judged at all)."""
    by_key = {_key(j): j for j in judged if j["order"] is None}
    out: dict[str, float | None] = {}
    for g in gold:
        j = by_key.get(_key(g))
        out[g["judgment_id"]] = j["score"] if j is not None and j["parse_error"] is None else None
    return out


def perturbation_checks(cfg: Config, split: str, gold_base: str, output_uri: str, gold: list[dict],
                        judged: list[dict], prompts: dict[str, dict], engine_factory, role: str) -> dict[str, float]:
    """Minos' perturbation checks on one split: write the perturbed items under <output_uri>/perturb/<split>/
    (prompts, candidates, gold: the original's gold score on each perturbed item), re-judge them with the same
    core and compare with the gold and with the judge's own unperturbed judgments (`judged`)."""
    pcfg = cfg.meta_eval.perturbation
    cands_table, cands_m = read_dataset(storage.join(gold_base, "candidates"), "candidate")
    candidates = {c["candidate_id"]: c for c in cands_table.to_pylist()}
    ps = perturbation.perturb(gold, prompts, candidates, pcfg.items, pcfg.span_fraction, pcfg.seed)
    root = storage.join(output_uri, "perturb", split)
    uri = {part: storage.join(root, part) for part in ("prompts", "candidates", "gold", "judged")}
    upstream = [read_dataset(storage.join(gold_base, part))[1] for part in ("judgments", "prompts")] + [cands_m]
    h = config_hash(pcfg)
    for part, kind, rows in (("prompts", "prompt", ps.prompts), ("candidates", "candidate", ps.candidates),
                             ("gold", "judgment", ps.gold)):
        write_dataset(uri[part], kind, rows, config_hash=h, producer=f"meta-eval-perturb-{split}",
                      upstream=upstream, limits=cfg.limits)
    n = {c: sum(i.check == c for i in ps.items) for c in perturbation.CHECKS}
    log.info("meta-eval %s perturbation checks: %d image-swapped, %d span-replaced items (%s skipped) → %s", split,
             n[perturbation.IMAGE_SWAP], n[perturbation.SPAN_SWAP], dict(ps.skipped) or "none", root)
    if not ps.items:  # metrics still reported, as n 0 and NaN
        return {f"perturb/{k}": v for k, v in perturbation.score(ps, {}, {}).items()}
    run_stage(f"meta-eval-perturb-{split}", inputs=[uri["gold"], uri["prompts"], uri["candidates"]],
              output=uri["judged"], kind="judgment",
              core_factory=lambda: MetaEvalCore(cfg, uri["prompts"], uri["candidates"], engine_factory(), role),
              resources=cfg.resources.labeling, batch_size=cfg.judgments.batch_size,
              stage_hash=cfg.stage_hash(f"meta-eval-{role}"), limits=cfg.limits, tracker=None)
    after = read_dataset(uri["judged"])[0].to_pylist()
    out = perturbation.score(ps, _scores([i.original for i in ps.items], judged), _scores(ps.gold, after))
    g = lambda k: out.get(k, float("nan"))  # noqa: E731
    log.info("meta-eval %s perturbation: image swap Kendall tau-b %.3f → %.3f (drop %.3f, n=%d); span swap "
             "scored lower %.1f%%, equal %.1f%%, higher %.1f%%, failed %.1f%% (n=%d)", split,
             g("image_swap/unperturbed/pointwise/kendall_tau_b"), g("image_swap/pointwise/kendall_tau_b"),
             g("image_swap/drop/kendall_tau_b"), g("image_swap/pointwise/n"), 100 * g("span_swap/lower_share"),
             100 * g("span_swap/equal_share"), 100 * g("span_swap/higher_share"),
             100 * (g("span_swap/parse_failure_rate") + g("span_swap/baseline_parse_failure_rate")),
             g("span_swap/n"))
    return {f"perturb/{k}": v for k, v in out.items()}


def run(cfg: Config, gold_uri: str, output_uri: str, role: str = "judge", engine_factory=None,
        tracker: Any = None) -> dict[str, dict[str, float]]:
    """Re-judge each split's gold items with the `role` engine and score them; returns split -> metrics."""
    results: dict[str, dict[str, float]] = {}
    split_cfg = cfg.world.suites.split
    for split in SPLITS:
        base = storage.join(gold_uri, split)
        if not storage.exists(storage.join(base, "judgments", "manifest.json")):
            log.info("meta-eval: no gold for %s at %s; skipped", split, base)
            continue
        inputs = _inputs(base)
        _, prompts_uri, cands_uri = inputs
        factory = engine_factory or (lambda: None)
        out_uri = storage.join(output_uri, split)
        run_stage(f"meta-eval-{split}", inputs=inputs, output=out_uri, kind="judgment",
                  core_factory=lambda: MetaEvalCore(cfg, prompts_uri, cands_uri, factory(), role),
                  resources=cfg.resources.labeling, batch_size=cfg.judgments.batch_size,
                  stage_hash=cfg.stage_hash(f"meta-eval-{role}"), limits=cfg.limits, tracker=None)
        gold, prompts = _gold(base)
        judged = read_dataset(out_uri)[0].to_pylist()
        results[split] = score_split(gold, judged, prompts, set(split_cfg.ood_aspects), set(split_cfg.ood_subtasks),
                                     tuple(cfg.meta_eval.protocols))
        log.info("meta-eval %s: ranking accuracy %.3f, pairwise accuracy %.3f, Kendall tau-b %.3f", split,
                 results[split].get("all/pointwise_ranking/accuracy", float("nan")),
                 results[split].get("all/pairwise/accuracy", float("nan")),
                 results[split].get("all/pointwise/kendall_tau_b", float("nan")))
        if cfg.meta_eval.perturbation.enabled and "pointwise" in cfg.meta_eval.protocols:  # pointwise items only
            results[split] |= perturbation_checks(cfg, split, base, output_uri, gold, judged, prompts, factory,
                                                  role)
    if tracker is not None:
        import mlflow

        mlflow.log_metrics({f"{s}/{k}": v for s, m in results.items() for k, v in m.items() if v == v})
        mlflow.log_dict(results, "meta_eval/metrics.json")
    return results

