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

from flywheel.worlds.shapes.assess_text import assess_answer
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


def posed_answer(q: dict, right: bool, rng: np.random.Generator, world: ShapesWorldConfig) -> tuple[str, str]:
    """(an answer to a colour/count/existence question, the value it gives in the judge's words), right or not."""
    if q["type"] == "colour":
        colour = q["answer"] if right else rng.choice([c for c in PALETTES[world.palette] if c != q["answer"]])
        return f"The {q['shape']} is {colour}.", str(colour)
    if q["type"] == "count":
        n = q["answer"] if right else q["answer"] + (int(rng.choice([-1, 1])) if q["answer"] else 1)
        return ("There are none." if n == 0 else f"There {'is' if n == 1 else 'are'} {number_word(n)}."), \
            number_word(n)
    yes = q["answer"] == right
    return ("Yes." if yes else "No."), ("yes" if yes else "no")


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
            answer = posed_answer(q, False, rng, world)[0]
    return _llava_row(scene, question, answer, world)


def _llava_row(scene: Scene, question: str, answer: str, world: ShapesWorldConfig) -> dict:
    """A TRL prompt-completion row: the rendered scene, the question, the answer."""
    return {
        "images": [render(scene, world.image_size)],
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
        "completion": [{"role": "assistant", "content": [{"type": "text", "text": answer}]}],
    }


def question_examples(world: ShapesWorldConfig, subtask: str):
    """Fault-free rows of one question sub-task (e.g. iu_color): a look-up phase of the base LLaVA's SFT
    (BasePoliciesConfig.policy_lookup)."""
    def make(rng: np.random.Generator, n: int) -> list[dict]:
        rows = []
        while len(rows) < n:
            scene = sample_scene(rng, config=world)
            posed = iu_question(subtask, scene, rng, PALETTES[world.palette], world.shapes)
            if posed is not None:
                rows.append(_llava_row(scene, posed[0], posed[1], world))
        return rows

    return make


def llava_examples(world: ShapesWorldConfig, faults: PolicyFaults):
    def make(rng: np.random.Generator, n: int) -> list[dict]:
        return [llava_example(rng, world, faults) for _ in range(n)]

    return make


def degrade(image: Image.Image, rng: np.random.Generator, cfg: JudgeBaseConfig) -> Image.Image:
    """The image as a small generator draws it: fewer pixels and a blur. What it shows stays the same."""
    side = int(rng.integers(cfg.low_res[0], cfg.low_res[1] + 1))
    small = image.resize((side, side), Image.Resampling.BOX).resize(image.size, Image.Resampling.BILINEAR)
    return small.filter(ImageFilter.GaussianBlur(float(rng.uniform(0, cfg.max_blur))))


def cell_labels(scene: Scene, grid: int, classes: tuple[str, ...], suffix: str = "") -> np.ndarray:
    """A grid x grid raster of class indices: the cell holding an object's centre is that object's "<colour>
    <shape>" (+ `suffix`), a cell its box only overlaps is IGNORE (part of an object, not which), every other cell
    background (the last class). Two centres in one cell: the later object's (rare at these sizes; the loss
    tolerates it)."""
    from flywheel.models.pretrain_vision import IGNORE

    labels = np.full(grid * grid, len(classes) - 1, np.int64)
    cell = lambda v: min(int(v * grid), grid - 1)  # noqa: E731
    for o in scene.objects:
        half = o.size / 2
        for r in range(cell(max(o.y - half, 0.0)), cell(min(o.y + half, 1.0)) + 1):
            for c in range(cell(max(o.x - half, 0.0)), cell(min(o.x + half, 1.0)) + 1):
                labels[r * grid + c] = IGNORE
    for o in scene.objects:
        labels[cell(o.y) * grid + cell(o.x)] = classes.index(f"{o.colour} {o.shape}{suffix}")
    return labels


