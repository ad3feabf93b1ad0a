"""What the oracle teacher knows about one output: findings read off the checkers, aspect values and gold scores.

An `Assessment` is the ground truth about one candidate for one prompt. It holds
- `findings`: short statements, each true of the output, with the aspects it bears on and its false
  counterpart (what a misperceiving annotator would say instead: the teacher's `wrong_analysis` error);
- `aspects`: a value in [0, 1] for every task aspect the checkers score and every universal aspect of the
  output's modality (universal ones are derived from what the checkers see without the query: text that parses,
  is well formed and does not repeat itself; clean, sharp shapes on a clean background);
- `rating` (1-5, the pointwise scale) and, for images, `score10` (0-10, the checker's own overall).

The rating follows the pointwise guidelines (configs/guidelines/pointwise.yaml): the share of the output's facts
that are right - each object stated or drawn right (half credit for a wrong colour or shape), each stated or
requested relation, minus half a fact per hallucinated object - mapped by RATING_STEPS, capped for image
quality flaws. Answers to questions are right or wrong (5 or 1), with 4 for a right answer that is not in the
short form asked for and 2 for a count that is off by one. Draw-and-describe outputs get the weaker of the
drawing's rating and its text's (the text judged against what the drawing shows).
"""
from __future__ import annotations

import io
import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PIL import Image

from flywheel.worlds.shapes.check_image import ImageCheck, check_image, detected_scene
from flywheel.worlds.shapes.check_text import (TextCheck, check_caption, check_colour_answer, check_count_answer,
                                               check_existence_answer, check_relation_answer)
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.scene import Scene, cap_first, describe, list_objects, relation_between
from flywheel.worlds.shapes.segment import Detection
from flywheel.worlds.shapes.spec import DrawSpec
from flywheel.worlds.shapes.text_parse import (COLOUR_WORDS, GENERIC_NOUNS, NO, NUMBERS, SHAPE_WORDS, SKIP_ADJ, YES,
                                               tokens)
from flywheel.worlds.shapes.vocab import INVERSE, PALETTES, RELATION_PHRASES, number_word

# ---------------------------------------------------------------- the oracle's rubric (constants, documented)
# Share of facts right -> rating: at least 1.0 -> 5, 0.85 -> 4, 0.6 -> 3, 0.3 -> 2, else 1.
RATING_STEPS: tuple[tuple[float, int], ...] = ((0.999, 5), (0.85, 4), (0.6, 3), (0.3, 2))
# Image quality (mean shape quality x background cleanliness, from check_image): below FLAW the rating is at most
# 4, below POOR at most 3 (the guideline's "quality is poor").
QUALITY_FLAW, QUALITY_POOR = 0.85, 0.6
CLEAN_OK = 0.9  # background cleanliness below this is "noisy"
MAX_STATEMENTS = 4  # an analysis states at most this many findings (the last may summarise the rest)
HALLUCINATION_WEIGHT = 0.5  # a hallucinated object counts as half a wrong fact
WRONG_ATTRIBUTE_CREDIT = 0.5  # an object present with a wrong colour or shape is half right

TEXT_UNIVERSAL = ("fluency", "grammaticality", "coherence", "clarity", "conciseness", "naturalness", "structure",
                  "word_choice", "tone_consistency", "text_harmlessness")
IMAGE_UNIVERSAL = ("realism", "artifact_free", "structural_integrity", "composition", "color_harmony", "lighting",
                   "visual_appeal", "sharpness", "noise_free", "exposure_balance", "fine_detail",
                   "image_harmlessness")
IMAGE_TEXT_UNIVERSAL = ("text_image_consistency", "image_text_complementarity", "interleaving_order",
                        "layout_readability", "style_consistency", "entity_consistency")
CAPTION_ASPECTS = ("object_presence", "object_hallucination", "color_accuracy", "shape_accuracy",
                   "attribute_binding", "count_accuracy", "spatial_relation")
QA_CONTENT = {"colour": "color_accuracy", "count": "count_accuracy", "existence": "existence_accuracy",
              "relation": "spatial_relation"}
