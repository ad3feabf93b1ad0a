"""The claims protocol in the judgments stage (RLAIF-V's divide-and-conquer): the teacher checks each claim of a
description in its own request, each claim is a row of its own, and curation turns each into an SFT row whose
request and target are the claim check's."""

import re
from collections import Counter, defaultdict

import pytest

from flywheel.aspects import AspectTree
from flywheel.config import JudgmentsConfig
from flywheel.curate.pipeline import curate_judge_data
from flywheel.engines.base import TextResult
from flywheel.engines.oracle import OracleTextEngine, RecordingEngine
from flywheel.judge import claims
from flywheel.records import make_id, validate, with_ids
from flywheel.stages.judgments import JudgmentsCore
from flywheel.worlds.shapes.claims import claim_texts, object_sentences, read_claim, relation_sentences, verdict
from flywheel.worlds.shapes.gold import gold_candidates
from flywheel.worlds.shapes.suites import SuitesConfig, generate


@pytest.fixture(scope="module")
def setup(cfg):
    c = cfg.model_copy(deep=True)
    c.judgments = JudgmentsConfig(protocols={"iu": ["claims"], "nlg": ["claims"]}, samples_per_item=2)
    suites = SuitesConfig(prompts_per_subtask=2, subtasks=["iu_caption", "iu_color", "nlg_describe_scene"],
                          split={"ood_subtasks": [], "ood_aspects": []})
    prompts = with_ids("prompt", generate(suites, c.world.shapes, AspectTree.load(), seed=3))
    cands = with_ids("candidate", [x for p in prompts for x in gold_candidates(p, c.world.gold, c.world.shapes,
                                                                                  seed=3)[:3]])
    gold = c.teacher.model_copy(update={"error_rate": 0.0})
    out = JudgmentsCore(c, cands, engine=OracleTextEngine(gold, c.world.shapes))(prompts)
    return c, prompts, cands, out


def test_each_claim_of_a_description_is_its_own_row_checked_both_ways(setup):
    _, prompts, cands, out = setup
    assert not out.quarantined
    valid, bad = validate("judgment", out.rows)
    assert not bad and len({r["judgment_id"] for r in valid}) == len(valid) == len(out.rows)
    prompt = {p["prompt_id"]: p for p in prompts}
    assert {prompt[r["prompt_id"]]["subtask"] for r in out.rows} == {"iu_caption", "nlg_describe_scene"}
    by_cand = defaultdict(list)
    for r in out.rows:
        if r["sample_k"] == 0:
            by_cand[r["candidate_ids"][0]].append(r)
    text = {c["candidate_id"]: c["output_text"] for c in cands}
    for cid, rows in by_cand.items():
        ref = prompt[rows[0]["prompt_id"]]["reference_text"]
        asked = Counter((r["parsed"]["side"], r["parsed"]["claim"], r["parsed"]["against"]) for r in rows)
        assert asked == Counter([(claims.PRECISION, w, ref) for w in claim_texts(text[cid])]
                                + [(claims.RECALL, w, text[cid]) for w in claim_texts(ref)])
        for r in rows:  # the teacher without errors writes the oracle's verdict, headed by its claim
            analysis, rating = verdict(read_claim(r["parsed"]["claim"]), r["parsed"]["against"])
            assert r["score"] == rating and r["analysis"] == analysis
            assert r["raw_output"].startswith(f"{r['parsed']['side']} claim: {r['parsed']['claim']}\n")


def test_a_right_description_scores_top_and_a_defective_one_lower(setup):
    _, prompts, cands, out = setup
    scores = claims.candidate_scores(r for r in out.rows if r["sample_k"] == 0)
    for p in prompts:
        if p["subtask"] == "iu_color":
            continue
        right, *defects = [c for c in cands if c["prompt_id"] == p["prompt_id"]]
        assert right["output_text"] == p["reference_text"] and scores[(p["prompt_id"], right["candidate_id"])] == 5
        assert all(scores[(p["prompt_id"], d["candidate_id"])] < 5 for d in defects if d["output_text"] !=
                   right["output_text"])


