"""Judge-DPO pairs (chosen = consistent sample, rejected = farthest, |delta| >= 2) and policy pairs (best vs worst,
ties dropped), with their training rows."""
import json

from curate_helpers import JUDGE, _row, candidate, check_report, messages, pairwise, png, pointwise, prompt, valid

from flywheel.curate.config import JudgePairsConfig, PolicyPairsConfig
from flywheel.curate.consistency import consistency_filter, item_key
from flywheel.curate.pairs import judge_pairs, policy_pairs, policy_training_rows
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt

P = prompt("How many red circles are there?", images=[png(0)])
A, B = candidate(P, "Two."), candidate(P, "Three.", index=1)


def samples(ratings, c=A):
    return [pointwise(P, c, k, r) for k, r in enumerate(ratings)]


def run(rows, gold=None, cfg=None):
    kept, _ = consistency_filter(rows, gold)
    return judge_pairs(rows, kept, [P], [A, B], cfg)


def test_judge_pair_picks_the_farthest_sample():
    rows = samples([4, 4, 2, 1, 5, None])  # mode 4 (k=0); farthest: 1 (k=3), |delta| = 3
    (pair,), (dpo,), rep = run(rows)
    assert (pair["chosen_id"], pair["rejected_id"]) == (rows[0]["judgment_id"], rows[3]["judgment_id"])
    assert (pair["kind"], pair["chosen_score"], pair["rejected_score"], pair["margin"]) == ("judge", 4.0, 1.0, 3.0)
    assert pair["judge"] == JUDGE and pair["prompt_id"] == P["prompt_id"]
    assert dpo["target"] == "judge" and dpo["pair_id"] == pair["pair_id"] and dpo["images"] == [png(0)]
    assert messages(dpo, "prompt") == pt.build(P, A).messages
    assert messages(dpo, "chosen") == [{"role": "assistant", "content": [
        {"type": "text", "text": "Analysis: Sample 0 says 4.\nRating: 4"}]}]
    assert messages(dpo, "rejected")[0]["content"][0]["text"] == "Analysis: Sample 3 says 1.\nRating: 1"
    assert dpo["source_ids"] == [rows[0]["judgment_id"], rows[3]["judgment_id"]]
    check_report(rep, 1, 1, {})
    valid("pair", [pair])
    valid("dpo", [dpo])


def test_delta_threshold_and_no_disagreement():
    pairs, _, rep = run(samples([4, 4, 4, 3]))  # farthest is 1 away
    assert pairs == [] and rep.dropped == {"delta_below_min": 1}
    pairs, _, rep = run(samples([4, 4, 4, 2]))  # exactly 2: kept (>=)
    assert len(pairs) == 1 and pairs[0]["margin"] == 2.0
    pairs, _, rep = run(samples([3, 3, 3]))
    assert pairs == [] and rep.dropped == {"no_disagreement": 1}
    pairs, _, rep = run(samples([3, None]))
    assert pairs == [] and rep.dropped == {"no_other_sample": 1}
    pairs, _, rep = run(samples([4, 4, 4, 3]), cfg=JudgePairsConfig(min_delta={"pointwise": 1}))
    assert len(pairs) == 1
    pairs, _, rep = run(samples([4, 4, 1]), cfg=JudgePairsConfig(min_delta={"pairwise": 2}))
    assert pairs == [] and rep.dropped == {"unsupported_protocol": 1}


def test_farthest_ties_take_the_lowest_sample_k_and_gold_sets_chosen():
    rows = samples([3, 3, 3, 5, 1])  # 5 and 1 both 2 away: k=3
    (pair,), _, _ = run(rows)
    assert pair["rejected_id"] == rows[3]["judgment_id"]
    rows = samples([4, 4, 2, 5, 1])
    (pair,), _, _ = run(rows, gold={item_key(rows[0]): 2})  # chosen = the gold match (k=2), farthest = 5
    assert (pair["chosen_id"], pair["rejected_id"]) == (rows[2]["judgment_id"], rows[3]["judgment_id"])


def test_pairwise_judge_pairs_use_opposite_verdicts():
    ab = [pairwise(P, A, B, "AB", v, k) for k, v in enumerate(["A", "A", "tie", "B"])]
    ba = [pairwise(P, A, B, "BA", v, k) for k, v in enumerate(["B", "B", "tie"])]  # AB frame: A, A, tie
    pairs, dpos, rep = run(ab + ba)
    assert [(p["chosen_id"], p["rejected_id"]) for p in pairs] == [(ab[0]["judgment_id"], ab[3]["judgment_id"])]
    assert rep.dropped == {"delta_below_min": 1}  # BA: the tie is only 1 away
    assert messages(dpos[0], "prompt") == pw.build(P, A, B).messages
    valid("dpo", dpos)


# ---------------------------------------------------------------- policy pairs
def scored(p, cands_scores, judge=JUDGE):
    cands, judgments = [], []
    for i, s in enumerate(cands_scores):
        c = candidate(p, f"answer {i}", index=i)
        cands.append(c)
        for k, v in enumerate(s if isinstance(s, list) else [s]):
            if v is not None:
                judgments.append(pointwise(p, c, 0, v, aspect=f"a{k}", judge=judge))
    return cands, judgments


