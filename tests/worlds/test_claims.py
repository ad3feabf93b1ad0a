"""The world's claim splitter and the oracle's verdict on one claim: the claim checks' targets and their ceiling
(bench/judge_claims.py), so a wrong verdict would teach the judge the wrong look-up."""

from collections import Counter

import pytest

from flywheel.worlds.shapes.claims import (
    ABSENT,
    EXACT,
    OTHER_ATTRIBUTE,
    OTHER_COUNT,
    claim_context,
    claim_kind,
    misread,
    object_sentences,
    read_claim,
    relation_sentences,
    split_claims,
    verdict,
)


def _texts(text: str) -> list[str]:
    return [c.text for c in split_claims(text)]


def test_a_caption_splits_into_its_object_groups_then_its_relations():
    assert _texts("Two red circles and a blue square. The blue square is to the left of the red circle.") == [
        "two red circles", "a blue square", "the blue square is to the left of the red circle"]
    assert _texts("An orange triangle.") == ["an orange triangle"]
    assert _texts("A triangle.") == ["a triangle"]  # no colour named: the claim names none


def test_a_claims_kind_is_read_from_its_words_alone():
    """What curate.claim_balance balances within: words that are not exactly one claim of this world have no kind."""
    assert claim_kind("two red circles") == "object"
    assert claim_kind("the blue square is to the left of the red circle") == "relation"
    assert claim_kind("a red dog") is claim_kind("A red circle and a blue square.") is claim_kind("") is None


def test_text_without_shapes_and_negated_relations_make_no_claims():
    assert split_claims("") == [] and split_claims("I cannot tell.") == []
    assert _texts("A red circle and a blue square. The red circle is not above the blue square.") == [
        "a red circle", "a blue square"]


@pytest.mark.parametrize("claim_of, against, analysis, rating", [
    ("A red circle.", "A red circle to the left of a blue square.", "The text has a red circle.", EXACT),
    ("Two red circles.", "A red circle.", "The text has a red circle.", OTHER_COUNT),
    ("A red circle.", "A red square.", "The red shape in the text is a square.", OTHER_ATTRIBUTE),
    ("A green circle.", "A purple circle.", "The text has no green shape; its circle is purple.", OTHER_ATTRIBUTE),
    ("A green circle.", "A purple square.", "The text has no green shape.", ABSENT),
    ("A triangle.", "A blue triangle.", "The text has a triangle.", EXACT),
    ("A triangle.", "Two blue triangles.", "The text has two triangles.", OTHER_COUNT),
    ("A triangle.", "A blue square.", "The text has no triangle.", ABSENT),
])
def test_an_object_claim_is_looked_up_by_its_colour_then_its_shape(claim_of, against, analysis, rating):
    (claim,) = split_claims(claim_of)
    assert verdict(claim, against) == (analysis, rating)


def test_a_relation_claim_holds_when_the_text_states_it_either_way_round():
    claim = split_claims("A red circle to the left of a blue square.")[-1]
    assert claim.kind == "relation"
    assert verdict(claim, "A blue square to the right of a red circle.") == ("The text says so.", EXACT)
    assert verdict(claim, "A red circle to the right of a blue square.") == (
        "The text says the red circle is to the right of the blue square.", ABSENT)
    assert verdict(claim, "A red circle and a blue square.") == (
        "The text does not place the red circle against the blue square.", ABSENT)


@pytest.mark.parametrize("claim_of, against, analysis, rating", [
    ("A red circle.", "A red circle.", "The text has no red shape.", ABSENT),  # stated, reported absent
    ("Two red circles.", "A red circle.", "The text has two red circles.", EXACT),  # the other verdicts: stated
    ("A triangle.", "A blue square.", "The text has a triangle.", EXACT),
    ("A red circle to the left of a blue square.", "A blue square to the right of a red circle.",
     "The text does not place the red circle against the blue square.", ABSENT),
])
def test_a_misread_claim_gets_the_opposite_verdict_with_its_analysis(claim_of, against, analysis, rating):
    claim = split_claims(claim_of)[-1]
    assert verdict(claim, against)[1] != rating
    assert misread(claim, verdict(claim, against)[1]) == (analysis, rating)



