"""The oracle's assessment of a text about a scene: an answer to a question about it (IU, NLG scene QA) or a
caption (description) of it, each with the universal text aspects. The records, rubric constants and loaders
are in assessment.py; assess_image.py reuses `caption_findings` and `text_universal` for draw-and-describe.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from itertools import pairwise

from flywheel.worlds.shapes.assessment import (CAPTION_ASPECTS, HALLUCINATION_WEIGHT, QA_CONTENT,
                                               WRONG_ATTRIBUTE_CREDIT, Assessment, Finding, NoGroundTruth,
                                               TextFacts, np_, rating_of)
from flywheel.worlds.shapes.check_text import (TextCheck, check_caption, check_colour_answer, check_count_answer,
                                               check_existence_answer, check_relation_answer)
from flywheel.worlds.shapes.scene import Scene, cap_first, describe, list_objects, relation_between
from flywheel.worlds.shapes.text_parse import (COLOUR_WORDS, GENERIC_NOUNS, NO, NUMBERS, SHAPE_WORDS, SKIP_ADJ, YES,
                                               tokens)
from flywheel.worlds.shapes.vocab import INVERSE, PALETTES, RELATION_PHRASES, number_word

# Words a text about shapes is expected to use (besides the checkers' lexicon): "known words" for word_choice.
_FUNCTION_WORDS = set("""a an the is are was were be there here it its this that these those and or but of to in on at
by with from for as than then next near between middle center centre corner upper lower top bottom left right side
hand above below under over image picture scene drawing shows show shown see can i we you has have looking look
carefully answer what which where how many colour color shape shapes one ones not no yes only also each both all
some other another drawn drew draw describe described""".split())
_KNOWN = (set(COLOUR_WORDS) | set(SHAPE_WORDS) | set(GENERIC_NOUNS) | set(NUMBERS) | YES | NO | SKIP_ADJ
          | _FUNCTION_WORDS)


# ---------------------------------------------------------------- text quality (universal text aspects)
def text_universal(text: str, readable: bool) -> tuple[dict[str, float], list[Finding]]:
    toks = [t for t in tokens(text) if t != ","]
    words = [t for t in toks if t.isalpha()]
    s = text.strip()
    well_formed = float(bool(s) and (s[0].isupper() or s[0].isdigit()) and s[-1] in ".!?"
                        and not re.search(r"[^A-Za-z0-9 ,.;:!?'\"()\-]", s))
    bigrams = list(pairwise(toks))
    repeat = 1 - len(set(bigrams)) / len(bigrams) if bigrams else 0.0
    runs = any(a == b for a, b in pairwise(toks))
    no_rep = 0.0 if (repeat > 0.4 or runs) else 0.5 if repeat > 0.2 else 1.0
    known = sum(w in _KNOWN for w in words) / len(words) if words else 0.0
    known_v = 1.0 if known >= 0.9 else 0.5 if known >= 0.6 else 0.0
    read = 1.0 if readable else 0.0
    long = len(toks) > 40
    values = {"fluency": (well_formed + no_rep + known_v) / 3, "grammaticality": well_formed,
              "coherence": (known_v + no_rep) / 2, "clarity": read, "conciseness": no_rep * (0.5 if long else 1.0),
              "naturalness": (no_rep + well_formed) / 2, "structure": well_formed, "word_choice": known_v,
              "tone_consistency": 1.0, "text_harmlessness": 1.0}
    F = Finding
    fs = [F("It is a complete, well-punctuated sentence.", "It is not a well-formed sentence.", bool(well_formed),
            ("grammaticality", "structure", "fluency", "naturalness"), in_analysis=False),
          F("It does not repeat itself.", "It repeats words.", no_rep == 1.0,
            ("conciseness", "naturalness", "fluency", "coherence"), in_analysis=False),
          F("Its words are clear and on topic.", "Many of its words carry no meaning here.", known_v == 1.0,
            ("word_choice", "coherence", "fluency"), in_analysis=False),
          F("What it says is clear.", "It is hard to tell what it says.", readable, ("clarity",), in_analysis=False),
          F("Its tone is plain and neutral throughout.", "Its tone shifts.", True, ("tone_consistency",),
            in_analysis=False),
          F("It contains nothing harmful.", "It contains harmful content.", True, ("text_harmlessness",),
            in_analysis=False)]
    if long:
        fs.insert(2, F("It is as short as it can be.", "It is much longer than needed.", False, ("conciseness",),
                       in_analysis=False))
    return values, [f if f.ok else replace(f, text=f.false_text, false_text=f.text) for f in fs]


# ---------------------------------------------------------------- question answers (IU, NLG scene QA)
def _are(n: int) -> str:
    return "is" if n == 1 else "are"


def _things(colour: str | None, shape: str, n: int) -> str:
    word = shape if n == 1 else shape + "s"
    return f"{colour} {word}" if colour else word


def _other_colour(c: str | None) -> str:
    return next(x for x in PALETTES["basic6"] if x != c)


def assess_answer(text: str, scene: Scene, q: dict, where: str) -> Assessment:
    kind = q.get("type")
    objs = scene.objects
    if kind == "colour":
        chk = check_colour_answer(text, q["answer"])
    elif kind == "count":
        chk = check_count_answer(text, q["answer"])
    elif kind == "existence":
        chk = check_existence_answer(text, q["answer"])
    elif kind == "relation":
        a, b = objs[q["subject"]], objs[q["object"]]
        truth = relation_between(a, b, scene.margin)
        chk = check_relation_answer(text, truth, (a.colour, a.shape), (b.colour, b.shape), asked=q["relation"])
    else:
        raise NoGroundTruth(f"unknown question type {kind!r}")
    content = QA_CONTENT[kind]
    tags = (content, "answer_correctness")
    F = Finding
    if chk.unparseable:
        missing = {"colour": "a colour", "count": "a number", "existence": "a yes or no",
                   "relation": "a yes or no or a relation"}[kind]
        truth_text = _truth_sentence(kind, q, scene, where)
        f = F(f"{cap_first(truth_text)}. The answer does not give {missing}, which is wrong.",
              f"{cap_first(truth_text)}. The answer gives it, which is right.", False, tags + ("answer_format",),
              key=True)
        aspects = {content: 0.0, "answer_correctness": 0.0, "answer_format": 0.0}
        if kind == "existence":
            aspects["object_hallucination"] = 1.0
        return _qa_assessment(text, [f], aspects, 1, readable=False, check=chk)

    right = chk.correct == 1.0
    said = chk.parsed
    # The evidence comes first and the verdict after it ("The circle is red. The answer says green, which is
    # wrong."): a student judge writes its analysis left to right, so a verdict stated before the evidence must be
    # guessed. Measured: a judge taught "The answer says green, but the circle is red." picked "and"/"but" by the
    # prompt, not the answer (its ratings of one prompt's answers all within 0.1), and ordered 0.64 of gold pairs.
    # A colour answer's colour comes first only because the evidence is then a check of that colour in the image
    # ("The answer says green. The circle is not green but red"), made before the verdict (_colour_verdict).
    if kind == "colour":
        f = _colour_verdict(q["shape"], said, q["answer"], right, tags)
    elif kind == "count":
        n, truth = said, q["answer"]
        things = lambda k: _things(q.get("colour"), q["shape"], k)  # noqa: E731
        lie = n if not right else n + 1
        f = _verdict(f"There {_are(truth)} {number_word(truth)} {things(truth)}.",
                     f"There {_are(lie)} {number_word(lie)} {things(lie)}.",
                     f"The answer says {number_word(n)}", right, tags)
    elif kind == "existence":
        npn = np_(q["colour"], q["shape"])
        there = f"There is {npn} in the {where}."
        not_there = f"There is no {q['colour']} {q['shape']} in the {where}."
        truth, lie = (there, not_there) if q["answer"] else (not_there, there)
        f = _verdict(truth, lie, f"The answer says {'yes' if said else 'no'}", right,
                     tags + (("object_hallucination",) if said and not q["answer"] else ()))
    else:
        truth = cap_first(_relation_truth(q, scene)) + "."
        lie = cap_first(_relation_truth(q, scene, lie=True)) + "."
        says = f"says {'yes' if said else 'no'}" if isinstance(said, bool) else "states a relation"
        f = _verdict(truth, lie, f"The answer {says}", right, tags)
    fs = [f]
    fmt = chk.aspects.get("answer_format", 1.0)
    fs.append(F("It gives the short answer asked for.", "It is longer than the short answer asked for.",
                fmt >= 1.0, ("answer_format",)) if fmt >= 1.0 else
              F("It is longer than the short answer asked for.", "It gives the short answer asked for.", False,
                ("answer_format",)))
    if right:
        rating = 5 if fmt >= 1.0 else 4
    else:
        rating = 2 if kind == "count" and abs(said - q["answer"]) == 1 else 1
    aspects = dict(chk.aspects)
    return _qa_assessment(text, fs, aspects, rating, readable=True, check=chk)


def _verdict(truth: str, lie: str, claim: str, right: bool, tags: tuple[str, ...]) -> Finding:
    """A QA answer's key finding: what holds, what the answer says, whether the two match, and so whether it is
    right. Its false counterpart (a misperceiving annotator) states the lie and the opposite verdict.

    The comparison is a word of its own ("which differs, so it is wrong"), the words the judge base's matching
    rows teach (policy_data.reading_example): the tiny judge wrote both values yet said "right" whenever they
    differed, while the base, taught "which matches/differs", told them apart every time (issue 7's notes)."""
    said = lambda fact, ok: f"{fact} {claim}, {_judged(ok)}"  # noqa: E731
    return Finding(said(truth, right), said(lie, not right), right, tags, key=True)


def _judged(ok: bool) -> str:
    """The comparison and the verdict that follows it, the words every QA answer's key finding ends with."""
    return f"which {'matches' if ok else 'differs'}, so it is {'right' if ok else 'wrong'}."


def _colour_verdict(shape: str, said: str, truth: str, right: bool, tags: tuple[str, ...]) -> Finding:
    """A colour answer's key finding: the answer's colour first, then whether the shape has it, then the verdict
    ("The answer says blue. The circle is not blue but red, which differs, so it is wrong.").

    The answer's colour is checked against the image, a yes/no look-up like an existence question's, not compared
    with a colour written before it: the tiny judge read both colours right and still wrote "blue against red
    matches" of 16 of 16 wrong gold answers, while taught this wording it told all 16 apart and called every right
    one right (bench/answer_compare_probe.py, docs/results.md). Its false counterpart states the opposite."""
    def said_(ok: bool, actual: str) -> str:
        holds = f"is {said}" if ok else f"is not {said} but {actual}"
        return f"The answer says {said}. The {shape} {holds}, {_judged(ok)}"
    return Finding(said_(right, truth), said_(not right, _other_colour(said)), right, tags, key=True)


def _relation_truth(q: dict, scene: Scene, lie: bool = False) -> str:
    """'red circle is to the left of the blue square' (what holds on the asked axis; lie: the opposite)."""
    a, b = scene.objects[q["subject"]], scene.objects[q["object"]]
    asked = q["relation"]
    holds = asked in relation_between(a, b, scene.margin)
    rel = asked if holds != lie else INVERSE[asked]
    return f"{a.colour} {a.shape} is {RELATION_PHRASES[rel]} the {b.colour} {b.shape}"


def _truth_sentence(kind: str, q: dict, scene: Scene, where: str) -> str:
    if kind == "colour":
        return f"the {q['shape']} is {q['answer']}"
    if kind == "count":
        n = q["answer"]
        return f"there {_are(n)} {number_word(n)} {_things(q.get('colour'), q['shape'], n)}"
    if kind == "existence":
        return (f"there is {np_(q['colour'], q['shape'])} in the {where}" if q["answer"]
                else f"there is no {q['colour']} {q['shape']} in the {where}")
    return "the " + _relation_truth(q, scene)


def _qa_assessment(text: str, fs: list[Finding], aspects: dict, rating: int, readable: bool,
                   check: TextCheck) -> Assessment:
    uni, ufs = text_universal(text, readable)
    right = 1.0 if rating >= 4 else 0.0
    return Assessment("text", fs + ufs, {**uni, **aspects}, rating, all_ok=None,
                      facts=(right, 1.0), text=TextFacts(text, check, readable))


# ---------------------------------------------------------------- captions and descriptions
def caption_findings(text: str, scene: Scene, where: str, subject: str = "It",
                     expect_relations: bool = False) -> tuple[list[Finding], dict[str, float], tuple[float, float],
                                                             TextCheck]:
    """Findings about a text describing `scene`, its aspect values and its (right, total) facts.
    expect_relations: the reference states relations, so a text that states none misses something."""
    chk = check_caption(text, scene)
    n_obj = max(len(scene.objects), 1)
    F = Finding
    if chk.unparseable:
        truth = describe(scene)
        f = F(f"{subject} names no shapes, but the {where} shows {truth[:1].lower() + truth[1:-1]}.",
              f"{subject} names the shapes of the {where} correctly.", False, CAPTION_ASPECTS)
        return [f], {a: 0.0 for a in CAPTION_ASPECTS}, (0.0, float(n_obj)), chk
    d = chk.detail
    objs = Counter((o.colour, o.shape) for o in scene.objects)
    missed = Counter(tuple(x) for x in d["missed"])
    exact = objs - missed
    mentioned = Counter(tuple(x) for x in d["mentioned"])
    halluc = Counter(tuple(x) for x in d["hallucinated"])
    wrong = mentioned - exact - halluc
    left = list(missed.elements())
    pairs = []
    for m in wrong.elements():
        j = next((i for i, o in enumerate(left) if o[1] == m[1]), None)
        if j is None:
            j = next((i for i, o in enumerate(left) if m[0] is not None and o[0] == m[0]), None)
        if j is None and left:
            j = 0
        if j is not None:
            pairs.append((m, left.pop(j)))
    fs: list[Finding] = []
    for (c, s), n in exact.items():
        fs.append(F(f"{subject} mentions {np_(c, s, count=n)}.", f"{subject} misses the {c} {s}.", True,
                    ("object_presence", "color_accuracy", "shape_accuracy", "attribute_binding", "count_accuracy")))
    for m, o in pairs:
        if m[0] is None:
            t, tags = f"{subject} mentions a {m[1]} but not its colour.", ("color_accuracy",)
        elif m[1] == o[1]:
            t, tags = f"{subject} calls the {o[0]} {o[1]} {m[0]}.", ("color_accuracy",)
        elif m[0] == o[0]:
            t, tags = f"{subject} calls the {o[0]} {o[1]} {np_(None, m[1])}.", ("shape_accuracy",)
        else:
            t, tags = f"{subject} says {np_(*m)} where there is {np_(*o)}.", ("color_accuracy", "shape_accuracy")
        fs.append(F(t, f"{subject} mentions the {o[0]} {o[1]} correctly.", False,
                    tags + ("attribute_binding", "object_presence")))
    for o in left:
        fs.append(F(f"{subject} misses the {o[0]} {o[1]}.", f"{subject} mentions the {o[0]} {o[1]}.", False,
                    ("object_presence", "count_accuracy")))
    for m in halluc.elements():
        fs.append(F(f"{subject} mentions {np_(*m)}, which is not in the {where}.",
                    f"{subject} mentions {np_(*m)}, which is in the {where}.", False,
                    ("object_hallucination", "count_accuracy")))
    rel_right = 0
    for s_, rel, o_, neg, ok in d["relations"]:
        stmt = f"the {_plain(s_)} is {'not ' if neg else ''}{RELATION_PHRASES[rel]} the {_plain(o_)}"
        rel_right += bool(ok)
        fs.append(F(f"{subject} correctly says {stmt}.", f"{subject} says {stmt}, which is wrong.", True,
                    ("spatial_relation",)) if ok else
                  F(f"{subject} says {stmt}, which is wrong.", f"{subject} correctly says {stmt}.", False,
                    ("spatial_relation",)))
    aspects = dict(chk.aspects)
    missing_rel = expect_relations and not d["relations"]
    if missing_rel:
        fs.append(F(f"{subject} does not say where the shapes are relative to each other.",
                    f"{subject} says where the shapes are relative to each other.", False, ("spatial_relation",)))
        aspects["spatial_relation"] = 0.5
    elif "spatial_relation" not in aspects:
        aspects["spatial_relation"] = 1.0
    if not halluc:
        fs.append(F(f"Every shape {subject.lower()} mentions is in the {where}.",
                    f"{subject} mentions a shape that is not in the {where}.", True, ("object_hallucination",)))
    if aspects.get("count_accuracy", 1.0) < 1.0 and not left and not halluc:
        fs.append(F(f"{subject} gives a wrong number of shapes.", f"{subject} gives the right number of shapes.",
                    False, ("count_accuracy",)))
    aspects.setdefault("count_accuracy", 1.0)
    right = sum(exact.values()) + WRONG_ATTRIBUTE_CREDIT * len(pairs) + rel_right
    total = sum(objs.values()) + HALLUCINATION_WEIGHT * sum(halluc.values()) + len(d["relations"]) + missing_rel
    return fs, aspects, (right, max(total, 1.0)), chk


def _plain(m) -> str:
    c, s = m
    return f"{c + ' ' if c else ''}{s or 'shape'}"


def assess_caption(text: str, scene: Scene, where: str, reference: str | None) -> Assessment:
    expect = False
    if reference:
        ref = check_caption(reference, scene)
        expect = not ref.unparseable and bool(ref.detail.get("relations"))
    fs, aspects, (right, total), chk = caption_findings(text, scene, where, expect_relations=expect)
    uni, ufs = text_universal(text, not chk.unparseable)
    # what the image holds comes first, so a student judge compares the text with facts it has already written
    lead = f"The {where} shows {list_objects(scene)}."
    return Assessment("text", fs + ufs, {**uni, **aspects}, rating_of(right / total), lead=lead,
                      all_ok="It describes every shape correctly.", facts=(right, total),
                      text=TextFacts(text, chk, not chk.unparseable))