def vision_task(world: ShapesWorldConfig, judge: JudgeBaseConfig | None = None):
    """The dense vision pretraining task (flywheel/models/pretrain_vision.py) of this world: every image token
    names the object whose centre is in its cell. With `judge`, a share of the images is degraded as in the
    judge's perception examples, so its features read generated images too; with `judge.see_blur` their objects'
    cells are classes of their own ("<colour> <shape> blurred"), so the features keep what degraded them."""
    from flywheel.models.pretrain_vision import CellTask

    objects = tuple(f"{c} {s}" for c in PALETTES[world.palette] for s in world.shapes)
    see_blur = judge is not None and judge.see_blur
    classes = objects + (tuple(f"{o} blurred" for o in objects) if see_blur else ()) + ("background",)

    def make(rng: np.random.Generator, n: int, grid: int) -> tuple[list[Image.Image], np.ndarray]:
        scenes = [sample_scene(rng, config=world) for _ in range(n)]
        images = [render(scene, world.image_size) for scene in scenes]
        degraded = [False] * n
        if judge is not None:  # drawn after the scenes, so the share changes the images and nothing else
            for i, im in enumerate(images):
                if rng.random() < judge.degraded_share:
                    images[i], degraded[i] = degrade(im, rng, judge), True
        return images, np.stack([cell_labels(scene, grid, classes, " blurred" if see_blur and d else "")
                                 for scene, d in zip(scenes, degraded, strict=True)])

    return CellTask(classes, len(classes) - 1, make)


READ_REFERENCE_SHARE = 0.25  # reading rows that ask for the reference, so the base tells the two quotes apart


def reading_example(rng: np.random.Generator, world: ShapesWorldConfig, compare: bool = False) -> dict:
    """Read a quoted answer: which value the response (or the reference beside it) gives, wrong half the time.

    A pretrained VLM can quote what a text says; the tiny judge base cannot, and then copies the reference into
    its analysis ("The answer says yellow" of an answer saying orange) until thousands of judging steps teach it
    to read (issue 7's note). The rows use the judge's request sentence because a 2-layer model does not carry a
    skill across phrasings. No verdict and no rating: the base still has never judged.

    With `compare`, say what holds, what the answer says and whether the two match, in the teacher's own words
    up to its verdict ("There are two circles. The answer says three, which differs."; assess_text._verdict goes on
    ", so it is wrong"; a colour: "The answer says orange. The triangle is not orange but yellow, which
    differs."): telling two words apart is a skill a pretrained VLM brings, and one the tiny judge never learnt
    from judging (issue 7's notes: its verdicts ignored the two colours it wrote itself). No verdict: that
    a differing answer is wrong is still for the flywheel to teach."""
    from flywheel.judge import base, pointwise
    from flywheel.judge.guidelines import get_guideline

    scene, posed = sample_scene(rng, config=world), None
    while posed is None:
        subtask = POLICY_SUBTASKS[rng.integers(3)]
        posed = iu_question(subtask, scene, rng, PALETTES[world.palette], world.shapes)
    question, reference, q = posed
    right = bool(rng.random() < 0.5)
    response, said = posed_answer(q, right, rng, world)
    if compare:
        key = assess_answer(response, scene, q, "image").findings[0].text
        target = key[:key.index(", so it is ")] + "."
        header = "Matching. Does the response give the reference answer's value?"
    else:
        ask_reference = rng.random() < READ_REFERENCE_SHARE
        target = (f"The reference says {posed_answer(q, True, rng, world)[1]}." if ask_reference
                  else f"The answer says {said}.")
        header = f"Reading. What does the {'reference answer' if ask_reference else 'response'} say?"
    image = render(scene, world.image_size)
    sentence, _ = pointwise.instance({"images": [image], "query": question, "reference_text": reference},
                                     {"output_text": response}, get_guideline("iu", subtask))
    return {
        "images": [image],
        "prompt": [{"role": "user", "content": base.content_parts(f"{header}\n{sentence}", 1)}],
        "completion": [{"role": "assistant", "content": [{"type": "text", "text": target}]}],
    }


def perception_examples(world: ShapesWorldConfig, cfg: JudgeBaseConfig):
    """Fault-free captions and questions on clean and degraded renders: perception for the judge base; a share of
    reading rows (cfg.reading_share, reading_example) and of matching rows (cfg.matching_share)."""
    clean = PolicyFaults(caption_hallucination=0, yes_bias=0, wrong_answer=0)

    def example(rng: np.random.Generator) -> dict:
        draw = rng.random()
        if draw < cfg.reading_share:
            return reading_example(rng, world)
        if draw < cfg.reading_share + cfg.matching_share:
            return reading_example(rng, world, compare=True)
        return llava_example(rng, world, clean)

    def make(rng: np.random.Generator, n: int) -> list[dict]:
        rows = [example(rng) for _ in range(n)]
        for row in rows:
            if rng.random() < cfg.degraded_share:
                row["images"] = [degrade(row["images"][0], rng, cfg)]
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
