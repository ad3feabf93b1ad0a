"""bench/judge_misses.py: the gold pairs a judge orders wrong, by sub-task and by what the two candidates are (the
world's gold variants), beside the teacher's misses on the same pairs."""

import pytest
from bench_scripts import load_bench
from stored_meta_eval import write_gold, write_judged

from flywheel.config import load_config
from flywheel.iteration import paths

bench = load_bench("judge_misses")


def test_misses_are_counted_per_kind_of_pair_for_judge_and_teacher(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}"])
    gold = paths(cfg, 0)["gold"]
    kinds = [("correct", "blur")] * 3 + [("correct", "wrong_colour")] * 2 + [("extra", "missing")]
    ids = write_gold(gold, len(kinds), variants=kinds)
    # the judge misses two blurred pairs and the extra one; the teacher misses one wrong colour and has no
    # verdict on pair 5, which counts wrong, as the gate counts an item without a usable verdict
    write_judged(paths(cfg, 2)["meta-eval"], gold, dict(zip(ids, [False, False, True, True, True, False])))
    write_judged(paths(cfg, 0)["meta-eval-teacher"], gold, dict(zip(ids[:5], [True, True, True, False, True])))
    metric = "id-test/all/pointwise_ranking/accuracy"
    judge = bench.outcomes(cfg, paths(cfg, 2)["meta-eval"], metric, "judge")
    teacher = bench.outcomes(cfg, paths(cfg, 0)["meta-eval-teacher"], metric, "teacher")
    rows = bench.misses(bench.pair_kinds(cfg, "id-test"), judge, teacher)
    assert rows == {("iu_count", "correct", "blur"): {"n": 3, "judge": 2, "teacher": 0},
                    ("iu_count", "correct", "wrong_colour"): {"n": 2, "judge": 0, "teacher": 1},
                    ("iu_count", "extra", "missing"): {"n": 1, "judge": 1, "teacher": 1}}
    # a variant's misses summed over its pairs, either side: the pair of two variants counts under both
    assert bench.by_variant(rows) == {"blur": {"n": 3, "judge": 2, "teacher": 0},
                                      "extra": {"n": 1, "judge": 1, "teacher": 1},
                                      "missing": {"n": 1, "judge": 1, "teacher": 1},
                                      "wrong_colour": {"n": 2, "judge": 0, "teacher": 1}}
    with pytest.raises(SystemExit, match="iteration 7: cannot read the meta-eval"):
        bench.outcomes(cfg, paths(cfg, 7)["meta-eval"], metric, "iteration 7")


def test_claim_checks_are_counted_by_claim_kind_and_gold_rating():
    def row(cid, claim, score, side="response"):
        return {"protocol": "claims", "prompt_id": "p", "candidate_ids": [cid], "score": score,
                "raw_output": f"{side} claim: {claim}\nAnalysis: x\nRating: {score}"}

    rel = "the red circle is to the left of the blue square"
    gold = [row("a", "a red circle", 5.0), row("a", rel, 5.0), row("b", rel, 1.0), row("b", "a red circle", 2.0),
            {"protocol": "pointwise", "prompt_id": "p", "candidate_ids": ["a"], "score": 5.0, "raw_output": ""}]
    prompts = {"p": {"subtask": "iu_caption"}}
    # the judge's expected ratings round to gold's or not; it reads the relation as absent, and its check of
    # b's red circle is missing (counted wrong); the teacher misses only that one
    judge = [row("a", "a red circle", 4.9997), row("a", rel, 1.0002), row("b", rel, 1.0)]
    teacher = [row("a", "a red circle", 5.0), row("a", rel, 5.0), row("b", rel, 1.0), row("b", "a red circle", 5.0)]
    assert bench.claim_misses(gold, prompts, {"judge": judge, "teacher": teacher}) == {
        ("iu_caption", "object", 2): {"n": 1, "judge": 1, "teacher": 1},
        ("iu_caption", "object", 5): {"n": 1, "judge": 0, "teacher": 0},
        ("iu_caption", "relation", 1): {"n": 1, "judge": 0, "teacher": 0},
        ("iu_caption", "relation", 5): {"n": 1, "judge": 1, "teacher": 0}}
