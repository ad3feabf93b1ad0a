"""The oracle's assessment of a drawing against its draw spec (IG), with the universal image aspects, and of a
draw-and-describe output (ITIG): the drawing, and its text against what the drawing shows (the caption code of
assess_text.py). The records, rubric constants and loaders are in assessment.py.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from flywheel.worlds.shapes.assess_text import caption_findings, text_universal
from flywheel.worlds.shapes.assessment import (CLEAN_OK, HALLUCINATION_WEIGHT, QUALITY_FLAW, WRONG_ATTRIBUTE_CREDIT,
                                               Assessment, Finding, ImageFacts, TextFacts, np_, rating_of)
from flywheel.worlds.shapes.check_image import check_image, detected_scene
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.scene import cap_first, describe, relation_between
from flywheel.worlds.shapes.spec import DrawSpec
from flywheel.worlds.shapes.vocab import RELATION_PHRASES


# ---------------------------------------------------------------- images
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
            fs.append(F(f"{cap_first(a_)} is {phrase} {b_}, as requested.", f"{cap_first(a_)} is not {phrase} {b_}.",
                        True, ("spatial_relation",)))
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

