"""Oracle scores of the policies on held-out items: how good the flywheel's downstream models really are.

Text policy: greedy answers to fresh IU questions (colour, count, existence, caption), checked against the scene;
reports accuracy per question type, the caption hallucination rate (captions naming an absent object) and recall,
and what an over-optimised policy loses first: format validity (answers the checker can read), repetition (a
repeated word 3-gram) and answer length.
Generator: images for fresh draw prompts (single object, attribute binding, relation), checked against the spec;
reports the mean 0–10 score and the three T2I dimensions, per prompt kind.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict

import numpy as np
from PIL import Image

from flywheel.engines import ImageRequest, TextRequest
from flywheel.worlds.shapes.check_image import check_image
from flywheel.worlds.shapes.check_text import (check_caption, check_colour_answer, check_count_answer,
                                               check_existence_answer)
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.policy_data import POLICY_SUBTASKS
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import sample_scene
from flywheel.worlds.shapes.spec import describe_spec, sample_spec
from flywheel.worlds.shapes.suites import iu_question
from flywheel.worlds.shapes.vocab import PALETTES


def check_answer(q: dict, answer: str, scene):
    """The oracle's check of one text answer (colour, count, existence) or caption against its scene."""
    if q["type"] == "colour":
        return check_colour_answer(answer, q["answer"])
    if q["type"] == "count":
        return check_count_answer(answer, q["answer"])
    if q["type"] == "existence":
        return check_existence_answer(answer, q["answer"])
    return check_caption(answer, scene)


# Seed streams of held-out items: the gate's, and the one training-time early stopping selects on (a checkpoint
# chosen on the gate's own items would flatter the gate). Training examples use neither.
GATE_STREAM, HELDOUT_STREAM = 7919, 7927
GATE_IMAGE_STREAM, HELDOUT_IMAGE_STREAM = 104729, 104723


def text_items(world: ShapesWorldConfig, n: int, seed: int,
               stream: int = GATE_STREAM) -> list[tuple[str, object, str, dict]]:
    """n held-out (subtask, scene, question, question-meta) items, evenly over the policy's question types; the
    meta carries the gold answer sentence as `reference`."""
    rng = np.random.default_rng([seed, stream])  # a stream the training examples never use
    items = []
    while len(items) < n:
        scene = sample_scene(rng, config=world)
        subtask = POLICY_SUBTASKS[len(items) % len(POLICY_SUBTASKS)]
        posed = iu_question(subtask, scene, rng, PALETTES[world.palette], world.shapes)
        if posed is not None:
            items.append((subtask, scene, posed[0], {**posed[2], "reference": posed[1]}))
    return items


def text_requests(items: list, world: ShapesWorldConfig) -> list[TextRequest]:
    return [TextRequest([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}],
                        [render(scene, world.image_size)]) for _, scene, q, _ in items]


def repetitive(text: str, n: int = 3) -> bool:
    """Does a word n-gram occur twice ("is a triangle is a triangle")? Correct answers here never repeat one."""
    words = text.lower().replace(".", " ").replace(",", " ").split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def evaluate_text_policy(engine, world: ShapesWorldConfig, n: int = 200, seed: int = 0,
                         stream: int = GATE_STREAM) -> dict[str, float]:
    return evaluate_text_policy_items(engine, world, n, seed, stream)[0]


