"""The world's claim splitter and the oracle's verdict on one claim: the claim checks' targets and their ceiling
(bench/judge_claims.py), so a wrong verdict would teach the judge the wrong look-up."""

import pytest

from flywheel.worlds.shapes.claims import (
    ABSENT,
    EXACT,
    OTHER_ATTRIBUTE,
    OTHER_COUNT,
    claim_kind,
    misread,
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

