"""Pointwise (Minos): request, format/parse round trip, strict failures, judgment fields."""
from __future__ import annotations

import random

import pytest
from judge_helpers import build_valid, candidate, checked, judgment_row, paragraph, prompt, tokens

from flywheel.judge import pointwise as pw
from flywheel.judge.guidelines import get_guideline
from flywheel.records import validate


def test_iu_request_is_minos_shaped(imgs):
    p = prompt("iu", "vqa", "What time of day might this be?", images=[imgs[0]])
    req = pw.build(p, candidate("Sunset."))
    text = checked(req)
    assert req.images == [imgs[0]]
    assert text.startswith("[user]\nPlease act as an impartial and helpful evaluator for multimodal generation. "
                           "Evaluate the quality of Visual Question Answering strictly")
    assert ('###Task Instance###\nThe input image is <image>, the question is "What time of day might this be?", '
            'the response is "Sunset.".\n###Your Evaluation###') in text
    assert "###Scoring Rubric###\n1: " in text and "\n5: " in text
    assert 'start with "Analysis:"' in text and 'start with "Rating:"' in text


def test_image_order_input_output_reference(imgs):
    p = prompt("ig", "image_editing", "Make the circle blue.", images=imgs[0:2], ref_text="A blue circle.",
               ref_images=[imgs[4]])
    req = pw.build(p, candidate(None, imgs[2:4]))
    text = checked(req)
    assert req.images == [imgs[0], imgs[1], imgs[2], imgs[3], imgs[4]]
    assert ("The input images are <image><image>, the input instruction is \"Make the circle blue.\", the generated "
            "response images are <image><image>, the reference answer is \"A blue circle.\", the reference image is "
            "<image>.") in text
    no_ref = pw.build(p, candidate(None, imgs[2:4]), use_reference=False)
    assert no_ref.images == imgs[0:4] and "reference" not in checked(no_ref).split("###Task Instance###")[1]


def test_itig_and_nlg_instances(imgs):
    itig = checked(pw.build(prompt("itig", "itig_draw_and_describe", "Draw a red circle."),
                            candidate("A red circle.", imgs[:1])))
    assert 'The input text is "Draw a red circle.", the response is "A red circle.", the generated response image ' \
           'is <image>.' in itig
    assert "Evaluate the quality of Draw and Describe" in itig
    nlg = pw.build(prompt("nlg", "summarization", "Summarize: ..."), candidate("Short."))
    assert nlg.images == [] and 'The input text is "Summarize: ...", the response is "Short.".' in checked(nlg)


def test_explicit_guideline_and_missing_task():
    g = get_guideline("ig")
    assert "Image Generation" in checked(pw.build(prompt("ig", "ig_relation", "x"), candidate("y"), g))
    with pytest.raises(ValueError, match="no pointwise guideline for task 'audio'"):
        pw.build(prompt("audio", "x", "q"), candidate("y"))


def _judgment(rng: random.Random) -> pw.PointwiseJudgment:
    return pw.PointwiseJudgment(paragraph(rng), rng.randint(1, 5))


def test_round_trip_many():
    rng = random.Random(0)
    js = build_valid(rng, _judgment, 300)
    for j in js:
        text = pw.format(j)
        assert pw.parse(text) == j, text
        assert text.endswith(f"\nRating: {j.rating}") and text.startswith("Analysis: ")


def test_format_exact():
    assert pw.format(pw.PointwiseJudgment("Correct count.", 5)) == "Analysis: Correct count.\nRating: 5"


def test_tolerates_whitespace_case_and_minos_period():
    assert pw.parse("  analysis :  Fine.\r\n\r\n   RATING:4. ") == pw.PointwiseJudgment("Fine.", 4)
    assert pw.parse("Analysis:\nLine one.\n\nLine two.\nRating: 2") == pw.PointwiseJudgment("Line one.\n\nLine two.", 2)


