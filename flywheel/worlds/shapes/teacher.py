"""The oracle teacher: answers any judge request of the six protocols (claims included) from the shapes world's
checkers, in exactly the text a trained judge must learn, with a configurable error rate (an imperfect GPT-4o or
human annotator). With error rate 0 it is the gold.

A request carries its ground truth in `TextRequest.context` (see `make_context`): the protocol and step, the
prompt record (its `meta` holds the scene or draw spec), the candidate record(s) in the order shown, and what the
step needs (aspect, order, aspect group, rubric, extraction, ...). The teacher never reads the request's text. It
assesses each candidate (flywheel/worlds/shapes/assess.py, which hands texts to assess_text.py and images to
assess_image.py: findings, aspect values, gold scores, in the records of assessment.py; rubric criteria and
decomposed questions come from flywheel/worlds/shapes/teacher_items.py), builds the protocol's structured judgment
and formats it with the protocol module, so the protocol's parser always accepts the answer. A context it cannot
judge from raises `TeacherError` (the engine turns it into a per-item error), never a made-up judgment.

Errors (TeacherConfig): each answer draws, from a stream seeded by (teacher seed, engine seed, item, sample k),
whether it errs and how - so the k samples of one item differ as an annotator's would, and a re-run gives the
same answers. Kinds that apply per request:
  pointwise          score_jitter, wrong_analysis        aspects         score_jitter, wrong_analysis
  pairwise           verdict_flip, wrong_analysis        rubric grade    verdict_flip, wrong_analysis
  decomposed scores  score_jitter, wrong_analysis        claims          verdict_flip (stated <-> not stated)
  (rubric drafting, decomposed extraction / answers, claim splits: none)
Every drawn error changes the answer (a jitter never lands on the gold value; a misperception flips a finding
whose shift is possible), so the realised error rate is the configured one.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flywheel.judge import aspects as ap
from flywheel.judge import claim_split as cs
from flywheel.judge import decomposed as dc
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.judge import rubric as rb
from flywheel.judge.base import clean_text, one_line
from flywheel.worlds.shapes.assess import assess
from flywheel.worlds.shapes.assessment import Assessment, Finding, ImageFacts, load_meta, value_score
from flywheel.worlds.shapes.claims import claim_texts, misread, read_claim, verdict
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.oracle_config import TeacherConfig
from flywheel.worlds.shapes.teacher_items import (TeacherError, answer_question, caption_of, extraction_for,
                                                  extraction_in, rubric_items, score_question)

TEACHER_VERSION = "2"  # bump when the teacher's answers change for the same inputs
APPLICABLE: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("pointwise", None): ("score_jitter", "wrong_analysis"),
    ("pairwise", None): ("verdict_flip", "wrong_analysis"),
    ("aspects", None): ("score_jitter", "wrong_analysis"),
    ("rubric", "grade"): ("verdict_flip", "wrong_analysis"),
    ("decomposed", "scores"): ("score_jitter", "wrong_analysis"),
    ("claims", None): ("verdict_flip",),
}
STEPS = {"pointwise": (None,), "pairwise": (None,), "aspects": (None,), "rubric": ("generate", "grade"),
         "decomposed": ("extraction", "answers", "scores"), "claims": (None, "split")}


@dataclass(frozen=True)
class Answer:
    """One teacher answer: the text, the error kind applied (None: the gold answer) and the gold text."""

    text: str
    error: str | None
    gold: str


def make_context(protocol: str, prompt: dict, candidates: Sequence[dict] = (), *, step: str | None = None,
                 sample_k: int = 0, aspect: str | None = None, order: str | None = None, group: str | None = None,
                 aspects: Sequence[str] | None = None, sections: Sequence[str] | None = None,
                 rubric: rb.Rubric | None = None, item_ids: Sequence[str] | None = None,
                 extraction: dc.Extraction | None = None, answers: dc.Answers | None = None,
                 claim: str | None = None, against: str | None = None, text: str | None = None) -> dict[str, Any]:
    """The `TextRequest.context` the oracle judges from. candidates: in the order the request shows them; claim and
    against: a claim check's claim and the text it is checked against; text: the text a claim split splits."""
    ctx = {"protocol": protocol, "step": step, "prompt": prompt, "candidates": list(candidates),
           "sample_k": int(sample_k), "aspect": aspect, "order": order, "group": group,
           "aspects": None if aspects is None else list(aspects),
           "sections": None if sections is None else list(sections), "rubric": rubric,
           "item_ids": None if item_ids is None else list(item_ids), "extraction": extraction, "answers": answers}
    if claim is not None:  # only claim checks carry these, so every other request's draws stay as they were
        ctx |= {"claim": claim, "against": against}
    if text is not None:
        ctx["text"] = text
    return ctx


