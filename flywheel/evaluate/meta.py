"""Judge meta-evaluation: a judge re-judges exactly the gold items of each split; its judgments are scored
against the gold (flywheel/evaluate/metrics.py).

Reported apart, as FRABench does: in-distribution (id-test), task generalization (ood-test items on unseen
sub-tasks judged on seen aspects or overall) and aspect generalization (ood-test items on an unseen aspect);
and per task category and sub-task (`task/iu/...`, `subtask/iu_caption/...`: where the judge fails). Pairwise
gold items are re-judged in both orders, so accuracy requires a verdict that survives the swap and the
position-bias rate is measured.

With Minos' perturbation checks (flywheel/evaluate/perturbation.py, `meta_eval.perturbation`), perturbed copies
of sampled pointwise gold items (images swapped between items; 25% of a response's word spans replaced) are
written under <output>/perturb/<split>/ first; their metrics join the split's as "perturb/...".

The judging runs as one Ray Data stage per judge (one pure core over the gold judgment rows of every split and
perturbed copy), so a 7B judge is placed on GPU actors like any labeling stage and loaded once; each split's
judged rows are then written apart (<output>/<split>, <output>/perturb/<split>/judged).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flywheel import storage
from flywheel.config import Config
from flywheel.datasets import ManifestMismatch, read_dataset, read_manifest, write_dataset
from flywheel.engines import TextRequest, make_text_engine
from flywheel.evaluate import metric_names, perturbation
from flywheel.evaluate.metrics import (PairItem, PointItem, one_verdict_metrics, pair_correct, pairwise_metrics,
                                      pointwise_metrics)
from flywheel.judge import claim_split, claims, pairwise, pointwise
from flywheel.judge.base import error_fields
from flywheel.records import config_hash
from flywheel.stages.runner import CoreOutput, run_stage, up_to_date
from flywheel.worlds.shapes.claims import claim_context, claim_texts  # the world's claim splitter and context
from flywheel.worlds.shapes.teacher import make_context  # ground truth for the oracle; models ignore it

log = logging.getLogger(__name__)
SPLITS = ("id-test", "ood-test")


class MetaEvalCore:
    """Gold judgment rows in → the judge's judgment rows for the same items (pointwise once, pairwise AB and BA;
    with meta_eval.protocols' claims, a row per claim of a description's pointwise item, split as
    judgments.claim_splitter says: by the world's parser, or by the judge itself first)."""

    def __init__(self, cfg: Config, prompts_uri: str | list[str], candidates_uri: str | list[str], engine=None,
                 role: str = "judge"):
        self.engine = engine or make_text_engine(cfg, role)
        self.prompts = _by_id(prompts_uri, "prompt")
        self.candidates = _by_id(candidates_uri, "candidate")
        self.judge = f"{self.engine.name}@{self.engine.version}"
        self.style = cfg.judge.prompt_style
        self.readout = cfg.judge.rating_readout
        self.protocols = set(cfg.meta_eval.protocols)
        self.claim_subtasks = set(cfg.judgments.claim_subtasks)
        self.splitter = cfg.judgments.claim_splitter
        self.claim_images = cfg.judgments.claim_images
        self.claim_context = claim_context(cfg.judgments.claim_context)
        self.seed = cfg.run.seed  # the labels stage's seed: a sampling judge (judge.samples) draws as it does there

    def __call__(self, gold_rows: list[dict]) -> CoreOutput:
        jobs: list[tuple[dict, str | claims.ClaimCheck | None, TextRequest]] = []
        out = CoreOutput()
        to_check = [g for g in gold_rows if self._checks_claims(g)]  # gold id -> how its texts split into claims
        splits = (self._splits(to_check, out) if self.splitter == "judge"
                  else {g["judgment_id"]: claim_texts for g in to_check})
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
            if g["judgment_id"] in splits:
                for check in claims.checks(prompt, cands[0], splits[g["judgment_id"]], style=self.style,
                                            with_images=self.claim_images, context=self.claim_context):
                    check.request.context = make_context("claims", prompt, cands, claim=check.claim,
                                                         against=check.against)
                    jobs.append((g, check, check.request))
        results = self.engine.generate([r for _, _, r in jobs], seed=self.seed)
        for (g, order, _), res in zip(jobs, results, strict=True):
            if not res.ok:
                out.quarantined.append({"kind": "judgment", "index": 0, "reason": f"judge: {res.error}",
                                        "field": "raw_output", "raw": {"gold": g["judgment_id"], "order": order}})
                continue
            protocol, raw = g["protocol"], res.text
            if isinstance(order, claims.ClaimCheck):  # a claim row: its own protocol, its raw output headed
                check, order = order, None
                protocol, raw, fields = claims.NAME, claims.raw_output(check, res.text), claims.fields(
                    check, res, self.readout)
            elif order is None:
                fields = pointwise.result_fields(res, self.readout)
            else:
                fields = pairwise.result_fields(res, order, self.readout)
            out.rows.append(self._row(g, protocol, order, raw, fields))
        return out

    def _row(self, g: dict, protocol: str, order: str | None, raw: str, fields: dict) -> dict:
        return {"prompt_id": g["prompt_id"], "candidate_ids": g["candidate_ids"], "judge": self.judge,
                "protocol": protocol, "aspect": g["aspect"], "order": order, "sample_k": 0, "raw_output": raw,
                **fields}

    def _checks_claims(self, g: dict) -> bool:
        """Whether a gold item's candidate is also claim-checked (a description's overall pointwise item)."""
        prompt = self.prompts[g["prompt_id"]]
        return (g["protocol"] == "pointwise" and g["aspect"] is None and "claims" in self.protocols
                and prompt.get("subtask") in self.claim_subtasks
                and not _perturbed(prompt, self.candidates[g["candidate_ids"][0]]))

    def _splits(self, items: list[dict], out: CoreOutput) -> dict[str, Callable[[str], list[str]]]:
        """judgments.claim_splitter judge: the judge lists the claims of each prompt's reference and each response
        first (one batch, each distinct text of a prompt once). Gold id -> its split; an item whose list did not
        parse gets a claims row with the parse error instead (its candidate's claims fail, as in the judgments
        stage), one the engine failed on is quarantined."""
        sides_of = {g["judgment_id"]: claim_split.sides(self.prompts[g["prompt_id"]],
                                                        self.candidates[g["candidate_ids"][0]]) for g in items}
        asked: dict[tuple[str, str], TextRequest] = {}
        for g in items:
            for _, text in sides_of[g["judgment_id"]]:
                if (g["prompt_id"], text) not in asked:
                    req = claim_split.build(text, style=self.style)
                    req.context = make_context("claims", self.prompts[g["prompt_id"]], step="split", text=text)
                    asked[(g["prompt_id"], text)] = req
        results = dict(zip(asked, self.engine.generate(list(asked.values()), seed=self.seed), strict=True))
        splits = {}
        for g in items:
            text_sides = sides_of[g["judgment_id"]]
            got = claim_split.read(text_sides, {t: results[(g["prompt_id"], t)] for _, t in text_sides})
            if got.engine_error:
                out.quarantined.append({"kind": "judgment", "index": 0, "field": "raw_output",
                                        "reason": f"judge: splitting {got.engine_error}",
                                        "raw": {"gold": g["judgment_id"], "order": None}})
            elif got.unparsed:
                out.rows.append(self._row(g, claims.NAME, None, got.unparsed.raw, error_fields(got.unparsed)))
            else:
                splits[g["judgment_id"]] = lambda t, m=got.claims: m.get(t, [])
        return splits


