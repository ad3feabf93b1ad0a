"""Task suites of the shapes world: prompt records in all four categories, with FRABench-style splits.

Every prompt carries its ground truth in `meta` (the scene or the draw spec, and the question), so checkers and
the oracle teacher can score any output later without re-deriving anything. Splits (train / id-test / ood-test)
follow FRABench: some sub-tasks never appear outside ood-test (task generalization) and some aspects are
withheld from every train and id-test prompt (aspect generalization); both lists are declared in config.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flywheel.aspects import AspectTree
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Scene, as_rng, describe, sample_scene
from flywheel.worlds.shapes.spec import describe_spec, sample_spec, scene_for_spec
from flywheel.worlds.shapes.vocab import PALETTES, PLURALS, RELATION_PHRASES, noun_phrase, number_word

SUBTASKS = ("iu_color", "iu_count", "iu_existence", "iu_relation", "iu_caption", "ig_single_object",
            "ig_attribute_binding", "ig_relation", "nlg_describe_scene", "nlg_scene_qa", "itig_draw_and_describe")
TASK_OF = {s: s.split("_", 1)[0] for s in SUBTASKS}

# Prompt wording: stable, because the policies and the judge are trained on exactly these strings.
Q_COLOUR = "What colour is the {shape}?"
Q_COUNT = "How many {things} are there?"
Q_EXISTS = "Is there {np} in the {where}?"
Q_RELATION = "Is {a} {rel} {b}?"
Q_CAPTION = "Describe the image."
DRAW = "Draw {what}."
DRAW_AND_DESCRIBE = "Draw {what}, then describe what you drew."
NLG_DESCRIBE = "Objects: {objects}. Relations: {relations}. Describe the scene in one sentence."
NLG_QA = "Scene: {scene} Question: {question}"


class SplitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ood_subtasks: list[str] = Field(
        ["iu_relation", "ig_relation"],
        description="Sub-tasks that appear only in ood-test (FRABench's unseen tasks: task generalization).")
    ood_aspects: list[str] = Field(
        ["spatial_relation"],
        description="Aspects removed from every train and id-test prompt and kept in ood-test ones (unseen "
        "aspects: aspect generalization).")
    id_test_fraction: float = Field(0.15, ge=0, lt=1, description="Share of seen-sub-task prompts in id-test.")


class SuitesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts_per_subtask: int | dict[str, int] = Field(
        200, description="Prompts generated per sub-task: one count for all, or a map from a task ('iu', 'ig', "
        "...) or a sub-task name to its count (a sub-task's own entry wins over its task's).")
    subtasks: list[str] = Field(list(SUBTASKS), description="Sub-tasks to generate (names from aspects.yaml).")
    split: SplitConfig = Field(default_factory=SplitConfig, description="FRABench-style splits.")

    @model_validator(mode="after")
    def _known(self) -> SuitesConfig:
        unknown = set(self.subtasks) - set(SUBTASKS)
        if unknown:
            raise ValueError(f"unknown oracle sub-tasks {sorted(unknown)}; known: {list(SUBTASKS)}")
        bad = set(self.split.ood_subtasks) - set(self.subtasks)
        if bad:
            raise ValueError(f"split.ood_subtasks {sorted(bad)} are not generated (not in subtasks)")
        counts = self.prompts_per_subtask
        if isinstance(counts, dict):
            keys = set(self.subtasks) | {TASK_OF[s] for s in self.subtasks}
            if set(counts) - keys:
                raise ValueError(f"prompts_per_subtask names {sorted(set(counts) - keys)}, which are neither "
                                 f"generated sub-tasks nor their tasks; use one of {sorted(keys)}")
            missing = [s for s in self.subtasks if s not in counts and TASK_OF[s] not in counts]
            if missing:
                raise ValueError(f"prompts_per_subtask has no count for {missing} (nor for their task)")
        for s in self.subtasks:
            if self.count(s) < 1:
                raise ValueError(f"prompts_per_subtask: {s} gets {self.count(s)} prompts; at least 1")
        return self

    def count(self, subtask: str) -> int:
        """Prompts generated for one sub-task."""
        c = self.prompts_per_subtask
        return c if isinstance(c, int) else c.get(subtask, c.get(TASK_OF[subtask], 0))


def _png(scene: Scene, size: int) -> bytes:
    buf = io.BytesIO()
    render(scene, size).save(buf, format="PNG")
    return buf.getvalue()


def _unique(scene: Scene) -> list[int]:
    """Indices of objects whose colour+shape is unique in the scene (so 'the red circle' names one)."""
    counts = scene.counts()
    return [i for i, o in enumerate(scene.objects) if counts[(o.colour, o.shape)] == 1]


def iu_question(subtask: str, scene: Scene, rng: np.random.Generator, palette: tuple[str, ...],
                shapes: tuple[str, ...], where: str = "image") -> tuple[str, str, dict] | None:
    """(question, gold answer, question meta) for an IU/NLG-QA sub-task, or None if the scene can't pose it."""
    objs = scene.objects
    if subtask == "iu_color":
        by_shape = [s for s in shapes if scene.count(shape=s) == 1]
        if not by_shape:
            return None
        shape = by_shape[rng.integers(len(by_shape))]
        colour = next(o.colour for o in objs if o.shape == shape)
        return Q_COLOUR.format(shape=shape), f"The {shape} is {colour}.", {"type": "colour", "shape": shape,
                                                                            "answer": colour}
    if subtask == "iu_count":
        shape = shapes[rng.integers(len(shapes))]
        colour = palette[rng.integers(len(palette))] if rng.random() < 0.5 else None
        n = scene.count(colour=colour, shape=shape)
        things = f"{colour} {PLURALS[shape]}" if colour else PLURALS[shape]
        answer = "There are none." if n == 0 else f"There {'is' if n == 1 else 'are'} {number_word(n)}."
        return (Q_COUNT.format(things=things), answer,
                {"type": "count", "colour": colour, "shape": shape, "answer": n})
    if subtask == "iu_existence":
        if rng.random() < 0.5:
            o = objs[rng.integers(len(objs))]
            colour, shape = o.colour, o.shape
        else:
            absent = [(c, s) for c in palette for s in shapes if scene.count(c, s) == 0]
            colour, shape = absent[rng.integers(len(absent))]
        yes = scene.count(colour, shape) > 0
        return (Q_EXISTS.format(np=noun_phrase(1, colour, shape), where=where), "Yes." if yes else "No.",
                {"type": "existence", "colour": colour, "shape": shape, "answer": yes})
    if subtask == "iu_relation":
        uniq = _unique(scene)
        rels = [r for r in scene.relations() if r.subject in uniq and r.object in uniq]
        if not rels:
            return None
        r = rels[rng.integers(len(rels))]
        holds = rng.random() < 0.5
        rel = r.relation if holds else {"left_of": "right_of", "right_of": "left_of", "above": "below",
                                        "below": "above"}[r.relation]
        a, b = objs[r.subject], objs[r.object]
        q = Q_RELATION.format(a=noun_phrase(1, a.colour, a.shape, "the"), rel=RELATION_PHRASES[rel],
                              b=noun_phrase(1, b.colour, b.shape, "the"))
        return q, "Yes." if holds else "No.", {"type": "relation", "subject": r.subject, "relation": rel,
                                               "object": r.object, "answer": holds}
    if subtask == "iu_caption":
        return Q_CAPTION, describe(scene), {"type": "caption"}
    raise ValueError(f"not a question sub-task: {subtask}")


