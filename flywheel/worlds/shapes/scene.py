"""Scenes of a few coloured shapes at known positions: the oracle world's ground truth.

Coordinates are fractions of the image side: x grows rightwards, y grows downwards (image convention), so
"above" means a smaller y. An object's (x, y) is the centre of its bounding box, whose side is `size`; for a
triangle that is not its centroid, and the image checker measures the same box centre.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any, Sequence

import numpy as np

from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.vocab import COLOURS, PALETTES, RELATION_PHRASES, SHAPES, noun_phrase

RngLike = np.random.Generator | int | None


def as_rng(rng: RngLike) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


@dataclass(frozen=True)
class Obj:
    shape: str
    colour: str
    size: float  # bounding-box side, fraction of the image side
    x: float
    y: float

    def __post_init__(self) -> None:
        if self.shape not in SHAPES or self.colour not in COLOURS:
            raise ValueError(f"unknown shape/colour: {self.shape!r} {self.colour!r}")


@dataclass(frozen=True)
class Relation:
    subject: int  # index into Scene.objects
    relation: str  # one of vocab.RELATIONS
    object: int


def relation_between(a: Obj, b: Obj, margin: float) -> list[str]:
    """Relations that hold for "a <rel> b": at most one per axis, each only beyond the margin."""
    rels = []
    if b.x - a.x > margin:
        rels.append("left_of")
    elif a.x - b.x > margin:
        rels.append("right_of")
    if b.y - a.y > margin:
        rels.append("above")
    elif a.y - b.y > margin:
        rels.append("below")
    return rels


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]
    margin: float = 0.12  # the relation margin the scene was laid out with
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def relations(self) -> list[Relation]:
        """Every relation that holds, for every ordered pair (so both "a left of b" and "b right of a")."""
        return [Relation(i, r, j) for i, a in enumerate(self.objects) for j, b in enumerate(self.objects)
                if i != j for r in relation_between(a, b, self.margin)]

    def counts(self) -> Counter:
        """(colour, shape) -> number of such objects."""
        return Counter((o.colour, o.shape) for o in self.objects)

    def count(self, colour: str | None = None, shape: str | None = None) -> int:
        return sum(1 for o in self.objects
                   if (colour is None or o.colour == colour) and (shape is None or o.shape == shape))

    def to_dict(self) -> dict[str, Any]:
        return {"objects": [asdict(o) for o in self.objects], "margin": self.margin}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> Scene:
        d = json.loads(data) if isinstance(data, str) else data
        return cls(tuple(Obj(**o) for o in d["objects"]), float(d["margin"]))


# ---- layout ----------------------------------------------------------------------------------------------
def _pair_ok(a: Obj, b: Obj, cfg: ShapesWorldConfig) -> bool:
    dx, dy = abs(a.x - b.x), abs(a.y - b.y)
    half = (a.size + b.size) / 2 + cfg.gap
    if dx < half and dy < half:  # bounding boxes (plus gap) overlap
        return False
    m = cfg.relation_margin
    return not (m / 2 < dx <= m or m / 2 < dy <= m)  # no near-margin (ambiguous) differences


def layout_ok(objects: Sequence[Obj], cfg: ShapesWorldConfig) -> bool:
    """Inside the image (with border), non-overlapping with a gap, every pair unambiguous on each axis."""
    for o in objects:
        lo, hi = o.size / 2 + cfg.border, 1 - o.size / 2 - cfg.border
        if not (lo <= o.x <= hi and lo <= o.y <= hi):
            return False
    return all(_pair_ok(a, b, cfg) for i, a in enumerate(objects) for b in objects[i + 1:])


def place(kinds: Sequence[tuple[str, str, float]], rng: np.random.Generator, cfg: ShapesWorldConfig,
          relation: Relation | None = None, restarts: int = 200, tries: int = 50) -> tuple[Obj, ...]:
    """Random valid positions for (shape, colour, size) triples, optionally satisfying one relation.

    Objects are placed one by one (each retried up to `tries` times); a dead end restarts the whole layout.
    """
    for _ in range(restarts):
        objs: list[Obj] = []
        for shape, colour, size in kinds:
            lo, hi = size / 2 + cfg.border, 1 - size / 2 - cfg.border
            for _ in range(tries):
                x, y = np.round(rng.uniform(lo, hi, 2), 4)
                o = Obj(shape, colour, size, float(x), float(y))
                if layout_ok(objs + [o], cfg):
                    objs.append(o)
                    break
            else:
                break
        else:
            if relation is None or relation.relation in relation_between(
                    objs[relation.subject], objs[relation.object], cfg.relation_margin):
                return tuple(objs)
    raise RuntimeError(f"could not place {len(kinds)} objects; loosen sizes, gap or margin")


def sample_scene(rng: RngLike, n_objects: tuple[int, int] | int | None = None,
                 config: ShapesWorldConfig | None = None) -> Scene:
    """A random scene; the same seed (or Generator state) and config always give the same scene."""
    cfg = config or ShapesWorldConfig()
    rng = as_rng(rng)
    lo, hi = (n_objects, n_objects) if isinstance(n_objects, int) else (n_objects or cfg.n_objects)
    n = int(rng.integers(lo, hi + 1))
    palette, sizes = PALETTES[cfg.palette], sorted(cfg.sizes.values())
    kinds = [(cfg.shapes[rng.integers(len(cfg.shapes))], palette[rng.integers(len(palette))],
              float(sizes[rng.integers(len(sizes))])) for _ in range(n)]
    return Scene(place(kinds, rng, cfg), cfg.relation_margin)


# ---- canonical English -------------------------------------------------------------------------------------
def cap_first(s: str) -> str:
    return s[:1].upper() + s[1:]


def join_words(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _pair_relation(a: Obj, b: Obj, margin: float) -> str | None:
    """Horizontal first. A rendered layout never lacks one (non-overlap forces one axis apart), but objects
    detected in a generated image may overlap: then there is none to state."""
    rels = relation_between(a, b, margin)
    return rels[0] if rels else None


def list_objects(scene: Scene) -> str:
    """'a purple square and two red circles': the objects grouped by colour and shape, in the order of their
    leftmost member."""
    groups = Counter((o.colour, o.shape) for o in sorted(scene.objects, key=lambda o: (o.x, o.y)))
    return join_words([noun_phrase(n, c, s) for (c, s), n in groups.items()]) if groups else "nothing"


def describe(scene: Scene) -> str:
    """Canonical description: objects listed left to right (grouped by colour+shape), plus relations.

    Two distinct objects: one sentence with their relation. Otherwise a list sentence, and, when every object is
    unique (so "the red circle" names one), a relation sentence for each left-to-right neighbour pair.
    """
    objs = sorted(scene.objects, key=lambda o: (o.x, o.y))
    if not objs:
        return "An empty image."
    groups = Counter((o.colour, o.shape) for o in objs)  # insertion order = left-to-right first appearance
    if len(objs) == 2 and len(groups) == 2 and (rel := _pair_relation(*objs, scene.margin)) is not None:
        a, b = objs
        return cap_first(f"{noun_phrase(1, a.colour, a.shape)} {RELATION_PHRASES[rel]} "
                    f"{noun_phrase(1, b.colour, b.shape)}.")
    text = cap_first(list_objects(scene)) + "."
    if len(objs) > 2 and all(n == 1 for n in groups.values()):
        for a, b in pairwise(objs):
            if (rel := _pair_relation(a, b, scene.margin)) is not None:
                text += " " + cap_first(f"{noun_phrase(1, a.colour, a.shape, 'the')} is {RELATION_PHRASES[rel]} "
                                   f"{noun_phrase(1, b.colour, b.shape, 'the')}.")
    return text