def _sha(*parts: Any) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()


def _record_key(rec: dict, id_field: str) -> str:
    if rec.get(id_field):
        return str(rec[id_field])
    h = hashlib.sha256()
    for k in sorted(rec):
        v = rec[k]
        if isinstance(v, (list, tuple)):
            for x in v:
                h.update(bytes(x) if isinstance(x, (bytes, bytearray, memoryview)) else repr(x).encode())
        else:
            h.update(f"{k}={v!r}".encode())
    return h.hexdigest()


# ---------------------------------------------------------------- error primitives
def jitter(value: int, lo: int, hi: int, rng: np.random.Generator, max_step: int) -> int:
    """value moved by 1..max_step up or down, inside [lo, hi], never equal to value."""
    d = int(rng.integers(1, max_step + 1))
    sign = 1 if rng.random() < 0.5 else -1
    out = value + sign * d
    if not lo <= out <= hi:
        out = value - sign * d
    out = int(min(max(out, lo), hi))
    return out if out != value else (value + 1 if value < hi else value - 1)


def shift(value: int, direction: int, lo: int, hi: int, rng: np.random.Generator, max_step: int) -> int:
    d = int(rng.integers(1, max_step + 1))
    out = int(min(max(value + direction * d, lo), hi))
    return out if out != value else value + direction  # callers only ask for feasible directions


def _feasible(findings: list[Finding], value: int, lo: int, hi: int, relevant=lambda f: f.in_analysis) -> list[int]:
    """Indices of findings whose flip could move value: a right finding turned wrong needs room below."""
    return [i for i, f in enumerate(findings) if relevant(f) and ((f.ok and value > lo) or (not f.ok and value < hi))]


def misperceive(findings: list[Finding], value: int, lo: int, hi: int, rng: np.random.Generator, max_step: int,
                relevant=lambda f: f.in_analysis) -> tuple[list[Finding], int] | None:
    """Flip one finding (the analysis says the opposite of the truth) and move the value the way it implies."""
    idx = _feasible(findings, value, lo, hi, relevant)
    if not idx:
        return None
    i = idx[int(rng.integers(len(idx)))]
    f = findings[i]
    out = list(findings)
    out[i] = f.flipped()
    return out, shift(value, 1 if not f.ok else -1, lo, hi, rng, max_step)


