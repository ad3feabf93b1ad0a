"""The claims protocol's divide step (flywheel/judge/claim_split.py): what a model's list of claims must look like,
and every other answer refused by name, never read as a guess at its claims."""

import pytest

from flywheel.judge import claim_split as cs
from flywheel.judge.base import ParseError, render


def test_a_formatted_list_parses_back_to_its_claims():
    claims = ["a red circle", "two blue squares", "a triangle left of the circle"]
    assert cs.parse(cs.format(claims)) == claims
    assert cs.parse(cs.format([])) == []


@pytest.mark.parametrize("raw", [
    "Claims:\n1. a red circle\n2) a blue square",
    "Claims:\n* a red circle\n\u2022 a blue square",
    # thought first, a remark after
    "The text names two shapes.\nClaims:\n- a red circle\n- a blue square\nThat is all.",
    "Claims:\n- old\nClaims:\n- a red circle\n- a blue square",  # the last block is the answer
    "Claims:\n- a red circle\n- a red circle\n- a blue square",  # a repeated claim is one claim (one check)
])
def test_the_lists_models_write_are_read(raw):
    assert cs.parse(raw) == ["a red circle", "a blue square"]


@pytest.mark.parametrize("raw, reason", [
    ("A red circle and a blue square.", 'no "Claims:" line'),
    ("Claims:\nnothing here", '"Claims:" lists no claim'),
    ("Claims: a red circle", "is followed by 'a red circle' on its line"),
    ("Claims:\n- ", 'lists no claim'),
    ("Claims:\n- " + "a red circle and " * 20, "characters (at most 200): not one fact"),
    ("", "empty output"),
])
def test_anything_else_is_a_parse_error_naming_what_is_wrong(raw, reason):
    got = cs.parse(raw)
    assert isinstance(got, ParseError) and reason in got.reason and got.raw == raw


def test_claims_none_is_an_answer_not_an_error():
    assert cs.parse("Claims: none") == [] and cs.parse("claims: None.") == []


def test_each_style_asks_for_the_text_alone():
    for style in ("compact", "minos"):
        req = cs.build("A red circle.", style=style, rid="c1")
        assert "A red circle." in render(req) and "<image>" not in render(req) and not req.images
        assert req.id == "c1"
    assert render(cs.build("A red circle.")).startswith("[user]\nClaims of the text.\n")
    assert "Please split the text into atomic claims" in render(cs.build("A red circle.", style="minos"))
