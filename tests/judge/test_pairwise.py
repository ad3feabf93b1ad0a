"""Pairwise (FRABench / Multimodal RewardBench): both orders, universal aspects without the query, verdict
frames, position consistency, round trips, strict failures, judgment fields, the verdict's probabilities and the
balanced verdict of both orders."""
from __future__ import annotations

import random

import pytest
from judge_helpers import build_valid, candidate, checked, judgment_row, paragraph, prompt, tokens

from flywheel.aspects import AspectTree
from flywheel.judge import pairwise as pw
from flywheel.records import validate

QUERY = "How many red circles are there?"


@pytest.fixture(scope="module")
def tree() -> AspectTree:
    return AspectTree.load()


def test_both_orders_swap_responses_and_images(imgs, tree):
    p = prompt("itig", "itig_draw_and_describe", "Draw a red circle and describe it.")
    a, b = candidate("Text of A.", [imgs[1]]), candidate("Text of B.", [imgs[2], imgs[3]])
    reqs = pw.build_both(p, a, b, tree.aspects["object_presence"])
    assert set(reqs) == {"AB", "BA"}
    ab, ba = checked(reqs["AB"]), checked(reqs["BA"])
    assert reqs["AB"].images == [imgs[1], imgs[2], imgs[3]]
    assert reqs["BA"].images == [imgs[2], imgs[3], imgs[1]]
    one, two = "Text: Text of A.\nImage: <image>", "Text: Text of B.\nImages: <image><image>"
    assert f"###Response A###\n{one}\n###Response B###\n{two}\n" in ab
    assert f"###Response A###\n{two}\n###Response B###\n{one}\n" in ba


def test_task_aspect_shows_query_and_input_images(imgs, tree):
    p = prompt("iu", "iu_count", QUERY, images=[imgs[0]])
    req = pw.build(p, candidate("Two."), candidate("Three."), tree.aspects["count_accuracy"])
    text = checked(req)
    assert req.images == [imgs[0]]
    assert f"###Query###\n{QUERY}\nInput image: <image>\n###Response A###\nTwo.\n###Response B###\nThree." in text
    assert "###Aspect###\ncount_accuracy: " in text and "The query is not shown" not in text


def test_the_reference_guides_a_task_aspect_after_the_query(imgs, tree):
    """Reference-guided pairwise judging (MT-Bench's judge for questions it cannot answer itself), as pointwise
    shows the reference: text, then its images, between the query and the responses; images in that order."""
    p = prompt("ig", "ig_single_object", "Draw a red circle.", ref_text="A red circle.", ref_images=[imgs[4]])
    a, b = candidate(None, [imgs[1]]), candidate(None, [imgs[2]])
    req = pw.build(p, a, b, tree.aspects["color_accuracy"])
    assert req.images == [imgs[4], imgs[1], imgs[2]]
    assert ("###Query###\nDraw a red circle.\n###Reference Answer###\nA red circle.\nReference image: <image>\n"
            "###Response A###\n") in checked(req)
    compact = pw.build(p, a, b, style="compact")
    assert compact.images == [imgs[4], imgs[1], imgs[2]]
    assert ("Query: Draw a red circle.\nReference: A red circle.\nReference image: <image>\n"
            "A: Image: ") in checked(compact)
    for off in (pw.build(p, a, b, style="compact", use_reference=False), pw.build(p, a, b, tree.aspects["sharpness"])):
        assert "Reference" not in checked(off) and off.images == [imgs[1], imgs[2]]  # not asked / universal aspect


def test_universal_aspect_is_judged_without_the_query(imgs, tree):
    p = prompt("iu", "iu_count", QUERY, images=[imgs[0]])
    aspect = tree.aspects["fluency"]
    assert aspect.modality == "text"
    for req in pw.build_both(p, candidate("Two."), candidate("Three."), aspect).values():
        text = checked(req)
        assert QUERY not in text and "###Query###" not in text and req.images == []
        assert "The query is not shown" in text and "###Aspect###\nfluency: " in text


def test_no_aspect_means_overall_with_query():
    text = checked(pw.build(prompt(), candidate("Two."), candidate("Three.")))
    assert f"###Aspect###\noverall: {pw.OVERALL_DEFINITION}\n###Query###\n{QUERY}\n" in text


def test_ba_verdict_maps_back_to_ab_frame():
    assert [pw.to_ab(v, "BA") for v in ("A", "B", "tie")] == ["B", "A", "tie"]
    assert [pw.to_ab(v, "AB") for v in ("A", "B", "tie")] == ["A", "B", "tie"]
    with pytest.raises(ValueError, match="verdict 'C' not in A/B/tie"):
        pw.to_ab("C", "AB")
    with pytest.raises(ValueError, match="order 'BB'"):
        pw.to_ab("A", "BB")


@pytest.mark.parametrize("v_ab, v_ba, consistent, combined", [
    ("A", "B", True, "A"),    # A better in both presentations
    ("B", "A", True, "B"),
    ("tie", "tie", True, "tie"),
    ("A", "A", False, None),  # always the first shown: position bias
    ("B", "B", False, None),  # always the second shown
    ("A", "tie", False, None),
    ("tie", "B", False, None),
])
def test_position_consistency(v_ab, v_ba, consistent, combined):
    assert pw.position_consistent(v_ab, v_ba) is consistent
    assert pw.combine(v_ab, v_ba) == combined


def _judgment(rng):
    return pw.PairwiseJudgment(paragraph(rng), rng.choice(pw.VERDICTS))