# Words a text about shapes is expected to use (besides the checkers' lexicon): "known words" for word_choice.
_FUNCTION_WORDS = set("""a an the is are was were be there here it its this that these those and or but of to in on at
by with from for as than then next near between middle center centre corner upper lower top bottom left right side
hand above below under over image picture scene drawing shows show shown see can i we you has have looking look
carefully answer what which where how many colour color shape shapes one ones not no yes only also each both all
some other another drawn drew draw describe described""".split())
_KNOWN = (set(COLOUR_WORDS) | set(SHAPE_WORDS) | set(GENERIC_NOUNS) | set(NUMBERS) | YES | NO | SKIP_ADJ
          | _FUNCTION_WORDS)


class NoGroundTruth(ValueError):
    """The prompt or candidate carries nothing the oracle can judge from (the request gets an error)."""


@dataclass(frozen=True)
class Finding:
    """One statement about an output that is true of it, and its false counterpart."""

    text: str
    false_text: str
    ok: bool
    aspects: tuple[str, ...]
    key: bool = False  # shown in the analysis even when ok (e.g. the verdict on a QA answer)
    in_analysis: bool = True  # False: only for aspect feedback (universal text quality)

    def flipped(self) -> Finding:
        return replace(self, text=self.false_text, false_text=self.text, ok=not self.ok)


@dataclass
class Assessment:
    modality: str  # text | image | image-text
    findings: list[Finding]
    aspects: dict[str, float]
    rating: int
    lead: str | None = None  # a neutral description of the output (images: what the render shows)
    all_ok: str | None = "It is correct."  # said when nothing is wrong (None: the key finding already says so)
    score10: int | None = None
    facts: tuple[float, float] = (0.0, 0.0)  # (right, total)
    quality: float | None = None
    image: ImageFacts | None = None
    text: TextFacts | None = None

    def analysis(self, findings: list[Finding] | None = None) -> str:
        """The analysis text: the lead, then every wrong (or key) finding, else the all-ok sentence."""
        fs = [f for f in (self.findings if findings is None else findings) if f.in_analysis]
        shown = [self.lead] if self.lead else []
        said = [f.text for f in fs if (f.key or not f.ok) and f.text != self.lead]
        said = list(dict.fromkeys(said))
        if len(said) > MAX_STATEMENTS:  # short: the first few problems, then how many more
            more = len(said) - MAX_STATEMENTS + 1
            said = said[:MAX_STATEMENTS - 1] + [f"It has {more} more errors."]
        shown += said
        if self.all_ok and not any(not f.ok for f in fs):
            shown.append(self.all_ok)
        return " ".join(shown)

    def feedback(self, aspect: str, findings: list[Finding] | None = None) -> Finding:
        """The finding that speaks for one aspect: its first wrong finding, else its first right one, else a
        generic statement from the aspect's value."""
        fs = [f for f in (self.findings if findings is None else findings) if aspect in f.aspects]
        bad = [f for f in fs if not f.ok]
        if bad:
            return bad[0]
        if fs:
            return fs[0]
        words = aspect.replace("_", " ")
        good = f"Nothing is wrong with its {words}."
        poor = f"Its {words} has problems."
        ok = self.aspects.get(aspect, 1.0) >= 0.999
        return Finding(good if ok else poor, poor if ok else good, ok, (aspect,))


def rating_of(fraction: float, quality: float | None = None) -> int:
    r = next((v for lo, v in RATING_STEPS if fraction >= lo), 1)
    if quality is not None:
        r = min(r, 4 if quality >= QUALITY_POOR else 3) if quality < QUALITY_FLAW else r
    return r


def value_score(v: float) -> int:
    """An aspect value in [0, 1] on the 1-5 scale (round half up)."""
    return 1 + int(np.floor(4 * float(v) + 0.5))


