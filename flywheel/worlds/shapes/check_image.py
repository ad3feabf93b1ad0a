"""Score an image (a render, or a generator's sample) against what it should show: a DrawSpec or a Scene.

Output follows the T2I paper's three dimensions, each in [0, 1]:
- appearance: each requested object is there as a clean shape - found, fitting a clean shape template, sharp -
  on a clean background (no specks, no pixel noise);
- intrinsic: the right entities with the right attributes - colour, shape, colour-to-shape binding, number of
  objects, and no extra objects;
- relationship: the requested relative positions hold (None when nothing relational was asked).
`overall` is the mean of the available dimensions; `score_10 = 10 * overall` (the paper's 0-10 scale) and
`score_5 = 1 + 4 * overall` (the 1-5 rating scale of the pointwise protocol; round it for a discrete rating).
`aspects` carries the same evidence per task aspect of configs/aspects.yaml (object_presence, count_accuracy,
color_accuracy, shape_accuracy, attribute_binding, object_hallucination, spatial_relation): the IG sub-tasks
and itig_draw_and_describe each use a subset of these keys.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image
from scipy.optimize import linear_sum_assignment

from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.scene import Obj, Relation, Scene, relation_between
from flywheel.worlds.shapes.segment import Detection, Segmentation, segment
from flywheel.worlds.shapes.spec import DrawSpec

# Matching costs: same colour and shape is a match; a detection sharing only the shape (the noun) or only
# the colour is that object drawn wrong; sharing neither, it is some other object.
_WRONG_COLOUR, _WRONG_SHAPE, _UNRELATED = 1.0, 1.2, 3.0
_POSITION = 0.3  # per unit of distance, for scenes: breaks ties between identical objects, never outweighs
# An object's appearance falls linearly from 1 to 0 between these levels of template residual (share of its
# signal energy) and blur (std / size); the lower ends absorb the estimators' own error on clean renders at any
# size. Background noise (std, 0-255) scales the whole image's appearance down to 0 at _MAX_NOISE.
_RESIDUAL, _BLUR, _MAX_NOISE = (0.005, 0.1), (0.03, 0.3), 48.0


def _ramp(v: float, lo_hi: tuple[float, float]) -> float:
    lo, hi = lo_hi
    return float(np.clip(1 - (v - lo) / (hi - lo), 0.0, 1.0))


@dataclass(frozen=True)
class ObjectCheck:
    colour: str  # requested
    shape: str
    found: bool  # a detection was matched to it (at least its colour or its shape right)
    detected_colour: str | None
    detected_shape: str | None
    x: float | None  # detected box centre
    y: float | None
    colour_ok: bool
    shape_ok: bool
    count_ok: bool  # as many detections of its colour+shape as requested objects of its colour+shape
    quality: float  # appearance of this object in [0, 1]


@dataclass(frozen=True)
class ImageCheck:
    appearance: float
    intrinsic: float
    relationship: float | None
    overall: float
    score_10: float
    score_5: float
    aspects: dict[str, float]
    objects: tuple[ObjectCheck, ...]
    extra: tuple[Detection, ...]  # detections matched to no requested object
    relations: tuple[tuple[Relation, bool], ...]  # each requested relation and whether it holds
    segmentation: Segmentation

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able summary (no segmentation internals)."""
        d = asdict(self)
        d.pop("segmentation")
        d["relations"] = [[r.subject, r.relation, r.object, ok] for r, ok in self.relations]
        return d


def _targets(target: DrawSpec | Scene) -> tuple[list[tuple[str, str]], list[Obj] | None, list[Relation]]:
    if isinstance(target, Scene):
        return [(o.colour, o.shape) for o in target.objects], list(target.objects), target.relations()
    return list(target.objects), None, [] if target.relation is None else [target.relation]


def match(wanted: list[tuple[str, str]], dets: tuple[Detection, ...], positions: list[Obj] | None = None
          ) -> dict[int, int]:
    """Requested object index -> detection index (minimum total cost; unrelated pairs stay unmatched)."""
    if not wanted or not dets:
        return {}
    cost = np.empty((len(wanted), len(dets)))
    for i, (c, s) in enumerate(wanted):
        for j, d in enumerate(dets):
            same_colour, same_shape = d.colour == c, d.shape == s
            cost[i, j] = (0.0 if same_colour and same_shape else _WRONG_COLOUR if same_shape
                          else _WRONG_SHAPE if same_colour else _UNRELATED)
            if positions is not None:
                cost[i, j] += _POSITION * float(np.hypot(d.x - positions[i].x, d.y - positions[i].y))
    rows, cols = linear_sum_assignment(cost)
    return {int(i): int(j) for i, j in zip(rows, cols, strict=True) if cost[i, j] < _UNRELATED}