def _structured(scene: Scene) -> tuple[str, str]:
    objects = "; ".join(f"{o.colour} {o.shape}" for o in scene.objects)
    uniq = _unique(scene)
    rels = [r for r in scene.relations() if r.subject in uniq and r.object in uniq and r.subject < r.object]
    o = scene.objects
    relations = "; ".join(f"{o[r.subject].colour} {o[r.subject].shape} {RELATION_PHRASES[r.relation]} "
                          f"{o[r.object].colour} {o[r.object].shape}" for r in rels)
    return objects, relations or "none"


def make_prompt(subtask: str, rng: np.random.Generator, world: ShapesWorldConfig) -> dict | None:
    """One prompt record (without split/aspects) for a sub-task, or None when the draw can't pose it."""
    palette, shapes, size = PALETTES[world.palette], world.shapes, world.image_size
    task = TASK_OF[subtask]
    row = {"task": task, "subtask": subtask, "images": [], "reference_images": [], "reference_text": None,
           "source": "shapes-world"}
    if task in ("iu", "nlg"):
        scene = sample_scene(rng, config=world)
        if subtask == "nlg_describe_scene":
            objects, relations = _structured(scene)
            query, answer, q = NLG_DESCRIBE.format(objects=objects, relations=relations), describe(scene), {
                "type": "caption"}
        else:
            kind = "iu_caption" if subtask == "iu_caption" else subtask
            if subtask == "nlg_scene_qa":
                kind = ("iu_color", "iu_count", "iu_existence")[rng.integers(3)]
            posed = iu_question(kind, scene, rng, palette, shapes, "image" if task == "iu" else "scene")
            if posed is None:
                return None
            question, answer, q = posed
            query = NLG_QA.format(scene=describe(scene), question=question) if task == "nlg" else question
            if task == "iu":
                row["images"] = [_png(scene, size)]
        row.update(query=query, reference_text=answer, meta={"scene": scene.to_dict(), "question": q})
        return row
    kind = {"ig_single_object": "single", "ig_attribute_binding": "binding", "ig_relation": "relation",
            "itig_draw_and_describe": ("single", "binding", "relation")[rng.integers(3)]}[subtask]
    spec = sample_spec(rng, kind, world)
    what = describe_spec(spec)
    reference = scene_for_spec(spec, rng, world)  # one correct rendering, for reference-based protocols
    row.update(query=(DRAW_AND_DESCRIBE if task == "itig" else DRAW).format(what=what),
               reference_text=what[:1].upper() + what[1:] + ".", reference_images=[_png(reference, size)],
               meta={"spec": json.loads(spec.to_json()), "spec_kind": kind, "generator_prompt": what})
    return row


