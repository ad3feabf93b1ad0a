"""The steps in order on a small mixed set: every produced row validates, reports chain, config is strict."""
from collections import Counter

import pytest
from curate_helpers import T2I_QUERY, _row, candidate, decomposed, pairwise, png, pointwise, prompt, valid
from pydantic import BaseModel, ValidationError

from flywheel.curate import CurateConfig, curate_judge_data, curate_policy_data, metrics
from flywheel.curate.config import ProtocolWeightsConfig, ScoreBalanceConfig
from flywheel.judge import pairwise as pw
from flywheel.records import validate


def test_judge_data_end_to_end():
    p = prompt("How many red circles are there?", images=[png(0)])
    cands = [candidate(p, f"answer {i}", index=i) for i in range(4)]
    rows = []
    for i, c in enumerate(cands):  # k = 5 samples each; ratings 1..4 by candidate, one outlier each
        rows += [pointwise(p, c, k, r) for k, r in enumerate([i + 1] * 4 + [5 if i < 3 else 1])]
    a, b = cands[0], cands[1]
    rows += [pairwise(p, a, b, "AB", "A", k) for k in range(3)] + [pairwise(p, a, b, "BA", "B", k) for k in range(3)]
    c, d = cands[2], cands[3]
    rows += [pairwise(p, c, d, "AB", "A", 0), pairwise(p, c, d, "BA", "A", 0)]  # position-inconsistent
    t = prompt(T2I_QUERY, task="ig", subtask="text_to_image")
    img = candidate(t, None, [png(4)])
    rows.append(decomposed(t, img))
    out = curate_judge_data(rows, [p, t], cands + [img], CurateConfig(score_balance=ScoreBalanceConfig(
        method="none")))
    names = [r.name for r in out.reports]
    assert names == ["consistency", "swap_consistency", "judge_pairs", "position_balance", "judge_sft",
                     "score_balance", "subtask_rebalance", "protocol_weights"]
    rep = dict(zip(names, out.reports))
    assert rep["consistency"].rows_out == 4 + 2 + 2 + 1
    assert rep["swap_consistency"].dropped == {"position_inconsistent": 2}
    assert len(out.pairs) == 4 and {p_["margin"] for p_ in out.pairs} == {4.0, 3.0, 2.0}  # pointwise outliers
    assert rep["position_balance"].rows_out == 4 + 1 + 1
    assert Counter(r["protocol"] for r in out.sft)["pointwise"] == 4
    # decomposed sub-tasks rebalanced to Q3 of [1, 3, 3, 3, 4, 4] = 3.75 -> 4
    assert Counter(r["subtask"] for r in out.sft if r["protocol"] == "decomposed") == {
        "content_extraction": 4, "answer_generation": 4, "explanation": 4, "scoring": 4, "summarization": 4,
        "summary_scoring": 4}
    valid("sft", out.sft)
    valid("dpo", out.dpo)
    valid("pair", out.pairs)
    valid("judgment", out.kept)
    # the same rows as read back from storage (JSON fields as text) give the same sets
    stored = [validate(kind, rows_)[0] for kind, rows_ in (("judgment", rows), ("prompt", [p, t]),
                                                            ("candidate", cands + [img]))]
    again = curate_judge_data(*stored, CurateConfig(score_balance=ScoreBalanceConfig(method="none")))
    assert [r["sft_id"] for r in again.sft] == [r["sft_id"] for r in out.sft]
    assert [r["dpo_id"] for r in again.dpo] == [r["dpo_id"] for r in out.dpo]
    weighted = curate_judge_data(rows, [p, t], cands + [img], CurateConfig(
        score_balance=ScoreBalanceConfig(method="none"),
        protocol_weights=ProtocolWeightsConfig(weights={"pointwise": 2})))
    assert (Counter(r["protocol"] for r in weighted.sft)
            == Counter(r["protocol"] for r in out.sft) + Counter(pointwise=4))
    m = metrics(out.reports)
    assert m["curate.consistency.rows_in"] == len(rows) and m["curate.swap_consistency.dropped.position_inconsistent"]
    assert all(isinstance(v, float) for v in m.values())


