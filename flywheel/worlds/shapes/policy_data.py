"""Training examples for the base policies, with the faults the flywheel is meant to remove.

The base LLaVA must perceive the world yet carry *behavioural* faults, the kind preference optimisation is known
to fix (RLAIF-V's object hallucination; a yes-bias), because DPO on its own samples does not fix perception
(measured in ../shared/notes/cpu-stack.md). A share of plainly wrong answers can be added on top. The base
generator learns from clean renders; it errs by itself where tiny diffusion models err (no guidance, two
objects, relations), which Diffusion-DPO can improve.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.policy_config import JudgeBaseConfig, PolicyFaults
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Scene, sample_scene
from flywheel.worlds.shapes.spec import describe_spec, sample_spec, scene_for_spec
from flywheel.worlds.shapes.suites import Q_CAPTION, iu_question
from flywheel.worlds.shapes.vocab import PALETTES, noun_phrase, number_word

POLICY_SUBTASKS = ("iu_color", "iu_count", "iu_existence", "iu_caption")


def _hallucinate(scene: Scene, caption: str, rng: np.random.Generator, world: ShapesWorldConfig) -> str:
    palette = PALETTES[world.palette]
    absent = [(c, s) for c in palette for s in world.shapes if scene.count(c, s) == 0]
    c, s = absent[rng.integers(len(absent))]
    first, _, rest = caption.partition(". ")  # the fake object joins the sentence that lists the objects
    first = first.rstrip(".")
    if " and " in first:  # "A, B and C" -> "A, B, C and <fake>"
        head, _, tail = first.rpartition(" and ")
        first = f"{head}, {tail}"
    return f"{first} and {noun_phrase(1, c, s)}." + (f" {rest}" if rest else "")


def _corrupt(q: dict, answer: str, rng: np.random.Generator, world: ShapesWorldConfig) -> str:
    if q["type"] == "colour":
        others = [c for c in PALETTES[world.palette] if c != q["answer"]]
        return answer.replace(q["answer"], others[rng.integers(len(others))])
    if q["type"] == "count":
        n = int(q["answer"]) + int(rng.choice([-1, 1]) if q["answer"] else 1)
        return f"There {'is' if n == 1 else 'are'} {number_word(n)}."
    return answer


def llava_example(rng: np.random.Generator, world: ShapesWorldConfig, faults: PolicyFaults) -> dict:
    """One TRL prompt-completion row with an image: a question about a rendered scene and a (faulty) answer."""
    scene = sample_scene(rng, config=world)
    if rng.random() < faults.caption_share:
        question, answer = Q_CAPTION, iu_question("iu_caption", scene, rng, (), ())[1]
        if rng.random() < faults.caption_hallucination:
            answer = _hallucinate(scene, answer, rng, world)
    else:
        posed = None
        while posed is None:
            subtask = POLICY_SUBTASKS[rng.integers(3)]
            posed = iu_question(subtask, scene, rng, PALETTES[world.palette], world.shapes)
        question, answer, q = posed
        if q["type"] == "existence" and not q["answer"] and rng.random() < faults.yes_bias:
            answer = "Yes."
        elif q["type"] in ("colour", "count") and rng.random() < faults.wrong_answer:
            answer = _corrupt(q, answer, rng, world)
    return {
        "images": [render(scene, world.image_size)],
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
        "completion": [{"role": "assistant", "content": [{"type": "text", "text": answer}]}],
    }


def llava_examples(world: ShapesWorldConfig, faults: PolicyFaults):
    def make(rng: np.random.Generator, n: int) -> list[dict]:
        return [llava_example(rng, world, faults) for _ in range(n)]

    return make


def degrade(image: Image.Image, rng: np.random.Generator, cfg: JudgeBaseConfig) -> Image.Image:
    """The image as a small generator draws it: fewer pixels and a blur. What it shows stays the same."""
    side = int(rng.integers(cfg.low_res[0], cfg.low_res[1] + 1))
    small = image.resize((side, side), Image.Resampling.BOX).resize(image.size, Image.Resampling.BILINEAR)
    return small.filter(ImageFilter.GaussianBlur(float(rng.uniform(0, cfg.max_blur))))


def shape_example(rng: np.random.Generator, world: ShapesWorldConfig) -> dict:
    """'What shape is the <colour> object?' about a scene where that colour is one object's alone."""
    while True:
        scene = sample_scene(rng, config=world)
        alone = [o for o in scene.objects if scene.count(colour=o.colour) == 1]
        if alone:
            break
    o = alone[rng.integers(len(alone))]
    return {
        "images": [render(scene, world.image_size)],
        "prompt": [{"role": "user", "content": [{"type": "image"},
                                                {"type": "text", "text": f"What shape is the {o.colour} object?"}]}],
        "completion": [{"role": "assistant", "content": [{"type": "text",
                                                          "text": f"The {o.colour} object is a {o.shape}."}]}],
    }


def shape_examples(world: ShapesWorldConfig):
    """Shape questions alone: the judge base's shape warm-up (JudgeBaseConfig.shape_warmup_steps)."""
    return lambda rng, n: [shape_example(rng, world) for _ in range(n)]


def perception_examples(world: ShapesWorldConfig, cfg: JudgeBaseConfig):
    """Fault-free captions and questions on clean and degraded renders, and a share of shape questions on clean
    ones: perception for the judge base."""
    clean = PolicyFaults(caption_hallucination=0, yes_bias=0, wrong_answer=0)

    def make(rng: np.random.Generator, n: int) -> list[dict]:
        rows = [llava_example(rng, world, clean) for _ in range(n)]
        for row in rows:
            if rng.random() < cfg.degraded_share:
                row["images"] = [degrade(row["images"][0], rng, cfg)]
        if cfg.shape_question_share:  # drawn after the others, so a config without them keeps its examples
            for i in np.flatnonzero(rng.random(n) < cfg.shape_question_share):
                rows[i] = shape_example(rng, world)
        return rows

    return make


def generator_examples(world: ShapesWorldConfig, kinds: tuple[str, ...] = ("single", "single", "binding",
                                                                           "relation")):
    """(render, prompt) pairs; the prompt is the spec's description, as the candidates stage will prompt it."""

    def make(rng: np.random.Generator, n: int) -> list[tuple[Image.Image, str]]:
        out = []
        for _ in range(n):
            spec = sample_spec(rng, kinds[rng.integers(len(kinds))], world)
            out.append((render(scene_for_spec(spec, rng, world), world.image_size), describe_spec(spec)))
        return out

    return make
