"""Minos' perturbation checks (flywheel/evaluate/perturbation.py) on an in-memory gold set, judged through the
meta-eval core without Ray: what is replaced, with what, deterministically; the noiseless oracle (a perfect judge
that judges from the perturbed content) collapses on swapped images and scores span-replaced answers lower; a
FAKE judge that never looks at images keeps its correlation; failures are counted, never imputed a score."""

import math
import re
from collections import Counter

import pytest

from flywheel.aspects import AspectTree
from flywheel.datasets import write_dataset
from flywheel.engines.base import TextEngine, TextResult
from flywheel.engines.oracle import gold_engine
from flywheel.evaluate import perturbation as pt
from flywheel.evaluate.meta import MetaEvalCore, _scores
from flywheel.records import with_ids
from flywheel.stages.gold import build_gold
from flywheel.worlds.shapes.scene import Obj, Scene
from flywheel.worlds.shapes.suites import generate

N, FRACTION, SEED = 40, 0.25, 0


@pytest.fixture(scope="module")
def gold_set(cfg):
    c = cfg.model_copy(deep=True)
    c.world.suites.prompts_per_subtask = 40
    c.world.gold.prompts_per_subtask = 3
    c.world.gold.splits = ["id-test"]
    prompts = with_ids("prompt", generate(c.world.suites, c.world.shapes, AspectTree.load(), c.run.seed))
    gs = build_gold(c, prompts)["id-test"]
    gold = with_ids("judgment", gs.judgments)
    return (c, gold, {p["prompt_id"]: p for p in gs.prompts}, {x["candidate_id"]: x for x in gs.candidates})


@pytest.fixture(scope="module")
def perturbed(gold_set):
    _, gold, prompts, cands = gold_set
    return pt.perturb(gold, prompts, cands, N, FRACTION, SEED)


def _judge(c, tmp, gold_set, ps, engine) -> dict[str, float]:
    """What meta.write_perturbed, judge_parts and score_perturbed do, with the core called directly instead of
    through a Ray stage."""
    _, gold, prompts, cands = gold_set
    write_dataset(str(tmp / "p"), "prompt", [*prompts.values(), *ps.prompts], config_hash="t", producer="test")
    write_dataset(str(tmp / "c"), "candidate", [*cands.values(), *ps.candidates], config_hash="t", producer="test")
    core = MetaEvalCore(c, str(tmp / "p"), str(tmp / "c"), engine)
    originals = [i.original for i in ps.items]
    before, after = core(originals), core(ps.gold)
    assert not before.quarantined and not after.quarantined
    return pt.score(ps, _scores(originals, before.rows), _scores(ps.gold, after.rows))


class FakeTextOnlyJudge(TextEngine):
    """A FAKE judge (scripted, no model) for this test: rates the response by comparing it with the reference
    answer in the request text, and never looks at the images - the judge the image-swap check must expose."""

    name, version = "fake:text-only", "0"

    def generate(self, requests, seed=0):
        out = []
        for r in requests:
            text = "".join(p.get("text", "") for m in r.messages for p in m["content"])
            resp = re.search(r'the response is "(.*?)"', text)
            ref = re.search(r'the reference answer is "(.*?)"', text)
            rating = 3
            if resp and ref:
                words = lambda s: set(re.findall(r"\w+", s.lower()))  # noqa: E731
                rating = 5 if resp[1] == ref[1] else 3 if words(ref[1]) <= words(resp[1]) else 1
            out.append(TextResult(text=f"Analysis: The response was compared with the reference.\nRating: {rating}"))
        return out


# ---------------------------------------------------------------- what is perturbed, and how
def test_image_swap_shows_another_gold_items_images_and_keeps_the_rest(gold_set, perturbed):
    _, _, prompts, cands = gold_set
    new_prompts = {p["prompt_id"]: p for p in perturbed.prompts}
    new_cands = {x["candidate_id"]: x for x in perturbed.candidates}
    items = [i for i in perturbed.items if i.check == pt.IMAGE_SWAP]
    assert Counter(i.slot for i in items).keys() == {"input", "output"}
    for i in items:
        g0, g1 = i.original, i.gold
        assert g1["judgment_id"] != g0["judgment_id"] and g1["score"] == g0["score"]  # gold of the original
        p0, c0 = prompts[g0["prompt_id"]], cands[g0["candidate_ids"][0]]
        p1, c1 = new_prompts[g1["prompt_id"]], new_cands[g1["candidate_ids"][0]]
        assert c1["output_text"] == c0["output_text"] and p1["query"] == p0["query"]
        assert p1["reference_text"] == p0["reference_text"]  # only the images change
        donor = pt.meta_of(c1 if i.slot == "output" else p1)["perturbation"]["donor"]
        if i.slot == "input":
            assert p1["prompt_id"] != p0["prompt_id"] and donor != p0["prompt_id"]
            assert p1["images"] == prompts[donor]["images"] != p0["images"]
        else:
            assert p1["prompt_id"] == p0["prompt_id"]
            assert cands[donor]["prompt_id"] != p0["prompt_id"]
            assert c1["output_images"] == cands[donor]["output_images"] != c0["output_images"]


