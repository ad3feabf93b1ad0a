"""FRABench: swap consistency drops exactly the position-inconsistent items; position balance ends 50/50 with
the swapped rows' verdicts flipped."""
from collections import Counter

from curate_helpers import candidate, check_report, pairwise, pointwise, prompt, valid

from flywheel.curate.config import PairwiseCurateConfig
from flywheel.curate.pairwise import balance_positions, curate_pairwise, shown_verdict, swap_consistency, swap_row
from flywheel.judge import pairwise as pw

P = prompt()


def pair(i):
    return candidate(P, f"left {i}", index=2 * i), candidate(P, f"right {i}", index=2 * i + 1)


def item(i, ab, ba, aspect=None, analysis=None):
    """The AB and BA rows of pair i with the verdicts as EMITTED in each order (None: no row for that order)."""
    a, b = pair(i)
    return [pairwise(P, a, b, o, v, aspect=aspect, analysis=analysis) for o, v in (("AB", ab), ("BA", ba))
            if v is not None]


def test_swap_consistency_drops_exactly_the_inconsistent_items():
    x = item(0, "A", "B")  # A wins in both orders (BA emits B = A in the AB frame)
    y = item(1, "A", "A")  # "the first one" both times: position bias
    z = item(2, "A", None)  # one order only
    w = item(3, "tie", "tie")
    v = item(4, "B", "A")  # B wins both times
    u = item(5, "tie", "B")
    a, b = pair(6)
    err = [pairwise(P, a, b, "AB", "A"), {**pairwise(P, a, b, "BA", "A"), "verdict": None, "parsed": None,
                                          "analysis": None, "parse_error": "no 'Verdict:' line"}]
    other = [pointwise(P, a, 0, 4)]
    dup = item(7, "A", "B") + [pairwise(P, *pair(7), "AB", "A", k=1)]
    rows = x + y + z + w + v + u + err + other + dup
    out, rep = swap_consistency(rows)
    assert out == x + w + v + other
    check_report(rep, len(rows), 7, {"position_inconsistent": 4, "missing_order": 2, "parse_error": 1,
                                     "duplicate_order": 3}, items_in=8, items_out=3, passed_through=1,
                 items_position_inconsistent=2)
    assert all(pw.position_consistent(shown_verdict(r1), shown_verdict(r2)) for r1, r2 in (x, w, v))


def test_aspects_are_separate_items():
    rows = item(0, "A", "B", aspect="fluency") + item(0, "A", "A", aspect="correctness")
    out, rep = swap_consistency(rows)
    assert out == rows[:2] and rep.dropped == {"position_inconsistent": 2}


def test_position_balance_swaps_to_50_50_using_the_other_order_rows():
    a_wins = [item(i, "A", "B") for i in range(5)]
    b_wins = [item(5, "B", "A")]
    ties = [item(6, "tie", "tie")]
    rows = [r for it in a_wins + b_wins + ties for r in it]
    out, rep = balance_positions(rows, seed=0)
    assert len(out) == 7  # one row per item
    assert Counter(shown_verdict(r) for r in out) == {"A": 3, "B": 3, "tie": 1}
    swapped = [r for r in out if r["order"] == "BA"]
    assert len(swapped) == 2
    for r in swapped:  # the real BA judgment of an A-wins item: emitted verdict flipped, same winner
        ab = next(it[0] for it in a_wins if it[1] is r)
        assert shown_verdict(ab) == "A" and shown_verdict(r) == "B" and r["verdict"] == ab["verdict"] == "A"
    check_report(rep, 14, 7, {"other_order": 7}, swapped_by_other_order=2, swapped_synthetic=0, a_wins=3,
                 b_wins=3, ties=1, items=7)
    again, _ = balance_positions(list(reversed(rows)), seed=0)
    assert sorted(r["judgment_id"] for r in again) == sorted(r["judgment_id"] for r in out)  # order-independent
    picks = {tuple(sorted(r["judgment_id"] for r in balance_positions(rows, seed=s)[0])) for s in range(8)}
    assert len(picks) > 1