def np_(colour: str | None, shape: str | None, article: str = "a", count: int = 1) -> str:
    """'a red circle', 'the red circle', 'two red circles', 'a circle' (no colour), 'a red shape' (no shape)."""
    words = " ".join(w for w in (colour, shape or "shape") if w)
    if count != 1:
        return f"{number_word(count)} {words}s"
    if article == "a" and words[0] in "aeiou":
        article = "an"
    return f"{article} {words}"


# ---------------------------------------------------------------- ground truth from records
def load_meta(prompt: dict) -> dict:
    meta = prompt.get("meta")
    if isinstance(meta, (bytes, bytearray)):
        meta = meta.decode()
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            raise NoGroundTruth("prompt meta is not JSON") from None
    if not isinstance(meta, dict) or not ("scene" in meta or "spec" in meta):
        raise NoGroundTruth(f"prompt {prompt.get('prompt_id')!r} (source {prompt.get('source')!r}) has no oracle "
                            "ground truth in meta (scene or spec)")
    return meta


def scene_of(prompt: dict) -> Scene:
    meta = load_meta(prompt)
    if "scene" not in meta:
        raise NoGroundTruth("prompt meta has no scene")
    return Scene.from_json(meta["scene"])


def spec_of(prompt: dict) -> DrawSpec:
    meta = load_meta(prompt)
    if "spec" not in meta:
        raise NoGroundTruth("prompt meta has no draw spec")
    return DrawSpec.from_json(meta["spec"])


def image_of(candidate: dict) -> Image.Image:
    imgs = candidate.get("output_images")
    if imgs is None or len(imgs) == 0:
        raise NoGroundTruth(f"candidate {candidate.get('candidate_id')!r} has no output image")
    img = imgs[0]
    if isinstance(img, (bytes, bytearray, memoryview)):
        try:
            img = Image.open(io.BytesIO(bytes(img)))
            img.load()
        except Exception as e:  # PIL raises several types for bad bytes
            raise NoGroundTruth(f"undecodable output image ({type(e).__name__})") from None
    if not isinstance(img, Image.Image):
        raise NoGroundTruth(f"output image is {type(img).__name__}, not an image")
    return img.convert("RGB")


def text_of(candidate: dict) -> str:
    text = candidate.get("output_text")
    if not isinstance(text, str):
        raise NoGroundTruth(f"candidate {candidate.get('candidate_id')!r} has no output text")
    return text


# ---------------------------------------------------------------- text quality (universal text aspects)
@dataclass
class TextFacts:
    text: str
    check: TextCheck | None = None
    readable: bool = True


def text_universal(text: str, readable: bool) -> tuple[dict[str, float], list[Finding]]:
    toks = [t for t in tokens(text) if t != ","]
    words = [t for t in toks if t.isalpha()]
    s = text.strip()
    well_formed = float(bool(s) and (s[0].isupper() or s[0].isdigit()) and s[-1] in ".!?"
                        and not re.search(r"[^A-Za-z0-9 ,.;:!?'\"()\-]", s))
    bigrams = list(zip(toks, toks[1:]))
    repeat = 1 - len(set(bigrams)) / len(bigrams) if bigrams else 0.0
    runs = any(a == b for a, b in zip(toks, toks[1:]))
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
              f"{cap_first(truth_text)}. The answer gives it, which is right.", False, tags + ("answer_format",), key=True)
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
    if kind == "colour":
        shape, truth = q["shape"], q["answer"]
        lie = said if not right else _other_colour(said)
        f = _verdict(f"The {shape} is {truth}.", f"The {shape} is {lie}.", f"The answer says {said}", right, tags)
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
    said = lambda fact, ok: (f"{fact} {claim}, which {'matches' if ok else 'differs'}, "  # noqa: E731
                             f"so it is {'right' if ok else 'wrong'}.")
    return Finding(said(truth, right), said(lie, not right), right, tags, key=True)


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