@pytest.mark.parametrize("raw, reason", [
    ("Analysis: good answer", "no 'Rating:' line"),
    ("Rating: 4", "no 'Analysis:' line"),
    ("Analysis: ok\nRating: 7", "rating 7 outside 1–5"),
    ("Analysis: ok\nRating: 0", "rating 0 outside 1–5"),
    ("Analysis: ok\nRating: 4/5", "rating '4/5' is not an integer 1–5"),
    ("Analysis: ok\nRating: four", "rating 'four' is not an integer 1–5"),
    ("Analysis: ok\nRating: 3.5", "rating '3.5' is not an integer 1–5"),
    ("Analysis: ok\nRating:", "empty rating"),
    ("Analysis: ok\nRating: 4\nHope this helps!", "text after the 'Rating:' line"),
    ("Sure, here it is.\nAnalysis: ok\nRating: 4", "text before 'Analysis:'"),
    ("Analysis:\nRating: 4", "empty analysis"),
    ("Analysis: a\nRating: 3\nRating: 4", "2 'Rating:' lines, expected 1"),
    ("Analysis: a\nAnalysis: b\nRating: 3", "2 'Analysis:' lines, expected 1"),
    ("Rating: 4\nAnalysis: backwards", "text before 'Analysis:'"),
])
def test_strict_failures(raw, reason):
    err = pw.parse(raw)
    assert isinstance(err, pw.ParseError) and err.reason == reason and err.raw == raw


@pytest.mark.parametrize("args, msg", [(("x", 6), "rating 6 outside 1–5"), (("x", True), "expected int"),
                                       (("", 3), "empty"), (("a\nRating: 2", 3), "reserved label"),
                                       ((" padded", 3), "canonical")])
def test_structure_refuses_what_cannot_round_trip(args, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        pw.PointwiseJudgment(*args)


def test_judgment_fields_validate_as_records():
    ok = pw.parse("Analysis: Correct.\nRating: 4")
    f = pw.to_judgment_fields(ok)
    assert f == {"parsed": {"rating": 4}, "score": 4.0, "verdict": None, "parse_error": None, "analysis": "Correct."}
    bad = pw.to_judgment_fields(pw.parse("Analysis: x\nRating: 9"))
    assert bad["parse_error"] == "rating 9 outside 1–5" and bad["score"] is None
    valid, quarantined = validate("judgment", [judgment_row("pointwise", f, raw="a"),
                                               judgment_row("pointwise", bad, raw="b")])
    assert not quarantined and len(valid) == 2 and valid[0]["parsed"] == '{"rating":4}'


def test_expected_rating_weights_the_ratings_at_the_written_one():
    # "Analysis: ok\nRating: 4" with P(4)=0.5, P(2)=0.3, P(" 5")+P("5")=0.2 at the rating token; "Rating" and ":"
    # earlier carry digits among their alternatives that must not count.
    steps = [("Analysis", {"Analysis": 0.9, "3": 0.1}), (": ok\n", {": ok\n": 1.0}), ("Rating", {"Rating": 1.0}),
             (":", {":": 0.8, " 1": 0.2}), (" 4", {" 4": 0.5, " 2": 0.3, " 5": 0.1, "5": 0.1, " the": 0.2})]
    got = pw.expected_rating(4, tokens(*steps))
    assert got == pytest.approx((4 * 0.5 + 2 * 0.3 + 5 * 0.2) / 1.0)
    f = pw.to_judgment_fields(pw.parse("Analysis: ok\nRating: 4"), tokens(*steps))
    assert f["score"] == pytest.approx(3.6) and f["parsed"] == {"rating": 4, "expected_rating": pytest.approx(3.6)}


def test_expected_rating_stays_on_the_scale_in_floating_point():
    # 5 * p / p is 5.000000000000001 for this p: a claim scored from it was refused as outside 1-5, which stopped
    # a meta-eval (runs/clb, 2026-11-30)
    p = 0.46689223535252355
    assert 5 * p / p > 5
    assert pw.expected_rating(5, tokens((" 5", {" 5": p}))) == 5.0
    assert pw.expected_rating(1, tokens(("1", {"1": p}))) == 1.0
    assert pw.expected_rating(5, tokens((" 5", {" 5": 0.8454245937016164, " 4": 3.42312541078584e-16}))) <= 5


def test_expected_rating_keeps_the_written_rating_without_its_token_and_never_rescues_a_parse_failure():
    steps = [("Rating", {"Rating": 1.0}), (":", {":": 1.0}), (" four", {" four": 0.6, " 3": 0.4})]
    assert pw.expected_rating(4, tokens(*steps)) is None
    assert pw.to_judgment_fields(pw.parse("Analysis: a\nRating: 4"), tokens(*steps))["score"] == 4.0
    bad = pw.to_judgment_fields(pw.parse("Analysis: a\nRating: four"), tokens(*steps))
    assert bad["score"] is None and bad["parse_error"]
    # a trailing period (Minos writes "Rating: 4.") still finds the rating's token
    assert pw.expected_rating(4, tokens(("4.", {"4.": 0.75, "2": 0.25}))) == pytest.approx(3.5)
