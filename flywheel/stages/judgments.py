"""Judgments: every candidate judged by the teacher (or a judge model) with the protocols its task is configured
for, k samples per item, multi-step protocols orchestrated, every output parsed strictly.

Per task (config `judgments.protocols`):
  pointwise   one request per candidate -> "Analysis / Rating"
  pairwise    pairs of a prompt's candidates (a seeded choice of `max_pairs_per_prompt`), overall or per aspect,
              each shown in both orders (AB, BA); rows keep candidate_ids in the AB frame
  aspects     UFEval: aspects selected from the tree (limited to the prompt's `aspects`, so aspects withheld from a
              split stay withheld), then one request for the universal group (no query) and one for the task group
  rubric      UEval: a rubric drafted from query + reference once per (prompt, k), then every candidate graded on
              it (all items in one request, or one per item); rows carry the rubric in parsed["rubric"]
  decomposed  T2I: extraction from the prompt once per (prompt, k) -> caption + answers from each image without
              the prompt -> explanations and scores; rows hold the three steps' outputs (raw) and the judgment
  claims      RLAIF-V: a description (judgments.claim_subtasks) split into claims (by the world's parser, or by
              the engine first: judgments.claim_splitter), each checked in its own request against the reference
              and the reference's against it; one row per claim (parsed names it)
An output that does not parse is kept with its raw text and the reason (`parse_error`, prefixed with the step for
multi-step protocols) - never coerced; a request the engine fails on, or that cannot be built, is quarantined
with its reason (there is no output to keep), and so is a row identical to an earlier one (same content hash:
e.g. a random judge's same text for both aspect groups of a candidate). Each row records its judge
(engine name@version).

`JudgmentsCore` is the pure core (any TextEngine: the oracle teacher, or a model judge through hf); requests
carry the ground truth in `context` for the oracle, which model backends ignore. The core drives every item as
a small coroutine so each protocol step of a whole batch goes to the engine in one call.
`run` places it on Ray Data (resources.labeling), mapping over prompts: each actor loads the candidates dataset
once and groups it by prompt_id - fine at this scale (thousands of candidates); a cluster-scale run would join
prompts and candidates in Ray Data instead.
"""
from __future__ import annotations

import hashlib
import logging
from collections import Counter, defaultdict
from collections.abc import Generator, Iterable, Mapping
from itertools import combinations
from typing import Any

import numpy as np

from flywheel.data_view import ReasonGroups
from flywheel.aspects import AspectTree, Selection
from flywheel.config import Config, JudgmentsConfig
from flywheel.engines.base import TextEngine, TextRequest, TextResult
from flywheel.judge import aspects as ap
from flywheel.judge import claim_split as cs
from flywheel.judge import claims as cl
from flywheel.judge import decomposed as dc
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.judge import rubric as rb
from flywheel.judge.base import ParseError, error_fields
from flywheel.records import make_id
from flywheel.stages.runner import CoreOutput, StageResult, run_stage
from flywheel.worlds.shapes.claims import claim_context, claim_texts  # the world's claim splitter and context
from flywheel.worlds.shapes.teacher import make_context

log = logging.getLogger(__name__)
Item = Generator[list[TextRequest], list[TextResult], list[dict]]
ROLES = ("teacher", "judge")


def group_candidates(candidates: Iterable[dict]) -> dict[str, list[dict]]:
    """prompt_id -> its candidates, ordered by (sample_index, candidate_id)."""
    by: dict[str, list[dict]] = defaultdict(list)
    for c in candidates:
        by[c["prompt_id"]].append(c)
    for rows in by.values():
        rows.sort(key=lambda c: (c.get("sample_index") or 0, c.get("candidate_id") or ""))
    return dict(by)


def select_aspects(tree: AspectTree, prompt: dict, candidate: dict) -> Selection:
    """UFEval step 1 for a candidate, limited to the prompt's `aspects` (when it has any): an aspect withheld
    from a split (FRABench's unseen aspects) is never judged on that split's prompts."""
    sel = ap.select(tree, prompt, candidate)
    allowed = prompt.get("aspects")
    if allowed is None or len(allowed) == 0:
        return sel
    keep = set(allowed)
    return Selection(sel.subtask, sel.output_modality, [a for a in sel.universal if a.name in keep],
                     [a for a in sel.task if a.name in keep])


