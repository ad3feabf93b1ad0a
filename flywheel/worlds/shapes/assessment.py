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

Built by assess_text.py (answers, captions) and assess_image.py (drawings, draw-and-describe); assess.py
dispatches a prompt's candidate to them.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from flywheel.worlds.shapes.check_image import ImageCheck
from flywheel.worlds.shapes.check_text import TextCheck
from flywheel.worlds.shapes.scene import Scene
from flywheel.worlds.shapes.segment import Detection
from flywheel.worlds.shapes.spec import DrawSpec
from flywheel.worlds.shapes.vocab import number_word

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

CAPTION_ASPECTS = ("object_presence", "object_hallucination", "color_accuracy", "shape_accuracy",
                   "attribute_binding", "count_accuracy", "spatial_relation")
QA_CONTENT = {"colour": "color_accuracy", "count": "count_accuracy", "existence": "existence_accuracy",
              "relation": "spatial_relation"}


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


# ---------------------------------------------------------------- what the checkers found (kept on an Assessment)
@dataclass
class TextFacts:
    text: str
    check: TextCheck | None = None
    readable: bool = True


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


# ---------------------------------------------------------------- scores and phrases
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