def test_judge_data_balances_pairwise_winners_within_each_sub_task():
    rows, cands = [], []
    for subtask, winner in (("iu_count", "A"), ("iu_caption", "B")):  # A always wins on one, B on the other
        p = prompt(f"Question for {subtask}?", subtask=subtask, images=[png(0)])
        for i in range(4):
            a, b = candidate(p, f"first {i}", index=2 * i), candidate(p, f"second {i}", index=2 * i + 1)
            cands += [a, b]
            rows += [pairwise(p, a, b, "AB", winner), pairwise(p, a, b, "BA", "B" if winner == "A" else "A")]
    prompts = {r["prompt_id"]: r for r in (prompt(f"Question for {s}?", subtask=s, images=[png(0)])
                                           for s in ("iu_count", "iu_caption"))}
    cfg = CurateConfig(score_balance=ScoreBalanceConfig(method="none"))

    def by_subtask(out) -> dict:  # the winner as shown, per sub-task
        return {s: Counter(pw.to_ab(r["verdict"], r["order"]) for r in out.kept
                           if prompts[r["prompt_id"]]["subtask"] == s) for s in ("iu_count", "iu_caption")}

    assert by_subtask(curate_judge_data(rows, prompts, cands, cfg)) == {"iu_count": {"A": 2, "B": 2},
                                                                       "iu_caption": {"A": 2, "B": 2}}
    cfg.pairwise.position_balance_within = "dataset"  # FRABench's: balanced only as a whole
    assert by_subtask(curate_judge_data(rows, list(prompts.values()), cands, cfg)) == {"iu_count": {"A": 4},
                                                                                      "iu_caption": {"B": 4}}


def test_policy_data_end_to_end():
    p = prompt("What is shown?", images=[png(1)])
    cands = [candidate(p, f"answer {i}", index=i) for i in range(3)]
    js = [pointwise(p, c, k, r) for c, rs in zip(cands, ([2, 2, 3], [5, 5, 4], [3, 3, 3])) for k, r in enumerate(rs)]
    out = curate_policy_data(cands, js, [p])
    assert [r.name for r in out.reports] == ["consistency", "policy_pairs", "policy_training_rows"]
    (pair,) = out.pairs
    assert (pair["chosen_id"], pair["rejected_id"], pair["margin"]) == (cands[1]["candidate_id"],
                                                                        cands[0]["candidate_id"], 3.0)
    valid("dpo", out.dpo)
    assert out.image_pref == []
    stored = [validate(k, r)[0] for k, r in (("candidate", cands), ("judgment", js), ("prompt", [p]))]
    assert [r["dpo_id"] for r in curate_policy_data(*stored).dpo] == [r["dpo_id"] for r in out.dpo]


def test_policy_pairs_rank_a_description_by_its_claims_and_never_by_part_of_them():
    from flywheel.engines.base import TextResult
    from flywheel.judge import claims as cl
    from flywheel.worlds.shapes.claims import claim_texts

    p = prompt("Describe the image.", subtask="iu_caption", images=[png(1)], reference_text="A red circle.")
    cands = [candidate(p, t, index=i) for i, t in enumerate(["A red circle.", "A blue circle.", "A red square."])]

    def rows(c, ratings):  # the judge's claim rows of one candidate, a rating per claim (None: unparsed output)
        checks = cl.checks(p, c, claim_texts)
        out = []
        for ch, r in zip(checks, ratings, strict=True):
            text = f"Analysis: checked.\nRating: {r}" if r else "no rating"
            res = TextResult(text=text)
            out.append(_row(p, [c["candidate_id"]], "claims", 0, cl.raw_output(ch, text), cl.fields(ch, res)))
        return out

    js = [pointwise(p, c, 0, r) for c, r in zip(cands, (1, 5, 4))]  # the holistic ratings say the opposite
    js += rows(cands[0], [5, 4]) + rows(cands[1], [2, 1]) + rows(cands[2], [5, None])
    out = curate_policy_data(cands, js, [p])
    (pair,) = out.pairs  # the right caption over the wrong one; the third, with a failed claim, is not scored
    assert (pair["chosen_id"], pair["rejected_id"], pair["margin"]) == (cands[0]["candidate_id"],
                                                                        cands[1]["candidate_id"], 3.0)