def choose_pairs(candidates: list[dict], limit: int | None, seed: int, prompt_id: str) -> list[tuple[dict, dict]]:
    """Pairs (A, B) of candidates with different outputs, A the smaller candidate_id (the AB frame); a seeded
    choice of `limit` of them (None: all), so the same prompt always gets the same pairs. Two samples with the
    same output are never paired: their comparison is a tie by construction and teaches a judge nothing."""
    cs, seen = [], set()
    for c in sorted(candidates, key=lambda c: c["candidate_id"]):
        output = (c.get("output_text"), tuple(c.get("output_images") or ()))
        if output not in seen:
            seen.add(output)
            cs.append(c)
    pairs = list(combinations(cs, 2))
    if limit is None or len(pairs) <= limit:
        return pairs
    h = hashlib.sha256(f"pairs:{seed}:{prompt_id}".encode()).digest()
    order = np.random.default_rng(int.from_bytes(h[:8], "big")).permutation(len(pairs))
    return [pairs[i] for i in sorted(order[:limit])]


class JudgmentsCore:
    """prompts -> judgment rows. candidates: rows (or prompt_id -> rows), or read from candidates_uri."""

    def __init__(self, cfg: Config, candidates: Iterable[dict] | Mapping[str, list[dict]] | None = None, *,
                 candidates_uri: str | None = None, engine: TextEngine | None = None, role: str = "teacher",
                 judgments: JudgmentsConfig | None = None, tree: AspectTree | None = None):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.cfg, self.role = cfg, role
        self.jcfg = judgments or cfg.judgments
        self.style = cfg.judge.prompt_style
        self.readout = cfg.judge.rating_readout if role == "judge" else "text"  # the teacher's rating is its label
        if candidates is None:
            if candidates_uri is None:
                raise ValueError("JudgmentsCore needs candidates or candidates_uri")
            from flywheel.datasets import read_rows

            candidates = read_rows(candidates_uri, "candidate")
        self.by_prompt = ({k: list(v) for k, v in candidates.items()} if isinstance(candidates, Mapping)
                          else group_candidates(candidates))
        self._engine = engine
        self.tree = tree or AspectTree.load()

    @property
    def engine(self) -> TextEngine:
        if self._engine is None:
            from flywheel.engines import make_text_engine

            self._engine = make_text_engine(self.cfg, self.role)
        return self._engine

    @property
    def judge(self) -> str:
        return f"{self.engine.name}@{self.engine.version}"

    # ---- driving
    def __call__(self, prompts: list[dict]) -> CoreOutput:
        out = CoreOutput()
        before = self._engine.counters() if self._engine is not None else {}  # the engine is loaded on first use
        items: list[Item] = []
        for i, p in enumerate(prompts):
            cands = self.by_prompt.get(p["prompt_id"], [])
            for proto in self.jcfg.protocols.get(p["task"], []):
                if not cands:
                    break
                for k in range(self.jcfg.samples_per_item):
                    items.extend(self._items(proto, i, p, cands, k, out))
        rows = self._drive(items)
        index = {p["prompt_id"]: i for i, p in enumerate(prompts)}
        seen = set()
        for r in rows:
            rid = make_id("judgment", r)
            if rid in seen:  # e.g. one garbage text answering both aspect groups: one record, the copy counted
                out.quarantined.append({"kind": "judgment", "index": index[r["prompt_id"]], "field": "judgment_id",
                                        "reason": f"{r['protocol']} sample {r['sample_k']}: duplicate of {rid} "
                                                  "(same judge, input and raw output)", "raw": r})
                continue
            seen.add(rid)
            out.rows.append(r)
        after = self._engine.counters() if self._engine is not None else {}
        out.counters = {k: v - before.get(k, 0.0) for k, v in after.items()}
        return out

    def _drive(self, items: list[Item]) -> list[dict]:
        rows: list[dict] = []
        pending: list[tuple[Item, list[TextRequest]]] = []

        def advance(item: Item, results: list[TextResult] | None) -> None:
            try:
                reqs = next(item) if results is None else item.send(results)
            except StopIteration as stop:
                rows.extend(stop.value or [])
                return
            pending.append((item, reqs))

        for it in items:
            advance(it, None)
        while pending:
            batch, pending = pending, []
            flat = [r for _, reqs in batch for r in reqs]
            results = self.engine.generate(flat, seed=self.cfg.run.seed) if flat else []
            if len(results) != len(flat):
                raise RuntimeError(f"engine returned {len(results)} results for {len(flat)} requests")
            at = 0
            for it, reqs in batch:
                advance(it, results[at:at + len(reqs)])
                at += len(reqs)
        return rows

    def _items(self, proto: str, i: int, p: dict, cands: list[dict], k: int, out: CoreOutput) -> list[Item]:
        if proto == "pointwise":
            return [self._pointwise(i, p, c, k, out) for c in cands]
        if proto == "aspects":
            return [self._aspects(i, p, c, k, out) for c in cands]
        if proto == "pairwise":
            return [self._pairwise(i, p, a, b, k, out)
                    for a, b in choose_pairs(cands, self.jcfg.max_pairs_per_prompt, self.cfg.run.seed,
                                             p["prompt_id"])]
        if proto == "rubric":
            return [self._rubric(i, p, cands, k, out)]
        if proto == "decomposed":
            return [self._decomposed(i, p, cands, k, out)]
        if proto == "claims":
            if p.get("subtask") not in self.jcfg.claim_subtasks:
                return []
            if self.jcfg.claim_splitter == "judge":
                return [self._claims_split_first(i, p, cands, k, out)]
            return [self._claims(i, p, c, k, out) for c in cands]
        raise ValueError(f"unknown protocol {proto!r}")

    # ---- rows and rejects
    def _row(self, p: dict, cands: list[dict], proto: str, k: int, raw: str, fields: dict, *,
             aspect: str | None = None, order: str | None = None) -> dict:
        return {"prompt_id": p["prompt_id"], "candidate_ids": [c["candidate_id"] for c in cands],
                "judge": self.judge, "protocol": proto, "aspect": aspect, "order": order, "sample_k": k,
                "raw_output": raw, **fields}

    @staticmethod
    def _reject(out: CoreOutput, i: int, p: dict, cands: list[dict], proto: str, k: int, reason: str,
                **extra: Any) -> None:
        out.quarantined.append({"kind": "judgment", "index": i, "reason": f"{proto} sample {k}: {reason}",
                                "field": "raw_output", "raw": {"prompt_id": p["prompt_id"], "protocol": proto,
                                                               "candidate_ids": [c["candidate_id"] for c in cands],
                                                               "sample_k": k, **extra}})

    @staticmethod
    def _with(req: TextRequest, **ctx: Any) -> TextRequest:
        req.context = make_context(**ctx)
        return req

    # ---- single-step protocols
    def _pointwise(self, i, p, c, k, out) -> Item:
        try:
            req = self._with(pt.build(p, c, style=self.style), protocol="pointwise", prompt=p, candidates=[c],
                             sample_k=k)
        except (ValueError, TypeError) as e:
            self._reject(out, i, p, [c], "pointwise", k, f"cannot build the request: {e}")
            return []
        (res,) = yield [req]
        if not res.ok:
            self._reject(out, i, p, [c], "pointwise", k, f"engine error: {res.error}")
            return []
        return [self._row(p, [c], "pointwise", k, res.text, pt.result_fields(res, self.readout))]

    def _pair_aspects(self, p: dict, a: dict) -> list[Any]:
        mode = self.jcfg.pairwise_aspects
        if mode == "overall":
            return [None]
        sel = select_aspects(self.tree, p, a)
        return list(sel.task) if mode == "task" else list(sel.universal) + list(sel.task)

    def _pairwise(self, i, p, a, b, k, out) -> Item:
        try:
            aspects = self._pair_aspects(p, a)
            jobs = []
            for aspect in aspects:
                for order in self.jcfg.pairwise_orders:
                    shown = [a, b] if order == "AB" else [b, a]
                    req = pw.build(p, shown[0], shown[1], aspect, style=self.style)
                    jobs.append((aspect, order, self._with(req, protocol="pairwise", prompt=p, candidates=shown,
                                                           sample_k=k, order=order,
                                                           aspect=None if aspect is None else aspect.name)))
        except (ValueError, TypeError) as e:
            self._reject(out, i, p, [a, b], "pairwise", k, f"cannot build the request: {e}")
            return []
        results = yield [j[2] for j in jobs]
        rows = []
        for (aspect, order, _), res in zip(jobs, results, strict=True):
            name = None if aspect is None else aspect.name
            if not res.ok:
                self._reject(out, i, p, [a, b], "pairwise", k, f"engine error: {res.error}", order=order, aspect=name)
                continue
            rows.append(self._row(p, [a, b], "pairwise", k, res.text,
                                  pw.result_fields(res, order, self.readout), aspect=name, order=order))
        return rows

    def _aspects(self, i, p, c, k, out) -> Item:
        try:
            sel = select_aspects(self.tree, p, c)
            reqs = ap.build(p, c, sel)
            jobs = [(g, self._with(r, protocol="aspects", prompt=p, candidates=[c], sample_k=k, group=g,
                                   aspects=ap.expected(sel, g))) for g, r in reqs.items()]
        except (ValueError, TypeError) as e:
            self._reject(out, i, p, [c], "aspects", k, f"cannot build the request: {e}")
            return []
        results = yield [r for _, r in jobs]
        rows = []
        for (g, _), res in zip(jobs, results, strict=True):
            if not res.ok:
                self._reject(out, i, p, [c], "aspects", k, f"engine error: {res.error}", group=g)
                continue
            rows.append(self._row(p, [c], "aspects", k, res.text,
                                  ap.to_judgment_fields(ap.parse(res.text, ap.expected(sel, g)), g)))
        return rows

    # ---- rubric (UEval)
    def _rubric(self, i, p, cands, k, out) -> Item:
        try:
            secs = rb.sections_for(p)
            req = self._with(rb.build_generate(p, secs), protocol="rubric", step="generate", prompt=p,
                             sample_k=k, sections=secs)
        except (ValueError, TypeError) as e:
            self._reject(out, i, p, cands, "rubric", k, f"cannot build the rubric request: {e}")
            return []
        (res,) = yield [req]
        if not res.ok:
            self._reject(out, i, p, cands, "rubric", k, f"engine error drafting the rubric: {res.error}")
            return []
        rubric = rb.parse_rubric(res.text, secs)
        if isinstance(rubric, ParseError):
            err = error_fields(ParseError(rubric.raw, f"rubric: {rubric.reason}"))
            return [self._row(p, [c], "rubric", k, res.text, err) for c in cands]
        parts = [rubric.ids] if self.jcfg.rubric_item_calls == "all" else [[x] for x in rubric.ids]
        jobs = []
        for c in cands:
            try:
                reqs = [self._with(rb.build_grade(p, c, rubric, ids), protocol="rubric", step="grade", prompt=p,
                                   candidates=[c], sample_k=k, rubric=rubric,
                                   item_ids=None if len(parts) == 1 else ids) for ids in parts]
            except (ValueError, TypeError) as e:
                self._reject(out, i, p, [c], "rubric", k, f"cannot build the grading request: {e}")
                continue
            jobs.append((c, reqs))
        results = yield [r for _, reqs in jobs for r in reqs]
        rows, at = [], 0
        for c, reqs in jobs:
            got = results[at:at + len(reqs)]
            at += len(reqs)
            failed = [r.error for r in got if not r.ok]
            if failed:
                self._reject(out, i, p, [c], "rubric", k, f"engine error grading: {failed[0]}")
                continue
            raw = "\n".join(r.text.strip() for r in got)
            parsed = [rb.parse_grades(r.text, ids) for r, ids in zip(got, parts, strict=True)]
            bad = next((x for x in parsed if isinstance(x, ParseError)), None)
            if bad is not None:
                fields = error_fields(ParseError(raw, f"grading: {bad.reason}"))
            else:
                fields = rb.to_judgment_fields(rb.merge(parsed))
                fields["parsed"] = {**fields["parsed"], "rubric": rubric.to_dict()}
            rows.append(self._row(p, [c], "rubric", k, raw, fields))
        return rows

    # ---- claim checks (RLAIF-V)
    def _claims(self, i, p, c, k, out) -> Item:
        """One candidate's claims, split by the world's parser, each checked in its own request."""
        checks = self._claim_checks(i, p, c, k, out, claim_texts)
        if not checks:
            return []
        results = yield [ch.request for ch in checks]
        return self._claim_rows(i, p, c, k, out, checks, results)

    def _claims_split_first(self, i, p, cands, k, out) -> Item:
        """judgments.claim_splitter judge: the engine lists the claims of the prompt's reference (once per sample
        k, so every candidate is checked against the same list) and of each response first (RLAIF-V's divide
        step), then every candidate's claims are checked as with the world's split. A list that does not parse
        fails its candidates' claims as one parse-failure row each; an engine error quarantines them."""
        if not p.get("reference_text"):  # nothing to check against: the other protocols judge these candidates
            return []
        texts = list(dict.fromkeys(t for c in cands for _, t in cs.sides(p, c)))  # the reference first
        results = yield [self._with(cs.build(t, style=self.style), protocol="claims", step="split", prompt=p,
                                    sample_k=k, text=t) for t in texts]
        answers = dict(zip(texts, results, strict=True))
        rows, jobs = [], []
        for c in cands:
            got = cs.read(cs.sides(p, c), answers)
            if got.engine_error:
                self._reject(out, i, p, [c], "claims", k, f"engine error splitting {got.engine_error}")
            elif got.unparsed:
                rows.append(self._row(p, [c], "claims", k, got.unparsed.raw, error_fields(got.unparsed)))
            elif checks := self._claim_checks(i, p, c, k, out, lambda t, m=got.claims: m.get(t, [])):
                jobs.append((c, checks))
        results = yield [ch.request for _, checks in jobs for ch in checks]
        at = 0
        for c, checks in jobs:
            rows += self._claim_rows(i, p, c, k, out, checks, results[at:at + len(checks)])
            at += len(checks)
        return rows

    def _claim_checks(self, i, p, c, k, out, split) -> list[cl.ClaimCheck]:
        """A candidate's claim checks, their requests carrying the oracle's context; [] when there is nothing to
        check (said so in a quarantine when both texts exist yet the split found no claim)."""
        try:
            checks = cl.checks(p, c, split, style=self.style, with_images=self.jcfg.claim_images,
                               context=claim_context(self.jcfg.claim_context))
            for ch in checks:
                self._with(ch.request, protocol="claims", prompt=p, candidates=[c], sample_k=k, claim=ch.claim,
                           against=ch.against)
        except (ValueError, TypeError) as e:
            self._reject(out, i, p, [c], "claims", k, f"cannot build the requests: {e}")
            return []
        if not checks and p.get("reference_text") and c.get("output_text"):  # both texts, yet not one claim
            why = ("the shapes world's parser, which reads only that world's text" if split is claim_texts
                   else "the engine listed none in either")
            self._reject(out, i, p, [c], "claims", k, "the claim splitter found no claim in the response or the "
                         f"reference: nothing checked ({why})")
        return checks

    def _claim_rows(self, i, p, c, k, out, checks, results) -> list[dict]:
        failed = [r.error for r in results if not r.ok]
        if failed:
            self._reject(out, i, p, [c], "claims", k, f"engine error: {failed[0]}")
            return []
        return [self._row(p, [c], "claims", k, cl.raw_output(ch, r.text), cl.fields(ch, r, self.readout))
                for ch, r in zip(checks, results, strict=True)]

    # ---- decomposed T2I
    def _decomposed(self, i, p, cands, k, out) -> Item:
        h1, h2, h3 = dc.FULL_HEADERS
        try:
            req = self._with(dc.build_extraction(p), protocol="decomposed", step="extraction", prompt=p, sample_k=k)
        except (ValueError, TypeError) as e:
            self._reject(out, i, p, cands, "decomposed", k, f"cannot build the extraction request: {e}")
            return []
        (res,) = yield [req]
        if not res.ok:
            self._reject(out, i, p, cands, "decomposed", k, f"engine error at extraction: {res.error}")
            return []
        raw1 = f"{h1}\n{res.text.strip()}"
        ex = dc.parse_extraction(res.text)
        if isinstance(ex, ParseError):
            err = error_fields(ParseError(raw1, f"extraction: {ex.reason}"))
            return [self._row(p, [c], "decomposed", k, raw1, err) for c in cands]
        jobs = []
        for c in cands:
            try:
                jobs.append((c, self._with(dc.build_answering(c, ex), protocol="decomposed", step="answers",
                                           prompt=p, candidates=[c], sample_k=k, extraction=ex)))
            except (ValueError, TypeError) as e:
                self._reject(out, i, p, [c], "decomposed", k, f"cannot build the answering request: {e}")
        results = yield [r for _, r in jobs]
        rows, step3 = [], []
        for (c, _), res in zip(jobs, results, strict=True):
            if not res.ok:
                self._reject(out, i, p, [c], "decomposed", k, f"engine error at answers: {res.error}")
                continue
            raw2 = f"{raw1}\n{h2}\n{res.text.strip()}"
            ans = dc.parse_answers(res.text, ex)
            if isinstance(ans, ParseError):
                rows.append(self._row(p, [c], "decomposed", k, raw2,
                                      error_fields(ParseError(raw2, f"answers: {ans.reason}"))))
                continue
            try:
                req = self._with(dc.build_scoring(p, ex, ans), protocol="decomposed", step="scores", prompt=p,
                                 candidates=[c], sample_k=k, extraction=ex, answers=ans)
            except (ValueError, TypeError) as e:
                self._reject(out, i, p, [c], "decomposed", k, f"cannot build the scoring request: {e}")
                continue
            step3.append((c, ans, raw2, req))
        results = yield [s[3] for s in step3]
        for (c, ans, raw2, _), res in zip(step3, results, strict=True):
            if not res.ok:
                self._reject(out, i, p, [c], "decomposed", k, f"engine error at scores: {res.error}")
                continue
            raw = f"{raw2}\n{h3}\n{res.text.strip()}"
            sc = dc.parse_scores(res.text, ex)
            if isinstance(sc, ParseError):
                fields = error_fields(ParseError(raw, f"scores: {sc.reason}"))
            else:
                try:
                    fields = dc.to_judgment_fields(dc.DecomposedJudgment(ex, ans, sc))
                except ValueError as e:
                    fields = error_fields(ParseError(raw, f"judgment: {e}"))
            rows.append(self._row(p, [c], "decomposed", k, raw, fields))
        return rows


