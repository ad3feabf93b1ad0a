"""Score balance (Minos cap, T2I third quartile) and sub-task rebalance: targets, counts, determinism."""
import random
from collections import Counter

import pytest
from curate_helpers import candidate, check_report, pairwise, pointwise, prompt
from pydantic import ValidationError

from flywheel.curate.balance import (balance_scores, cap, claim_key, q3_target, rebalance, rebalance_subtasks,
                                     score_key, weight_protocols)
from flywheel.curate.config import ProtocolWeightsConfig, ScoreBalanceConfig, SubtaskRebalanceConfig
from flywheel.curate.report import row_key

P = prompt()


def rated(sizes: dict[int, int], aspect=None) -> list[dict]:
    """One kept judgment per candidate, `n` candidates rated `score` for each score: n in sizes."""
    rows, i = [], 0
    for score, n in sizes.items():
        for _ in range(n):
            rows.append(pointwise(P, candidate(P, f"answer {i}", index=i), 0, score, aspect=aspect))
            i += 1
    return rows


@pytest.mark.parametrize("sizes,target", [([10, 2, 5, 1], 6), ([1, 2, 3, 10], 5), ([4], 4), ([2, 2], 2),
                                          ([1, 1, 1, 2], 1), ([1, 2, 3, 4], 3), ([1, 3], 3), ([0, 0], 1)])
def test_q3_target(sizes, target):
    # numpy linear interpolation, rounded half up: [1,3] -> 2.5 -> 3; [10,2,5,1] -> 6.25 -> 6
    assert q3_target(sizes) == target


def test_q3_rule_up_and_down_samples_to_the_target():
    rows = rated({1: 1, 2: 3, 5: 8, 4: 2})  # sizes 1,3,8,2 -> Q3 = 3 + 0.25 * 5 = 4.25 -> 4
    out, rep = rebalance(rows, score_key, seed=0)
    assert Counter(r["score"] for r in out) == {1.0: 4, 2.0: 4, 4.0: 4, 5.0: 4}
    ids = Counter(r["judgment_id"] for r in out)
    by_score = {s: [r["judgment_id"] for r in rows if r["score"] == s] for s in (1.0, 2.0, 4.0, 5.0)}
    assert ids[by_score[1.0][0]] == 4  # one row repeated 4 times
    assert [ids[i] for i in by_score[4.0]] == [2, 2]  # two rows twice each
    assert sorted(ids[i] for i in by_score[2.0]) == [1, 1, 2]  # floor(4/3)=1 each, plus 1 drawn once more
    assert sorted(ids[i] for i in by_score[5.0]) == [0, 0, 0, 0, 1, 1, 1, 1]  # 4 of 8 drawn
    check_report(rep, 14, 16, {"downsampled": 4}, added=6, buckets=4, strata=1, passed_through=0)
    assert rep.rows_out == rep.rows_in - sum(rep.dropped.values()) + rep.stats["added"]
    # repeats are equal copies, never the same dict twice; output keeps input order
    first = [r for r in out if r["judgment_id"] == by_score[1.0][0]]
    assert first[0] is rows[0] and all(r == rows[0] and r is not rows[0] for r in first[1:])


def test_q3_rule_is_deterministic_and_order_independent():
    rows = rated({1: 2, 2: 5, 3: 9, 4: 1})
    out1, _ = rebalance(rows, score_key, seed=3)
    out2, _ = rebalance(rows, score_key, seed=3)
    assert out1 == out2
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    out3, _ = rebalance(shuffled, score_key, seed=3)
    assert Counter(map(row_key, out3)) == Counter(map(row_key, out1))
    picks = {tuple(sorted(map(row_key, rebalance(rows, score_key, seed=s)[0]))) for s in range(6)}
    assert len(picks) > 1  # the seed matters


def test_up_or_down_only():
    rows = rated({1: 1, 2: 3, 5: 8, 4: 2})
    out, rep = rebalance(rows, score_key, upsample=False)
    assert Counter(r["score"] for r in out) == {1.0: 1, 2.0: 3, 4.0: 2, 5.0: 4}
    out, rep = rebalance(rows, score_key, downsample=False)
    assert Counter(r["score"] for r in out) == {1.0: 4, 2.0: 4, 4.0: 4, 5.0: 8}


def test_minos_cap():
    rows = rated({1: 1, 3: 3, 5: 8})
    out, rep = cap(rows, 2, seed=0)
    assert Counter(r["score"] for r in out) == {1.0: 1, 3.0: 2, 5.0: 2}
    check_report(rep, 12, 5, {"over_cap": 7})
    assert [r for r in rows if r in out] == out  # a filter: input order, no repeats