def _by_id(uris: str | list[str], kind: str) -> dict[str, dict]:
    uris = [uris] if isinstance(uris, str) else uris
    return {r[f"{kind}_id"]: r for uri in uris for r in read_dataset(uri, kind)[0].to_pylist()}


def _perturbed(prompt: dict, candidate: dict) -> bool:
    """A perturbation check's copy: its metrics read the pointwise rating alone, so claim-checking it is waste."""
    return any("perturbation" in perturbation.meta_of(r) for r in (prompt, candidate))


def item_key(row: dict) -> tuple:
    """The gold item a judged row answers: a claim check answers its candidate's pointwise item."""
    protocol = "pointwise" if row["protocol"] == claims.NAME else row["protocol"]
    return row["prompt_id"], tuple(row["candidate_ids"]), protocol, row["aspect"]


# name -> (points, pairs, ranked, balanced): pointwise items, pairwise verdicts in both orders, pairs ordered by
# the pointwise ratings, and pairs given one verdict from both orders' probabilities (pairwise.balanced_verdict)
Slices = dict[str, tuple[list[PointItem], list[PairItem], list[PairItem], list[PairItem]]]


def _slices(gold: list[dict], judged: list[dict], prompts: dict[str, dict], unseen_aspects: set[str],
            ood_subtasks: set[str], protocols: tuple[str, ...]) -> Slices:
    """The scored items of each slice (all, per task category and sub-task, per generalization), keyed by gold
    judgment id: one code path for the metrics and for the per-pair outcomes a paired gate test compares."""
    by_key: dict[tuple, dict[str | None, dict]] = defaultdict(dict)
    for j in judged:
        if j["protocol"] != claims.NAME:
            by_key[item_key(j)][j["order"]] = j
    rating = {(j["prompt_id"], j["candidate_ids"][0]): j["score"] if j["parse_error"] is None else None
              for j in judged if j["protocol"] == "pointwise" and j["aspect"] is None}
    if "claims" in protocols:  # a description with claim checks is rated by them (as the preference stage does)
        rating |= claims.candidate_scores(judged)
    slices: Slices = defaultdict(lambda: ([], [], [], []))
    for g in gold:
        names = _slice_names(g, prompts[g["prompt_id"]], unseen_aspects, ood_subtasks)
        mine = by_key.get(item_key(g), {})
        key = g["judgment_id"]
        ab, ba = mine.get("AB"), mine.get("BA")
        # once per gold pair, not per slice: each order's probabilities are JSON to parse
        one_verdict = pairwise.balanced_verdict(_probs(ab), _probs(ba)) if g["protocol"] == "pairwise" else None
        for name in names:
            points, pairs, ranked, balanced = slices[name]
            if g["protocol"] == "pointwise" and g["score"] is not None and "pointwise" in protocols:
                got = mine.get(None)
                points.append(PointItem(key, g["score"], got["score"] if got and got["parse_error"] is None else None))
            elif g["protocol"] == "pairwise" and g["verdict"] in ("A", "B"):
                if "pairwise" in protocols:
                    pairs.append(PairItem(key, g["verdict"], ab["verdict"] if ab and not ab["parse_error"] else None,
                                          ba["verdict"] if ba and not ba["parse_error"] else None))
                    balanced.append(PairItem(key, g["verdict"], one_verdict))
                if g["aspect"] is None and "pointwise" in protocols:
                    a, b = (rating.get((g["prompt_id"], c)) for c in g["candidate_ids"])
                    verdict = None if a is None or b is None else "A" if a > b else "B" if b > a else "tie"
                    ranked.append(PairItem(key, g["verdict"], verdict))
    return slices