def test_round_trip_many():
    for j in build_valid(random.Random(1), _judgment, 300):
        text = pw.format(j)
        assert pw.parse(text) == j, text


def test_format_exact():
    assert pw.format(pw.PairwiseJudgment("B names two circles; A three.", "A")) == \
        "Analysis: B names two circles; A three.\nVerdict: A"


def test_tolerates_whitespace_and_case():
    assert pw.parse(" analysis: x \r\nverdict : a").verdict == "A"
    assert pw.parse("Analysis: x\nVERDICT: TIE.").verdict == "tie"


@pytest.mark.parametrize("raw, reason", [
    ("Analysis: x\nVerdict: C", "verdict 'C' not in A/B/tie"),
    ("Analysis: x\nVerdict: [[A]]", "verdict '[[A]]' not in A/B/tie"),
    ("Analysis: x\nVerdict: Response A", "verdict 'Response A' not in A/B/tie"),
    ("Analysis: x\nVerdict: A or B", "verdict 'A or B' not in A/B/tie"),
    ("Analysis: x\nVerdict:", "empty verdict"),
    ("Analysis: A is better.", "no 'Verdict:' line"),
    ("Verdict: A", "no 'Analysis:' line"),
    ("Analysis: x\nVerdict: A\nVerdict: B", "2 'Verdict:' lines, expected 1"),
    ("Analysis: x\nVerdict: A\nbecause", "text after the 'Verdict:' line"),
    ("Analysis:\nVerdict: B", "empty analysis"),
])
def test_strict_failures(raw, reason):
    err = pw.parse(raw)
    assert isinstance(err, pw.ParseError) and err.reason == reason


def test_judgment_fields_are_in_the_ab_frame():
    j = pw.parse("Analysis: the second shown is better\nVerdict: B")
    ab, ba = pw.to_judgment_fields(j, "AB"), pw.to_judgment_fields(j, "BA")
    assert ab["verdict"] == "B" and ba["verdict"] == "A"
    assert ba["parsed"] == {"verdict": "B", "order": "BA"} and ba["score"] is None
    err = pw.to_judgment_fields(pw.parse("Verdict: C"), "AB")
    rows = [judgment_row("pairwise", ab, ("ca_a", "ca_b"), "AB", "fluency", raw="1"),
            judgment_row("pairwise", ba, ("ca_a", "ca_b"), "BA", "fluency", raw="2"),
            judgment_row("pairwise", err, ("ca_a", "ca_b"), "AB", "fluency", raw="3")]
    valid, quarantined = validate("judgment", rows)
    assert not quarantined and [r["verdict"] for r in valid] == ["B", "A", None]
    with pytest.raises(ValueError, match="order"):
        pw.to_judgment_fields(j, "ab")


def test_verdict_probs_are_read_at_the_verdict_token_and_renormalised():
    # "Analysis: Response A is red.\nVerdict: A": the analysis's own " A" and the colon's alternatives must not count
    steps = [("Analysis", {"Analysis": 1.0}), (": Response", {": Response": 1.0}), (" A", {" A": 0.6, " B": 0.4}),
             (" is red.\n", {" is red.\n": 1.0}), ("Verdict", {"Verdict": 1.0}), (":", {":": 0.9, " B": 0.1}),
             (" A", {" A": 0.5, "A": 0.1, " B": 0.2, " tie": 0.1, " the": 0.1})]
    probs = pw.verdict_probs("A", tokens(*steps))
    assert probs == pytest.approx({"A": 0.6 / 0.9, "B": 0.2 / 0.9, "tie": 0.1 / 0.9})
    f = pw.to_judgment_fields(pw.parse("Analysis: Response A is red.\nVerdict: A"), "BA", tokens(*steps))
    assert f["verdict"] == "B" and f["parsed"]["verdict"] == "A"  # probabilities stay in the order as emitted
    assert f["parsed"]["verdict_probs"] == pytest.approx(probs)
    assert pw.verdict_probs("B", tokens(("Verdict", {"Verdict": 1.0}), (": b", {": b": 1.0}))) is None
    bad = pw.to_judgment_fields(pw.parse("Analysis: a\nVerdict: C"), "AB", tokens(*steps))
    assert bad["verdict"] is None and bad["parse_error"]  # never rescued by the probabilities


@pytest.mark.parametrize("ab, ba, expected", [
    # always "A" (the first shown), but more sure of it when B's response sits first: B is preferred
    ({"A": 0.9, "B": 0.1, "tie": 0.0}, {"A": 0.95, "B": 0.05, "tie": 0.0}, "B"),
    ({"A": 0.95, "B": 0.05, "tie": 0.0}, {"A": 0.9, "B": 0.1, "tie": 0.0}, "A"),
    ({"A": 0.2, "B": 0.2, "tie": 0.6}, {"A": 0.3, "B": 0.3, "tie": 0.4}, "tie"),
    ({"A": 0.6, "B": 0.4, "tie": 0.0}, {"A": 0.6, "B": 0.4, "tie": 0.0}, "tie"),  # an exact draw
    ({"A": 0.6, "B": 0.4, "tie": 0.0}, None, None),  # one order without probabilities: no balanced verdict
])
def test_balanced_verdict_cancels_the_position_preference(ab, ba, expected):
    assert pw.balanced_verdict(ab, ba) == expected
    if ba is not None:  # the same two responses shown the other way round give the mirrored verdict
        assert pw.balanced_verdict(ba, ab) == {"A": "B", "B": "A", "tie": "tie"}[expected]
