"""What the oracle teacher judges against, from the ground truth: the UEval rubric's criteria of a prompt, each with
the check that grades it (`rubric_items`), and the decomposed T2I protocol's three steps (`extraction_for`,
`answer_question`, `score_question`). flywheel/worlds/shapes/teacher.py turns them into the protocols' answers.

TeacherError lives here, the lowest layer that raises it; teacher.py re-exports it.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from flywheel.judge import decomposed as dc
from flywheel.worlds.shapes.assess_text import caption_findings
from flywheel.worlds.shapes.assessment import CLEAN_OK, QUALITY_FLAW, Assessment, Finding, ImageFacts, load_meta
from flywheel.worlds.shapes.check_text import check_caption
from flywheel.worlds.shapes.scene import Obj, Scene, describe, relation_between
from flywheel.worlds.shapes.spec import DrawSpec
from flywheel.worlds.shapes.vocab import INVERSE, PALETTES, RELATION_PHRASES, number_word

# The decomposed protocol's questions, as the oracle writes (and reads back) them.
APPEARANCE_Q = "Is the {s} drawn cleanly and sharply?"
COLOUR_Q = "What colour is the {s}?"
COUNT_Q = "How many shapes are in the image?"
RELATION_Q = "Is the {a} {phrase} the {b}?"
_PHRASE_OF = {v: k for k, v in RELATION_PHRASES.items()}
_Q_RES = [("appearance", re.compile(r"^Is the (\w+) drawn cleanly and sharply\?$")),
          ("colour", re.compile(r"^What colour is the (\w+)\?$")),
          ("count", re.compile(r"^How many shapes are in the image\?$")),
          ("relation", re.compile(r"^Is the (\w+) (" + "|".join(map(re.escape, RELATION_PHRASES.values()))
                                  + r") the (\w+)\?$"))]



class TeacherError(ValueError):
    """The request cannot be judged by the oracle (no context, no ground truth, an unknown step or item)."""



# ---------------------------------------------------------------- rubric items (UEval), from the ground truth
def _shape_names(spec: DrawSpec) -> list[str]:
    return [s for _, s in spec.objects]


def _spec_scene(spec: DrawSpec) -> Scene:
    """The spec's objects in a row (positions only matter for relations, which are not read from it)."""
    return Scene(tuple(Obj(s, c, 0.16, 0.15 + 0.7 * i / max(len(spec.objects) - 1, 1), 0.5)
                       for i, (c, s) in enumerate(spec.objects)))


def rubric_items(prompt: dict) -> list[tuple[str, str, Any]]:
    """(section, criterion, check) for an oracle prompt, in rubric order; check(assessment) -> (met, why,
    false_why). Criteria come from the query and the reference (the scene or spec the reference was made from)."""
    meta = load_meta(prompt)
    items: list[tuple[str, str, Any]] = []
    if "scene" in meta:
        scene = Scene.from_json(meta["scene"])
        q = meta.get("question") or {}
        where = "image" if prompt.get("task") == "iu" else "scene"
        if q.get("type") == "caption":
            return _caption_items(scene, prompt.get("reference_text"), where)
        key = lambda a: next(f for f in a.findings if f.key)  # noqa: E731  (the answer's verdict)
        items.append(("text", f"The answer says {_answer_claim(q, scene, where)}.",
                      lambda a: (key(a).ok, key(a).text, key(a).false_text)))
        form = {"colour": "a colour word", "count": "a number", "existence": "yes or no",
                "relation": "yes or no"}[q["type"]]

        def short(a: Assessment):
            fmt = a.aspects.get("answer_format", 0.0) >= 1.0
            return (fmt, "It gives the short answer asked for." if fmt else
                    "It does not give the short answer asked for.",
                    "It does not give the short answer asked for." if fmt else "It gives the short answer asked for.")
        items.append(("text", f"The answer is short: {form}, or one short sentence.", short))
        return items
    spec = DrawSpec.from_json(meta["spec"])
    if len(set(_shape_names(spec))) != len(spec.objects):
        raise TeacherError("the oracle's rubric needs the spec's shapes to be distinct")
    for i, (c, s) in enumerate(spec.objects):
        items.append(("image", f"The image shows a {c} {s}.", _object_check(i)))
    if spec.relation is not None:
        r = spec.relation
        (ca, sa), (cb, sb) = spec.objects[r.subject], spec.objects[r.object]
        items.append(("image", f"The {ca} {sa} is {RELATION_PHRASES[r.relation]} the {cb} {sb}.",
                      _relation_check(f"the {ca} {sa}", f"the {cb} {sb}", RELATION_PHRASES[r.relation])))
    items.append(("image", "The image shows no other shapes.", _no_extra))
    items.append(("image", "The shapes are drawn cleanly on a clean background.", _clean))
    if prompt.get("task") == "itig":
        ref = _spec_scene(spec)
        for c, s in spec.objects:
            items.append(("text", f"The text mentions the {c} {s}.", _text_mentions(ref, c, s)))
        items.append(("text", "The text describes only what the image shows.", _text_faithful))
    return items


