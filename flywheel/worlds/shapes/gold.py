"""Deliberately varied outputs for the gold meta-eval sets: for each oracle prompt, correct, partly wrong and wrong
answers or descriptions, and correct renders next to renders with one controlled defect (perturb.py).

Each output is a candidate record (producer "gold:<variant>", meta {"variant": ...}); the noiseless oracle then
labels them (flywheel/stages/gold.py). Variants a prompt cannot have (a count near-miss for a colour question, a
swapped relation for a spec without one, a missing object from a one-object caption) are skipped, and a variant
whose output equals an earlier one is dropped, so every candidate of a prompt is a distinct output.
"""
from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np
from PIL import Image

from flywheel.worlds.shapes import perturb
from flywheel.worlds.shapes.assessment import load_meta
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.oracle_config import GoldConfig
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Scene, describe, sample_scene
from flywheel.worlds.shapes.spec import DrawSpec, scene_for_spec
from flywheel.worlds.shapes.vocab import PALETTES, number_word

PRODUCER = "gold:{variant}"
UNREADABLE = "Hard to say."
VERBOSE = "Looking carefully at the {where}, my answer is: {answer}"


def _rng(seed: int, prompt: dict, what: str) -> np.random.Generator:
    key = prompt.get("prompt_id") or f"{prompt.get('subtask')}:{prompt.get('query')}"
    h = hashlib.sha256(f"gold:{what}:{seed}:{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "big"))


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:]


def answer_variants(prompt: dict, names: list[str], rng: np.random.Generator) -> list[tuple[str, str]]:
    """(variant, text) for a question prompt (IU questions, NLG scene QA)."""
    meta = load_meta(prompt)
    q = meta["question"]
    ref = prompt["reference_text"]
    where = "image" if prompt["task"] == "iu" else "scene"
    t = q["type"]
    out = []
    for name in names:
        if name == "correct":
            out.append((name, ref))
        elif name == "verbose":
            out.append((name, VERBOSE.format(where=where, answer=_lower_first(ref))))
        elif name == "wrong":
            if t == "colour":
                others = [c for c in PALETTES["basic6"] if c != q["answer"]]
                out.append((name, f"The {q['shape']} is {others[int(rng.integers(len(others)))]}."))
            elif t == "count":
                m = q["answer"] + 2
                out.append((name, f"There are {number_word(m)}."))
            else:
                out.append((name, "No." if q["answer"] else "Yes."))
        elif name == "near_miss" and t == "count":
            n = q["answer"]
            m = n + 1 if n == 0 or rng.random() < 0.5 else n - 1
            out.append((name, "There are none." if m == 0 else f"There {'is' if m == 1 else 'are'} {number_word(m)}."))
        elif name == "unreadable":
            out.append((name, UNREADABLE))
    return out


def caption_variants(prompt: dict, names: list[str], rng: np.random.Generator,
                     world: ShapesWorldConfig) -> list[tuple[str, str]]:
    """(variant, text) for a caption / scene-description prompt."""
    scene = Scene.from_json(load_meta(prompt)["scene"])
    n = len(scene.objects)
    kinds = [(o.colour, o.shape) for o in scene.objects]
    out = []
    for name in names:
        s: Scene | None = None
        if name == "correct":
            s = scene
        elif name == "missing" and n >= 2:
            s = perturb.missing_object(scene, int(rng.integers(n)))
        elif name == "wrong_colour":
            s = perturb.wrong_colour(scene, int(rng.integers(n)), rng, world.palette)
        elif name == "extra":
            try:
                s = perturb.extra_object(scene, rng, world)
            except ValueError:
                s = None
        elif name == "swapped":
            pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if kinds[i] != kinds[j]]
            if pairs:
                i, j = pairs[int(rng.integers(len(pairs)))]
                s = perturb.swap_positions(scene, i, j)
        elif name == "other_scene":
            s = sample_scene(rng, config=world)
        if s is not None:
            out.append((name, describe(s)))
    return out


def image_variants(prompt: dict, gold: GoldConfig, rng: np.random.Generator,
                   world: ShapesWorldConfig) -> list[tuple[str, bytes, str | None]]:
    """(variant, PNG, text) for a drawing prompt; text (ITIG only) describes what the render shows."""
    spec = DrawSpec.from_json(load_meta(prompt)["spec"])
    itig = prompt["task"] == "itig"
    scene = scene_for_spec(spec, rng, world)
    n = len(scene.objects)
    size, ss = world.image_size, world.supersample
    out = []
    for name in gold.image_variants:
        s, img = None, None
        if name == "correct":
            s = scene
        elif name == "wrong_colour":
            s = perturb.wrong_colour(scene, int(rng.integers(n)), rng, world.palette)
        elif name == "wrong_shape":
            s = perturb.wrong_shape(scene, int(rng.integers(n)), rng, world.shapes)
        elif name == "swapped" and spec.relation is not None:
            s = perturb.swap_positions(scene, spec.relation.subject, spec.relation.object)
        elif name == "missing":
            s = perturb.missing_object(scene, int(rng.integers(n)))
        elif name == "extra":
            try:
                s = perturb.extra_object(scene, rng, world)
            except ValueError:
                s = None
        elif name == "noise":
            img, s = perturb.noise(render(scene, size, ss), gold.noise_sigma, rng), scene
        elif name == "blur":
            img, s = perturb.blur(render(scene, size, ss), gold.blur_radius), scene
        elif name == "wrong_text" and itig:
            out.append((name, _png(render(scene, size, ss)), describe(sample_scene(rng, config=world))))
            continue
        if s is None:
            continue
        out.append((name, _png(img if img is not None else render(s, size, ss)), describe(s) if itig else None))
    return out


def gold_candidates(prompt: dict, gold: GoldConfig, world: ShapesWorldConfig, seed: int) -> list[dict]:
    """Candidate rows (ids left for validation to fill) of the varied outputs of one oracle prompt."""
    meta = load_meta(prompt)
    rng = _rng(seed, prompt, "variants")
    if "spec" in meta:
        made = image_variants(prompt, gold, rng, world)
    elif (meta.get("question") or {}).get("type") == "caption":
        made = [(v, None, t) for v, t in caption_variants(prompt, gold.text_variants, rng, world)]
    else:
        made = [(v, None, t) for v, t in answer_variants(prompt, gold.text_variants, rng)]
    rows, seen = [], set()
    for k, (variant, png, text) in enumerate(made):
        key = (png, text)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"prompt_id": prompt["prompt_id"], "producer": PRODUCER.format(variant=variant),
                     "output_text": text, "output_images": [] if png is None else [png], "sample_index": k,
                     "meta": {"variant": variant}})
    return rows


def variant_of(candidate: dict) -> str | None:
    meta: Any = candidate.get("meta")
    if isinstance(meta, str):
        import json

        meta = json.loads(meta)
    return meta.get("variant") if isinstance(meta, dict) else None
