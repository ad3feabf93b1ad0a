"""The oracle teacher's assessment of one output: `assess(prompt, candidate, world)` reads the prompt's ground
truth and hands the candidate to the assessor for its kind. The work is done in three modules:
- assessment.py: what an Assessment is (findings, aspect values, gold scores), the rubric's constants and the
  loaders of ground truth and outputs from records;
- assess_text.py: answers to questions and captions (IU, NLG);
- assess_image.py: drawings (IG) and draw-and-describe outputs (ITIG).
"""
from __future__ import annotations

from typing import Any

from flywheel.worlds.shapes.assess_image import assess_image, assess_image_text
from flywheel.worlds.shapes.assess_text import assess_answer, assess_caption
from flywheel.worlds.shapes.assessment import Assessment, image_of, load_meta, text_of
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.scene import Scene
from flywheel.worlds.shapes.spec import DrawSpec


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
