"""The colour-comparison probe's rewording: its `verify-but` arm must give old rows exactly the loop's words, or the
probe measures a wording the loop does not train on."""

from bench_scripts import load_bench

from flywheel.worlds.shapes.assess_text import _colour_verdict

bench = load_bench("answer_compare_probe")


def old_words(shape: str, said: str, truth: str) -> str:
    ok = said == truth
    return (f"The {shape} is {truth}. The answer says {said}, which {'matches' if ok else 'differs'}, "
            f"so it is {'right' if ok else 'wrong'}.")


def test_verify_but_rewords_a_run_before_2026_12_08_into_the_loops_words():
    for said, truth in (("blue", "red"), ("red", "red")):
        new = _colour_verdict("circle", said, truth, said == truth, ()).text
        assert bench.reword(old_words("circle", said, truth), "verify-but") == new
        assert bench.VERDICT.search(new).group(1) == ("matches" if said == truth else "differs")


def test_the_other_rewordings_keep_the_verdict_and_leave_other_rows_alone():
    row = '{"analysis": "' + old_words("square", "green", "yellow") + ' It gives the short answer asked for."}'
    for how in ("side-by-side", "verify", "evidence-verify"):
        assert [m.group(1) for m in bench.VERDICT.finditer(bench.reword(row, how))] == ["differs"]
    count = "There are two circles. The answer says three, which differs, so it is wrong."
    assert bench.reword(count, "verify-but") == count
