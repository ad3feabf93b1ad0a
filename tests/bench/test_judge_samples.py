"""bench/judge_samples.py: a judged row's score averaged over the samples that parsed it, per claim for claim rows,
a row no sample parsed kept failed; each sample's engine draws from seeds of its own. (The meta-eval it runs is
the loop's own code, tested with the meta-eval stage.)"""

import pytest
from bench_scripts import load_bench

from flywheel.evaluate import meta
from flywheel.judge import claims

bench = load_bench("judge_samples")


def _row(cand: str, score: float | None, protocol: str = "pointwise", claim: str | None = None) -> dict:
    raw = "Rating: x" if claim is None else f"{claims.HEADER.format(side='response', claim=claim)}\nStated."
    return {"prompt_id": "p", "candidate_ids": [cand], "protocol": protocol, "aspect": None, "order": None,
            "raw_output": raw, "score": score, "parse_error": None if score is not None else "no rating"}


def test_scores_are_averaged_over_the_samples_that_parsed_and_a_row_none_parsed_stays_failed():
    samples = [[_row("a", 3.0), _row("b", None), _row("c", None)],
               [_row("a", 4.0), _row("b", 2.0), _row("c", None)],
               [_row("a", 5.0), _row("b", None), _row("c", None)]]
    got = {r["candidate_ids"][0]: r for r in bench.averaged(samples)}
    assert got["a"]["score"] == pytest.approx(4.0) and got["a"]["parse_error"] is None
    assert got["b"]["score"] == pytest.approx(2.0) and got["b"]["parse_error"] is None
    assert got["c"]["score"] is None and got["c"]["parse_error"] == "no rating"  # never a made-up score


def test_claim_rows_of_one_candidate_are_averaged_claim_by_claim():
    one = [_row("a", 5.0, claims.NAME, "a red circle"), _row("a", 1.0, claims.NAME, "a blue square")]
    two = [_row("a", 3.0, claims.NAME, "a red circle"), _row("a", 3.0, claims.NAME, "a blue square")]
    got = {claims.header(r["raw_output"]): r["score"] for r in bench.averaged([one, two])}
    assert list(got.values()) == pytest.approx([4.0, 2.0])
    assert len(got) == 2


def test_a_pair_the_greedy_ratings_tie_is_ordered_by_the_averaged_ones():
    gold = [{"judgment_id": "g", "prompt_id": "p", "candidate_ids": ["a", "b"], "protocol": "pairwise",
             "aspect": None, "verdict": "A", "score": None}]
    prompts = {"p": {"prompt_id": "p", "task": "ig", "subtask": "ig_single_object"}}
    greedy = [_row("a", 4.0), _row("b", 4.0)]
    sampled = [[_row("a", 4.0), _row("b", 4.0)], [_row("a", 4.0), _row("b", 3.0)]]
    metric = "all/pointwise_ranking/accuracy"
    assert meta.pair_outcomes(metric, gold, greedy, prompts, set(), set()) == {"g": False}
    assert meta.pair_outcomes(metric, gold, bench.averaged(sampled), prompts, set(), set()) == {"g": True}


def test_each_sample_draws_from_seeds_of_its_own():
    class Engine:
        name, version = "hf:judge", "v1"

        def generate(self, requests, seed=0):
            return [seed] * len(requests)

    assert bench.Reseeded(Engine(), 2_000_000).generate(["r"]) == [2_000_000]
    assert bench.Reseeded(Engine(), 2_000_000).generate(["r"], seed=3) == [2_000_003]
    assert bench.Reseeded(Engine(), 5).name == "hf:judge"


def test_outcomes_are_split_by_the_sub_task_of_each_gold_pairs_prompt():
    gold = [{"judgment_id": j, "prompt_id": p} for j, p in (("g1", "p1"), ("g2", "p1"), ("g3", "p2"))]
    prompts = {"p1": {"subtask": "iu_caption"}, "p2": {"subtask": "ig_single_object"}}
    greedy, mean = {"g1": True, "g2": False, "g3": True}, {"g1": True, "g2": True, "g3": False}
    got = bench.by_subtask(["g1", "g2", "g3"], greedy, mean, gold, prompts)
    assert got == {"iu_caption": ([True, False], [True, True]), "ig_single_object": ([True], [False])}