def _slice_names(g: dict, p: dict, unseen_aspects: set[str], ood_subtasks: set[str]) -> list[str]:
    """The slices a gold item counts in: all, its task category and sub-task, and its generalization."""
    names = ["all", f"task/{p['task']}", *([metric_names.SUBTASK + p["subtask"]] if p["subtask"] else [])]
    if p["subtask"] in ood_subtasks:
        names.append("aspect_generalization" if g["aspect"] in unseen_aspects else "task_generalization")
    return names


def claim_metrics(gold: list[dict], judged: list[dict], prompts: dict[str, dict], unseen_aspects: set[str],
                   ood_subtasks: set[str]) -> dict[str, float]:
    """`<slice>/claims/<metric>` where the gold has claim checks (world.gold.protocols with claims): each gold
    claim against the judge's check of the same claim of the same candidate, scored as pointwise items (exact: the
    judge's nearest rating is gold's). A claim the judge did not check, or whose check did not parse, fails."""
    if not any(g["protocol"] == claims.NAME for g in gold):
        return {}
    mine = {(j["prompt_id"], j["candidate_ids"][0], claims.header(j.get("raw_output"))): j
            for j in judged if j["protocol"] == claims.NAME}
    items: dict[str, list[PointItem]] = defaultdict(list)
    for g in gold:
        if g["protocol"] != claims.NAME or g["score"] is None:
            continue
        j = mine.get((g["prompt_id"], g["candidate_ids"][0], claims.header(g["raw_output"])))
        got = j["score"] if j and j["parse_error"] is None else None
        for name in _slice_names(g, prompts[g["prompt_id"]], unseen_aspects, ood_subtasks):
            items[name].append(PointItem(g["judgment_id"], g["score"], got))
    return {f"{name}/claims/{k}": v for name, pts in sorted(items.items()) for k, v in pointwise_metrics(pts).items()}