def test_input_swap_truth_is_the_donor_scene_with_the_question_answered_on_it(gold_set, perturbed):
    _, _, prompts, _ = gold_set
    new_prompts = {p["prompt_id"]: p for p in perturbed.prompts}
    changed = 0
    for i in (i for i in perturbed.items if i.slot == "input"):
        p0, p1 = prompts[i.original["prompt_id"]], new_prompts[i.gold["prompt_id"]]
        m0, m1 = pt.meta_of(p0), pt.meta_of(p1)
        md = pt.meta_of(prompts[m1["perturbation"]["donor"]])
        assert m1["scene"] == md["scene"] and m1["question"]["type"] == m0["question"]["type"]
        changed += m1["question"] != m0["question"]
    assert changed > 0  # the oracle's truth moved with the image


def test_question_on_another_scene():
    red_circle, blue_square = Obj("circle", "red", "small", 0.2, 0.5), Obj("square", "blue", "small", 0.8, 0.5)
    original = Scene((red_circle, blue_square))
    flipped = Scene((Obj("triangle", "green", "small", 0.5, 0.2), Obj("square", "blue", "small", 0.2, 0.5),
                     Obj("circle", "red", "small", 0.8, 0.5)))
    rel = {"type": "relation", "subject": 0, "relation": "left_of", "object": 1, "answer": True}
    assert pt.question_on(flipped, original, rel) == {**rel, "subject": 2, "object": 1, "answer": False}
    two_circles = Scene((red_circle, Obj("circle", "blue", "small", 0.8, 0.5)))
    assert pt.question_on(two_circles, original, {"type": "colour", "shape": "circle", "answer": "red"}) is None
    assert pt.question_on(two_circles, original, rel) is None  # no blue square to relate to
    count = {"type": "count", "colour": None, "shape": "circle", "answer": 1}
    assert pt.question_on(two_circles, original, count)["answer"] == 2
    exists = {"type": "existence", "colour": "blue", "shape": "square", "answer": True}
    assert pt.question_on(two_circles, original, exists)["answer"] is False


def test_span_swap_replaces_a_quarter_of_the_words_with_other_responses_words(gold_set, perturbed):
    _, _, prompts, cands = gold_set
    new_cands = {x["candidate_id"]: x for x in perturbed.candidates}
    items = [i for i in perturbed.items if i.check == pt.SPAN_SWAP]
    assert len(items) == N
    for i in items:
        c0, c1 = cands[i.original["candidate_ids"][0]], new_cands[i.gold["candidate_ids"][0]]
        assert c1["prompt_id"] == c0["prompt_id"] and c1["candidate_id"] != c0["candidate_id"]
        w0, w1 = pt.WORD.findall(c0["output_text"]), pt.WORD.findall(c1["output_text"])
        assert pt.WORD.split(c0["output_text"]) == pt.WORD.split(c1["output_text"])  # punctuation kept
        swapped = [(a, b) for a, b in zip(w0, w1, strict=True) if a != b]
        assert len(swapped) == max(1, math.floor(FRACTION * len(w0) + 0.5))
        vocab = {w.lower() for x in cands.values() if x["prompt_id"] != c0["prompt_id"] and x["output_text"]
                 for w in pt.WORD.findall(x["output_text"])}
        assert all(b.lower() in vocab and b.lower() != a.lower() for a, b in swapped)