# ---------------------------------------------------------------- images
@dataclass
class ImageFacts:
    """What the image checker found, kept for the rubric and decomposed protocols."""

    check: ImageCheck  # against the spec
    detections: tuple[Detection, ...]
    det_quality: tuple[float, ...]  # appearance of each detection in [0, 1]
    clean: float  # background cleanliness in [0, 1]
    quality: float  # mean detection quality x clean (0 for an empty image)
    shown: Scene  # what the image shows, as a scene
    spec: DrawSpec
    tolerance: float  # relation tolerance of the checker


def image_facts(img: Image.Image, spec: DrawSpec, world: ShapesWorldConfig) -> ImageFacts:
    chk = check_image(img, spec, world)
    shown = detected_scene(chk.segmentation, world.relation_margin)
    dets = chk.segmentation.detections
    if dets:
        self_chk = check_image(img, shown, world)  # every detection against itself: shape quality only
        dq = tuple(o.quality for o in self_chk.objects)
        mean_q = sum(dq) / len(dq)
        clean = self_chk.appearance / mean_q if mean_q > 1e-9 else 1.0 - chk.segmentation.speck_fraction
        quality = self_chk.appearance
    else:
        dq, clean, quality = (), 1.0 - chk.segmentation.speck_fraction, 0.0
    return ImageFacts(chk, dets, dq, float(min(max(clean, 0.0), 1.0)), float(quality), shown, spec,
                      world.checker.relation_tolerance * world.relation_margin)


def image_lead(fx: ImageFacts) -> str:
    if not fx.detections:
        return "The image is empty."
    d = describe(fx.shown)
    return f"The image shows {d[:1].lower()}{d[1:]}"


def image_universal(fx: ImageFacts) -> tuple[dict[str, float], list[Finding]]:
    has = bool(fx.detections)
    mean_q = sum(fx.det_quality) / len(fx.det_quality) if has else 0.0
    values = {"sharpness": mean_q, "fine_detail": mean_q, "structural_integrity": mean_q,
              "noise_free": fx.clean, "exposure_balance": fx.clean, "artifact_free": fx.quality if has else fx.clean,
              "composition": 1.0 if has else 0.0, "realism": fx.quality, "visual_appeal": fx.quality,
              "color_harmony": 1.0, "lighting": 1.0, "image_harmlessness": 1.0}
    F = Finding
    fs = []
    if not has:
        fs.append(F("The image is empty.", "The image shows clean shapes.", False,
                    ("composition", "realism", "visual_appeal", "structural_integrity", "sharpness", "fine_detail",
                     "artifact_free")))
    else:
        sharp = mean_q >= QUALITY_FLAW
        fs.append(F("The shapes are sharp and well formed.", "The shapes are blurred or misshapen.", True,
                    ("sharpness", "fine_detail", "structural_integrity", "realism", "visual_appeal"))
                  if sharp else
                  F("The shapes are blurred or misshapen.", "The shapes are sharp and well formed.", False,
                    ("sharpness", "fine_detail", "structural_integrity", "realism", "visual_appeal", "artifact_free")))
    clean = fx.clean >= CLEAN_OK
    fs.append(F("The background is clean.", "The background is noisy.", True, ("noise_free", "exposure_balance",
                                                                               "artifact_free"))
              if clean else F("The background is noisy.", "The background is clean.", False,
                              ("noise_free", "exposure_balance", "artifact_free", "realism", "visual_appeal")))
    fs += [F("The shapes stand apart on the canvas.", "The shapes are crowded together.", True, ("composition",),
             in_analysis=False) if has else None,
           F("The colours are flat and vivid.", "The colours clash.", True, ("color_harmony",), in_analysis=False),
           F("The lighting is flat and even.", "The lighting is uneven.", True, ("lighting",), in_analysis=False),
           F("It contains nothing harmful.", "It contains harmful content.", True, ("image_harmlessness",),
             in_analysis=False)]
    return values, [f for f in fs if f is not None]


