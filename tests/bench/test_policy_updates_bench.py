"""The policy-update bench's LLaVA items: its oracle-pair DPO numbers steer the policy settings, so every question
type must be in the pairs it makes (it once took only colour items beside the captions)."""

from collections import Counter

from bench_scripts import load_bench

from flywheel.config import load_config

bench = load_bench("policy_updates")


def test_llava_items_take_the_asked_number_of_each_question_type():
    world = load_config().world.shapes
    items = bench.llava_items(world, captions=12, others=5, seed=0)
    assert Counter(it[3]["type"] for it in items) == {"caption": 12, "colour": 5, "count": 5, "existence": 5}
    more = bench.llava_items(world, captions=4, others=10, seed=0)  # more of each question type than captions
    assert Counter(it[3]["type"] for it in more) == {"caption": 4, "colour": 10, "count": 10, "existence": 10}
    assert [it[2] for it in bench.llava_items(world, 12, 5, 0)] == [it[2] for it in items]  # seeded
