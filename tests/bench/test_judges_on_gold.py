"""bench/judges_on_gold.py: judges compared on the gold pairs every one of them was scored on, each pair of judges
by the gate's McNemar counts; --judge specs parsed with the colons a models:/ URI holds. (Its meta-eval runs are
the loop's own code, tested with the meta-eval stage.)"""

import pytest
from bench_scripts import load_bench
from scipy import stats

bench = load_bench("judges_on_gold")


def _split(right: list[bool], prefix: str = "g") -> dict[str, bool]:
    return {f"{prefix}{i}": r for i, r in enumerate(right)}


def test_judges_are_scored_on_the_pairs_all_of_them_were_scored_on_and_compared_two_by_two():
    a = {"id-test": _split([True] * 8 + [False] * 2), "ood-test": _split([True, False])}
    b = {"id-test": _split([True] * 5 + [False] * 5), "ood-test": _split([False, True])}
    t = {"id-test": _split([True] * 9), "ood-test": _split([True, True])}  # no outcome for g9: unparsed
    r = bench.compare({"a": a, "b": b, "teacher": t})
    idt = r["id-test"]
    assert idt["n"] == 9
    assert idt["accuracy"] == pytest.approx({"a": 8 / 9, "b": 5 / 9, "teacher": 1.0})
    assert idt["mcnemar"][("a", "b")][:2] == (3, 0)
    assert idt["mcnemar"][("a", "b")][2] == pytest.approx(stats.binomtest(3, 3, 0.5, alternative="greater").pvalue)
    assert idt["mcnemar"][("a", "teacher")][:2] == (0, 1)
    assert r["ood-test"]["mcnemar"][("a", "b")][:2] == (1, 1)


def test_judge_specs_keep_the_colons_of_their_model_uri_and_a_malformed_one_is_refused_by_name():
    assert bench.parse_judge("a0=runs/cla:models:/judge/2") == ("a0", "runs/cla", "models:/judge/2")
    assert bench.parse_judge("x=runs/x:/abs/path/export") == ("x", "runs/x", "/abs/path/export")
    for bad in ("runs/cla:models:/judge/2", "a0=runs/cla", "=runs/cla:models:/judge/2"):
        with pytest.raises(SystemExit, match="NAME=WORKDIR:REF"):
            bench.parse_judge(bad)
