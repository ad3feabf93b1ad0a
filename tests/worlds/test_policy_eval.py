"""Oracle evaluation of policies, on stand-in engines whose answers we control (the scoring is under test)."""

from flywheel.engines.base import ImageResult, TextResult
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.policy_eval import (evaluate_generator, evaluate_generator_items, evaluate_text_policy,
                                                evaluate_text_policy_items, generator_items, score_text_items,
                                                text_items)
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Obj, Scene, describe
from flywheel.worlds.shapes.spec import scene_for_spec

WORLD = ShapesWorldConfig()
KINDS = ("single", "binding", "relation")


class ScriptedText:
    """Answers the held-out items in order from their ground truth, optionally with a hallucination habit."""

    def __init__(self, n: int, hallucinate: bool):
        self.items, self.hallucinate = text_items(WORLD, n, 0), hallucinate

    def generate(self, requests, seed=0):
        out = []
        for (_, scene, q, meta), req in zip(self.items, requests, strict=True):
            assert req.messages[0]["content"][1]["text"] == q
            if meta["type"] == "caption":
                text = describe(scene)
                if self.hallucinate:
                    absent = next(c for c in ("purple", "orange", "red", "blue") if scene.count(c, "square") == 0)
                    text = text.split(". ")[0].rstrip(".") + f" and a {absent} square."
            elif meta["type"] == "colour":
                text = f"It is {meta['answer']}."
            elif meta["type"] == "count":
                text = str(meta["answer"])
            else:
                text = "Yes." if meta["answer"] else "No."
            out.append(TextResult(text=text))
        return out


def test_perfect_policy_scores_one_and_a_hallucinating_one_is_caught():
    good = evaluate_text_policy(ScriptedText(40, False), WORLD, n=40)
    assert good["accuracy"] == 1.0 and good["caption_hallucination_rate"] == 0.0
    bad = evaluate_text_policy(ScriptedText(40, True), WORLD, n=40)
    assert bad["caption_hallucination_rate"] == 1.0
    assert bad["accuracy/caption"] == 0.0 and bad["accuracy/colour"] == 1.0
    assert bad["caption_recall"] == 1.0  # perception intact: the habit is behavioural


class ScriptedImages:
    def __init__(self, n: int, correct: bool):
        self.specs, self.correct = generator_items(WORLD, n, 0, KINDS), correct

    def generate(self, requests, seed=0):
        scenes = [scene_for_spec(s, i, WORLD) for i, s in enumerate(self.specs)]
        return [ImageResult(image=render(sc if self.correct else Scene((), sc.margin), 56)) for sc in scenes]


def test_generator_scores_follow_the_checker():
    good = evaluate_generator(ScriptedImages(6, True), WORLD, n=6)
    blank = evaluate_generator(ScriptedImages(6, False), WORLD, n=6)
    assert good["score10"] > 9.5 and blank["score10"] < 2
    assert set(good) >= {"score10/single", "score10/binding", "score10/relation", "dim/relationship"}


def test_per_item_values_are_what_the_gated_metrics_average_in_item_order():
    # the gate's paired test compares two models item by item: item i must be the same question for both
    metrics, per_item = evaluate_text_policy_items(ScriptedText(40, True), WORLD, n=40)
    right = per_item["accuracy"]
    assert len(right) == 40 and sum(right) / 40 == metrics["accuracy"]
    kinds = [meta["type"] for _, _, _, meta in text_items(WORLD, 40, 0)]
    assert [k for k, r in zip(kinds, right) if r == 0.0] == ["caption"] * kinds.count("caption")  # the habit
    metrics, per_item = evaluate_generator_items(ScriptedImages(6, True), WORLD, n=6)
    assert len(per_item["score10"]) == 6 and sum(per_item["score10"]) / 6 == metrics["score10"]


def test_caption_f1_rewards_dropping_inventions_and_punishes_dropping_objects():
    """The trade the policy's guard watches: a caption that stops inventing objects but names one fewer real one
    loses recall yet gains F1; one that keeps a single right object loses both."""
    scene = Scene((Obj("circle", "red", 0.2, 0.2, 0.5), Obj("square", "blue", 0.2, 0.5, 0.5),
                   Obj("triangle", "green", 0.2, 0.8, 0.5)))
    caption = {"type": "caption"}

    def measures(text):
        return score_text_items([(None, scene, None, caption)], [TextResult(text=text)])[0]

    full = measures("A red circle, a blue square and a green triangle.")
    assert full["caption_f1"] == full["caption_recall"] == 1.0
    inventive = measures("A red circle, a blue square, a green triangle, a purple square and a purple circle.")
    terse = measures("A red circle and a blue square.")
    assert (inventive["caption_recall"], inventive["caption_f1"]) == (1.0, 6 / 8)  # 3 right of 5 named
    assert terse["caption_recall"] < inventive["caption_recall"]                   # recall calls it worse
    assert terse["caption_f1"] == 4 / 5 > inventive["caption_f1"]                   # F1 calls it better
    one = measures("A red circle.")
    assert one["caption_f1"] == 2 / 4 < inventive["caption_f1"]  # shortening to what it gets right still loses
    wrong_colour = measures("A purple circle, a blue square and a green triangle.")
    assert wrong_colour["caption_f1"] == 2 * 2 / 6  # a right shape in the wrong colour is not a match