def image_findings(fx: ImageFacts) -> tuple[list[Finding], tuple[float, float]]:
    """Findings about the render against its spec, and its (right, total) facts."""
    F = Finding
    chk, spec = fx.check, fx.spec
    fs, right = [], 0.0
    for o in chk.objects:
        c, s = o.colour, o.shape
        if not o.found:
            fs.append(F(f"The requested {c} {s} is missing.", f"The {c} {s} is drawn.", False,
                        ("object_presence", "count_accuracy")))
        elif not o.colour_ok:
            right += WRONG_ATTRIBUTE_CREDIT
            fs.append(F(f"The {s} is {o.detected_colour} instead of {c}.", f"The {s} is {c}, as requested.", False,
                        ("color_accuracy", "attribute_binding")))
        elif not o.shape_ok:
            right += WRONG_ATTRIBUTE_CREDIT
            fs.append(F(f"The {c} shape is {np_(None, o.detected_shape)} instead of {np_(None, s)}.",
                        f"The {c} {s} is drawn as requested.", False, ("shape_accuracy", "attribute_binding")))
        else:
            right += 1
            fs.append(F(f"The {c} {s} is drawn.", f"The requested {c} {s} is missing.", True,
                        ("object_presence", "color_accuracy", "shape_accuracy", "attribute_binding")))
    for d in chk.extra:
        fs.append(F(f"There is an extra {d.colour} {d.shape}.", f"There is no {d.colour} {d.shape}.", False,
                    ("object_hallucination", "count_accuracy")))
    if not chk.extra:
        fs.append(F("Nothing else is drawn.", "There is an extra shape.", True, ("object_hallucination",)))
    if len(fx.detections) == len(chk.objects):
        fs.append(F("The number of shapes is right.", "The number of shapes is wrong.", True, ("count_accuracy",)))
    if not chk.relations:
        fs.append(F("No relation between the shapes was asked for.", "The shapes are placed wrongly.", True,
                    ("spatial_relation",), in_analysis=False))
    total = len(chk.objects) + HALLUCINATION_WEIGHT * len(chk.extra)
    for r, ok in chk.relations:
        (ca, sa), (cb, sb) = spec.objects[r.subject], spec.objects[r.object]
        phrase = RELATION_PHRASES[r.relation]
        a_, b_ = f"the {ca} {sa}", f"the {cb} {sb}"
        total += 1
        if ok:
            right += 1
            fs.append(F(f"{cap_first(a_)} is {phrase} {b_}, as requested.", f"{cap_first(a_)} is not {phrase} {b_}.", True,
                        ("spatial_relation",)))
            continue
        oa, ob = chk.objects[r.subject], chk.objects[r.object]
        if oa.found and ob.found:
            actual = _actual_relation(oa.x, oa.y, ob.x, ob.y, r.relation, fx.tolerance)
            t = f"{cap_first(a_)} should be {phrase} {b_} but is {actual}."
        else:
            t = f"{cap_first(a_)} cannot be {phrase} {b_}, since one of them is missing."
        fs.append(F(t, f"{cap_first(a_)} is {phrase} {b_}, as requested.", False, ("spatial_relation",)))
    return fs, (right, max(total, 1.0))


def _actual_relation(ax: float, ay: float, bx: float, by: float, asked: str, tol: float) -> str:
    """What holds on the asked relation's axis, as a phrase ending with 'it': 'below it', 'level with it'."""
    from flywheel.worlds.shapes.scene import Obj

    rels = relation_between(Obj("circle", "red", 0.1, ax, ay), Obj("circle", "red", 0.1, bx, by), tol)
    axis = ("left_of", "right_of") if asked in ("left_of", "right_of") else ("above", "below")
    on_axis = [r for r in rels if r in axis]
    if on_axis:
        return f"{RELATION_PHRASES[on_axis[0]]} it"
    return "level with it"


def assess_image(img: Image.Image, spec: DrawSpec, world: ShapesWorldConfig) -> Assessment:
    fx = image_facts(img, spec, world)
    fs, (right, total) = image_findings(fx)
    uni, ufs = image_universal(fx)
    aspects = {**uni, **fx.check.aspects}
    aspects.setdefault("spatial_relation", 1.0)  # nothing relational asked: nothing can be wrong
    return Assessment("image", fs + ufs, aspects,
                      rating_of(right / total, fx.quality), lead=image_lead(fx), all_ok="It matches the prompt.",
                      score10=int(np.floor(fx.check.score_10 + 0.5)), facts=(right, total), quality=fx.quality,
                      image=fx)


