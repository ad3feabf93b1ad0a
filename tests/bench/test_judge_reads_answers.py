"""The judge-reading bench's parser: which of the judge's three steps (restate the reference, read the answer,
compare them) held on one item. Its numbers steer what the judge base is taught, so a misparse would misdirect."""

from bench_scripts import load_bench

bench = load_bench("judge_reads_answers")


def test_a_wrong_verdict_is_blamed_on_the_step_that_failed():
    steps = bench.steps
    ok = steps("iu_count", "There are none.", "There are two.",
               "Analysis: There are zero squares. The answer says two, which is wrong. Rating: 1")
    assert all(ok[k] for k in ("restates", "reads", "follows", "verdict")) and ok["differ"] and not ok["differ_right"]
    # restated and read right, compared wrong
    got = steps("iu_existence", "No.", "Yes.",
                "Analysis: There is no blue triangle in the image. The answer says yes, which is right. Rating: 5")
    assert got["restates"] and got["reads"] and not got["follows"] and not got["verdict"] and got["differ_right"]
    # copied the reference instead of reading: its verdict follows its (wrong) reading
    got = steps("iu_color", "The circle is blue.", "The circle is red.",
                "Analysis: The circle is blue. The answer says blue, which is right. Rating: 5")
    assert got["restates"] and not got["reads"] and got["follows"] and not got["verdict"]
    # the teacher's words since the comparison got a word of its own
    got = steps("iu_color", "The circle is blue.", "The circle is red.",
                "Analysis: The circle is blue. The answer says red, which differs, so it is wrong. Rating: 1")
    assert all(got[k] for k in ("restates", "reads", "follows", "verdict"))
    # the colour words since the answer's colour is checked against the image (assess_text._colour_verdict)
    got = steps("iu_color", "The circle is blue.", "The circle is red.",
                "Analysis: The answer says red. The circle is not red but blue, which differs, so it is wrong.")
    assert all(got[k] for k in ("restates", "reads", "follows", "verdict")) and got["differ"]
    got = steps("iu_color", "The circle is blue.", "The circle is red.",
                "Analysis: The answer says red. The circle is red, which matches, so it is right. Rating: 5")
    assert got["reads"] and got["follows"] and not got["restates"] and not got["verdict"]
    # an analysis without the expected sentence fails every step instead of being guessed
    got = steps("iu_color", "The circle is blue.", "The circle is blue.", "Rating: 5")
    assert not any(got.values())


def test_values_are_read_per_question_type():
    assert bench.value("iu_count", "There are none.") == "zero"
    assert bench.value("iu_color", "The circle is blue.") == "blue"
    assert bench.value("iu_color", "A red circle and a blue square.") is None  # two colours: no single value
    assert bench.value("iu_existence", "There is a purple circle in the image.") == "yes"
    assert bench.value("iu_existence", "There is no purple circle in the image.") == "no"