def _background_noise(image: Image.Image, seg: Segmentation) -> float:
    """Robust std (0-255) of pixels that are near the background colour: 0 for a clean flat background."""
    arr = np.asarray(image.convert("RGB"), np.float32) - np.array(seg.background, np.float32)
    dev = np.abs(arr).max(axis=-1)
    near = arr[dev < 64]  # background-like pixels; object pixels differ by far more
    return float(1.4826 * np.median(np.abs(near))) if near.size else 0.0  # MAD -> std for a normal


def check_image(image: Image.Image, target: DrawSpec | Scene, config: ShapesWorldConfig | None = None
                ) -> ImageCheck:
    cfg = config or ShapesWorldConfig()
    seg = segment(image, cfg)
    dets = seg.detections
    wanted, positions, rels = _targets(target)
    pairs = match(wanted, dets, positions)
    want_n, got_n = Counter(wanted), Counter((d.colour, d.shape) for d in dets)
    noise = _background_noise(image, seg)
    clean = max(0.0, 1 - noise / _MAX_NOISE) * (1 - seg.speck_fraction)

    objects = []
    for i, (c, s) in enumerate(wanted):
        d = dets[pairs[i]] if i in pairs else None
        if d is None:
            objects.append(ObjectCheck(c, s, False, None, None, None, None, False, False, False, 0.0))
            continue
        q = _ramp(d.residual, _RESIDUAL) * _ramp(d.blur, _BLUR)
        objects.append(ObjectCheck(c, s, True, d.colour, d.shape, d.x, d.y, d.colour == c, d.shape == s,
                                   got_n[(c, s)] == want_n[(c, s)], q))
    n, found = max(len(wanted), 1), [o for o in objects if o.found]
    extra = tuple(d for j, d in enumerate(dets) if j not in set(pairs.values()))
    # Colour, shape and binding are judged on the objects that were drawn (a missing one is a presence and
    # count error, not also a colour error), so each aspect carries its own evidence; nothing drawn scores 0.
    aspects = {
        "object_presence": len(found) / n,
        "color_accuracy": sum(o.colour_ok for o in found) / len(found) if found else 0.0,
        "shape_accuracy": sum(o.shape_ok for o in found) / len(found) if found else 0.0,
        "attribute_binding": sum(o.colour_ok and o.shape_ok for o in found) / len(found) if found else 0.0,
        "count_accuracy": 1 - abs(len(dets) - len(wanted)) / max(len(dets), len(wanted), 1),
        "object_hallucination": 1 - len(extra) / len(dets) if dets else 1.0,
    }
    tol = cfg.checker.relation_tolerance * cfg.relation_margin
    checked = []
    for r in rels:
        a, b = pairs.get(r.subject), pairs.get(r.object)
        ok = a is not None and b is not None and r.relation in relation_between(
            _as_obj(dets[a]), _as_obj(dets[b]), tol)
        checked.append((r, ok))
    relationship = sum(ok for _, ok in checked) / len(checked) if checked else None
    if relationship is not None:
        aspects["spatial_relation"] = relationship

    appearance = clean * sum(o.quality for o in objects) / n
    intrinsic = float(np.mean([aspects[k] for k in ("color_accuracy", "shape_accuracy", "attribute_binding",
                                                    "count_accuracy", "object_hallucination")])) if found else 0.0
    dims = [appearance, intrinsic] + ([] if relationship is None else [relationship])
    overall = sum(dims) / len(dims)
    return ImageCheck(appearance, intrinsic, relationship, overall, 10 * overall, 1 + 4 * overall, aspects,
                      tuple(objects), extra, tuple(checked), seg)


def _as_obj(d: Detection) -> Obj:
    return Obj(d.shape, d.colour, d.size, d.x, d.y)


def detected_scene(seg: Segmentation, margin: float = 0.12) -> Scene:
    """What an image shows, as a Scene: lets the text of a draw-and-describe answer be checked against the
    image that was actually drawn (check_text.check_caption(text, detected_scene(...)))."""
    return Scene(tuple(_as_obj(d) for d in seg.detections), margin)