def _models(model: type[BaseModel]):
    yield model
    for f in model.model_fields.values():
        t = f.annotation
        if isinstance(t, type) and issubclass(t, BaseModel):
            yield from _models(t)


def test_config_is_strict_and_documented():
    for m in _models(CurateConfig):
        assert m.model_config.get("extra") == "forbid", m
        for name, f in m.model_fields.items():
            assert f.description, f"{m.__name__}.{name} has no description"
    with pytest.raises(ValidationError):
        CurateConfig.model_validate({"consistency": {"min_agreemnt": 0.5}})
    cfg = CurateConfig.model_validate({"score_balance": {"method": "cap", "cap": 100}, "seed": 7})
    assert cfg.score_balance.cap == 100


def test_claim_balance_evens_the_verdicts_of_the_claim_sft_rows_by_the_worlds_reading():
    """The world's claim kinds reach the balance: caption relations the teacher found absent three times as often as
    stated become as many stated as absent SFT rows; objects are balanced apart. Default: no claim balance."""
    from flywheel.engines.base import TextResult
    from flywheel.judge import claims as cl
    from flywheel.worlds.shapes.claims import claim_kind, claim_texts, read_claim, verdict

    ref = "A red circle and a blue square. The red circle is to the left of the blue square."
    p = prompt("Describe the image.", subtask="iu_caption", images=[png(1)], reference_text=ref)
    texts = ["A red circle and a blue square. The blue square is to the left of the red circle.",
             "A red circle and a blue square. The red circle is above the blue square.",
             "A red circle and a blue square. The red circle is below the blue square.",
             "A red circle and a green square. The red circle is to the left of the blue square."]
    rows = []
    for i, t in enumerate(texts):
        c = candidate(p, t, index=i)
        for ch in cl.checks(p, c, claim_texts):
            analysis, rating = verdict(read_claim(ch.claim), ch.against)
            out = f"Analysis: {analysis}\nRating: {rating}"
            rows.append(_row(p, [c["candidate_id"]], "claims", 0, cl.raw_output(ch, out),
                             cl.fields(ch, TextResult(text=out))))
    cands = [candidate(p, t, index=i) for i, t in enumerate(texts)]

    def sft_counts(cfg):
        got = curate_judge_data(rows, [p], cands, cfg, claim_kind=claim_kind)
        claim = Counter()
        for r in got.sft:  # the row names its claim, the words its request asks about
            asked = "".join(x.get("text") or "" for x in r["messages"][0]["content"])
            assert f'the claim is "{r["meta"]["claim"]}"' in asked
            claim[(claim_kind(r["meta"]["claim"]), r["meta"]["score"])] += 1
        return claim, [rep.name for rep in got.reports]

    plain, names = sft_counts(CurateConfig())
    assert "claim_balance" not in names
    # relations: the reference's one is stated by the 4th text only; 3 responses' own relations are absent
    assert plain[("relation", 5.0)] == 2 and plain[("relation", 1.0)] == 6
    balanced, names = sft_counts(CurateConfig(claim_balance=ScoreBalanceConfig(method="q3")))
    assert names.index("claim_balance") == names.index("score_balance") + 1
    assert balanced[("relation", 5.0)] == balanced[("relation", 1.0)] == 5  # Q3 of [6, 2] = 5
    objects = {k: v for k, v in balanced.items() if k[0] == "object"}
    assert len(set(objects.values())) == 1 and len(objects) == len({k for k in plain if k[0] == "object"})
