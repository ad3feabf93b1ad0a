"""bench/compare_judges.py: two runs' judges compared pair by pair on their shared gold, as the gate's McNemar test
counts them, paired by what each gold pair is (not its id, which names the labeller), and refused when the runs'
gold shares no pair."""

import pytest
from bench_scripts import load_bench
from scipy import stats
from stored_meta_eval import write_gold, write_judged

from flywheel.config import load_config
from flywheel.iteration import paths

bench = load_bench("compare_judges")


def _run(root, name: str, right_by_iteration: list[list[bool]], gold_seed: int = 0, labeller: str = "oracle"):
    """A run's workdir holding one gold set and each iteration's stored meta-eval (right[i]: gold pair i)."""
    cfg = load_config(None, [f"run.workdir={root / name}"])
    gold = paths(cfg, 0)["gold"]
    ids = write_gold(gold, len(right_by_iteration[0]), seed=gold_seed, labeller=labeller)
    for n, right in enumerate(right_by_iteration):
        write_judged(paths(cfg, n)["meta-eval"], gold, dict(zip(ids, right)))
    return cfg


def test_two_runs_judges_are_compared_on_the_same_pairs_per_iteration_and_pooled(tmp_path):
    a = _run(tmp_path, "a", [[True] * 8 + [False] * 4, [True] * 10 + [False] * 2])
    b = _run(tmp_path, "b", [[True] * 5 + [False] * 3 + [True] + [False] * 3, [True] * 6 + [False] * 6])
    rows = dict(bench.run(a, b, [0, 1], [0, 1], "all/pointwise_ranking/accuracy", splits=("id-test",)))
    first, second, pooled = rows["id-test 000 vs 000"], rows["id-test 001 vs 001"], rows["id-test pooled"]
    assert (first["n"], first["a"], first["b"], first["better"], first["worse"]) == (12, 8 / 12, 6 / 12, 3, 1)
    assert (second["better"], second["worse"]) == (4, 0)
    assert (pooled["n"], pooled["better"], pooled["worse"]) == (24, 7, 1)
    assert pooled["p"] == pytest.approx(stats.binomtest(7, 8, 0.5, alternative="greater").pvalue)
    # A against itself: no pair tells them apart
    same = dict(bench.run(a, a, [0], [1], "all/pointwise_ranking/accuracy", splits=("id-test",)))
    assert same["id-test 000 vs 001"]["worse"] == 2 and same["id-test 000 vs 001"]["better"] == 0


def test_runs_whose_gold_ids_name_another_labeller_are_paired_by_what_each_pair_is(tmp_path):
    # the same gold pairs under other ids (a run whose teacher version changed): B's pair i is A's pair i
    a = _run(tmp_path, "a", [[True] * 8 + [False] * 4])
    b = _run(tmp_path, "b", [[False] * 2 + [True] * 6 + [True] * 2 + [False] * 2], labeller="oracle-v2")
    r = dict(bench.run(a, b, [0], [0], "all/pointwise_ranking/accuracy", splits=("id-test",)))["id-test 000 vs 000"]
    assert (r["n"], r["better"], r["worse"]) == (12, 2, 2)


def test_runs_with_other_gold_or_a_missing_iteration_are_refused_by_name(tmp_path):
    a = _run(tmp_path, "a", [[True] * 6])
    other = _run(tmp_path, "other", [[True] * 6], gold_seed=1)
    with pytest.raises(SystemExit, match="id-test gold shares no pair"):
        bench.run(a, other, [0], [0], "all/pointwise_ranking/accuracy", splits=("id-test",))
    with pytest.raises(SystemExit, match="iteration 3: cannot read the meta-eval"):
        bench.run(a, a, [0], [3], "all/pointwise_ranking/accuracy", splits=("id-test",))


def test_one_runs_judge_read_two_ways_is_compared_on_the_pairs_both_score(tmp_path):
    # pointwise ratings right on pairs 0-5 of 8; balanced pairwise verdicts right on 0-2 and 6-7, strict ones never
    cfg = load_config(None, [f"run.workdir={tmp_path / 'a'}"])
    gold = paths(cfg, 0)["gold"]
    ids = write_gold(gold, 8)
    write_judged(paths(cfg, 0)["meta-eval"], gold, {i: n < 6 for n, i in enumerate(ids)},
                 balanced={i: n < 3 or n >= 6 for n, i in enumerate(ids)})
    rows = dict(bench.run(cfg, cfg, [0], [0], "all/pairwise_balanced/accuracy", splits=("id-test",),
                          name_b="all/pointwise_ranking/accuracy"))
    r = rows["id-test 000 vs 000"]
    assert (r["n"], r["a"], r["b"], r["better"], r["worse"]) == (8, 5 / 8, 6 / 8, 2, 3)
    strict = dict(bench.run(cfg, cfg, [0], [0], "all/pairwise_balanced/accuracy", splits=("id-test",),
                            name_b="all/pairwise/accuracy"))["id-test 000 vs 000"]
    assert (strict["a"], strict["b"], strict["better"], strict["worse"]) == (5 / 8, 0.0, 5, 0)
