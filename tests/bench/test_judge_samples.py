"""bench/judge_samples.py: one sample read off the rows the loop's meta-eval wrote with judge.samples (each row's
first sample; a row whose first sample did not parse a failure, never a score), and the outcomes split by sub-task.
(The mean of k is the loop's own judge.samples, tested in tests/engines/test_samples.py.)"""

import json

from bench_scripts import load_bench

from flywheel.evaluate import meta

bench = load_bench("judge_samples")


def _row(cand: str, score: float | None, sample_scores: list | None = None) -> dict:
    parsed = None if score is None else {"rating": 3, **({} if sample_scores is None
                                                          else {"sample_scores": sample_scores})}
    return {"prompt_id": "p", "candidate_ids": [cand], "protocol": "pointwise", "aspect": None, "order": None,
            "raw_output": "x", "parsed": parsed, "score": score,
            "parse_error": None if score is not None else "no rating"}


def test_one_sample_is_each_rows_first_sample_and_an_unparsed_first_sample_is_a_failure():
    rows = [_row("a", 3.5, [5.0, 2.0]), _row("b", 2.0, [None, 2.0]), _row("c", None), _row("d", 4.0)]
    rows[0]["parsed"] = json.dumps(rows[0]["parsed"])  # as a dataset stores it
    got = {r["candidate_ids"][0]: r for r in bench.first_sample(rows)}
    assert got["a"]["score"] == 5.0 and got["a"]["parse_error"] is None
    assert got["b"]["score"] is None and got["b"]["parse_error"] == "first sample did not parse"
    assert got["c"]["score"] is None and got["c"]["parse_error"] == "no rating"
    assert got["d"]["score"] == 4.0  # a row of one sample is that sample


def test_a_pair_the_first_samples_tie_is_ordered_by_the_mean():
    gold = [{"judgment_id": "g", "prompt_id": "p", "candidate_ids": ["a", "b"], "protocol": "pairwise",
             "aspect": None, "verdict": "A", "score": None}]
    prompts = {"p": {"prompt_id": "p", "task": "ig", "subtask": "ig_single_object"}}
    rows = [_row("a", 4.0, [4.0, 4.0]), _row("b", 3.5, [4.0, 3.0])]
    metric = "all/pointwise_ranking/accuracy"
    assert meta.pair_outcomes(metric, gold, bench.first_sample(rows), prompts, set(), set()) == {"g": False}
    assert meta.pair_outcomes(metric, gold, rows, prompts, set(), set()) == {"g": True}


def test_outcomes_are_split_by_the_sub_task_of_each_gold_pairs_prompt():
    gold = [{"judgment_id": j, "prompt_id": p} for j, p in (("g1", "p1"), ("g2", "p1"), ("g3", "p2"))]
    prompts = {"p1": {"subtask": "iu_caption"}, "p2": {"subtask": "ig_single_object"}}
    greedy, mean = {"g1": True, "g2": False, "g3": True}, {"g1": True, "g2": True, "g3": False}
    got = bench.by_subtask(["g1", "g2", "g3"], greedy, mean, gold, prompts)
    assert got == {"iu_caption": ([True, False], [True, True]), "ig_single_object": ([True], [False])}