def test_strata_are_balanced_apart_and_rows_without_scores_pass_through():
    flu = rated({5: 6, 1: 2}, aspect="fluency")  # target = Q3 of [6, 2] = 5
    cor = rated({2: 1, 4: 1}, aspect="correctness")  # target 1: unchanged
    a, b = candidate(P, "x"), candidate(P, "y", index=1)
    pair = [pairwise(P, a, b, "AB", "A")]
    out, rep = rebalance(flu + cor + pair, score_key, seed=0)
    got = Counter((r["aspect"], r["score"]) for r in out)
    assert got == {("fluency", 5.0): 5, ("fluency", 1.0): 5, ("correctness", 2.0): 1, ("correctness", 4.0): 1,
                   (None, None): 1}
    assert rep.stats["strata"] == 2 and rep.stats["passed_through"] == 1


def test_sft_rows_balance_by_meta_score_per_sample_kind_and_dimension():
    def sft(kind, dim, score, i):
        return {"sft_id": f"sf_{kind}_{dim}_{i}", "messages": "[]", "protocol": "decomposed", "subtask": kind,
                "meta": {"score": score, "dimension": dim}}
    rows = [sft("scoring", "appearance", 9, i) for i in range(4)] + [sft("scoring", "appearance", 2, 9)]
    rows += [sft("scoring", "intrinsic", 10, i) for i in range(3)]
    rows += [{"sft_id": "sf_answer", "messages": "[]", "protocol": "decomposed", "subtask": "answer_generation",
              "meta": "{\"dimension\": \"appearance\"}"}]
    assert score_key(rows[0]) == (("decomposed", "scoring", None, "appearance"), 9.0)
    out, rep = rebalance(rows, score_key)
    got = Counter((r["meta"]["dimension"], r["meta"]["score"]) for r in out if r["subtask"] == "scoring")
    # appearance: Q3 of [4, 1] = 3.25 -> 3 (4 cut, 1 repeated); intrinsic: one bucket of 3, its own target
    assert got == {("appearance", 9): 3, ("appearance", 2): 3, ("intrinsic", 10): 3}
    assert rep.stats["passed_through"] == 1


def test_claim_checks_pass_through_the_score_balance_as_verdicts_do():
    """A claim's rating is its verdict class: balancing it by score once repeated the teacher's rare off-verdict
    ratings (a jittered 4) into a fifth of the claim rows."""
    def sft(score, i):
        return {"sft_id": f"sf_claim_{score}_{i}", "messages": "[]", "protocol": "claims", "meta": {"score": score}}
    rows = [sft(5, i) for i in range(6)] + [sft(1, i) for i in range(5)] + [sft(4, 0)]
    assert score_key(rows[0]) is None
    out, rep = rebalance(rows, score_key, seed=0)
    assert sorted(r["sft_id"] for r in out) == sorted(r["sft_id"] for r in rows)  # nothing cut, nothing repeated
    assert rep.stats["passed_through"] == len(rows)


def test_claim_verdicts_balance_within_sub_task_and_claim_kind():
    """curate.claim_balance: a claim's ratings balanced against each other within (sub-task, kind), so relations
    the teacher mostly found absent stop teaching the judge that relations are absent; other rows pass through."""
    def claim(subtask, words, score, i):
        return {"sft_id": f"sf_{subtask}_{words}_{score}_{i}", "messages": "[]", "protocol": "claims",
                "subtask": subtask, "meta": {"score": score, "claim": words}}
    sizes = {("iu_caption", "rel", 1): 9, ("iu_caption", "rel", 5): 3, ("iu_caption", "obj", 5): 4,
             ("iu_caption", "obj", 2): 4, ("scene", "rel", 1): 2, ("scene", "rel", 5): 6}
    rows = [claim(*bucket, i) for bucket, n in sizes.items() for i in range(n)]
    other = {"sft_id": "sf_pointwise", "messages": "[]", "protocol": "pointwise", "meta": {"score": 3}}
    key = claim_key({"rel": "relation", "obj": "object"}.get)
    assert key(rows[0]) == (("iu_caption", "relation"), 1) and key(other) is None
    assert key({**rows[0], "meta": {"claim": "rel"}}) is None  # no rating, no verdict to balance
    out, rep = balance_scores(rows + [other], ScoreBalanceConfig(method="q3"), key=key, name="claim_balance")
    got = Counter((r["subtask"], r["meta"]["claim"], r["meta"]["score"]) for r in out[:-1])
    # caption relations: Q3 of [9, 3] = 7.5 -> 8 each; objects already even; scene relations: Q3 of [2, 6] = 5
    assert got == {("iu_caption", "rel", 1): 8, ("iu_caption", "rel", 5): 8, ("iu_caption", "obj", 5): 4,
                   ("iu_caption", "obj", 2): 4, ("scene", "rel", 1): 5, ("scene", "rel", 5): 5}
    assert out[-1] is other and rep.name == "claim_balance"
    check_report(rep, len(rows) + 1, len(rows) + 1 - 2 + 8, {"downsampled": 2}, passed_through=1, strata=3, buckets=6,
                 added=8)