def assess_image_text(img: Image.Image, text: str, spec: DrawSpec, world: ShapesWorldConfig) -> Assessment:
    """ITIG: the render against the spec, and the text against what the render shows."""
    im = assess_image(img, spec, world)
    fx = im.image
    tfs, taspects, (tr, tt), chk = caption_findings(text, fx.shown, "drawing", subject="The text")
    uni, ufs = text_universal(text, not chk.unparseable)
    consistency = tr / tt
    readable = 1.0 if not chk.unparseable else 0.0
    it = {"text_image_consistency": consistency, "entity_consistency": consistency,
          "image_text_complementarity": 1.0 if (readable and fx.detections) else 0.5,
          "interleaving_order": 1.0, "layout_readability": readable, "style_consistency": 1.0}
    F = Finding
    ok_c = consistency >= 0.999
    ifs = [F("The text describes the drawing.", "The text contradicts the drawing.", True,
             ("text_image_consistency", "entity_consistency"), in_analysis=False) if ok_c else
           F("The text does not match the drawing.", "The text describes the drawing.", False,
             ("text_image_consistency", "entity_consistency"), in_analysis=False),
           F("The text names the shapes and the image shows where they are.", "The text only repeats the image.",
             it["image_text_complementarity"] == 1.0, ("image_text_complementarity",), in_analysis=False),
           F("The text comes with its one image.", "The text and image are out of order.", True,
             ("interleaving_order",), in_analysis=False),
           F("Text and image are easy to follow together.", "Text and image are hard to follow together.",
             bool(readable), ("layout_readability",), in_analysis=False),
           F("There is one image, in one style.", "The images differ in style.", True, ("style_consistency",),
             in_analysis=False)]
    right, total = im.facts[0] + tr, im.facts[1] + tt
    # task aspects: the image's, each worsened by the text's where the text is wrong about the drawing
    aspects = {**uni, **im.aspects, **it}
    for a, v in taspects.items():
        if a in im.aspects:
            aspects[a] = min(aspects[a], v)
    # the weaker of the drawing and its text: a right text about a wrong drawing does not make up for it
    rating = min(im.rating, rating_of(tr / tt))
    return Assessment("image-text", im.findings + tfs + ufs + ifs, aspects, rating,
                      lead=im.lead, all_ok="The drawing matches the prompt and the text describes it.",
                      score10=im.score10, facts=(right, total), quality=fx.quality, image=fx,
                      text=TextFacts(text, chk, not chk.unparseable))


# ---------------------------------------------------------------- dispatch
def assess(prompt: dict, candidate: dict, world: ShapesWorldConfig) -> Assessment:
    """The oracle's assessment of a candidate for an oracle-world prompt (NoGroundTruth when it has none)."""
    meta = load_meta(prompt)
    task = prompt.get("task")
    if "scene" in meta:
        scene = Scene.from_json(meta["scene"])
        q = meta.get("question") or {}
        where = "image" if task == "iu" else "scene"
        text = text_of(candidate)
        if q.get("type") == "caption":
            return assess_caption(text, scene, where, prompt.get("reference_text"))
        return assess_answer(text, scene, q, where)
    spec = DrawSpec.from_json(meta["spec"])
    img = image_of(candidate)
    if task == "itig":
        text = candidate.get("output_text")
        if isinstance(text, str):
            return assess_image_text(img, text, spec, world)
    return assess_image(img, spec, world)


def facts_detail(a: Assessment) -> dict[str, Any]:
    """A JSON-able summary (for logs and tests)."""
    return {"rating": a.rating, "score10": a.score10, "facts": list(a.facts), "quality": a.quality,
            "findings": [[f.text, f.ok] for f in a.findings if f.in_analysis]}
