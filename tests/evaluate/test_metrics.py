import math

import pytest
from scipy import stats

from flywheel.evaluate.metrics import (PairItem, PointItem, pair_correct, pairs_from_points, pairwise_metrics,
                                      pointwise_metrics)


def test_pointwise_correlations_match_scipy_and_parse_failures_are_not_imputed():
    gold = [1, 2, 3, 4, 5, 2, 4]
    judged = [1, 3, 3, 5, 4, None, 4]
    m = pointwise_metrics([PointItem(str(k), g, j) for k, (g, j) in enumerate(zip(gold, judged))])
    g = [x for x, j in zip(gold, judged) if j is not None]
    j = [x for x in judged if x is not None]
    assert m["pearson"] == pytest.approx(stats.pearsonr(g, j).statistic)
    assert m["kendall_tau_b"] == pytest.approx(stats.kendalltau(g, j, variant="b").statistic)
    assert m["parse_failure_rate"] == pytest.approx(1 / 7)
    assert m["exact"] == pytest.approx(3 / 7)  # the unparsed item counts as not exact
    assert m["parsed"] == 6


def test_constant_judge_has_undefined_correlation_not_zero():
    m = pointwise_metrics([PointItem(str(k), g, 3) for k, g in enumerate([1, 2, 3, 4])])
    assert math.isnan(m["pearson"]) and math.isnan(m["spearman"])


def test_pairwise_accuracy_requires_both_orders_and_counts_flips():
    items = [
        PairItem("a", "A", "A", "A"),  # right, consistent
        PairItem("b", "A", "A", "B"),  # flips with order: not right, position-biased
        PairItem("c", "B", "B", None),  # one order only, right
        PairItem("d", "B", None, None),  # unparsed: wrong
    ]
    m = pairwise_metrics(items)
    assert [pair_correct(i) for i in items] == [True, False, True, False]  # the accuracy is their mean
    assert m["accuracy"] == 0.5
    assert m["position_bias_rate"] == 0.5
    assert m["parse_failure_rate"] == 0.25


def test_pairs_from_points_excludes_gold_ties_and_scores_judge_ties_wrong():
    pairs = pairs_from_points([("x", "", 5, 4, 1, 2), ("y", "", 3, 3, 3, 1), ("z", "", 2, 3, 4, 3)])
    assert [p.key for p in pairs] == ["x", "z"]
    assert pairwise_metrics(pairs)["accuracy"] == 0.5  # x right; z judged a tie
