"""Judgments: the pure core with the oracle teacher (every protocol, k samples, both pairwise orders, multi-step
protocols to final judgments) and with the random zoo judge (parse failures kept with reasons, never scores);
one small run through Ray with MLflow tracking."""

from collections import Counter, defaultdict

import pytest
import ray

from flywheel.aspects import AspectTree
from flywheel.config import JudgmentsConfig
from flywheel.datasets import read_rows, write_dataset
from flywheel.engines import make_text_engine
from flywheel.engines.oracle import OracleTextEngine
from flywheel.judge import decomposed as dc
from flywheel.judge.base import is_error
from flywheel.records import validate, with_ids
from flywheel.stages import judgments as stage
from flywheel.stages.judgments import JudgmentsCore, choose_pairs, judgment_stats
from flywheel.worlds.shapes.gold import gold_candidates
from flywheel.worlds.shapes.suites import SuitesConfig, generate

PROTOCOLS = {"nlg": ["pointwise", "pairwise"], "iu": ["pointwise", "pairwise", "aspects"], "ig": ["decomposed"],
             "itig": ["rubric", "pointwise"]}


@pytest.fixture(scope="module")
def jcfg(cfg):
    c = cfg.model_copy(deep=True)
    c.judgments = JudgmentsConfig(protocols=PROTOCOLS, samples_per_item=2, max_pairs_per_prompt=2, batch_size=2)
    c.resources.labeling.actors = 1
    return c


@pytest.fixture(scope="module")
def prompts(jcfg):
    suites = SuitesConfig(prompts_per_subtask=1, subtasks=["iu_color", "nlg_describe_scene", "ig_relation",
                                                           "itig_draw_and_describe"],
                          split={"ood_subtasks": [], "ood_aspects": []})
    return with_ids("prompt", generate(suites, jcfg.world.shapes, AspectTree.load(), seed=1))


@pytest.fixture(scope="module")
def candidates(jcfg, prompts):
    out = []
    for p in prompts:  # three varied outputs per prompt: correct, then two defects
        out += gold_candidates(p, jcfg.world.gold, jcfg.world.shapes, seed=1)[:3]
    return with_ids("candidate", out)


@pytest.fixture(scope="module")
def oracle_out(jcfg, prompts, candidates):
    engine = OracleTextEngine(jcfg.teacher, jcfg.world.shapes)
    return JudgmentsCore(jcfg, candidates, engine=engine)(prompts), engine


def test_oracle_judgments_cover_every_protocol_and_validate(oracle_out, prompts, candidates):
    out, engine = oracle_out
    assert not out.quarantined
    valid, bad = validate("judgment", out.rows)
    assert not bad and len({r["judgment_id"] for r in valid}) == len(valid)
    assert all(r["judge"] == f"oracle:shapes@{engine.version}" and r["parse_error"] is None for r in out.rows)
    task = {p["prompt_id"]: p["task"] for p in prompts}
    by = Counter((task[r["prompt_id"]], r["protocol"]) for r in out.rows)
    n = 3 * 2  # candidates x k
    assert by[("iu", "pointwise")] == by[("nlg", "pointwise")] == by[("itig", "pointwise")] == n
    assert by[("iu", "aspects")] == 2 * n  # a universal and a task group per candidate and sample
    assert by[("ig", "decomposed")] == by[("itig", "rubric")] == n
    assert {r["sample_k"] for r in out.rows} == {0, 1}


def test_pairwise_is_judged_in_both_orders(oracle_out):
    out, _ = oracle_out
    orders = defaultdict(set)
    for r in out.rows:
        if r["protocol"] == "pairwise":
            orders[(r["prompt_id"], tuple(r["candidate_ids"]), r["sample_k"])].add(r["order"])
            assert r["verdict"] in ("A", "B", "tie") and r["candidate_ids"][0] < r["candidate_ids"][1]
    assert len(orders) == 2 * 2 * 2  # 2 prompts x 2 pairs x k
    assert all(o == {"AB", "BA"} for o in orders.values())


def test_multi_step_protocols_end_in_final_judgments(oracle_out):
    out, _ = oracle_out
    for r in out.rows:
        if r["protocol"] == "decomposed":
            assert 0 <= r["score"] <= 10 and r["parsed"]["questions"] and r["analysis"]
            assert not is_error(dc.parse_full(r["raw_output"]))
        elif r["protocol"] == "rubric":
            assert 0 <= r["score"] <= 1 and r["parsed"]["grades"] and r["parsed"]["rubric"]["image"]
            assert r["parsed"]["rubric"]["text"]
        elif r["protocol"] == "aspects":
            assert r["parsed"]["group"] in ("universal", "task") and 1 <= r["score"] <= 5
    stats = judgment_stats(out.rows)
    assert stats["parse_failure_rate"] == 0 and stats["histogram"]["pointwise"]
    assert set(stats["histogram"]["pairwise"]) <= {"A", "B", "tie"}