def test_balance_scores_by_config():
    rows = rated({1: 1, 3: 3, 5: 8})
    assert balance_scores(rows, ScoreBalanceConfig(method="none"))[0] == rows
    out, rep = balance_scores(rows, ScoreBalanceConfig(method="cap", cap=2))
    assert len(out) == 5 and rep.name == "score_balance" and rep.dropped == {"over_cap": 7}
    out, rep = balance_scores(rows, ScoreBalanceConfig(method="q3"))  # Q3 of [1, 3, 8] = 5.5 -> 6
    assert Counter(r["score"] for r in out) == {1.0: 6, 3.0: 6, 5.0: 6}
    with pytest.raises(ValidationError, match="cap"):
        ScoreBalanceConfig(method="cap")
    with pytest.raises(ValidationError):
        ScoreBalanceConfig(method="mean")


def test_subtask_rebalance_q3_over_sample_kinds():
    sizes = {"content_extraction": 2, "answer_generation": 10, "explanation": 10, "scoring": 10, "summarization": 8,
             "summary_scoring": 7}
    rows = [{"sft_id": f"sf_{k}_{i}", "protocol": "decomposed", "subtask": k} for k, n in sizes.items()
            for i in range(n)]
    other = [{"sft_id": "sf_pw", "protocol": "pointwise", "subtask": "iu_count"}]
    out, rep = rebalance_subtasks(rows + other, seed=0)  # sorted sizes 2,7,8,10,10,10 -> Q3 = 10
    assert Counter(r["subtask"] for r in out) == {k: 10 for k in sizes} | {"iu_count": 1}
    assert Counter(r["sft_id"] for r in out)["sf_content_extraction_0"] == 5  # extraction repeated
    check_report(rep, 48, 61, {}, added=13, passed_through=1)
    out, rep = rebalance_subtasks(rows, SubtaskRebalanceConfig(enabled=False))
    assert out == rows and rep.rows_out == len(rows)


def test_protocol_weights_scale_one_protocols_rows_as_a_whole():
    rows = [{"sft_id": f"sf_claim_{i}", "protocol": "claims"} for i in range(10)]
    rows += [{"sft_id": f"sf_pt_{i}", "protocol": "pointwise"} for i in range(4)]
    out, rep = weight_protocols(rows, ProtocolWeightsConfig(weights={"claims": 1.5}), seed=0)
    got = Counter(r["sft_id"] for r in out)
    assert sum(got[f"sf_claim_{i}"] for i in range(10)) == 15
    assert sorted(got[f"sf_claim_{i}"] for i in range(10)) == [1] * 5 + [2] * 5  # a seeded half once more
    assert all(got[f"sf_pt_{i}"] == 1 for i in range(4))  # not named: as they were
    check_report(rep, 14, 19, {}, added=5, buckets=1)
    again, _ = weight_protocols(list(reversed(rows)), ProtocolWeightsConfig(weights={"claims": 1.5}), seed=0)
    assert Counter(r["sft_id"] for r in again) == got  # the same rows repeated in any input order
    out, rep = weight_protocols(rows, ProtocolWeightsConfig(weights={"claims": 2, "pointwise": 0.5}))
    assert Counter(r["protocol"] for r in out) == {"claims": 20, "pointwise": 2}
    assert rep.dropped == {"downweighted": 2}
    assert weight_protocols(rows)[0] == rows  # no weights: nothing changes
    for bad, match in (({"claim": 2}, "not a protocol"), ({"claims": 0}, "must be > 0")):
        with pytest.raises(ValidationError, match=match):
            ProtocolWeightsConfig(weights=bad)


def test_task_weights_multiply_the_protocols_weight_on_that_tasks_rows():
    rows = [{"sft_id": f"sf_{t}_{p}_{i}", "task": t, "protocol": p} for t in ("iu", "ig")
            for p in ("pointwise", "claims") for i in range(4)]
    out, rep = weight_protocols(rows, ProtocolWeightsConfig(weights={"claims": 2}, tasks={"ig": 1.5}), seed=0)
    assert Counter((r["task"], r["protocol"]) for r in out) == {("iu", "pointwise"): 4, ("iu", "claims"): 8,
                                                                 ("ig", "pointwise"): 6, ("ig", "claims"): 12}
    check_report(rep, 16, 30, {}, added=14, buckets=3)
    out, _ = weight_protocols(rows, ProtocolWeightsConfig(tasks={"ig": 0.5}), seed=0)
    assert Counter(r["task"] for r in out) == {"iu": 8, "ig": 4}
    for bad, match in (({"drawing": 2}, "'drawing' is not a task"), ({"ig": -1}, "tasks.ig: -1.0 must be > 0")):
        with pytest.raises(ValidationError, match=match):
            ProtocolWeightsConfig(tasks=bad)