def _probs(row: dict | None) -> dict[str, float] | None:
    """A judged pairwise row's verdict probabilities as emitted (parsed.verdict_probs), if it recorded them; its
    `parsed` is JSON text as stored (flywheel/records.py), or a dict as judged."""
    if not row or row["parse_error"] is not None or not row.get("parsed"):
        return None
    parsed = row["parsed"] if isinstance(row["parsed"], dict) else json.loads(row["parsed"])
    return parsed.get("verdict_probs")


def score_split(gold: list[dict], judged: list[dict], prompts: dict[str, dict], unseen_aspects: set[str],
                ood_subtasks: set[str], protocols: tuple[str, ...] = ("pointwise", "pairwise")) -> dict[str, float]:
    """Metrics of one split's judge judgments vs its gold, overall, per task category and sub-task and per
    generalization.

    Besides the pairwise protocol's accuracy, `<slice>/pointwise_ranking/accuracy` scores each overall gold pair
    by the judge's two pointwise ratings (higher wins; equal ratings or a failed parse count wrong): the way the
    flywheel's preference stage uses the judge, so it predicts the quality of the pairs it makes. `protocols`:
    those the judge was asked in (meta_eval.protocols); a protocol left out has no metrics, not zeros."""
    out: dict[str, float] = {}
    for name, (points, pairs, ranked, balanced) in sorted(_slices(gold, judged, prompts, unseen_aspects, ood_subtasks,
                                                        protocols).items()):
        if points:
            out |= {f"{name}/pointwise/{k}": v for k, v in pointwise_metrics(points).items()}
        if pairs:
            out |= {f"{name}/pairwise/{k}": v for k, v in pairwise_metrics(pairs).items()}
        if ranked:
            out |= {f"{name}/pointwise_ranking/{k}": v for k, v in one_verdict_metrics(ranked).items()}
        if any(i.verdict_ab is not None for i in balanced):  # only a judge read with its probabilities has these
            out |= {f"{name}/pairwise_balanced/{k}": v for k, v in one_verdict_metrics(balanced).items()}
    if claims.NAME in protocols:
        out |= claim_metrics(gold, judged, prompts, unseen_aspects, ood_subtasks)
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
    # every protocol: the metric exists only if its own was asked, asking another changes none of its items, and
    # claim rows, where the judge was asked for them, rate their candidates as score_split did
    slices = _slices(gold, judged, prompts, unseen_aspects, ood_subtasks, ("pointwise", "pairwise", claims.NAME))
    _, pairs, ranked, balanced = slices.get(slice_name, ([], [], [], []))
    items = {"pairwise": pairs, "pointwise_ranking": ranked, "pairwise_balanced": balanced}[protocol]
    return {i.key: pair_correct(i) for i in items}


class OutcomesUnavailable(LookupError):
    """A judge's per-pair outcomes cannot be recomputed from storage; the message says why."""


def _inputs(gold_base: str) -> list[str]:
    """A split's meta-eval stage inputs, in the order its output's manifest records them as upstream."""
    return [storage.join(gold_base, part) for part in ("judgments", "prompts", "candidates")]


def read_gold(gold_base: str) -> tuple[list[dict], dict[str, dict]]:
    """A split's gold items meta-eval scores (pointwise, pairwise and claim checks) and its prompts by id."""
    gold = [g for g in read_dataset(storage.join(gold_base, "judgments"))[0].to_pylist()
            if g["protocol"] in ("pointwise", "pairwise", claims.NAME)]
    prompts = {r["prompt_id"]: r for r in read_dataset(storage.join(gold_base, "prompts"))[0].to_pylist()}
    return gold, prompts


def stored_outcomes(cfg: Config, gold_uri: str, output_uri: str, metric: str) -> dict[str, bool]:
    """pair_outcomes of `metric` (`<split>/<name>`, as gate.judge_metric) for the judge whose meta-eval wrote
    its judged rows under `output_uri`, recomputed from storage against the gold under `gold_uri`. Raises
    OutcomesUnavailable when the rows are gone or the gold is no longer the one they were judged against."""
    split, name = metric_names.split_of(metric)
    table = judged_against(gold_uri, output_uri, split)
    base = storage.join(gold_uri, split)
    try:
        gold, prompts = read_gold(base)
    except (FileNotFoundError, ManifestMismatch) as e:
        raise OutcomesUnavailable(f"cannot read the gold at {base}: {e}") from e
    s = cfg.world.suites.split
    return pair_outcomes(name, gold, table.to_pylist(), prompts, set(s.ood_aspects), set(s.ood_subtasks))