# ---------------------------------------------------------------- stats and the Ray stage
def judgment_stats(rows: Iterable[dict]) -> dict[str, Any]:
    """Counts for tracking: judgments and parse failures (overall and per protocol), the parse-failure rate, a
    histogram of scores per protocol (rubric fractions in tenths, aspect-group means in halves) and verdicts.
    The outputs that did not parse are grouped by reason, each with an example (`parse_failure_reasons`,
    data_view.ReasonGroups). One pass over `rows`: an iterator streamed from storage (datasets.iter_dataset_rows)
    is never held whole."""
    n, fails, reasons = Counter(), Counter(), ReasonGroups()
    hist: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        proto = r["protocol"]
        n[proto] += 1
        if r.get("parse_error") is not None:
            fails[proto] += 1
            reasons.add_unparsed(r)
            continue
        if r.get("verdict") is not None:
            hist[proto][r["verdict"]] += 1
        elif r.get("score") is not None and not (isinstance(r["score"], float) and np.isnan(r["score"])):
            s = float(r["score"])
            s = round(s, 1) if proto == "rubric" else round(s * 2) / 2
            hist[proto][f"{s:g}"] += 1
    total = sum(n.values())
    return {"judgments": total, "parse_failures": sum(fails.values()),
            "parse_failure_rate": sum(fails.values()) / total if total else 0.0,
            "by_protocol": {p: {"judgments": n[p], "parse_failures": fails[p],
                                "parse_failure_rate": fails[p] / n[p]} for p in sorted(n)},
            "histogram": {p: dict(sorted(h.items())) for p, h in sorted(hist.items())},
            "parse_failure_reasons": reasons.top(10)}