def test_a_failed_claim_makes_the_description_a_failure():
    rows = [{"protocol": "claims", "prompt_id": "p", "candidate_ids": ["c"], "score": 5.0, "parse_error": None},
            {"protocol": "claims", "prompt_id": "p", "candidate_ids": ["c"], "score": None, "parse_error": "x"},
            {"protocol": "pointwise", "prompt_id": "p", "candidate_ids": ["d"], "score": 5.0, "parse_error": None}]
    assert claims.candidate_scores(rows) == {("p", "c"): None}


def test_curation_makes_one_sft_row_per_claim_with_its_request_and_verdict(setup):
    c, prompts, cands, out = setup
    data = curate_judge_data(out.rows, prompts, cands, style=c.judge.prompt_style)
    rows = [r for r in data.sft if r["protocol"] == "claims"]
    checked = set()
    for r in rows:
        user = "".join(p.get("text", "") for p in r["messages"][0]["content"] if p["type"] == "text")
        claim, against = re.search(r'[Tt]he claim is "([^"]*)", the text is "([^"]*)"\.$', user).groups()
        analysis, rating = verdict(read_claim(claim), against)
        assert user.startswith("Claim check. Rate 1-5.\n")
        assert r["messages"][1]["content"][0]["text"] == f"Analysis: {analysis}\nRating: {rating}"
        checked.add((claim, against))
    # the checks judged, each taught once however many candidates share it (score balancing then drops or
    # repeats some); right claims and wrong ones both
    judged = {(r["parsed"]["claim"], r["parsed"]["against"]) for r in out.rows}
    assert checked <= judged and len(checked) > len(judged) / 2
    assert {r["meta"]["score"] for r in rows} >= {1.0, 5.0}


def test_claim_checks_without_images_are_asked_recorded_and_taught_without_them(setup):
    """judgments.claim_images=False: the caption's claim checks go out without the prompt's image, the rows say
    so, and curation rebuilds their SFT rows as asked (no image), with the same verdicts as with images."""
    c, prompts, cands, out = setup
    c2 = c.model_copy(update={"judgments": c.judgments.model_copy(update={"claim_images": False})})
    engine = RecordingEngine(OracleTextEngine(c.teacher.model_copy(update={"error_rate": 0.0}), c.world.shapes))
    out2 = JudgmentsCore(c2, cands, engine=engine)(prompts)
    captions = {p["prompt_id"] for p in prompts if p["subtask"] == "iu_caption" and p["images"]}
    assert captions and all(r.images == [] for r in engine.requests)
    assert all("image" not in str(r.messages) for r in engine.requests)
    assert all(r["parsed"]["with_images"] is False for r in out2.rows)
    assert all("with_images" not in r["parsed"] for r in out.rows)  # asked with images: nothing recorded
    assert sorted((r["parsed"]["claim"], r["score"]) for r in out2.rows) == sorted(
        (r["parsed"]["claim"], r["score"]) for r in out.rows)
    with_images = [r for r in curate_judge_data(out.rows, prompts, cands, style=c.judge.prompt_style).sft
                   if r["protocol"] == "claims"]
    without = [r for r in curate_judge_data(out2.rows, prompts, cands, style=c.judge.prompt_style).sft
               if r["protocol"] == "claims"]
    assert any(r["images"] for r in with_images) and without and not any(r["images"] for r in without)
    assert all(p["type"] == "text" for r in without for p in r["messages"][0]["content"])