def _answer_claim(q: dict, scene: Scene, where: str) -> str:
    t = q["type"]
    if t == "colour":
        return f"the {q['shape']} is {q['answer']}"
    if t == "count":
        n = q["answer"]
        things = (f"{q['colour']} " if q.get("colour") else "") + q["shape"] + ("" if n == 1 else "s")
        return f"there {'is' if n == 1 else 'are'} {number_word(n)} {things}"
    if t == "existence":
        c, s = q["colour"], q["shape"]
        return (f"yes: there is {'an' if c[0] in 'aeiou' else 'a'} {c} {s} in the {where}" if q["answer"]
                else f"no: there is no {c} {s} in the {where}")
    a, b = scene.objects[q["subject"]], scene.objects[q["object"]]
    phrase = RELATION_PHRASES[q["relation"]]
    return (f"yes: the {a.colour} {a.shape} is {phrase} the {b.colour} {b.shape}" if q["answer"]
            else f"no: the {a.colour} {a.shape} is not {phrase} the {b.colour} {b.shape}")


def _find(a: Assessment, *words: str, ok: bool | None = None) -> Finding | None:
    return next((f for f in a.findings if f.in_analysis and all(w in f.text for w in words)
                 and (ok is None or f.ok == ok)), None)


def _caption_items(scene: Scene, reference: str | None, where: str) -> list[tuple[str, str, Any]]:
    items = []
    for (c, s), n in Counter((o.colour, o.shape) for o in scene.objects).items():
        words = f"{number_word(n)} {c} {s}s" if n > 1 else f"{'an' if c[0] in 'aeiou' else 'a'} {c} {s}"

        def mentions(a: Assessment, c=c, s=s, n=n, words=words):
            chk = a.text.check if a.text else None
            if chk is None or chk.unparseable:
                return False, f"It names no shapes, so it does not mention {words}.", f"It mentions {words}."
            missed = Counter(tuple(x) for x in chk.detail["missed"])[(c, s)]
            if not missed:
                return True, f"It mentions {words}.", f"It misses the {c} {s}."
            f = _find(a, f"{c} {s}", ok=False)
            return False, f.text if f else f"It misses the {c} {s}.", f"It mentions {words}."
        items.append(("text", f"The description mentions {words}.", mentions))
    rels = []
    if reference:
        ref = check_caption(reference, scene)
        if not ref.unparseable:
            rels = [r for r in ref.detail["relations"] if not r[3] and r[4]][:2]
    for s_, rel, o_, _, _ in rels:
        stmt = f"the {s_[0]} {s_[1]} is {RELATION_PHRASES[rel]} the {o_[0]} {o_[1]}"

        def says(a: Assessment, s_=tuple(s_), rel=rel, o_=tuple(o_), stmt=stmt):
            chk = a.text.check if a.text else None
            if chk is None or chk.unparseable:
                return False, f"It names no shapes, so it does not say {stmt}.", f"It says {stmt}."
            about = [r for r in chk.detail["relations"] if {tuple(r[0]), tuple(r[2])} == {s_, o_}]
            if any(r[4] and not r[3] and (tuple(r[0]), r[1]) in ((s_, rel), (o_, INVERSE[rel])) for r in about):
                return True, f"It says {stmt}.", f"It does not say {stmt}."
            wrong = [r for r in about if not r[4]]
            if wrong:
                r = wrong[0]
                said = (f"the {r[0][0]} {r[0][1]} is {'not ' if r[3] else ''}{RELATION_PHRASES[r[1]]} "
                        f"the {r[2][0]} {r[2][1]}")
                return False, f"It says {said}, which is wrong.", f"It says {stmt}."
            return (False, f"It does not say where the {s_[0]} {s_[1]} is relative to the {o_[0]} {o_[1]}.",
                    f"It says {stmt}.")
        items.append(("text", f"The description says {stmt}.", says))

    def faithful(a: Assessment):
        chk = a.text.check if a.text else None
        if chk is None or chk.unparseable:
            return False, "It names no shapes at all.", "Every shape it mentions is there."
        h = chk.detail["hallucinated"]
        if not h:
            return True, f"Every shape it mentions is in the {where}.", "It mentions a shape that is not there."
        f = _find(a, "which is not in", ok=False)
        return False, f.text if f else "It mentions a shape that is not there.", \
            f"Every shape it mentions is in the {where}."
    items.append(("text", f"The description mentions no shape that is not in the {where}.", faithful))
    return items


