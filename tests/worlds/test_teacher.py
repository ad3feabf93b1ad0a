"""The oracle teacher: exact protocol formats for every protocol and oracle sub-task, agreement with the checkers
at error rate 0, the realised error rate, per-(item, k) determinism, and per-item errors without ground truth."""

import io
import json
import re

import pytest

from flywheel.aspects import AspectTree
from flywheel.config import JudgmentsConfig
from flywheel.engines import TextRequest, make_text_engine
from flywheel.engines.oracle import OracleTextEngine, RecordingEngine
from flywheel.judge import decomposed as dc
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.judge.base import is_error
from flywheel.records import validate, with_ids
from flywheel.stages.judgments import JudgmentsCore
from flywheel.worlds.shapes import perturb
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.gold import gold_candidates, variant_of
from flywheel.worlds.shapes.oracle_config import GoldConfig, TeacherConfig
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Obj, Scene
from flywheel.worlds.shapes.spec import DrawSpec
from flywheel.worlds.shapes.suites import SUBTASKS, SuitesConfig, generate
from flywheel.worlds.shapes.teacher import (APPLICABLE, OracleTeacher, TeacherError, decision, make_context,
                                            measure_errors)

ALL = ["pointwise", "pairwise", "aspects", "rubric"]
EVERY = JudgmentsConfig(protocols={"nlg": ALL, "iu": ALL, "ig": ALL + ["decomposed"], "itig": ALL + ["decomposed"]},
                        samples_per_item=2, max_pairs_per_prompt=2, pairwise_aspects="all")
WORLD = ShapesWorldConfig()


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def prompts():
    suites = SuitesConfig(prompts_per_subtask=2, split={"ood_subtasks": [], "ood_aspects": []})
    return with_ids("prompt", generate(suites, WORLD, AspectTree.load(), seed=3))


@pytest.fixture(scope="module")
def candidates(prompts):
    return with_ids("candidate", [c for p in prompts for c in gold_candidates(p, GoldConfig(), WORLD, seed=3)])


@pytest.fixture(scope="module")
def recorded(cfg, prompts, candidates):
    """Every request of every protocol on every sub-task, answered by a noisy oracle (errors exercised too)."""
    rec = RecordingEngine(OracleTextEngine(TeacherConfig(error_rate=0.5), WORLD))
    out = JudgmentsCore(cfg, candidates, engine=rec, judgments=EVERY)(prompts)
    return rec, out


def test_answers_parse_for_all_protocols_and_subtasks(recorded, prompts):
    rec, out = recorded
    assert not out.quarantined, out.quarantined[:2]
    assert not [r["parse_error"] for r in out.rows if r["parse_error"]]
    valid, bad = validate("judgment", out.rows)
    assert not bad and len(valid) == len(out.rows)
    task = {p["prompt_id"]: p["subtask"] for p in prompts}
    seen = {(task[r["prompt_id"]], r["protocol"]) for r in out.rows}
    for s in SUBTASKS:
        protos = ALL + (["decomposed"] if s.startswith(("ig", "itig")) else [])
        assert {(s, p) for p in protos} <= seen, s
    steps = {(r.context["protocol"], r.context["step"]) for r in rec.requests}
    assert {("rubric", "generate"), ("rubric", "grade"), ("decomposed", "extraction"), ("decomposed", "answers"),
            ("decomposed", "scores")} <= steps


def _qa(prompts, subtask):
    return next(p for p in prompts if p["subtask"] == subtask)