@pytest.mark.parametrize("setting", ["sentences", "all_sentences"])
def test_claims_checked_against_their_sentences_keep_their_verdicts_and_teach_that_text(setup, setting):
    """judgments.claim_context: a relation claim goes out with only the sentences of the other text that name both
    its objects; an object claim with the whole text (`sentences`) or the sentences introducing objects
    (`all_sentences`). The teacher's ratings are those of the whole text, and curation teaches the text each check
    was asked against."""
    c, prompts, cands, out = setup
    c2 = c.model_copy(update={"judgments": c.judgments.model_copy(update={"claim_context": setting})})
    out2 = JudgmentsCore(c2, cands, engine=OracleTextEngine(c.teacher.model_copy(update={"error_rate": 0.0}),
                                                            c.world.shapes))(prompts)
    whole = {(r["candidate_ids"][0], r["parsed"]["group"], r["sample_k"]): r for r in out.rows}
    kinds = Counter()
    for r in out2.rows:
        before = whole[(r["candidate_ids"][0], r["parsed"]["group"], r["sample_k"])]
        kind = read_claim(r["parsed"]["claim"]).kind
        kinds[kind, r["parsed"]["against"] == before["parsed"]["against"]] += 1
        assert r["score"] == before["score"]
        if kind == "relation":  # its sentences, in the whole text's order
            assert r["parsed"]["against"] == relation_sentences(r["parsed"]["claim"], before["parsed"]["against"])
        elif setting == "all_sentences":
            assert r["parsed"]["against"] == object_sentences(before["parsed"]["against"])
    assert len(out2.rows) == len(out.rows)
    assert kinds[("relation", False)] and bool(kinds[("object", False)]) == (setting == "all_sentences")
    sft = [r for r in curate_judge_data(out2.rows, prompts, cands, style=c.judge.prompt_style).sft
           if r["protocol"] == "claims"]
    asked = {(r["parsed"]["claim"], r["parsed"]["against"]) for r in out2.rows}
    for r in sft:
        user = "".join(p.get("text", "") for p in r["messages"][0]["content"] if p["type"] == "text")
        assert re.search(r'[Tt]he claim is "([^"]*)", the text is "([^"]*)"\.$', user).groups() in asked


def test_the_teacher_refuses_a_claim_this_world_cannot_read(setup):
    from flywheel.worlds.shapes.teacher import OracleTeacher, TeacherError, make_context

    c, prompts, cands, _ = setup
    p = next(x for x in prompts if x["subtask"] == "iu_caption")
    cand = next(x for x in cands if x["prompt_id"] == p["prompt_id"])
    teacher = OracleTeacher(c.teacher, c.world.shapes)
    ctx = make_context("claims", p, [cand], claim="a red circle", against="A red circle.")
    assert teacher.answer(ctx) == "Analysis: The text has a red circle.\nRating: 5"
    with pytest.raises(TeacherError, match="not a claim of this world: 'something shiny'"):
        teacher.answer(make_context("claims", p, [cand], claim="something shiny", against="A red circle."))


def test_a_claim_row_whose_output_lost_its_header_makes_no_sft_row(setup):
    c, prompts, cands, out = setup
    row = next(r for r in out.rows if r["sample_k"] == 0)
    broken = {**row, "raw_output": row["raw_output"].split("\n", 1)[1]}  # the judge's text without its claim
    data = curate_judge_data([broken], prompts, cands, style=c.judge.prompt_style)
    assert data.sft == []
    assert next(r for r in data.reports if r.name == "judge_sft").dropped == {"unformattable": 1}


def test_a_description_the_splitter_finds_no_claim_in_is_quarantined_with_why(setup):
    # real captions (the GPU config's data) hold no claim the shapes world's parser can read: the protocol must
    # say it checked nothing, not judge nothing silently
    c, prompts, cands, _ = setup
    p = next({**x, "reference_text": "A dog runs on the beach."} for x in prompts if x["subtask"] == "iu_caption")
    cand = {**next(x for x in cands if x["prompt_id"] == p["prompt_id"]), "output_text": "A cat sleeps."}
    out = JudgmentsCore(c, [cand], engine=OracleTextEngine(c.teacher, c.world.shapes))([p])
    assert not out.rows and len(out.quarantined) == c.judgments.samples_per_item
    assert all("splitter found no claim" in q["reason"] for q in out.quarantined)
    # an empty answer is not that case: nothing of it to check, its reference's claims still are
    empty = JudgmentsCore(c, [{**cand, "output_text": ""}], engine=OracleTextEngine(c.teacher, c.world.shapes))(
        [{**p, "reference_text": next(x for x in prompts if x["subtask"] == "iu_caption")["reference_text"]}])
    assert not empty.quarantined and empty.rows