def log_stats(stats: dict[str, Any]) -> None:
    """Into the active MLflow run: the counts as metrics, the histogram as metrics and as judgments/stats.json."""
    import mlflow

    metrics = {"judgments": stats["judgments"], "parse_failures": stats["parse_failures"],
               "parse_failure_rate": stats["parse_failure_rate"]}
    for p, s in stats["by_protocol"].items():
        metrics[f"parse_failure_rate.{p}"] = s["parse_failure_rate"]
    for p, h in stats["histogram"].items():
        for bucket, count in h.items():
            metrics[f"score_hist.{p}.{bucket}"] = count
    mlflow.log_metrics(metrics)
    mlflow.log_dict(stats, "judgments/stats.json")


def stage_hash(cfg: Config, role: str, served: bool = False) -> str:
    """The config the role's judgments depend on (judge: also the judge model; the oracle reads `teacher`).
    served: the judge is this project's Ray Serve deployment of models.judge.path, reached over HTTP. Its address
    changes with each deployment (on a cluster it names a node) and says nothing about the labels, so it is left
    out: a resume finds the labels done without deploying the judge again."""
    if served:
        cfg = cfg.model_copy(deep=True)
        cfg.judge.http.base_url = "served"
        cfg.judge.http.expect_model_version = None  # the served judge is models.judge.path, already in the hash
    return cfg.stage_hash(f"judgments-{role}")