def test_a_relation_is_checked_against_the_sentences_naming_both_its_objects():
    text = ("A red circle, a blue square and a green triangle. The red circle is to the left of the blue square. "
            "The blue square is above the green triangle.")
    assert relation_sentences("the red circle is to the left of the blue square", text) == (
        "A red circle, a blue square and a green triangle. The red circle is to the left of the blue square.")
    assert relation_sentences("the red circle is above the green triangle", text) == (
        "A red circle, a blue square and a green triangle.")
    assert relation_sentences("the purple circle is above the green triangle", text) == ""
    assert relation_sentences("a red circle", text) == text  # object claims read the whole text
    assert relation_sentences("a red dog", text) == text  # no claim of this world: nothing to narrow by


def test_an_object_is_checked_against_the_sentences_that_introduce_objects():
    text = ("A red circle, a blue square and a green triangle. The red circle is to the left of the blue square. "
            "A purple circle is below the green triangle.")
    narrowed = "A red circle, a blue square and a green triangle. A purple circle is below the green triangle."
    assert object_sentences(text) == narrowed
    narrow = claim_context("all_sentences")
    assert narrow("a purple circle", text) == narrow("two yellow squares", text) == narrowed
    assert narrow("the red circle is to the left of the blue square", text) == (  # relations as under `sentences`
        relation_sentences("the red circle is to the left of the blue square", text))
    assert narrow("a red dog", text) == text
    assert object_sentences("The red circle is left of the blue square.") == (  # nothing before: introduces both
        "The red circle is left of the blue square.")
    assert object_sentences("An empty image.") == ""
    assert claim_context("text") is None and claim_context("sentences") is relation_sentences


@pytest.mark.parametrize("setting", ["sentences", "all_sentences"])
def test_a_claim_has_the_same_verdict_against_its_sentences_as_against_the_whole_text(setting):
    """What makes judgments.claim_context safe to label with: over the texts and errors the loop makes, and
    captions worded otherwise (definite mentions introducing objects, relations naming one introduced before)."""
    import numpy as np

    from flywheel.worlds.shapes.config import ShapesWorldConfig
    from flywheel.worlds.shapes.perturb import swap_positions, wrong_colour, wrong_shape
    from flywheel.worlds.shapes.scene import describe, sample_scene

    narrow, kinds = claim_context(setting), {"sentences": {"relation"}, "all_sentences": {"relation", "object"}}
    worded = ["The red circle is to the left of a blue square. A red circle is above the blue square.",
              "Two red circles. The red circle is below a green triangle; the triangle is left of the blue one.",
              "A blue square and a red circle. Another red circle is above the blue square."]
    world, rng, checked = ShapesWorldConfig(), np.random.default_rng(0), Counter()
    pairs = [(a, b) for a in worded for b in worded]
    for _ in range(300):
        scene = sample_scene(rng, n_objects=(2, 4), config=world)
        i, j = (int(k) for k in rng.choice(len(scene.objects), size=2, replace=False))
        pairs += [(describe(scene), describe(other)) for other in (
            wrong_colour(scene, i, rng, world.palette), wrong_shape(scene, i, rng, world.shapes),
            swap_positions(scene, i, j))]
    for a, b in pairs:
        for words, against in [(w, b) for w in _texts(a)] + [(w, a) for w in _texts(b)]:
            claim = read_claim(words)
            narrowed = narrow(words, against)
            assert (narrowed != against) <= (claim.kind in kinds[setting])  # other claims read the whole text
            rating = verdict(claim, against)[1]
            assert verdict(claim, narrowed)[1] == rating, (words, against, narrowed)
            checked[claim.kind, rating] += 1
    assert checked["relation", EXACT] > 100 and checked["relation", ABSENT] > 100
    assert checked["object", EXACT] > 100 and checked["object", OTHER_ATTRIBUTE] > 100
