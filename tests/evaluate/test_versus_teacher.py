"""The judge against its noisy teacher, gold pair by gold pair, from both meta-evals on storage: the counts and
McNemar's one-sided p that the summary, the MLflow description and `flywheel report` show."""

import pytest
from scipy import stats
from stored_meta_eval import SPLIT, write_gold, write_judged

from flywheel.config import load_config
from flywheel.evaluate.versus_teacher import compared_metric, versus_teacher
from flywheel.iteration_summary import vs_teacher_line


def test_counts_the_pairs_only_one_of_them_gets_right_and_tests_the_judge_above(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}"])
    gold = str(tmp_path / "gold")
    ids = write_gold(gold, 40)
    # both right on 0-19; only the judge on 20-29; only the teacher on 30-32; both wrong on 33-39
    judge = {k: i < 30 for i, k in enumerate(ids)}
    teacher = {k: i < 20 or 30 <= i < 33 for i, k in enumerate(ids)}
    write_judged(str(tmp_path / "judge"), gold, judge)
    write_judged(str(tmp_path / "teacher"), gold, teacher)

    vs = versus_teacher(cfg, gold, str(tmp_path / "judge"), str(tmp_path / "teacher"), [SPLIT])

    p = stats.binomtest(10, 13, 0.5, alternative="greater").pvalue
    assert vs == {SPLIT: {"metric": "all/pointwise_ranking/accuracy", "pairs": 40, "better": 10, "worse": 3,
                          "p": pytest.approx(p)}}
    assert p < 0.05
    # the other way round the judge is not above: same discordant pairs, the large p
    swapped = versus_teacher(cfg, gold, str(tmp_path / "teacher"), str(tmp_path / "judge"), [SPLIT])[SPLIT]
    assert (swapped["better"], swapped["worse"]) == (3, 10) and swapped["p"] > 0.95
    line = vs_teacher_line(vs)
    assert "id-test: 10 pairs only the judge gets right, 3 only the teacher (of 40; one-sided McNemar p=0.046)" \
        in line and "all/pointwise_ranking/accuracy" in line


def test_a_split_it_cannot_recompute_is_named_not_scored(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}"])
    gold = str(tmp_path / "gold")
    ids = write_gold(gold, 6)
    write_judged(str(tmp_path / "judge"), gold, {k: True for k in ids})
    vs = versus_teacher(cfg, gold, str(tmp_path / "judge"), str(tmp_path / "no-teacher"), [SPLIT])
    assert set(vs[SPLIT]) == {"metric", "unavailable"} and "cannot read the meta-eval" in vs[SPLIT]["unavailable"]
    assert "id-test: not compared (cannot read" in vs_teacher_line(vs)


def test_the_compared_metric_is_the_gates_per_pair_accuracy_or_the_ranking(tmp_path):
    load = lambda *o: load_config(None, [f"run.workdir={tmp_path}", *o])  # noqa: E731
    assert compared_metric(load("gate.judge_metric=id-test/task/iu/pairwise/accuracy")) == "task/iu/pairwise/accuracy"
    pearson = ["gate.judge_metric=id-test/all/pointwise/pearson", "gate.judge_test=none"]
    assert compared_metric(load(*pearson)) == "all/pointwise_ranking/accuracy"
    bias = ["gate.judge_metric=id-test/all/pairwise/position_bias_rate", "gate.judge_test=none",
            "meta_eval.protocols=[pairwise]"]
    assert compared_metric(load(*bias)) == "all/pairwise/accuracy"