# ---------------------------------------------------------------- the teacher
class OracleTeacher:
    def __init__(self, config: TeacherConfig | None = None, world: ShapesWorldConfig | None = None,
                 cache_size: int = 512):
        self.cfg = config or TeacherConfig()
        self.world = world or ShapesWorldConfig()
        self._cache: OrderedDict[tuple[str, str], Assessment] = OrderedDict()
        self._cache_size = cache_size
        # the oracle's own fields only: the flywheel's teacher section adds other backends' settings (its http)
        mine = self.cfg.model_dump(mode="json", include=set(TeacherConfig.model_fields))
        digest = hashlib.sha256(json.dumps([TEACHER_VERSION, mine,
                                            self.world.model_dump(mode="json")], sort_keys=True).encode())
        self.version = f"v{TEACHER_VERSION}-e{self.cfg.error_rate:g}-{digest.hexdigest()[:8]}"

    # ---- public
    def answer(self, context: Mapping | None, seed: int = 0) -> str:
        return self.answer_detail(context, seed).text

    def answer_detail(self, context: Mapping | None, seed: int = 0) -> Answer:
        ctx = self._check(context)
        proto, step = ctx["protocol"], ctx.get("step")
        rng = self._rng(ctx, seed)
        kind = self._draw(rng, proto, step)
        fn = getattr(self, f"_{proto}" + (f"_{step}" if step else ""))
        gold = fn(ctx, None, rng)
        return Answer(gold if kind is None else fn(ctx, kind, rng), kind, gold)

    def assessment(self, prompt: dict, candidate: dict) -> Assessment:
        key = (_record_key(prompt, "prompt_id"), _record_key(candidate, "candidate_id"))
        hit = self._cache.get(key)
        if hit is None:
            hit = assess(prompt, candidate, self.world)
            self._cache[key] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return hit

    # ---- plumbing
    def _check(self, context: Mapping | None) -> Mapping:
        if not isinstance(context, Mapping) or not context:
            raise TeacherError("request has no oracle context (prompt, candidates, protocol): nothing to judge from")
        proto, step = context.get("protocol"), context.get("step")
        if proto not in STEPS:
            raise TeacherError(f"unknown protocol {proto!r} in context")
        if step not in STEPS[proto]:
            raise TeacherError(f"{proto}: unknown step {step!r}; valid: {STEPS[proto]}")
        if not isinstance(context.get("prompt"), Mapping):
            raise TeacherError("context has no prompt record")
        load_meta(dict(context["prompt"]))  # NoGroundTruth (a ValueError) when the prompt has no ground truth
        need = {"pairwise": 2}.get(proto, 0 if (proto, step) in (("rubric", "generate"), ("decomposed", "extraction"),
                                                                   ("claims", "split")) else 1)
        cands = context.get("candidates") or []
        if len(cands) != need:
            raise TeacherError(f"{proto}{'/' + step if step else ''} needs {need} candidate(s) in context, "
                               f"got {len(cands)}")
        return context

    def _rng(self, ctx: Mapping, seed: int) -> np.random.Generator:
        prompt = ctx["prompt"]
        item = [ctx["protocol"], ctx.get("step"), _record_key(dict(prompt), "prompt_id"),
                [_record_key(dict(c), "candidate_id") for c in ctx.get("candidates") or []], ctx.get("aspect"),
                ctx.get("order"), ctx.get("group"), ctx.get("aspects"), ctx.get("item_ids")]
        if "claim" in ctx:
            item += [ctx["claim"], ctx["against"]]
        if "text" in ctx:
            item.append(ctx["text"])
        h = _sha(self.cfg.seed, int(seed), item, int(ctx.get("sample_k") or 0))
        return np.random.default_rng(int.from_bytes(h[:8], "big"))

    def _draw(self, rng: np.random.Generator, proto: str, step: str | None) -> str | None:
        u = rng.random()  # always drawn, so the stream after it does not depend on the rate
        kinds = [k for k in APPLICABLE.get((proto, step), ()) if self.cfg.error_kinds.get(k, 0.0) > 0]
        if not kinds or u >= self.cfg.error_rate:
            return None
        w = np.array([self.cfg.error_kinds[k] for k in kinds], float)
        return kinds[int(rng.choice(len(kinds), p=w / w.sum()))]

    def _one(self, ctx: Mapping) -> tuple[dict, dict, Assessment]:
        prompt, cand = dict(ctx["prompt"]), dict(ctx["candidates"][0])
        return prompt, cand, self.assessment(prompt, cand)

    # ---- pointwise
    def _pointwise(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        _, _, a = self._one(ctx)
        findings, rating = list(a.findings), a.rating
        if kind == "wrong_analysis":
            got = misperceive(findings, rating, pt.RATING_MIN, pt.RATING_MAX, rng, self.cfg.max_jitter)
            findings, rating = got if got else (findings, jitter(rating, 1, 5, rng, self.cfg.max_jitter))
        elif kind == "score_jitter":
            rating = jitter(rating, pt.RATING_MIN, pt.RATING_MAX, rng, self.cfg.max_jitter)
        return pt.format(pt.PointwiseJudgment(clean_text(a.analysis(findings)), rating))

    # ---- pairwise
    def _side(self, a: Assessment, aspect: str | None) -> tuple[int, Any]:
        if aspect is None:
            return a.rating, lambda fs: a.analysis(fs)
        if aspect not in a.aspects:
            raise TeacherError(f"the oracle does not judge aspect {aspect!r} for this output")
        return value_score(a.aspects[aspect]), lambda fs: a.feedback(aspect, fs).text

    def _pairwise(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        prompt = dict(ctx["prompt"])
        aspect = ctx.get("aspect")
        sides = [self.assessment(prompt, dict(c)) for c in ctx["candidates"]]
        (va, say_a), (vb, say_b) = (self._side(s, aspect) for s in sides)
        verdict = "A" if va > vb else "B" if vb > va else "tie"
        fs = [list(s.findings) for s in sides]
        if kind in ("verdict_flip", "wrong_analysis"):
            new = {"A": "B", "B": "A"}.get(verdict) or ("A" if rng.random() < 0.5 else "B")
            if kind == "wrong_analysis":
                w, l_ = (0, 1) if new == "A" else (1, 0)
                def rel(f: Finding) -> bool:
                    return f.in_analysis if aspect is None else aspect in f.aspects
                bad_w = [i for i, f in enumerate(fs[w]) if rel(f) and not f.ok]
                ok_l = [i for i, f in enumerate(fs[l_]) if rel(f) and f.ok]
                side, idx = (w, bad_w) if bad_w and (not ok_l or rng.random() < 0.5) else (l_, ok_l)
                if idx:
                    i = idx[int(rng.integers(len(idx)))]
                    fs[side][i] = fs[side][i].flipped()
            verdict = new
        words = aspect.replace("_", " ") if aspect else None
        on = f" on {words}" if words else ""
        end = f"Both are equally good{on}." if verdict == "tie" else f"Response {verdict} is better{on}."
        text = f"Response A: {say_a(fs[0])}\nResponse B: {say_b(fs[1])}\n{end}"
        return pw.format(pw.PairwiseJudgment(clean_text(text), verdict))

    # ---- claim checks
    def _claims(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        """One claim checked against a text (flywheel/worlds/shapes/claims.py). Its error is a wrong verdict on the
        claim's own scale (a jitter would write a 4, which no verdict is)."""
        try:
            claim = read_claim(str(ctx.get("claim")))
        except ValueError as e:
            raise TeacherError(f"claims: {e}") from None
        analysis, rating = verdict(claim, str(ctx.get("against") or ""))
        if kind == "verdict_flip":  # a misread text: the claim's verdict itself is wrong, stated <-> not stated
            analysis, rating = misread(claim, rating)
        return pt.format(pt.PointwiseJudgment(analysis, rating))

    def _claims_split(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        """The claims of a text (RLAIF-V's divide step), as the world's parser reads them: no error kind, since the
        world's split is exact and the checks carry the teacher's noise."""
        return cs.format(claim_texts(str(ctx.get("text") or "")))

    # ---- aspects
    def _aspects(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        _, _, a = self._one(ctx)
        names = ctx.get("aspects")
        if not names:
            raise TeacherError("aspects request without the aspect names in context")
        missing = [n for n in names if n not in a.aspects]
        if missing:
            raise TeacherError(f"the oracle does not judge aspect(s) {missing} for this output")
        lines = [[n, a.feedback(n), value_score(a.aspects[n])] for n in names]
        if kind == "score_jitter":
            i = int(rng.integers(len(lines)))
            lines[i][2] = jitter(lines[i][2], ap.SCORE_MIN, ap.SCORE_MAX, rng, self.cfg.max_jitter)
        elif kind == "wrong_analysis":
            # a line whose feedback can flip with its score moving the same way (a wrong finding turned right
            # needs room above, a right one turned wrong room below); none: the score jitters instead
            ok = [i for i, (_, f, s) in enumerate(lines)
                  if (not f.ok and s < ap.SCORE_MAX) or (f.ok and s > ap.SCORE_MIN)]
            if ok:
                i = ok[int(rng.integers(len(ok)))]
                f, s = lines[i][1], lines[i][2]
                lines[i][1] = f.flipped()
                lines[i][2] = shift(s, 1 if not f.ok else -1, ap.SCORE_MIN, ap.SCORE_MAX, rng, self.cfg.max_jitter)
            else:
                i = int(rng.integers(len(lines)))
                lines[i][2] = jitter(lines[i][2], ap.SCORE_MIN, ap.SCORE_MAX, rng, self.cfg.max_jitter)
        return ap.format(ap.AspectsJudgment(tuple(ap.AspectJudgment(n, one_line(f.text), s) for n, f, s in lines)))

    # ---- rubric
    def _rubric_generate(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        prompt = dict(ctx["prompt"])
        sections = ctx.get("sections") or rb.sections_for(prompt)
        items = rubric_items(prompt)
        have = {s for s, _, _ in items}
        if set(sections) - have:
            raise TeacherError(f"the oracle has no {sorted(set(sections) - have)} rubric items for a "
                               f"{prompt.get('subtask')} prompt")
        by = {s: tuple(c for s2, c, _ in items if s2 == s) for s in sections}
        return rb.format_rubric(rb.Rubric(by.get("image", ()), by.get("text", ())))

    def _rubric_grade(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        prompt, _, a = self._one(ctx)
        rubric = ctx.get("rubric")
        if isinstance(rubric, Mapping):
            rubric = rb.Rubric.from_dict(rubric)
        if not isinstance(rubric, rb.Rubric):
            raise TeacherError("rubric grading without the rubric in context")
        known = {c: check for _, c, check in rubric_items(prompt)}
        ids = ctx.get("item_ids") or rubric.ids
        crit = dict(rubric.items)
        graded = []
        for iid in ids:
            if iid not in crit:
                raise TeacherError(f"item {iid!r} is not in the rubric")
            check = known.get(crit[iid])
            if check is None:
                raise TeacherError(f"rubric item {iid} {crit[iid]!r} is not one the oracle can grade")
            met, why, false_why = check(a)
            graded.append([iid, met, why, false_why])
        if kind in ("verdict_flip", "wrong_analysis"):
            g = graded[int(rng.integers(len(graded)))]
            g[1] = not g[1]
            if kind == "wrong_analysis":
                g[2], g[3] = g[3], g[2]
        return rb.format_grades(rb.RubricGrades(tuple(
            rb.ItemGrade(iid, one_line(why), "true" if met else "false") for iid, met, why, _ in graded)))

    # ---- decomposed
    def _decomposed_extraction(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        return dc.format_extraction(extraction_for(dict(ctx["prompt"])))

    def _image_facts(self, ctx: Mapping) -> tuple[dict, ImageFacts]:
        prompt, _, a = self._one(ctx)
        if a.image is None:
            raise TeacherError("the decomposed protocol needs an image output")
        return prompt, a.image

    def _decomposed_answers(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        _, fx = self._image_facts(ctx)
        ex = extraction_in(ctx)
        caption = caption_of(fx)
        return dc.format_answers(dc.Answers(caption, tuple((q.id, answer_question(q.text, fx))
                                                          for q in ex.questions)))

    def _decomposed_scores(self, ctx: Mapping, kind: str | None, rng: np.random.Generator) -> str:
        _, fx = self._image_facts(ctx)
        ex = extraction_in(ctx)
        answers = ctx.get("answers")
        if answers is not None and set(answers.by_id) != set(ex.ids):
            raise TeacherError("answers do not cover the extraction's questions")
        qs = {q.id: list(score_question(q.text, fx)) for q in ex.questions}  # id -> [score, why, false_why]
        dims = {d: [int(np.floor(10 * v + 0.5)), None] for d, v in
                (("appearance", fx.check.appearance), ("intrinsic", fx.check.intrinsic),
                 ("relationship", fx.check.relationship)) if d in ex.dimensions and v is not None}
        overall = int(np.floor(fx.check.score_10 + 0.5))
        if kind == "wrong_analysis":
            qid = ex.ids[int(rng.integers(len(ex.ids)))]
            s, why, false_why = qs[qid]
            new = 10 - s if s != 5 else (0 if rng.random() < 0.5 else 10)
            qs[qid] = [new, false_why, why]
            d = dc.DIMENSION_OF[qid[0]]
            n_q = sum(1 for q in ex.ids if q[0] == qid[0])
            if d in dims:
                old = dims[d][0]
                dims[d][0] = int(min(max(round(old + (new - s) / n_q), 0), 10))
                overall = int(min(max(round(overall + (dims[d][0] - old) / len(dims)), 0), 10))
        elif kind == "score_jitter":
            overall = jitter(overall, dc.SCORE_MIN, dc.SCORE_MAX, rng, 2 * self.cfg.max_jitter)
        for d in dims:
            bad = [qs[q.id][1] for q in ex.questions if q.dimension == d and qs[q.id][0] < 10]
            dims[d][1] = " ".join(bad) if bad else f"Every {d} check passes."
        short = [d for d in ex.dimensions if d in dims and dims[d][0] < 10]
        why = (f"The image falls short on {' and '.join(short)}." if short
               else "The image matches the prompt and is cleanly drawn.")
        scores = dc.Scores(tuple(dc.Scored(q, one_line(qs[q][1]), qs[q][0]) for q in ex.ids),
                           tuple(dc.Scored(d, one_line(dims[d][1]), dims[d][0]) for d in ex.dimensions if d in dims),
                           dc.Scored(dc.OVERALL, why, overall))
        return dc.format_scores(scores)


# ---------------------------------------------------------------- measuring the realised error rate
def decision(context: Mapping, text: str) -> Any:
    """What an answer decides (rating, verdict, aspect scores, item grades, overall 0-10 score), parsed strictly;
    None for steps that decide nothing (rubric drafting, decomposed extraction and answers)."""
    proto, step = context["protocol"], context.get("step")
    if proto == "pointwise":
        return pt.parse(text).rating
    if proto == "pairwise":
        return pw.parse(text).verdict
    if proto == "aspects":
        return ap.parse(text, context["aspects"]).scores
    if (proto, step) == ("rubric", "grade"):
        return rb.parse_grades(text, context.get("item_ids") or _rubric(context).ids).by_id
    if (proto, step) == ("decomposed", "scores"):
        return dc.parse_scores(text, extraction_in(context)).overall.score
    return None


def _rubric(context: Mapping) -> rb.Rubric:
    r = context["rubric"]
    return rb.Rubric.from_dict(r) if isinstance(r, Mapping) else r


def measure_errors(teacher: OracleTeacher, contexts: Sequence[Mapping], seed: int = 0) -> dict[str, Any]:
    """Answer every context with `teacher` and compare with the gold answer (the same request at error rate 0):
    over the requests an error can apply to, the share whose text differs from the gold (realised error rate)
    and whose decision differs (decision error rate), overall, per protocol and per error kind."""
    per_proto: dict[str, Counter] = {}
    kinds: Counter = Counter()
    eligible = Counter()
    for ctx in contexts:
        proto, step = ctx["protocol"], ctx.get("step")
        if (proto, step) not in APPLICABLE:
            continue
        a = teacher.answer_detail(ctx, seed)
        c = per_proto.setdefault(proto, Counter())
        c["n"] += 1
        eligible["n"] += 1
        if a.error is not None:
            kinds[a.error] += 1
        if a.text != a.gold:
            c["differ"] += 1
            eligible["differ"] += 1
            if decision(ctx, a.text) != decision(ctx, a.gold):
                c["decision"] += 1
                eligible["decision"] += 1
    n = eligible["n"] or 1
    return {"configured": teacher.cfg.error_rate, "requests": eligible["n"],
            "realised": eligible["differ"] / n, "decision": eligible["decision"] / n,
            "kinds": {k: v / n for k, v in sorted(kinds.items())},
            "by_protocol": {p: {"requests": c["n"], "realised": c["differ"] / c["n"],
                                "decision": c["decision"] / c["n"]} for p, c in sorted(per_proto.items())}}