def test_gold_agrees_with_the_checkers(prompts):
    t = OracleTeacher(TeacherConfig(error_rate=0.0), WORLD)
    p = _qa(prompts, "iu_color")
    q = json.loads(p["meta"])["question"]
    right = {"candidate_id": "r", "output_text": p["reference_text"]}
    other = next(c for c in ("red", "blue", "green") if c != q["answer"])
    wrong = {"candidate_id": "w", "output_text": f"The {q['shape']} is {other}."}
    j = pt.parse(t.answer(make_context("pointwise", p, [right])))
    assert j.rating == 5
    j = pt.parse(t.answer(make_context("pointwise", p, [wrong])))
    assert j.rating == 1 and j.analysis == (f"The answer says {other}. The {q['shape']} is not {other} but "
                                            f"{q['answer']}, which differs, so it is wrong.")
    for order, shown, winner in (("AB", [wrong, right], "B"), ("BA", [right, wrong], "A")):
        v = pw.parse(t.answer(make_context("pairwise", p, shown, order=order)))
        assert v.verdict == winner and "Response" in v.analysis

    spec = DrawSpec((("red", "circle"), ("blue", "square")), relation=None)
    from flywheel.worlds.shapes.scene import Relation
    spec = DrawSpec(spec.objects, Relation(0, "left_of", 1))
    scene = Scene((Obj("circle", "red", 0.3, 0.25, 0.5), Obj("square", "blue", 0.3, 0.75, 0.5)))
    ig = {"prompt_id": "pig", "task": "ig", "subtask": "ig_relation", "query": "Draw a red circle to the left of "
          "a blue square.", "images": [], "meta": json.dumps({"spec": json.loads(spec.to_json())})}
    good = {"candidate_id": "g", "output_images": [_png(render(scene))]}
    swapped = {"candidate_id": "s", "output_images": [_png(render(perturb.swap_positions(scene, 0, 1)))]}
    recoloured = {"candidate_id": "c", "output_images": [_png(render(perturb.wrong_colour(scene, 0, 1)))]}
    assert pt.parse(t.answer(make_context("pointwise", ig, [good]))).rating == 5
    bad = pt.parse(t.answer(make_context("pointwise", ig, [recoloured])))
    assert bad.rating <= 3 and "instead of red" in bad.analysis
    ex = dc.parse_extraction(t.answer(make_context("decomposed", ig, [], step="extraction")))
    assert ex.relationship and ex.ids[-1].startswith("R")
    for cand, r_low in ((good, False), (swapped, True)):
        ans = dc.parse_answers(t.answer(make_context("decomposed", ig, [cand], step="answers", extraction=ex)), ex)
        sc = dc.parse_scores(t.answer(make_context("decomposed", ig, [cand], step="scores", extraction=ex,
                                                   answers=ans)), ex)
        r1 = sc.by_key["R1"].score
        assert (r1 <= 2) == r_low and (sc.overall.score < 10) == r_low
        if r_low:
            assert ans.by_id["R1"].startswith("No,") and "to the right of" in sc.by_key["R1"].explanation


def test_measured_error_rate_is_the_configured_one(recorded):
    rec, _ = recorded
    contexts = [r.context for r in rec.requests]
    zero = measure_errors(OracleTeacher(TeacherConfig(error_rate=0.0), WORLD), contexts)
    assert zero["realised"] == 0.0 and zero["decision"] == 0.0
    m = measure_errors(OracleTeacher(TeacherConfig(error_rate=0.3), WORLD), contexts)
    assert m["requests"] > 500
    assert abs(m["realised"] - 0.3) < 0.05, m
    assert m["decision"] > 0.25 and set(m["kinds"]) == {"score_jitter", "verdict_flip", "wrong_analysis"}
    only = measure_errors(OracleTeacher(TeacherConfig(error_rate=0.3, error_kinds={"verdict_flip": 1.0}), WORLD),
                          contexts)
    assert set(only["by_protocol"]) >= {"pairwise", "pointwise"}
    assert only["by_protocol"]["pointwise"]["realised"] == 0.0  # verdict flips do not apply to ratings
    assert abs(only["by_protocol"]["pairwise"]["realised"] - 0.3) < 0.08


def test_errors_are_seeded_per_item_and_sample(recorded):
    rec, _ = recorded
    ctx = next(r.context for r in rec.requests if r.context["protocol"] == "pointwise")
    a, b = (OracleTeacher(TeacherConfig(error_rate=0.5, seed=1), WORLD) for _ in range(2))
    samples = [a.answer({**ctx, "sample_k": k}) for k in range(12)]
    assert samples == [b.answer({**ctx, "sample_k": k}) for k in range(12)]  # same item, same k: same answer
    assert len(set(samples)) > 1  # the k samples of one item differ, as an annotator's would
    gold = OracleTeacher(TeacherConfig(error_rate=0.0), WORLD).answer(ctx)
    assert gold in samples and all(not is_error(pt.parse(s)) for s in samples)
    kinds = {a.answer_detail({**ctx, "sample_k": k}).error for k in range(40)}
    assert {None, "score_jitter", "wrong_analysis"} <= kinds
    assert ("pointwise", None) in APPLICABLE and decision(ctx, gold) == pt.parse(gold).rating


def test_wrong_analysis_is_a_consistent_misperception(prompts):
    p = _qa(prompts, "iu_color")
    right = {"candidate_id": "r", "output_text": p["reference_text"]}
    t = OracleTeacher(TeacherConfig(error_rate=1.0, error_kinds={"wrong_analysis": 1.0}), WORLD)
    j = pt.parse(t.answer(make_context("pointwise", p, [right])))
    q = json.loads(p["meta"])["question"]
    # rated down, and it misperceived the colour to say so
    assert j.rating < 5 and f"The {q['shape']} is not {q['answer']} but " in j.analysis
    assert j.analysis.endswith("which differs, so it is wrong.")


