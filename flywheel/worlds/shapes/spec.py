"""What a generation prompt asks to draw: objects (colour + shape) and at most one relation between two of them.

A DrawSpec has no positions or sizes: those are the generator's freedom. `scene_for_spec` picks them at random
(satisfying the relation) to make a correct reference render for gold sets.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.scene import Relation, RngLike, Scene, as_rng, join_words, place
from flywheel.worlds.shapes.vocab import COLOURS, PALETTES, RELATION_PHRASES, RELATIONS, SHAPES, noun_phrase

SpecKind = Literal["single", "binding", "relation"]
SPEC_KINDS: tuple[str, ...] = ("single", "binding", "relation")
# The IG sub-task each kind of spec serves (names from configs/aspects.yaml).
SUBTASK_OF_KIND: dict[str, str] = {"single": "ig_single_object", "binding": "ig_attribute_binding",
                                   "relation": "ig_relation"}


@dataclass(frozen=True)
class DrawSpec:
    objects: tuple[tuple[str, str], ...]  # (colour, shape) per requested object
    relation: Relation | None = None  # indices into objects

    def __post_init__(self) -> None:
        for c, s in self.objects:
            if c not in COLOURS or s not in SHAPES:
                raise ValueError(f"unknown colour/shape {c!r} {s!r}")
        r = self.relation
        if r is not None and (r.relation not in RELATIONS or r.subject == r.object
                              or not (0 <= r.subject < len(self.objects) and 0 <= r.object < len(self.objects))):
            raise ValueError(f"invalid relation {r}")

    def to_json(self) -> str:
        rel = None if self.relation is None else [self.relation.subject, self.relation.relation,
                                                  self.relation.object]
        return json.dumps({"objects": [list(o) for o in self.objects], "relation": rel}, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> DrawSpec:
        d = json.loads(data) if isinstance(data, str) else data
        rel = d.get("relation")
        return cls(tuple((c, s) for c, s in d["objects"]), None if rel is None else Relation(*rel))


def spec_of_scene(scene: Scene) -> DrawSpec:
    """The scene's objects as a spec (relations are not carried: a scene has many)."""
    return DrawSpec(tuple((o.colour, o.shape) for o in scene.objects))


def sample_spec(rng: RngLike, kind: SpecKind, config: ShapesWorldConfig | None = None,
                n_objects: int = 2) -> DrawSpec:
    """A prompt spec for an IG sub-task: one object; `n_objects` with distinct colours and distinct shapes
    (attribute binding: each colour must go to the right shape); or two distinct objects in a relation."""
    cfg = config or ShapesWorldConfig()
    rng = as_rng(rng)
    palette, shapes = PALETTES[cfg.palette], cfg.shapes
    if kind == "single":
        return DrawSpec(((palette[rng.integers(len(palette))], shapes[rng.integers(len(shapes))]),))
    n = 2 if kind == "relation" else n_objects
    if kind not in SPEC_KINDS or n > min(len(palette), len(shapes)) or n < 2:
        raise ValueError(f"cannot sample a {kind!r} spec with {n} objects from this palette and shape set")
    colours = rng.choice(len(palette), n, replace=False)
    kinds = rng.choice(len(shapes), n, replace=False)
    objects = tuple((palette[c], shapes[s]) for c, s in zip(colours, kinds, strict=True))
    if kind == "relation":
        return DrawSpec(objects, Relation(0, RELATIONS[rng.integers(len(RELATIONS))], 1))
    return DrawSpec(objects)


def describe_spec(spec: DrawSpec) -> str:
    """'a red circle above a blue square', 'a red circle and a blue square', 'two green triangles'."""
    if spec.relation is not None and len(spec.objects) == 2:
        (ca, sa), (cb, sb) = spec.objects[spec.relation.subject], spec.objects[spec.relation.object]
        return f"{noun_phrase(1, ca, sa)} {RELATION_PHRASES[spec.relation.relation]} {noun_phrase(1, cb, sb)}"
    text = join_words([noun_phrase(n, c, s) for (c, s), n in Counter(spec.objects).items()])
    if spec.relation is not None:  # a relation among more than two objects: a second clause names it
        r = spec.relation
        (ca, sa), (cb, sb) = spec.objects[r.subject], spec.objects[r.object]
        text += (f", with {noun_phrase(1, ca, sa, 'the')} {RELATION_PHRASES[r.relation]} "
                 f"{noun_phrase(1, cb, sb, 'the')}")
    return text


def scene_for_spec(spec: DrawSpec, rng: RngLike, config: ShapesWorldConfig | None = None) -> Scene:
    """A valid random layout of the spec's objects (random sizes) in which its relation holds."""
    cfg = config or ShapesWorldConfig()
    rng = as_rng(rng)
    sizes = sorted(cfg.sizes.values())
    kinds = [(s, c, float(sizes[rng.integers(len(sizes))])) for c, s in spec.objects]
    return Scene(place(kinds, rng, cfg, spec.relation), cfg.relation_margin)