def _object_check(i: int):
    def check(a: Assessment):
        o = a.image.check.objects[i]
        ok_text, miss = f"The {o.colour} {o.shape} is drawn.", f"The requested {o.colour} {o.shape} is missing."
        if o.found and o.colour_ok and o.shape_ok:
            return True, ok_text, miss
        if not o.found:
            return False, miss, ok_text
        if not o.colour_ok:
            return False, f"The {o.shape} is {o.detected_colour} instead of {o.colour}.", ok_text
        return False, f"The {o.colour} shape is a {o.detected_shape} instead of a {o.shape}.", ok_text
    return check


def _relation_check(a_: str, b_: str, phrase: str):
    def check(a: Assessment):
        (_, ok), = a.image.check.relations
        yes = f"{a_[:1].upper()}{a_[1:]} is {phrase} {b_}."
        no = f"{a_[:1].upper()}{a_[1:]} is not {phrase} {b_}."
        if ok:
            return True, yes, no
        f = next((f for f in a.findings if "spatial_relation" in f.aspects and not f.ok and f.in_analysis), None)
        return False, f.text if f else no, yes
    return check


def _no_extra(a: Assessment):
    extra = a.image.check.extra
    if not extra:
        return True, "Only the requested shapes are drawn.", "There is an extra shape."
    d = extra[0]
    return False, f"There is an extra {d.colour} {d.shape}.", "Only the requested shapes are drawn."


def _clean(a: Assessment):
    fx = a.image
    if not fx.detections:
        return False, "The image is empty.", "The shapes are drawn cleanly."
    if fx.quality >= QUALITY_FLAW:
        return True, "The shapes are sharp on a clean background.", "The shapes are blurred or the background noisy."
    f = next((f for f in a.findings if f.in_analysis and not f.ok and
              ("noise_free" in f.aspects or "sharpness" in f.aspects)), None)
    return False, f.text if f else "The drawing is not clean.", "The shapes are sharp on a clean background."


