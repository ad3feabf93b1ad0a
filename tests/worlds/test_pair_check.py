"""Preference pairs graded by the oracle: right, wrong, tie, and pairs without ground truth kept apart."""

import math

import numpy as np
from PIL import Image

from flywheel.images import to_png_bytes
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.pair_check import UNPARSEABLE, oracle_value, pair_agreement
from flywheel.worlds.shapes.suites import make_prompt
from flywheel.worlds.shapes.vocab import PALETTES

WORLD = ShapesWorldConfig()


def _prompt(subtask: str, pid: str) -> dict:
    rng = np.random.default_rng(0)
    row = None
    while row is None:
        row = make_prompt(subtask, rng, WORLD)
    return {**row, "prompt_id": pid}


def _text(cid: str, pid: str, text: str) -> dict:
    return {"candidate_id": cid, "prompt_id": pid, "output_text": text, "output_images": []}


def test_pairs_are_graded_by_the_oracles_own_checks():
    colour = _prompt("iu_color", "p-colour")
    truth = colour["meta"]["question"]["answer"]
    other = next(c for c in PALETTES[WORLD.palette] if c != truth)
    shape = colour["meta"]["question"]["shape"]
    draw = _prompt("ig_single_object", "p-draw")
    user = {"prompt_id": "p-user", "subtask": "iu_color", "source": "user", "meta": None}
    candidates = {c["candidate_id"]: c for c in [
        _text("right", "p-colour", colour["reference_text"]),
        _text("wrong", "p-colour", f"The {shape} is {other}."),
        _text("wrong2", "p-colour", f"The {shape} is {other}."),
        _text("garbled", "p-colour", "The."),
        {"candidate_id": "drawn", "prompt_id": "p-draw", "output_images": draw["reference_images"]},
        {"candidate_id": "blank", "prompt_id": "p-draw",
         "output_images": [to_png_bytes(Image.new("RGB", (WORLD.image_size,) * 2, "white"))]},
        _text("u1", "p-user", "Blue."), _text("u2", "p-user", "Red."),
    ]}
    prompts = {p["prompt_id"]: p for p in (colour, draw, user)}
    assert oracle_value(colour, candidates["right"], WORLD) == 1.0
    assert oracle_value(colour, candidates["wrong"], WORLD) == 0.0
    assert oracle_value(colour, candidates["garbled"], WORLD) == UNPARSEABLE  # recorded as unreadable, not 0
    assert oracle_value(draw, candidates["drawn"], WORLD) > oracle_value(draw, candidates["blank"], WORLD)

    pairs = [("p-colour", "right", "wrong"), ("p-colour", "wrong", "garbled"),  # right twice
             ("p-colour", "wrong", "right"),                                    # wrong
             ("p-colour", "wrong", "wrong2"),                                   # tie
             ("p-draw", "drawn", "blank"), ("p-draw", "blank", "drawn"),        # right, wrong
             ("p-user", "u1", "u2")]                                            # no ground truth
    got = pair_agreement([{"prompt_id": p, "chosen_id": c, "rejected_id": r} for p, c, r in pairs],
                         prompts, candidates, WORLD)
    assert (got["iu_color/right"], got["iu_color/tie"], got["iu_color/wrong"]) == (2, 1, 1)
    assert got["iu_color/precision"] == 2 / 3
    assert (got["ig_single_object/right"], got["ig_single_object/wrong"]) == (1, 1)
    assert (got["all/right"], got["all/tie"], got["all/wrong"], got["all/no_ground_truth"]) == (3, 1, 2, 1)
    assert got["all/precision"] == 3 / 5


def test_only_ties_give_no_precision():
    colour = _prompt("iu_color", "p")
    candidates = {"a": _text("a", "p", colour["reference_text"]), "b": _text("b", "p", colour["reference_text"])}
    got = pair_agreement([{"prompt_id": "p", "chosen_id": "a", "rejected_id": "b"}], {"p": colour}, candidates,
                         WORLD)
    assert got["all/tie"] == 1 and math.isnan(got["all/precision"])
