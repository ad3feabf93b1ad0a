"""Candidates: N samples per prompt from the right engine(s), per-item failures quarantined."""

from collections import Counter

import pytest

from flywheel.aspects import AspectTree
from flywheel.records import validate, with_ids
from flywheel.stages.candidates import CandidatesCore
from flywheel.worlds.shapes.suites import SuitesConfig, generate


@pytest.fixture(scope="module")
def small_cfg(cfg, zoo):
    c = cfg.model_copy(deep=True)
    c.candidates.samples_per_prompt = 2
    c.candidates.seeded_variants = 0  # the policy's samples alone (the variants have their own test)
    c.generator.generation.num_inference_steps = 2
    c.policy.generation.max_new_tokens = 6
    return c


@pytest.fixture(scope="module")
def prompts(small_cfg):
    suites = SuitesConfig(prompts_per_subtask=2, subtasks=["iu_color", "nlg_scene_qa", "ig_single_object",
                                                           "itig_draw_and_describe"],
                          split={"ood_subtasks": [], "ood_aspects": []})
    return with_ids("prompt", generate(suites, small_cfg.world.shapes, AspectTree.load(), seed=0))


def test_each_prompt_gets_n_samples_from_the_right_engines(small_cfg, prompts):
    out = CandidatesCore(small_cfg)(prompts)
    assert not out.quarantined
    valid, bad = validate("candidate", out.rows)
    assert not bad and len(valid) == len(prompts) * 2
    by_prompt = Counter(r["prompt_id"] for r in out.rows)
    assert set(by_prompt.values()) == {2}
    task = {p["prompt_id"]: p["task"] for p in prompts}
    for r in out.rows:
        t = task[r["prompt_id"]]
        assert (r["output_text"] is not None) == (t in ("iu", "nlg", "itig")), t
        assert (len(r["output_images"]) == 1) == (t in ("ig", "itig")), t
        assert r["producer"].count("@") == (2 if t == "itig" else 1)
    assert sorted({r["sample_index"] for r in out.rows}) == [0, 1]


def test_image_samples_do_not_depend_on_batching(small_cfg, prompts):
    draw = [p for p in prompts if p["task"] == "ig"]
    together = CandidatesCore(small_cfg)(draw).rows
    alone = CandidatesCore(small_cfg)(draw[1:]).rows
    import io

    import numpy as np
    from PIL import Image

    a, b = (np.asarray(Image.open(io.BytesIO(r["output_images"][0])), dtype=int) for r in (together[2], alone[0]))
    assert np.abs(a - b).max() <= 3  # same seed and noise; only float rounding of the batch shape differs


def test_a_failing_item_is_quarantined_and_the_rest_survive(small_cfg, prompts):
    iu = [p for p in prompts if p["task"] == "iu"]
    broken = {**iu[0], "images": [b"\x89PNG but not really"]}
    out = CandidatesCore(small_cfg)([broken, iu[1]])
    assert len(out.rows) == 2 and all(r["prompt_id"] == iu[1]["prompt_id"] for r in out.rows)
    assert len(out.quarantined) == 2
    assert "undecodable image" in out.quarantined[0]["reason"] and "sample 0" in out.quarantined[0]["reason"]


def test_seeded_variants_add_outputs_of_mixed_quality_after_the_policy_samples(small_cfg, prompts):
    c = small_cfg.model_copy(deep=True)
    c.candidates.seeded_variants = 3
    qa = [p for p in prompts if p["subtask"] in ("iu_color", "nlg_scene_qa")]
    foreign = {**qa[0], "prompt_id": "pr_foreign", "meta": None, "source": "user-file"}  # no oracle ground truth
    rows = CandidatesCore(c)(qa + [foreign]).rows
    valid, bad = validate("candidate", rows)
    assert not bad and len(valid) == len(rows)
    seeded = [r for r in rows if r["producer"].startswith("gold:")]
    assert Counter(r["prompt_id"] for r in seeded) == {p["prompt_id"]: 3 for p in qa}  # none for the foreign one
    assert {r["sample_index"] for r in seeded} == {2, 3, 4}  # numbered after the 2 policy samples
    assert len({r["meta"]["variant"] for r in seeded}) > 3  # drawn per prompt, not the same three everywhere
    from flywheel.worlds.shapes.teacher import OracleTeacher
    teacher = OracleTeacher(world=c.world.shapes)
    by_id = {p["prompt_id"]: p for p in qa}
    ratings = Counter(teacher.assessment(by_id[r["prompt_id"]], r).rating for r in seeded)
    assert ratings[5] and sum(n for k, n in ratings.items() if k <= 2)  # right and wrong answers both occur
    again = CandidatesCore(c)(qa[1:]).rows  # the same draw however prompts are batched
    key = lambda r: (r["prompt_id"], r["sample_index"], r["output_text"])  # noqa: E731
    assert {key(r) for r in again if r["producer"].startswith("gold:")} <= {key(r) for r in seeded}