def evaluate_text_policy_items(engine, world: ShapesWorldConfig, n: int = 200, seed: int = 0,
                               stream: int = GATE_STREAM) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(metrics, per-item values of `accuracy` in item order): two policies answering the same items can be
    compared item by item (the gate's paired test)."""
    metrics, right = score_text_items(*answer_text_items(engine, world, n, seed, stream))
    return metrics, {"accuracy": right}


def answer_text_items(engine, world: ShapesWorldConfig, n: int, seed: int, stream: int = GATE_STREAM):
    """(the n held-out items, the engine's answers to them in item order)."""
    items = text_items(world, n, seed, stream)
    return items, engine.generate(text_requests(items, world), seed=seed)


def score_text_answers(items: list, results: list) -> dict[str, float]:
    """Oracle measures of the answers (engine results, in item order) to `items`."""
    return score_text_items(items, results)[0]


def score_text_items(items: list, results: list) -> tuple[dict[str, float], list[float]]:
    """(score_text_answers' measures, per item in item order 1.0 if the answer is right - a caption: exactly,
    nothing extra - else 0.0, an unreadable answer too): `accuracy` is the mean of the per-item values."""
    by_type: dict[str, list[float]] = defaultdict(list)
    right, hallucinated, recall, f1, unparseable = [], [], [], [], 0
    for (_, scene, _, q), res in zip(items, results, strict=True):
        check = check_answer(q, res.text or "", scene)
        if check.unparseable or not res.ok:
            unparseable += 1
            right.append(0.0)
        else:
            right.append(float(check.correct == 1.0))
            if q["type"] == "caption":
                hallucinated.append(float(bool(check.detail.get("hallucinated"))))
                recall.append(check.aspects["object_presence"])
                f1.append(_caption_f1(check.detail, len(scene.objects)))
        by_type[q["type"]].append(right[-1])
    out = {f"accuracy/{t}": float(np.mean(v)) for t, v in sorted(by_type.items())}
    out["accuracy"] = float(np.mean(right))
    out["caption_hallucination_rate"] = float(np.mean(hallucinated)) if hallucinated else float("nan")
    out["caption_recall"] = float(np.mean(recall)) if recall else float("nan")
    out["caption_f1"] = float(np.mean(f1)) if f1 else float("nan")
    out["unparseable_rate"] = unparseable / len(items)
    out["format_valid"] = 1.0 - out["unparseable_rate"]
    return out | text_measures(results), right


def text_measures(results: list) -> dict[str, float]:
    """What any answers show without ground truth: `repetition_rate` (a collapse into "is a triangle is a
    triangle") and `mean_words`."""
    texts = [(r.text or "") if r.ok else "" for r in results]
    return {"repetition_rate": float(np.mean([repetitive(t) for t in texts])),
            "mean_words": float(np.mean([len(t.split()) for t in texts]))}


def _caption_f1(detail: dict, n_objects: int) -> float:
    """F1 of a caption's mentioned (colour, shape) items against the scene's objects, exact matches counted right:
    recall alone falls when captions shorten to what the policy gets right; this falls only if the captions lose
    more than they stop inventing (a one-object caption of a three-object scene: 0.5)."""
    exact = n_objects - len(detail["missed"])
    total = len(detail["mentioned"]) + n_objects
    return 2 * exact / total if total else 1.0


def generator_items(world: ShapesWorldConfig, n: int, seed: int, kinds: tuple[str, ...],
                    stream: int = GATE_IMAGE_STREAM) -> list:
    """n held-out draw specs, cycling over the prompt kinds."""
    rng = np.random.default_rng([seed, stream])
    return [sample_spec(rng, kinds[i % len(kinds)], world) for i in range(n)]


def evaluate_generator(engine, world: ShapesWorldConfig, n: int = 120, seed: int = 0,
                       kinds: tuple[str, ...] = ("single", "binding", "relation"),
                       stream: int = GATE_IMAGE_STREAM) -> dict[str, float]:
    return evaluate_generator_items(engine, world, n, seed, kinds, stream)[0]


def evaluate_generator_items(engine, world: ShapesWorldConfig, n: int = 120, seed: int = 0,
                             kinds: tuple[str, ...] = ("single", "binding", "relation"),
                             stream: int = GATE_IMAGE_STREAM) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(metrics, per-prompt `score10` in prompt order), for the gate's paired test."""
    specs, results = draw_generator_items(engine, world, n, seed, kinds, stream)
    metrics, scores = score_image_items(specs, kinds, results, world)
    return metrics, {"score10": scores}


def draw_generator_items(engine, world: ShapesWorldConfig, n: int, seed: int, kinds: tuple[str, ...],
                         stream: int = GATE_IMAGE_STREAM):
    """(the n held-out draw specs, the engine's images for them in spec order)."""
    specs = generator_items(world, n, seed, kinds, stream)
    return specs, engine.generate(image_requests(specs, seed))


def image_requests(specs: list, seed: int) -> list[ImageRequest]:
    return [ImageRequest(describe_spec(s), seed=seed * 100_003 + i) for i, s in enumerate(specs)]


def score_images(specs: list, kinds: tuple[str, ...], results: list, world: ShapesWorldConfig) -> dict[str, float]:
    """Oracle measures of generated images (engine results, in spec order)."""
    return score_image_items(specs, kinds, results, world)[0]


def score_image_items(specs: list, kinds: tuple[str, ...], results: list,
                      world: ShapesWorldConfig) -> tuple[dict[str, float], list[float]]:
    """(score_images' measures, each image's 0-10 score in spec order, 0 when not generated): `score10` is the
    mean of the per-image scores."""
    per_kind: dict[str, list[float]] = defaultdict(list)
    dims: dict[str, list[float]] = defaultdict(list)
    scores: list[float] = []
    for i, (spec, res) in enumerate(zip(specs, results, strict=True)):
        if not res.ok:
            per_kind[kinds[i % len(kinds)]].append(0.0)
            scores.append(0.0)
            continue
        image = res.image if isinstance(res.image, Image.Image) else Image.open(io.BytesIO(res.image))
        check = check_image(image, spec, world)
        per_kind[kinds[i % len(kinds)]].append(check.score_10)
        scores.append(check.score_10)
        dims["appearance"].append(check.appearance)
        dims["intrinsic"].append(check.intrinsic)
        if check.relationship is not None:
            dims["relationship"].append(check.relationship)
    out = {f"score10/{k}": float(np.mean(v)) for k, v in per_kind.items()}
    out["score10"] = float(np.mean([x for v in per_kind.values() for x in v]))
    out |= {f"dim/{k}": float(np.mean(v)) for k, v in dims.items()}
    return out, scores


# ---- the same held-out items as prompt records, so a judge can score the answers (flywheel/train/heldout_probes)
IMAGE_SUBTASKS = {"single": "ig_single_object", "binding": "ig_attribute_binding", "relation": "ig_relation"}


def text_prompt_records(items: list, world: ShapesWorldConfig) -> list[dict]:
    """Prompt records (without ids) of text items, as the suites pose them: image, question, gold answer as the
    reference, the scene as the oracle's ground truth."""
    from flywheel.worlds.shapes.suites import _png

    out = []
    for subtask, scene, question, q in items:
        meta = {"scene": scene.to_dict(), "question": {k: v for k, v in q.items() if k != "reference"}}
        out.append({"task": "iu", "subtask": subtask, "query": question, "images": [_png(scene, world.image_size)],
                    "reference_text": q["reference"], "reference_images": [], "aspects": [], "source": "heldout",
                    "split": "id-test", "meta": json.dumps(meta, sort_keys=True)})
    return out


def image_prompt_records(specs: list, kinds: tuple[str, ...], world: ShapesWorldConfig, seed: int) -> list[dict]:
    """Prompt records (without ids) of draw items, as the suites pose them (a correct render as reference)."""
    from flywheel.worlds.shapes.spec import scene_for_spec
    from flywheel.worlds.shapes.suites import DRAW, _png

    rng = np.random.default_rng([seed, 15485863])
    out = []
    for i, spec in enumerate(specs):
        kind, what = kinds[i % len(kinds)], describe_spec(spec)
        meta = {"spec": json.loads(spec.to_json()), "spec_kind": kind, "generator_prompt": what}
        out.append({"task": "ig", "subtask": IMAGE_SUBTASKS[kind], "query": DRAW.format(what=what), "images": [],
                    "reference_text": what[:1].upper() + what[1:] + ".",
                    "reference_images": [_png(scene_for_spec(spec, rng, world), world.image_size)],
                    "aspects": [], "source": "heldout", "split": "id-test", "meta": json.dumps(meta, sort_keys=True)})
    return out