def _cost_cap(cfg: Config, role: str) -> tuple[str, float] | None:
    """The role's HTTP engine's cap on a stage's estimated cost, if it labels through one with a cap."""
    section = cfg.teacher if role == "teacher" else cfg.judge
    cap = section.http.max_cost_per_stage if section.engine == "http" else None
    return None if cap is None else ("http.cost", cap)


def run(cfg: Config, prompts_uri: str, candidates_uri: str, output_uri: str, role: str = "teacher",
        tracker: Any = None, served: bool = False) -> StageResult:
    """Judge the candidates of every prompt with the `role` engine (teacher: cfg.teacher; judge: cfg.judge);
    served: see stage_hash."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    result = run_stage(
        f"judgments-{role}", inputs=[prompts_uri, candidates_uri], output=output_uri, kind="judgment",
        core_factory=lambda: JudgmentsCore(cfg, candidates_uri=candidates_uri, role=role),
        resources=cfg.resources.labeling, batch_size=cfg.judgments.batch_size,
        stage_hash=stage_hash(cfg, role, served), limits=cfg.limits, tracker=tracker, cap=_cost_cap(cfg, role))
    if not result.skipped:
        from flywheel.datasets import iter_dataset_rows

        stats = judgment_stats(iter_dataset_rows(output_uri, "judgment"))  # streamed: the driver holds no rows
        log.info("judgments-%s: %d judgments, parse-failure rate %.3f", role, stats["judgments"],
                 stats["parse_failure_rate"])
        if stats["parse_failures"]:
            most = stats["parse_failure_reasons"]["groups"][0]
            log.info("judgments-%s: most frequent parse failure (%d of %d): %s; all: flywheel data --dataset %s",
                     role, most["count"], stats["parse_failures"], most["reason"][:200], output_uri)
        if tracker is not None:
            log_stats(stats)
    return result