def test_an_analysis_states_the_evidence_before_the_verdict(prompts):
    """A student judge writes left to right: the verdict must follow what it is based on (what the image holds),
    not precede it."""
    t = OracleTeacher(TeacherConfig(error_rate=0.0), WORLD)
    for sub in ("iu_color", "iu_count", "iu_existence"):
        p = _qa(prompts, sub)
        for cid, text in (("right", p["reference_text"]), ("unreadable", "Hard to say.")):
            a = pt.parse(t.answer(make_context("pointwise", p, [{"candidate_id": cid, "output_text": text}]))).analysis
            verdict = re.search(r", (which|so it) is (right|wrong)", a).start()
            if sub == "iu_color" and text == p["reference_text"]:  # the answer's colour, then the image's check
                assert re.fullmatch(r"The answer says (\w+)\. The \w+ is \1, which matches, so it is right\.",
                                    a.split(" It ")[0]), (sub, a)
                continue
            assert a.index("The answer") < verdict and a.index(". The answer") > 0, (sub, a)
            if text == p["reference_text"]:  # the comparison comes between the two values and the verdict
                assert re.search(r"The answer says \w+, which matches, so it is right\.", a), (sub, a)
    cap = next(p for p in prompts if p["subtask"] == "iu_caption")
    a = pt.parse(t.answer(make_context("pointwise", cap, [{"candidate_id": "c", "output_text": "A red circle."}])))
    scene = Scene.from_json(json.loads(cap["meta"])["scene"])
    assert a.analysis.startswith("The image shows ") and all(o.shape in a.analysis.split(".")[0] for o in scene.objects)


def test_no_usable_context_is_a_per_item_error(cfg, prompts):
    eng = make_text_engine(cfg.model_copy(update={"teacher": TeacherConfig(error_rate=0.1)}), "teacher")
    assert eng.name == "oracle:shapes" and "-e0.1-" in eng.version
    p = _qa(prompts, "iu_count")
    cand = {"candidate_id": "c", "output_text": "Two."}
    user = {"prompt_id": "u", "task": "nlg", "subtask": "nlg_scene_qa", "query": "Hi?", "images": [], "meta": None,
            "source": "user-file"}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "judge this"}]}]
    reqs = [TextRequest(msgs), TextRequest(msgs, context=make_context("pointwise", user, [cand])),
            TextRequest(msgs, context=make_context("pointwise", p, [])),
            TextRequest(msgs, context=make_context("decomposed", p, [], step="extraction")),
            TextRequest(msgs, context=make_context("pointwise", p, [cand]))]
    res = eng.generate(reqs)
    assert [r.ok for r in res] == [False, False, False, False, True]
    assert "no context" in res[0].error and "ground truth" in res[1].error
    assert "needs 1 candidate" in res[2].error and "draw spec" in res[3].error
    with pytest.raises(TeacherError):
        OracleTeacher().answer(None)


def test_gold_variants_cover_correct_partly_wrong_and_wrong(candidates):
    variants = {variant_of(c) for c in candidates}
    assert {"correct", "verbose", "wrong", "near_miss", "unreadable", "missing", "wrong_colour", "extra",
            "swapped", "other_scene", "wrong_shape", "noise", "blur", "wrong_text"} <= variants


def test_claim_check_errors_are_verdict_flips_on_the_verdict_scale(prompts):
    """An erring claim check is a parseable wrong verdict with its analysis (a stated claim reported absent, any
    other reported stated), never a jittered 4; pointwise-only error kinds leave claim checks alone."""
    p = next(x for x in prompts if x["subtask"] == "iu_caption")
    cand = {"candidate_id": "c", "prompt_id": p["prompt_id"], "output_text": "A red circle."}
    always = OracleTeacher(TeacherConfig(error_rate=1.0, error_kinds={"verdict_flip": 1.0}), WORLD)
    seen = set()
    for claim, against, flipped in (("a red circle", "A red circle and a blue square.", "The text has no red shape."),
                                    ("a green square", "A red circle.", "The text has a green square.")):
        for k in range(4):
            ans = always.answer_detail({**make_context("claims", p, [cand], claim=claim, against=against),
                                        "sample_k": k})
            assert ans.error == "verdict_flip" and ans.text != ans.gold
            j = pt.parse(ans.text)
            assert j.analysis == flipped and j.rating == 6 - pt.parse(ans.gold).rating  # 5 <-> 1 here
            seen.add(j.rating)
    assert seen == {1, 5}
    jitter_only = OracleTeacher(TeacherConfig(error_rate=1.0, error_kinds={"score_jitter": 1.0}), WORLD)
    ans = jitter_only.answer_detail(make_context("claims", p, [cand], claim="a red circle", against="A red circle."))
    assert ans.error is None and ans.text == "Analysis: The text has a red circle.\nRating: 5"
