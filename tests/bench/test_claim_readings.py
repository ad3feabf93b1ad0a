"""bench/claim_readings.py: a description's claim checks read into one score other ways, each pair right or wrong as
meta-eval would count it (an unparsed claim leaves its candidate unscored: the pair is wrong)."""

from bench_scripts import load_bench

from flywheel.judge import claims

bench = load_bench("claim_readings")


def _claim(cand: str, side: str, rating: float | None) -> dict:
    return {"prompt_id": "p", "candidate_ids": [cand], "protocol": "claims", "aspect": None,
            "raw_output": f"{side} claim: x\nAnalysis: .\nRating: {rating}", "score": rating,
            "parse_error": None if rating is not None else "bad"}


def _rating(cand: str, score: float) -> dict:
    return {"prompt_id": "p", "candidate_ids": [cand], "protocol": "pointwise", "aspect": None, "score": score,
            "parse_error": None, "raw_output": ""}


GOLD = [{"judgment_id": "g", "prompt_id": "p", "candidate_ids": ["a", "b"], "protocol": "pairwise", "aspect": None,
         "verdict": "A"}]


def test_each_reading_orders_the_pair_by_its_own_score():
    # a: its claims all right (5), but it misses one of two reference claims; b: one wrong claim of two, nothing
    # missed. The mean of all claims ties them (0.75 each); precision prefers a, recall b, min ties, and the
    # pointwise rating (a 4, b 2) breaks the tie for every blend
    judged = [_claim("a", claims.PRECISION, 5), _claim("a", claims.PRECISION, 5), _claim("a", claims.RECALL, 5),
              _claim("a", claims.RECALL, 1), _claim("b", claims.PRECISION, 5), _claim("b", claims.PRECISION, 1),
              _claim("b", claims.RECALL, 5), _claim("b", claims.RECALL, 5), _rating("a", 4), _rating("b", 2)]
    got = {name: right["g"] for name, right in bench.outcomes(GOLD, judged).items()}
    assert got == {"default": False, "precision": True, "recall": False, "min": False, "f1": False,
                   "blend0.25": True, "blend0.5": True, "blend0.75": True}


def test_an_unparsed_claim_makes_the_pair_wrong_for_every_reading():
    judged = [_claim("a", claims.PRECISION, 5), _claim("a", claims.RECALL, None), _claim("b", claims.PRECISION, 1),
              _claim("b", claims.RECALL, 1), _rating("a", 5), _rating("b", 1)]
    # even precision alone, which a's unparsed reference claim is not part of: meta-eval fails a as a whole
    assert not any(right["g"] for right in bench.outcomes(GOLD, judged).values())