def judged_against(gold_uri: str, output_uri: str, split: str) -> pa.Table:
    """A split's judged rows under `output_uri`, if they were judged against the gold now under `gold_uri`; raises
    OutcomesUnavailable when they are gone or the gold changed since."""
    base, judged_uri = storage.join(gold_uri, split), storage.join(output_uri, split)
    try:
        table, manifest = read_dataset(judged_uri)
        gold_hashes = [read_manifest(uri).content_hash for uri in _inputs(base)]
    except (FileNotFoundError, ManifestMismatch) as e:  # FileNotFoundError covers a missing manifest
        raise OutcomesUnavailable(f"cannot read the meta-eval at {judged_uri}: {e}") from e
    # the gold's three manifests lead the judged rows' upstream (judge_parts adds the combined stage's output)
    if [u.content_hash for u in manifest.upstream][:len(gold_hashes)] != gold_hashes:
        raise OutcomesUnavailable(f"the gold at {base} changed since {judged_uri} was judged")
    return table


def _scores(gold: list[dict], judged: list[dict]) -> dict[str, float | None]:
    """Gold judgment id -> the judge's pointwise score of that item (None: unparsed, or not judged at all)."""
    by_key = {item_key(j): j for j in judged if j["order"] is None and j["protocol"] != claims.NAME}
    out: dict[str, float | None] = {}
    for g in gold:
        j = by_key.get(item_key(g))
        out[g["judgment_id"]] = j["score"] if j is not None and j["parse_error"] is None else None
    return out


@dataclass
class _Part:
    """One set of gold items a meta-eval judges: a split's, or its perturbed copies'."""
    name: str
    inputs: list[str]  # gold judgments, prompts, candidates
    output: str  # where its judged rows go


def write_perturbed(cfg: Config, split: str, gold_base: str, output_uri: str, gold: list[dict],
                    prompts: dict[str, dict]) -> tuple[perturbation.PerturbedSet, _Part]:
    """Minos' perturbation checks on one split, first half: write the perturbed items under
    <output_uri>/perturb/<split>/ (prompts, candidates, gold: the original's gold score on each perturbed item)."""
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
    return ps, _Part(f"perturb-{split}", [uri["gold"], uri["prompts"], uri["candidates"]], uri["judged"])


def score_perturbed(split: str, ps: perturbation.PerturbedSet, judged: list[dict],
                    perturbed_judged: list[dict]) -> dict[str, float]:
    """Second half: compare the judge's judgments of the perturbed items with the gold and with its own
    judgments of the originals (`judged`)."""
    if not ps.items:  # metrics still reported, as n 0 and NaN
        return {f"perturb/{k}": v for k, v in perturbation.score(ps, {}, {}).items()}
    out = perturbation.score(ps, _scores([i.original for i in ps.items], judged), _scores(ps.gold, perturbed_judged))
    g = lambda k: out.get(k, float("nan"))  # noqa: E731
    log.info("meta-eval %s perturbation: image swap Kendall tau-b %.3f → %.3f (drop %.3f, n=%d); span swap "
             "scored lower %.1f%%, equal %.1f%%, higher %.1f%%, failed %.1f%% (n=%d)", split,
             g("image_swap/unperturbed/pointwise/kendall_tau_b"), g("image_swap/pointwise/kendall_tau_b"),
             g("image_swap/drop/kendall_tau_b"), g("image_swap/pointwise/n"), 100 * g("span_swap/lower_share"),
             100 * g("span_swap/equal_share"), 100 * g("span_swap/higher_share"),
             100 * (g("span_swap/parse_failure_rate") + g("span_swap/baseline_parse_failure_rate")),
             g("span_swap/n"))
    return {f"perturb/{k}": v for k, v in out.items()}