def test_perturbations_are_deterministic_given_the_seed(gold_set, perturbed):
    _, gold, prompts, cands = gold_set
    again = pt.perturb(list(reversed(gold)), prompts, cands, N, FRACTION, SEED)  # row order does not matter
    assert [i.gold["judgment_id"] for i in again.items] == [i.gold["judgment_id"] for i in perturbed.items]
    other = pt.perturb(gold, prompts, cands, N, FRACTION, SEED + 1)
    assert {i.gold["judgment_id"] for i in other.items} != {i.gold["judgment_id"] for i in perturbed.items}


# ---------------------------------------------------------------- scoring
def _item(check, k, gold_score, slot="text"):
    return pt.PerturbedItem(check, slot, {"judgment_id": f"o{k}", "score": gold_score},
                            {"judgment_id": f"p{k}", "score": gold_score})


def test_span_scores_count_failures_as_failures():
    items = [_item(pt.SPAN_SWAP, k, 5) for k in range(6)]
    before = {"o0": 5, "o1": 3, "o2": 3, "o3": 1, "o4": 4, "o5": None}
    after = {"p0": 2, "p1": 3, "p2": 4, "p3": 1, "p4": None, "p5": 1}
    m = pt.score_span_swap(items, before, after)
    assert m["n"] == 6
    assert (m["lower_share"], m["equal_share"], m["higher_share"]) == (1 / 6, 2 / 6, 1 / 6)
    assert m["parse_failure_rate"] == 1 / 6 and m["baseline_parse_failure_rate"] == 1 / 6
    assert m["lower_share_above_floor"] == 1 / 3  # o3 was already at the lowest rating
    assert sum(m[k] for k in ("lower_share", "equal_share", "higher_share", "parse_failure_rate",
                              "baseline_parse_failure_rate")) == pytest.approx(1.0)


def test_image_swap_scores_correlate_with_the_original_gold_and_report_the_drop():
    golds = [1, 2, 3, 4, 5, 1, 5]
    items = [_item(pt.IMAGE_SWAP, k, g, "input") for k, g in enumerate(golds)]
    before = {f"o{k}": g for k, g in enumerate(golds)}
    after = {f"p{k}": s for k, s in enumerate([3, 5, 1, 2, None, 4, 1])}
    m = pt.score_image_swap(items, before, after)
    assert m["unperturbed/pointwise/kendall_tau_b"] == pytest.approx(1.0) and m["pointwise/kendall_tau_b"] < 0
    assert m["drop/kendall_tau_b"] == pytest.approx(1.0 - m["pointwise/kendall_tau_b"])
    assert m["pointwise/parse_failure_rate"] == 1 / 7 and m["pointwise/parsed"] == 6  # not imputed
    assert m["input/pointwise/n"] == 7 and "output/pointwise/n" not in m


# ---------------------------------------------------------------- judges
def test_oracle_collapses_on_swapped_images_and_scores_replaced_spans_lower(gold_set, perturbed, tmp_path):
    c = gold_set[0]
    m = _judge(c, tmp_path, gold_set, perturbed, gold_engine(c.world.shapes))
    # scipy sums floats: 1 - 1e-16 is a perfect order
    assert m["image_swap/unperturbed/pointwise/kendall_tau_b"] == pytest.approx(1.0)
    assert m["image_swap/pointwise/parse_failure_rate"] == 0.0
    assert m["image_swap/pointwise/kendall_tau_b"] < 0.4 and m["image_swap/drop/kendall_tau_b"] > 0.6
    for slot in ("input", "output"):
        assert m[f"image_swap/{slot}/drop/kendall_tau_b"] > 0.3, slot
    assert m["span_swap/parse_failure_rate"] == m["span_swap/baseline_parse_failure_rate"] == 0.0
    assert m["span_swap/lower_share"] > 3 * m["span_swap/higher_share"]
    assert m["span_swap/lower_share_above_floor"] > 0.4


def test_a_judge_that_ignores_images_keeps_its_correlation(gold_set, perturbed, tmp_path):
    c = gold_set[0]
    m = _judge(c, tmp_path, gold_set, perturbed, FakeTextOnlyJudge())
    assert m["image_swap/input/unperturbed/pointwise/kendall_tau_b"] > 0.6  # it grades IU answers well ...
    assert m["image_swap/input/pointwise/kendall_tau_b"] == m["image_swap/input/unperturbed/pointwise/kendall_tau_b"]
    assert m["image_swap/input/drop/kendall_tau_b"] == 0.0  # ... without looking at the image
    assert m["image_swap/drop/kendall_tau_b"] == 0.0 and m["image_swap/pointwise/kendall_tau_b"] > 0.4