def _text_mentions(ref: Scene, c: str, s: str):
    def check(a: Assessment):
        if a.text is None:
            return False, "There is no text.", f"The text mentions the {c} {s}."
        chk = check_caption(a.text.text, ref)
        if chk.unparseable:
            return False, f"The text names no shapes, so not the {c} {s}.", f"The text mentions the {c} {s}."
        if (c, s) not in {tuple(x) for x in chk.detail["missed"]}:
            return True, f"The text mentions the {c} {s}.", f"The text does not mention the {c} {s}."
        return False, f"The text does not mention the {c} {s}.", f"The text mentions the {c} {s}."
    return check


def _text_faithful(a: Assessment):
    if a.text is None:
        return False, "There is no text.", "The text describes the drawing."
    fs, _, _, _ = caption_findings(a.text.text, a.image.shown, "drawing", subject="The text")
    bad = [f for f in fs if not f.ok]
    if not bad:
        return True, "The text describes the drawing.", "The text contradicts the drawing."
    return False, bad[0].text, "The text describes the drawing."


# ---------------------------------------------------------------- decomposed T2I: extraction, answers, scores
def extraction_for(prompt: dict) -> dc.Extraction:
    """Step 1 from the prompt's draw spec: the shapes, their colours, the relation, and the questions."""
    meta = load_meta(prompt)
    if "spec" not in meta:
        raise TeacherError("the decomposed protocol judges drawing prompts; this prompt has no draw spec")
    spec = DrawSpec.from_json(meta["spec"])
    shapes = _shape_names(spec)
    if len(set(shapes)) != len(shapes):
        raise TeacherError("the oracle's decomposed extraction needs the spec's shapes to be distinct")
    rels, rq = (), ()
    if spec.relation is not None:
        r = spec.relation
        a, b, phrase = shapes[r.subject], shapes[r.object], RELATION_PHRASES[r.relation]
        rels, rq = (f"{a} {phrase} {b}",), (RELATION_Q.format(a=a, phrase=phrase, b=b),)
    return dc.Extraction(tuple(shapes), tuple((s, c) for c, s in spec.objects), rels,
                         tuple(APPEARANCE_Q.format(s=s) for s in shapes),
                         tuple(COLOUR_Q.format(s=s) for s in shapes) + (COUNT_Q,), rq)


def extraction_in(ctx: Mapping) -> dc.Extraction:
    """The extraction a decomposed request's context carries (as a record or as a dict)."""
    ex = ctx.get("extraction")
    if isinstance(ex, Mapping):
        ex = dc.Extraction(**ex)
    if not isinstance(ex, dc.Extraction):
        raise TeacherError("this decomposed step needs the extraction in context")
    return ex


def _parse_question(text: str) -> tuple[str, tuple[str, ...]]:
    for kind, rx in _Q_RES:
        m = rx.match(text)
        if m:
            return kind, m.groups()
    raise TeacherError(f"question {text!r} is not one the oracle can answer")


def caption_of(fx: ImageFacts) -> str:
    """The decomposed answers' caption: what the image shows, from its detections."""
    return describe(fx.shown) if fx.detections else "An empty image."


def _of_shape(fx: ImageFacts, shape: str) -> list[int]:
    """Detections of a shape, best-drawn first."""
    idx = [i for i, d in enumerate(fx.detections) if d.shape == shape]
    return sorted(idx, key=lambda i: -fx.det_quality[i])


def _relation_holds(fx: ImageFacts, a: str, phrase: str, b: str) -> tuple[bool, str] | None:
    ia, ib = _of_shape(fx, a), _of_shape(fx, b)
    if not ia or not ib:
        return None
    da, db = fx.detections[ia[0]], fx.detections[ib[0]]
    rel = _PHRASE_OF[phrase]
    rels = relation_between(Obj(da.shape, da.colour, da.size, da.x, da.y), Obj(db.shape, db.colour, db.size, db.x,
                                                                               db.y), fx.tolerance)
    axis = ("left_of", "right_of") if rel in ("left_of", "right_of") else ("above", "below")
    actual = next((r for r in rels if r in axis), None)
    return rel in rels, RELATION_PHRASES[actual] if actual else "level with"


