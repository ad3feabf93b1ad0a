"""Claim checks (flywheel/judge/claims.py): each claim its own request, both directions, and a score that is a
failure, never a guess, when one claim's output does not parse."""

import pytest

from flywheel.judge import claims
from flywheel.judge.base import IMAGE


def _text(req) -> str:
    return "".join(p["text"] if p["type"] == "text" else IMAGE for p in req.messages[0]["content"])


def _split(text: str) -> list[str]:
    return [w.strip() for w in text.rstrip(".").split(" and ")]


def test_a_response_is_checked_against_the_reference_and_the_reference_against_it():
    prompt = {"images": [b"png"], "reference_text": "A red circle and a blue square."}
    out = claims.checks(prompt, {"candidate_id": "c1", "output_text": "A red circle."}, _split)
    assert [(c.side, c.claim, c.against) for c in out] == [
        (claims.PRECISION, "A red circle", "A red circle and a blue square."),
        (claims.RECALL, "A red circle", "A red circle."), (claims.RECALL, "a blue square", "A red circle.")]
    assert _text(out[0].request) == (f'Claim check. Rate 1-5.\nThe input image is {IMAGE}, the claim is "A red '
                                     'circle", the text is "A red circle and a blue square.".')
    assert out[0].request.images == [b"png"] and out[0].request.id == "c1"


def test_a_text_only_prompt_asks_without_images_and_the_long_style_states_the_scale():
    req = claims.build("a red circle", "A red circle.", style="minos")
    assert req.images == [] and "5 the text states the claim" in _text(req)
    assert 'The claim is "a red circle", the text is "A red circle."' in _text(req)


def test_nothing_to_check_without_a_reference_or_a_response_text():
    assert claims.checks({"images": [], "reference_text": None}, {"output_text": "A red circle."}, _split) == []
    assert claims.checks({"images": [], "reference_text": "A red circle."}, {"output_images": [b"png"]},
                         _split) == []


def test_the_score_is_the_mean_credit_on_the_rating_scale_and_a_failed_claim_fails_it():
    assert claims.score([5, 5]) == 5 and claims.score([5, 1]) == 3 and claims.score([3.0]) == 3
    assert claims.score([5, None]) is None and claims.score([]) is None
    with pytest.raises(ValueError):
        claims.credit(7)
    with pytest.raises(ValueError):
        claims.credit(5.01)
    # expected ratings stored before pointwise.expected_rating kept to the scale: rounding, read as the top
    assert claims.credit(5.000000000000001) == 1.0 and claims.score([5.000000000000001, 1]) == 3