def test_an_engine_that_returns_too_few_results_stops_the_batch(jcfg, prompts, candidates):
    """A result list shorter than its requests can't be matched to them in order: the core raises, never drops the
    items past its end or labels one item with another's answer."""
    class DropsLast(OracleTextEngine):
        def generate(self, requests, seed=0):
            return super().generate(requests, seed)[:-1]

    with pytest.raises(RuntimeError, match=r"engine returned \d+ results for \d+ requests"):
        JudgmentsCore(jcfg, candidates, engine=DropsLast(jcfg.teacher, jcfg.world.shapes))(prompts)


def test_pairs_are_a_seeded_choice_of_different_outputs():
    cands = [{"candidate_id": f"c{i}", "output_text": f"answer {i}"} for i in range(5)]
    a = choose_pairs(cands, 3, 0, "p1")
    assert a == choose_pairs(list(reversed(cands)), 3, 0, "p1") and len(a) == 3
    assert len(choose_pairs(cands, None, 0, "p1")) == 10
    # two samples saying the same thing are one output: a tie by construction is never judged
    same = cands + [{"candidate_id": "c9", "output_text": "answer 0"}]
    pairs = choose_pairs(same, None, 0, "p1")
    assert len(pairs) == 10 and all(a["output_text"] != b["output_text"] for a, b in pairs)


def test_random_zoo_judge_outputs_are_parse_failures(jcfg, zoo, prompts, candidates):
    c = jcfg.model_copy(deep=True)
    c.judgments = JudgmentsConfig(protocols={"iu": ["pointwise", "pairwise"], "ig": ["decomposed"],
                                             "itig": ["rubric"]}, samples_per_item=1, max_pairs_per_prompt=1)
    c.judge.generation.max_new_tokens = 24
    engine = make_text_engine(c, "judge")
    few = [p for p in prompts if p["task"] in ("iu", "ig", "itig")]
    keep = {p["prompt_id"]: 2 if p["task"] == "iu" else 1 for p in few}
    cands, seen = [], Counter()
    for x in candidates:
        if seen[x["prompt_id"]] < keep.get(x["prompt_id"], 0):
            seen[x["prompt_id"]] += 1
            cands.append(x)
    out = JudgmentsCore(c, cands, engine=engine)(few)
    valid, bad = validate("judgment", out.rows)
    assert not bad and not out.quarantined
    assert {r["protocol"] for r in out.rows} == {"pointwise", "pairwise", "decomposed", "rubric"}
    for r in out.rows:
        assert r["parse_error"] and r["score"] is None and r["verdict"] is None and r["parsed"] is None
        assert isinstance(r["raw_output"], str) and r["judge"].startswith("hf:")
    reasons = {r["protocol"]: r["parse_error"] for r in out.rows}
    assert reasons["decomposed"].startswith("extraction: ") and reasons["rubric"].startswith("rubric: ")
    stats = judgment_stats(valid)  # as stored: with their ids
    assert stats["parse_failure_rate"] == 1.0
    # why they failed, grouped per protocol, each with a raw output to read (MLflow: judgments/stats.json)
    groups = stats["parse_failure_reasons"]
    assert groups["total"] == len(valid) == sum(g["count"] for g in groups["groups"]) + groups["other"]
    by_id = {r["judgment_id"]: r for r in valid}
    for g in groups["groups"]:  # each group's example is its first judgment's raw output
        r = by_id[g["item"]]
        assert (r["protocol"], r["parse_error"]) == (g["field"], g["reason"])
        assert g["example"].split("... (")[0] == r["raw_output"][:400]
    assert {g["field"] for g in groups["groups"]} == {r["protocol"] for r in valid}


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def test_run_through_ray_with_tracking(ray_local, jcfg, prompts, candidates, oracle_out, tmp_path):
    from mlflow import MlflowClient

    from flywheel.track import Tracker

    pu = write_dataset(str(tmp_path / "prompts"), "prompt", prompts, config_hash="p", producer="test").path
    cu = write_dataset(str(tmp_path / "candidates"), "candidate", candidates, config_hash="c", producer="test").path
    out_uri = str(tmp_path / "judgments")
    tracker = Tracker(jcfg)
    with tracker.iteration(0), tracker.stage("judgments") as run:
        res = stage.run(jcfg, pu, cu, out_uri, role="teacher", tracker=tracker)
    assert not res.skipped and res.rows_in == len(prompts)
    rows = read_rows(out_uri, "judgment")
    expected, _ = oracle_out
    assert sorted(r["raw_output"] for r in rows) == sorted(r["raw_output"] for r in expected.rows)  # same as the core
    metrics = MlflowClient(tracker.uri).get_run(run.info.run_id).data.metrics
    assert metrics["parse_failure_rate"] == 0.0 and metrics["judgments"] == len(rows)
    assert any(k.startswith("score_hist.pointwise.") for k in metrics)
    n_batches = -(-len(prompts) // jcfg.judgments.batch_size)
    progress = MlflowClient(tracker.uri).get_metric_history(run.info.run_id, "progress.fraction")
    assert progress[0].step == 1 and progress[-1].value == 1.0 and progress[-1].step == n_batches  # first and last
    assert stage.run(jcfg, pu, cu, out_uri, role="teacher").skipped
    assert stage.stage_hash(jcfg, "teacher") != stage.stage_hash(jcfg, "judge")  # a judge run never reuses it