class SplitsBadly(OracleTextEngine):
    """Stands in for a judge that cannot split a text into claims (a small model; the real tiny judge is meta-eval's
    case, tests/evaluate/test_meta.py): the oracle's answers, but prose where a claim list is asked for."""

    answer = TextResult(text="A red circle, I think.")

    def generate(self, requests, seed=0):
        got = super().generate(requests, seed)
        return [self.answer if (r.context or {}).get("step") == "split" else g for r, g in zip(requests, got)]


def test_the_engine_splitting_claims_checks_the_claims_the_world_parser_finds(setup):
    # judgments.claim_splitter judge: the teacher lists the claims first (RLAIF-V's divide step); the oracle's list
    # is the world's parse, so every claim row is the one the world splitter makes. Per prompt and sample, one
    # split of the reference (every candidate is checked against the same list) and one of each distinct response
    c, prompts, cands, out = setup
    cj = c.model_copy(update={"judgments": c.judgments.model_copy(update={"claim_splitter": "judge"})})
    engine = RecordingEngine(OracleTextEngine(c.teacher.model_copy(update={"error_rate": 0.0}), c.world.shapes))
    by_engine = JudgmentsCore(cj, cands, engine=engine)(prompts)
    assert not by_engine.quarantined
    assert sorted(make_id("judgment", r) for r in by_engine.rows) == sorted(make_id("judgment", r) for r in out.rows)
    steps = Counter((r.context or {}).get("step") for r in engine.requests)
    texts = [{p["reference_text"]} | {x["output_text"] for x in cands if x["prompt_id"] == p["prompt_id"]}
             for p in prompts if p["subtask"] in c.judgments.claim_subtasks]
    assert steps["split"] == sum(map(len, texts)) * c.judgments.samples_per_item
    assert sum(map(len, texts)) < 2 * 3 * len(texts)  # fewer than a response and a reference per candidate
    assert steps[None] == len(out.rows)


def test_a_split_that_does_not_parse_fails_its_candidates_claims_as_unparsed(setup):
    c, prompts, cands, _ = setup
    cj = c.model_copy(update={"judgments": c.judgments.model_copy(update={"claim_splitter": "judge"})})
    out = JudgmentsCore(cj, cands, engine=SplitsBadly(c.teacher, c.world.shapes))(prompts)
    assert not out.quarantined and out.rows
    assert all(r["parse_error"] == 'split: no "Claims:" line' and r["score"] is None for r in out.rows)
    assert all(r["raw_output"] == "claim split: reference\nA red circle, I think." for r in out.rows)
    assert set(claims.candidate_scores(out.rows).values()) == {None}  # never a guessed score
    assert len(out.rows) == len({(r["candidate_ids"][0], r["sample_k"]) for r in out.rows})  # one per sample
    assert curate_judge_data(out.rows, prompts, cands, style=c.judge.prompt_style).sft == []  # nothing taught


def test_a_split_the_engine_fails_on_quarantines_the_candidates_it_fails(setup):
    c, prompts, cands, _ = setup
    cj = c.model_copy(update={"judgments": c.judgments.model_copy(update={"claim_splitter": "judge"})})
    engine = SplitsBadly(c.teacher, c.world.shapes)
    engine.answer = TextResult(error="timeout")
    out = JudgmentsCore(cj, cands, engine=engine)(prompts)
    assert not out.rows and out.quarantined
    assert all(q["reason"].endswith("engine error splitting the reference's claims: timeout") for q in out.quarantined)