def assign_split(row: dict, split: SplitConfig, seed: int) -> str:
    if row["subtask"] in split.ood_subtasks:
        return "ood-test"
    # Seeded by what makes the prompt (its query and input images, as its record id is), so a prompt keeps its
    # split however many prompts are drawn, and identical prompts share one. The query alone is not enough:
    # "Describe the image." would send every caption prompt to one split.
    h = hashlib.sha256(f"{seed}:{row['subtask']}:{row['query']}".encode())
    for image in row["images"]:
        h.update(hashlib.sha256(image).digest())
    h = h.digest()
    return "id-test" if int.from_bytes(h[:8], "big") / 2**64 < split.id_test_fraction else "train"


def generate(suites: SuitesConfig, world: ShapesWorldConfig, tree: AspectTree, seed: int,
             split_seed: int | None = None) -> Iterator[dict]:
    """Prompt rows for every configured sub-task, with aspects selected from the tree and the split rules.
    seed draws the prompts; split_seed (default: seed) assigns splits, so that fresh draws (a new seed per
    iteration) put any prompt identical to a test prompt in the same test split, never in train."""
    split_seed = seed if split_seed is None else split_seed
    for k, subtask in enumerate(suites.subtasks):
        rng = as_rng(np.random.default_rng([seed, k]))
        made = tries = 0
        want = suites.count(subtask)
        while made < want:
            tries += 1
            if tries > 20 * want:
                raise RuntimeError(f"{subtask}: could not pose enough prompts; check the world config")
            row = make_prompt(subtask, rng, world)
            if row is None:
                continue
            split = assign_split(row, suites.split, split_seed)
            aspects = tree.select(row["task"], subtask).names
            if split != "ood-test":
                aspects = [a for a in aspects if a not in suites.split.ood_aspects]
            row.update(split=split, aspects=aspects, meta=json.dumps(row["meta"], sort_keys=True))
            made += 1
            yield row

