"""bench/sample_headroom.py: its shares (pass@K, mixed) decide whether more samples could teach the policy more, so
they must count what they say; and the script must load against the loop's own evaluation code."""

import pytest
from bench_scripts import load_bench

bench = load_bench("sample_headroom")


def test_the_bench_loads_and_documents_its_options(capsys):
    with pytest.raises(SystemExit) as e:  # in this process: a subprocess would spend ~10 s importing torch
        bench.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("--temperatures", "--samples", "--items", "--policy", "--set"))


def test_shares_count_items_with_a_right_sample_and_with_both():
    items = [(None, None, None, {"type": t}) for t in ("count", "count", "caption")]
    greedy = [1.0, 0.0, 0.0]
    samples = [[1.0, 0.0, 0.0],   # draw 1, item by item
               [1.0, 1.0, 0.0]]   # draw 2
    out = bench.summarise(items, greedy, samples)
    assert out["count"] == {"greedy": 0.5, "mean": 0.75, "pass": 1.0, "mixed": 0.5, "n": 2.0}
    assert out["caption"] == {"greedy": 0.0, "mean": 0.0, "pass": 0.0, "mixed": 0.0, "n": 1.0}
    assert out["all"]["pass"] == pytest.approx(2 / 3) and out["all"]["mixed"] == pytest.approx(1 / 3)
