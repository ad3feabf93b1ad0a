"""The claim-check bench's training rows: each asks about one claim of one caption against the other caption
and is answered with the oracle's verdict, so the bench's numbers measure the judge, not a wrong target."""

import re

import numpy as np
from bench_scripts import load_bench

from flywheel.config import REPO_ROOT, load_config
from flywheel.worlds.shapes.claims import split_claims, verdict

bench = load_bench("judge_claims")
WORLD = load_config(str(REPO_ROOT / "configs" / "local.yaml")).world.shapes


def test_a_row_asks_one_claim_against_a_caption_and_targets_the_oracle_verdict():
    rng, ratings, with_image = np.random.default_rng(0), set(), 0
    for _ in range(60):
        row = bench.train_row(rng, WORLD)
        text = "".join(p["text"] for p in row["prompt"][0]["content"] if p["type"] == "text")
        claim, against = re.search(r'[Tt]he claim is "([^"]*)", the text is "([^"]*)"\.$', text).groups()
        found = next(c for c in split_claims(claim) if c.text == claim)  # a claim's words read back as itself
        analysis, rating = verdict(found, against)
        assert row["completion"][0]["content"][0]["text"] == f"Analysis: {analysis}\nRating: {rating}"
        ratings.add(rating)
        with_image += len(row["images"]) == 1
    assert ratings == {1, 2, 3, 5}  # every verdict occurs: a constant target would teach nothing
    assert 20 < with_image < 60  # descriptions (no image) and captions (an image) both


def test_the_oracle_ceiling_ranks_a_right_caption_above_a_wrong_one():
    from flywheel.judge import claims

    prompt = {"images": [], "reference_text": "A red circle to the left of a blue square."}
    good, bad = ({"output_text": t} for t in ("A red circle to the left of a blue square.", "A green circle."))
    score = [claims.score([bench.oracle_rating(c) for c in claims.checks(prompt, x, bench.split_text)])
             for x in (good, bad)]
    assert score[0] == 5 and score[1] < 2