def test_policy_pairs_best_vs_worst_ties_dropped():
    p1, p2, p3, p4 = (prompt(f"Question {i}?") for i in range(4))
    c1, j1 = scored(p1, [2, 5, 3, 5])  # best: the first 5 (index 1), worst: 2
    c2, j2 = scored(p2, [3, 3, 3])  # all tied
    c3, j3 = scored(p3, [[3, 4], [4, 4]])  # means 3.5 vs 4: margin 0.5
    c4, j4 = scored(p4, [4, None])  # one scored
    pairs, rep = policy_pairs(c1 + c2 + c3 + c4, j1 + j2 + j3 + j4)
    assert len(pairs) == 1
    (pr,) = pairs
    assert (pr["chosen_id"], pr["rejected_id"]) == (c1[1]["candidate_id"], c1[0]["candidate_id"])
    assert (pr["kind"], pr["chosen_score"], pr["rejected_score"], pr["margin"], pr["judge"]) == (
        "policy", 5.0, 2.0, 3.0, JUDGE)
    check_report(rep, 4, 1, {"tie": 1, "margin_below_min": 1, "too_few_scored": 1}, candidates=11,
                 candidates_unscored=1)
    pairs, _ = policy_pairs(c3, j3, PolicyPairsConfig(min_margin=0.5))
    assert [p["margin"] for p in pairs] == [0.5]
    pairs, _ = policy_pairs(c3, j3, PolicyPairsConfig(min_margin=0.5, aspects=["a0"]))  # 3 vs 4 on a0 only
    assert [p["margin"] for p in pairs] == [1.0]
    assert policy_pairs(c1, j1, PolicyPairsConfig(protocols=["rubric"]))[0] == []
    valid("pair", policy_pairs(c1, j1)[0])


def test_policy_training_rows_text_and_image():
    pt_ = prompt("What colour is the circle?", images=[png(1), png(2)])
    ct, jt = scored(pt_, [1, 4])
    pi = prompt("a red circle", task="ig", subtask="ig_single_object", meta=json.dumps({"generator_prompt": "red"}))
    ci = [candidate(pi, None, [png(i)], index=i) for i in (3, 4)]
    ji = [pointwise(pi, c, 0, s) for c, s in zip(ci, (5, 2))]
    pm = prompt("draw and describe", task="itig", subtask="itig_draw_and_describe")
    cm = [candidate(pm, f"text {i}", [png(i)], index=i) for i in (5, 6)]
    jm = [pointwise(pm, c, 0, s) for c, s in zip(cm, (5, 2))]
    pairs, _ = policy_pairs(ct + ci + cm, jt + ji + jm)
    dpos, prefs, rep = policy_training_rows(pairs, [pt_, pi, pm], ct + ci + cm)
    (d,) = dpos
    assert d["target"] == "policy" and d["images"] == [png(1), png(2)]
    assert messages(d, "prompt") == [{"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "What colour is the circle?"}]}]
    assert messages(d, "chosen") == [{"role": "assistant", "content": [{"type": "text", "text": "answer 1"}]}]
    assert messages(d, "rejected")[0]["content"][0]["text"] == "answer 0"
    assert (d["chosen_score"], d["rejected_score"], d["margin"], d["protocol"]) == (4.0, 1.0, 3.0, "pointwise")
    (ip,) = prefs
    assert ip["prompt"] == "red" and ip["chosen"] == [png(3)] and ip["rejected"] == [png(4)]
    assert ip["judge"] == JUDGE and ip["pair_id"] == pairs[1]["pair_id"]
    check_report(rep, 3, 2, {"mixed_output": 1}, dpo=1, image_pref=1)
    valid("dpo", dpos)
    valid("image_pref", prefs)


def test_claim_rows_make_judge_pairs_per_claim_with_the_claim_check_as_prompt():
    """A claim check's k samples pair like pointwise ones (majority over the flipped verdict), each claim apart:
    the DPO prompt is the claim-check request, chosen and rejected the two outputs without their claim header."""
    from flywheel.engines.base import TextResult
    from flywheel.judge import claims as cl
    from flywheel.worlds.shapes.claims import claim_texts

    p = prompt("Describe the image.", subtask="iu_caption", images=[png(1)], reference_text="A red circle.")
    c = candidate(p, "A red circle and a blue square.")
    checks = cl.checks(p, c, claim_texts)  # red circle, blue square (response's), red circle (reference's)
    ratings = {0: [5, 5, 1], 1: [1, 1, 1], 2: [5, 1, 5]}  # a flip on claims 0 and 2; claim 1 agrees
    rows = []
    for i, ch in enumerate(checks):
        for k, r in enumerate(ratings[i]):
            text = f"Analysis: Claim {i} sample {k}.\nRating: {r}"
            rows.append(_row(p, [c["candidate_id"]], "claims", k, cl.raw_output(ch, text),
                             cl.fields(ch, TextResult(text=text))))
    kept, _ = consistency_filter(rows)
    pairs, dpos, rep = judge_pairs(rows, kept, [p], [c], JudgePairsConfig(min_delta={"claims": 2.0}))
    check_report(rep, 3, 2, {"no_disagreement": 1})
    assert len({json.dumps(messages(d, "prompt")) for d in dpos}) == 2  # two claims, two distinct requests
    for pair, dpo in zip(pairs, dpos):
        assert (pair["chosen_score"], pair["rejected_score"], pair["margin"]) == (5.0, 1.0, 4.0)
        i = next(i for i, ch in enumerate(checks) if messages(dpo, "prompt") == cl.build(
            ch.claim, ch.against, [png(1)], style="minos").messages)  # JudgeContext's default style
        assert i in (0, 2) and dpo["protocol"] == "claims"
        assert messages(dpo, "chosen")[0]["content"][0]["text"].startswith(f"Analysis: Claim {i} sample ")
        assert messages(dpo, "rejected")[0]["content"][0]["text"].endswith("Rating: 1")
    valid("pair", pairs)
    valid("dpo", dpos)
    assert judge_pairs(rows, kept, [p], [c], JudgePairsConfig(min_delta={"pointwise": 2.0}))[2].dropped == {
        "unsupported_protocol": 3}