def judge_parts(cfg: Config, parts: list[_Part], output_uri: str, role: str, engine_factory) -> dict[str, list]:
    """Judge every part's gold items in one Ray Data stage (`meta-eval-<role>`, output <output_uri>/judged), then
    write each part's judged rows to its own output, upstream its gold inputs and the combined output. Why one
    stage: each stage starts its actors and loads the judge again, ~8 s here, which four stages per judge (two
    splits, each with its perturbed copies) paid four times. Returns part name -> its judged rows."""
    stage_hash = cfg.stage_hash(f"meta-eval-{role}")
    gold = {part.name: read_dataset(part.inputs[0], "judgment")[0].to_pylist() for part in parts}
    inputs = {part.name: [read_manifest(u) for u in part.inputs] for part in parts}
    todo = storage.join(output_uri, "to-judge")
    todo_upstream = [m for part in parts for m in inputs[part.name]]
    if up_to_date(todo, stage_hash, todo_upstream) is None:  # its rows are its upstream's: same hashes, same rows
        write_dataset(todo, "judgment", [g for part in parts for g in gold[part.name]], config_hash=stage_hash,
                      producer=f"meta-eval-{role}", upstream=todo_upstream, limits=cfg.limits)
    prompts, candidates = [p.inputs[1] for p in parts], [p.inputs[2] for p in parts]
    judged_uri = storage.join(output_uri, "judged")
    combined = run_stage(f"meta-eval-{role}", inputs=[todo, *prompts, *candidates], output=judged_uri,
                         kind="judgment", resources=cfg.resources.labeling, batch_size=cfg.judgments.batch_size,
                         core_factory=lambda: MetaEvalCore(cfg, prompts, candidates, engine_factory(), role),
                         stage_hash=stage_hash, limits=cfg.limits, tracker=None).manifest
    judged = read_dataset(judged_uri)[0].to_pylist()
    out = {}
    for part in parts:
        upstream = [*inputs[part.name], combined]
        keys = {item_key(g) for g in gold[part.name]}
        out[part.name] = [j for j in judged if item_key(j) in keys]
        if up_to_date(part.output, stage_hash, upstream) is None:
            write_dataset(part.output, "judgment", out[part.name], config_hash=stage_hash,
                          producer=f"meta-eval-{role}-{part.name}", upstream=upstream, limits=cfg.limits)
    return out


def run(cfg: Config, gold_uri: str, output_uri: str, role: str = "judge", engine_factory=None,
        tracker: Any = None) -> dict[str, dict[str, float]]:
    """Re-judge each split's gold items (and their perturbed copies) with the `role` engine and score them; returns
    split -> metrics. Each split's judged rows are at <output_uri>/<split>, its perturbed ones' at
    <output_uri>/perturb/<split>/judged."""
    results: dict[str, dict[str, float]] = {}
    split_cfg = cfg.world.suites.split
    unseen, ood = set(split_cfg.ood_aspects), set(split_cfg.ood_subtasks)
    perturb = cfg.meta_eval.perturbation.enabled and "pointwise" in cfg.meta_eval.protocols  # pointwise items only
    parts: list[_Part] = []
    splits: dict[str, tuple] = {}
    for split in SPLITS:
        base = storage.join(gold_uri, split)
        if not storage.exists(storage.join(base, "judgments", "manifest.json")):
            log.info("meta-eval: no gold for %s at %s; skipped", split, base)
            continue
        gold, prompts = read_gold(base)
        parts.append(_Part(split, _inputs(base), storage.join(output_uri, split)))
        ps = None
        if perturb:
            ps, part = write_perturbed(cfg, split, base, output_uri, gold, prompts)
            if ps.items:
                parts.append(part)
        splits[split] = gold, prompts, ps
    judged = judge_parts(cfg, parts, output_uri, role, engine_factory or (lambda: None)) if parts else {}
    for split, (gold, prompts, ps) in splits.items():
        results[split] = score_split(gold, judged[split], prompts, unseen, ood, tuple(cfg.meta_eval.protocols))
        log.info("meta-eval %s: ranking accuracy %.3f, pairwise accuracy %.3f, Kendall tau-b %.3f", split,
                 results[split].get("all/pointwise_ranking/accuracy", float("nan")),
                 results[split].get("all/pairwise/accuracy", float("nan")),
                 results[split].get("all/pointwise/kendall_tau_b", float("nan")))
        if ps is not None:
            results[split] |= score_perturbed(split, ps, judged[split], judged.get(f"perturb-{split}", []))
    if tracker is not None:
        import mlflow

        mlflow.log_metrics({f"{s}/{k}": v for s, m in results.items() for k, v in m.items() if v == v})
        mlflow.log_dict(results, "meta_eval/metrics.json")
    return results