def test_position_balance_synthesises_swaps_for_single_order_items():
    rows = [item(i, "A", None, analysis="Response A is clearer than Response B.")[0] for i in range(4)]
    out, rep = balance_positions(rows, seed=1)
    assert Counter(shown_verdict(r) for r in out) == {"A": 2, "B": 2}
    check_report(rep, 4, 4, {"replaced_by_swap": 2}, swapped_synthetic=2, added=2, a_wins=2, b_wins=2)
    new = [r for r in out if r["judgment_id"] not in {x["judgment_id"] for x in rows}]
    assert len(new) == 2
    for r in new:
        orig = next(x for x in rows if x["candidate_ids"] == r["candidate_ids"][::-1])
        assert r["order"] == orig["order"] == "AB"
        assert (r["verdict"], orig["verdict"]) == ("B", "A")  # flipped in the row's frame ...
        assert r["parsed"]["verdict"] == "B"  # ... and as emitted
        assert r["raw_output"] == "Analysis: Response B is clearer than Response A.\nVerdict: B"
        assert pw.parse(r["raw_output"]) == pw.PairwiseJudgment("Response B is clearer than Response A.", "B")
    valid("judgment", out)


def test_swap_row_twice_is_the_original():
    r = item(0, "B", None)[0]
    back = swap_row(swap_row(r))
    assert back["judgment_id"] == r["judgment_id"] and back["verdict"] == r["verdict"]


def test_odd_difference_leaves_one_apart_and_balanced_input_is_untouched():
    rows = [r for i in range(4) for r in item(i, "A", "B")] + item(4, "B", "A")
    out, rep = balance_positions(rows)
    assert Counter(shown_verdict(r) for r in out) == {"A": 3, "B": 2}  # 4 vs 1: one swap
    rows = [r for i in range(2) for r in item(i, "A", "B")] + [r for i in (2, 3) for r in item(i, "B", "A")]
    out, rep = balance_positions(rows)
    assert all(r["order"] == "AB" for r in out) and rep.stats.get("swapped_by_other_order", 0) == 0


def test_curate_pairwise_by_config():
    rows = [r for i in range(4) for r in item(i, "A", "B")] + item(4, "A", "A")
    out, reps = curate_pairwise(rows)
    assert [r.name for r in reps] == ["swap_consistency", "position_balance"]
    assert Counter(shown_verdict(r) for r in out) == {"A": 2, "B": 2}
    out, reps = curate_pairwise(rows, PairwiseCurateConfig(position_balance=False))
    assert len(out) == 8 and len(reps) == 1


def test_position_balance_within_groups_balances_each_group_apart():
    # as a whole 4 A-wins and 4 B-wins: the dataset-wide balance swaps nothing, though "fluency" is all A and
    # "correctness" all B - a judge trained on that learns which position wins on which aspect
    rows = [r for i in range(4) for r in item(i, "A", "B", aspect="fluency")]
    rows += [r for i in range(4, 8) for r in item(i, "B", "A", aspect="correctness")]
    whole, rep = balance_positions(rows, seed=0)
    assert rep.stats.get("swapped_by_other_order", 0) == 0
    grouped, rep = balance_positions(rows, seed=0, group=lambda r: r["aspect"])
    for aspect in ("fluency", "correctness"):
        assert Counter(shown_verdict(r) for r in grouped if r["aspect"] == aspect) == {"A": 2, "B": 2}
    assert rep.stats["swapped_by_other_order"] == 4 and rep.stats["groups"] == 2 and len(grouped) == 8
    # each swap presents the item's real other-order row: the same winner in the AB frame
    winners = {tuple(r["candidate_ids"]): r["verdict"] for r in whole}
    assert {tuple(r["candidate_ids"]): r["verdict"] for r in grouped} == winners
    assert curate_pairwise(rows, group=lambda r: r["aspect"])[0] == grouped