def answer_question(text: str, fx: ImageFacts) -> str:
    """Step 2: a question answered from the image alone (the detections), never from the prompt."""
    kind, args = _parse_question(text)
    if kind == "count":
        n = len(fx.detections)
        return "There are no shapes." if n == 0 else f"There {'is' if n == 1 else 'are'} {number_word(n)} " \
                                                     f"shape{'' if n == 1 else 's'}."
    if kind == "relation":
        a, phrase, b = args
        got = _relation_holds(fx, a, phrase, b)
        if got is None:
            return f"There is no {a if not _of_shape(fx, a) else b}."
        holds, actual = got
        return f"Yes, the {a} is {phrase} the {b}." if holds else f"No, the {a} is {actual} the {b}."
    (s,) = args
    idx = _of_shape(fx, s)
    if not idx:
        return f"There is no {s}."
    if kind == "colour":
        cols = [fx.detections[i].colour for i in idx]
        return f"The {s} is {cols[0]}." if len(cols) == 1 else \
            f"There are {number_word(len(cols))} {s}s: {', '.join(cols)}."
    q = fx.det_quality[idx[0]]
    if q >= QUALITY_FLAW and fx.clean >= CLEAN_OK:
        return f"Yes, the {s} is clean and sharp."
    if q >= QUALITY_FLAW:
        return f"The {s} is sharp, but the background is noisy."
    return f"No, the {s} is blurred or misshapen."


def score_question(text: str, fx: ImageFacts) -> tuple[int, str, str]:
    """Step 3 for one question: (score 0-10, explanation, its false counterpart), from the image and the spec."""
    kind, args = _parse_question(text)
    spec = fx.spec
    if kind == "count":
        d, n = len(fx.detections), len(spec.objects)
        ok = f"There {'is' if n == 1 else 'are'} {number_word(n)} shape{'' if n == 1 else 's'}, as the prompt asks."
        if d == n:
            return 10, ok, f"There are {number_word(n + 1)} shapes, but the prompt asks for {number_word(n)}."
        return (int(np.floor(10 * (1 - abs(d - n) / max(d, n)) + 0.5)),
                f"There are {number_word(d)} shapes, but the prompt asks for {number_word(n)}.", ok)
    if kind == "relation":
        a, phrase, b = args
        ok = f"The {a} is {phrase} the {b}, as the prompt asks."
        got = _relation_holds(fx, a, phrase, b)
        if got is None:
            return 0, f"There is no {a if not _of_shape(fx, a) else b}, so the relation cannot hold.", ok
        holds, actual = got
        return (10, ok, f"The {a} is not {phrase} the {b}.") if holds else \
            (0, f"The {a} is {actual} the {b}, not {phrase} it.", ok)
    (s,) = args
    want = next((c for c, s2 in spec.objects if s2 == s), None)
    if want is None:
        raise TeacherError(f"the prompt asks for no {s}")
    idx = _of_shape(fx, s)
    if kind == "colour":
        ok = f"The {s} is {want}, as the prompt asks."
        if not idx:
            return 0, f"There is no {s}, so it cannot be {want}.", ok
        cols = [fx.detections[i].colour for i in idx]
        if want in cols:
            other = next(c for c in PALETTES["basic6"] if c != want)
            return 10, ok, f"The {s} is {other}, but the prompt asks for {want}."
        return 0, f"The {s} is {cols[0]}, but the prompt asks for {want}.", ok
    good = f"The {s} is drawn cleanly and sharply."
    if not idx:
        return 0, f"There is no {s}, so it cannot look right.", good
    q = fx.det_quality[idx[0]] * fx.clean
    score = int(np.floor(10 * q + 0.5))
    if score >= 9:
        return score, good, f"The {s} is blurred or misshapen."
    why = f"The {s} sits on a noisy background." if fx.clean < CLEAN_OK else f"The {s} is blurred or misshapen."
    return score, why, good
