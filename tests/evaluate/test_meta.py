"""Meta-eval end to end on small gold sets: the noiseless oracle is perfect, a noisy teacher is not, and a
random judge's outputs are parse failures (never scores)."""

import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest
import ray

from flywheel.config import load_config
from flywheel.engines.oracle import OracleTextEngine, gold_engine
from flywheel.evaluate import meta
from flywheel.iteration import paths, with_models
from flywheel.judge import claims
from flywheel.stages import gold, prompts
from flywheel.worlds.shapes.claims import claim_texts
from flywheel.worlds.shapes.oracle_config import TeacherConfig


@pytest.fixture(scope="module")
def gold_uri(tmp_path_factory, cfg, zoo):
    root = tmp_path_factory.mktemp("meta")
    c = load_config(None, [f"run.workdir={cfg.run.workdir}", "models.judge.path=zoo:judge",
                           "world.suites.prompts_per_subtask=8",
                           "world.gold.prompts_per_subtask=1", "world.gold.max_pairs_per_prompt=1",
                           "judge.generation.max_new_tokens=8", "meta_eval.protocols=[pointwise, pairwise]",
                           "world.gold.splits=[id-test, ood-test]"])
    prompts.run(c, str(root / "prompts"))
    gold.run(c, str(root / "prompts"), str(root / "gold"))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield c, root
    ray.shutdown()


def test_noiseless_oracle_scores_perfectly_and_generalization_is_reported_apart(gold_uri):
    c, root = gold_uri
    res = meta.run(c, str(root / "gold"), str(root / "me-gold"), engine_factory=lambda: gold_engine(c.world.shapes))
    assert set(res) == {"id-test", "ood-test"}
    for split in res.values():
        assert split["all/pairwise/accuracy"] == 1.0
        assert split["all/pairwise/position_bias_rate"] == 0.0
        assert split["all/pointwise/exact"] == 1.0
        assert split["all/pointwise_ranking/accuracy"] == 1.0  # its ratings order every overall gold pair
    assert "task_generalization/pointwise/n" in res["ood-test"]
    assert any(k.startswith("task/") for k in res["id-test"])


def test_a_protocol_left_out_of_meta_eval_is_neither_asked_nor_scored(gold_uri):
    from flywheel.datasets import read_dataset

    c, root = gold_uri
    pointwise_only = c.model_copy(update={"meta_eval": c.meta_eval.model_copy(update={"protocols": ["pointwise"]})})
    res = meta.run(pointwise_only, str(root / "gold"), str(root / "me-pointwise"),
                   engine_factory=lambda: gold_engine(c.world.shapes))
    judged = read_dataset(str(root / "me-pointwise" / "id-test"))[0].to_pylist()
    assert judged and {j["protocol"] for j in judged} == {"pointwise"}
    m = res["id-test"]
    assert m["all/pointwise_ranking/accuracy"] == 1.0  # gold pairs are still ordered by the ratings
    assert not any("/pairwise/" in k for k in m)  # not asked: no metric at all, rather than a 0 that reads as a fail


def test_a_pairwise_only_meta_eval_skips_the_pointwise_perturbation_checks(gold_uri):
    c, root = gold_uri
    pairwise_only = c.model_copy(update={"meta_eval": c.meta_eval.model_copy(update={"protocols": ["pairwise"]})})
    res = meta.run(pairwise_only, str(root / "gold"), str(root / "me-pairwise"),
                   engine_factory=lambda: gold_engine(c.world.shapes))
    m = res["id-test"]
    assert m["all/pairwise/accuracy"] == 1.0
    assert not any(k.startswith("perturb/") or "/pointwise" in k for k in m)  # nothing pointwise was asked


def test_a_gate_metric_meta_eval_never_measures_is_refused():
    with pytest.raises(Exception, match="meta_eval.protocols"):
        load_config(None, ["meta_eval.protocols=[pointwise]", "gate.judge_metric=id-test/all/pairwise/accuracy"])
    with pytest.raises(Exception, match="needs the pointwise protocol"):  # ranking orders pairs by pointwise ratings
        load_config(None, ["meta_eval.protocols=[pairwise]",
                           "gate.judge_metric=id-test/task/iu/pointwise_ranking/accuracy"])
    load_config(None, ["meta_eval.protocols=[pairwise]", "gate.judge_metric=id-test/task/iu/pairwise/accuracy"])


def test_noisy_teacher_is_measurably_worse(gold_uri):
    c, root = gold_uri
    noisy = lambda: OracleTextEngine(TeacherConfig(error_rate=0.4, seed=3), c.world.shapes)  # noqa: E731
    res = meta.run(c, str(root / "gold"), str(root / "me-noisy"), engine_factory=noisy)
    assert res["id-test"]["all/pointwise/exact"] < 0.9
    assert res["id-test"]["all/pairwise/accuracy"] < 1.0


def test_random_zoo_judge_yields_parse_failures_not_scores(gold_uri):
    c, root = gold_uri
    res = meta.run(c, str(root / "gold"), str(root / "me-zoo"))  # cfg.judge: the random tiny Qwen2-VL
    split = res["id-test"]
    assert split["all/pointwise/parse_failure_rate"] == 1.0
    assert split["all/pairwise/accuracy"] == 0.0


def test_pointwise_ranking_orders_gold_pairs_by_the_judges_ratings():
    """No Ray: gold pairs scored by the judge's pointwise ratings; ties and unparsed ratings count wrong."""
    prompts = {"p": {"task": "iu", "subtask": "iu_count"}}
    gold = [{"judgment_id": f"g{i}", "prompt_id": "p", "candidate_ids": ids, "protocol": "pairwise", "aspect": None,
             "verdict": "A", "score": None} for i, ids in enumerate([["a", "b"], ["a", "c"], ["a", "d"], ["e", "a"]])]

    def rated(cid, score, error=None):
        return {"prompt_id": "p", "candidate_ids": [cid], "protocol": "pointwise", "aspect": None, "order": None,
                "score": score, "parse_error": error}

    judged = [rated("a", 4), rated("b", 2), rated("c", 4), rated("d", None, "no 'Rating:' line"), rated("e", 5)]
    m = meta.score_split(gold, judged, prompts, set(), set())
    # a>b right; a=c tie: wrong; d unparsed: wrong; e>a with gold A(=e): right
    assert m["all/pointwise_ranking/accuracy"] == 0.5
    assert m["all/pointwise_ranking/parse_failure_rate"] == 0.25
    assert m["all/pairwise/accuracy"] == 0.0  # no pairwise-protocol judgments at all: nothing is guessed
    assert not any("pairwise_balanced" in k for k in m)  # nor any probabilities to balance


def test_a_balanced_verdict_counts_a_position_biased_judge_right_when_its_probabilities_lean_to_gold():
    """No Ray: the pairwise protocol in both orders, scored strictly (both verdicts right) and balanced (one verdict
    from both orders' probabilities, pairwise.balanced_verdict). Gold is A for every pair."""
    prompts = {"p": {"task": "iu", "subtask": "iu_count"}}
    gold = [{"judgment_id": f"g{i}", "prompt_id": "p", "candidate_ids": [f"a{i}", f"b{i}"], "protocol": "pairwise",
             "aspect": None, "verdict": "A", "score": None} for i in range(4)]

    def shown(i, order, verdict, p_a, error=None):  # verdict and p_a as emitted in `order`
        probs = {"A": p_a, "B": 1 - p_a, "tie": 0.0}
        return {"prompt_id": "p", "candidate_ids": [f"a{i}", f"b{i}"], "protocol": "pairwise", "aspect": None,
                "order": order, "verdict": None if error else verdict if order == "AB" else "AB"["BA".index(verdict)],
                "parse_error": error, "parsed": None if error else {"verdict": verdict, "verdict_probs": probs}}

    judged = [shown(0, "AB", "A", 0.9), shown(0, "BA", "A", 0.6),  # says "A" both times, surer when A is first
              shown(1, "AB", "A", 0.6), shown(1, "BA", "A", 0.9),  # ... surer when B is first: wrong
              shown(2, "AB", "A", 0.8), shown(2, "BA", "B", 0.3),  # consistent and right
              shown(3, "AB", "A", 0.9), shown(3, "BA", None, 0.5, "no verdict")]  # one order unparsed
    m = meta.score_split(gold, judged, prompts, set(), set())
    # strictly, g2 is right and so is g3 (its one parsed verdict names gold); balanced, g3 has no verdict
    assert m["all/pairwise/accuracy"] == 0.5 and m["all/pairwise/position_bias_rate"] == pytest.approx(2 / 3)
    assert m["all/pairwise_balanced/accuracy"] == 0.5 and m["all/pairwise_balanced/parse_failure_rate"] == 0.25
    outcomes = meta.pair_outcomes("all/pairwise_balanced/accuracy", gold, judged, prompts, set(), set())
    assert outcomes == {"g0": True, "g1": False, "g2": True, "g3": False}


# ---------------------------------------------------------------- per-pair outcomes (the gate's McNemar test)
def _random_split(seed: int = 0):
    """A split with two task categories and an ood sub-task: overall and aspect gold pairs, pointwise ratings (some
    unparsed, some tied, some missing) and pairwise verdicts in both orders (some flipped, unparsed or missing)."""
    rng = random.Random(seed)
    prompts = {f"p{i}": {"task": task, "subtask": sub} for i, (task, sub) in
               enumerate([("iu", "iu_count"), ("iu", "iu_relation"), ("nlg", "nlg_describe_scene")] * 4)}
    gold, judged, pointwise_rows = [], [], []
    for pid in prompts:
        cands = [f"{pid}-c{k}" for k in range(4)]
        for c in cands:
            r = rng.random()
            score, error = (None, "no 'Rating:' line") if r < 0.15 else (float(rng.randint(1, 5)), None)
            if r > 0.05:  # a few items are not judged at all (an engine error)
                pointwise_rows.append({"prompt_id": pid, "candidate_ids": [c], "protocol": "pointwise",
                                       "aspect": None, "order": None, "score": score, "parse_error": error})
        for n, (a, b) in enumerate([(0, 1), (0, 2), (1, 3), (2, 3)]):
            aspect = "color" if n == 3 else None  # an aspect pair: pairwise protocol only, never ranked
            g = {"judgment_id": f"{pid}-g{n}", "prompt_id": pid, "candidate_ids": [cands[a], cands[b]],
                 "protocol": "pairwise", "aspect": aspect, "verdict": rng.choice("AB"), "score": None}
            gold.append(g)
            for order in ("AB", "BA"):
                r = rng.random()
                if r < 0.1:
                    continue
                verdict, error = (None, "no verdict") if r < 0.2 else (rng.choice("AB"), None)
                p_a = rng.random()  # the verdict's probabilities, as emitted (some rows recorded none)
                parsed = None if error else {"verdict_probs": {"A": p_a, "B": 1 - p_a, "tie": 0.0}} if r < 0.95 else {}
                judged.append({**{k: g[k] for k in ("prompt_id", "candidate_ids", "protocol", "aspect")},
                               "order": order, "verdict": verdict, "parse_error": error, "parsed": parsed})
    return gold, judged + pointwise_rows, prompts


def test_each_per_pair_accuracy_is_the_mean_of_its_pair_outcomes():
    gold, judged, prompts = _random_split()
    unseen, ood = {"color"}, {"iu_relation"}
    metrics = meta.score_split(gold, judged, prompts, unseen, ood)
    names = [k for k in metrics if k.endswith("/accuracy")]
    assert {"all/pairwise/accuracy", "all/pointwise_ranking/accuracy", "task/iu/pairwise/accuracy",
            "task/nlg/pointwise_ranking/accuracy", "task_generalization/pointwise_ranking/accuracy",
            "aspect_generalization/pairwise/accuracy", "subtask/iu_count/pointwise_ranking/accuracy",
            "subtask/nlg_describe_scene/pairwise/accuracy", "all/pairwise_balanced/accuracy",
            "task/iu/pairwise_balanced/accuracy"} <= set(names)
    # the sub-tasks partition their task: a task's pairs are its sub-tasks' pairs
    n = lambda name: metrics.get(f"{name}/pointwise_ranking/n", 0)  # noqa: E731
    assert n("task/iu") == n("subtask/iu_count") + n("subtask/iu_relation") > n("subtask/iu_count") > 0
    for name in names:
        outcomes = meta.pair_outcomes(name, gold, judged, prompts, unseen, ood)
        n = metrics[name.replace("/accuracy", "/n")]
        assert len(outcomes) == n and 0 < sum(outcomes.values()) < n, name  # a mix of right and wrong
        assert sum(outcomes.values()) / len(outcomes) == pytest.approx(metrics[name], abs=1e-12), name
    ranked = meta.pair_outcomes("all/pointwise_ranking/accuracy", gold, judged, prompts, unseen, ood)
    assert set(ranked) == {g["judgment_id"] for g in gold if g["aspect"] is None}  # keyed by gold pair
    with pytest.raises(ValueError, match="not a per-pair accuracy"):
        meta.pair_outcomes("all/pointwise/kendall_tau_b", gold, judged, prompts, unseen, ood)


def test_outcomes_are_recomputed_from_storage_only_against_the_gold_they_were_judged_on(tmp_path):
    from stored_meta_eval import METRIC, write_gold, write_judged

    cfg = load_config(None, [f"run.workdir={tmp_path}"])
    gold_uri, out = str(tmp_path / "gold"), str(tmp_path / "me")
    ids = write_gold(gold_uri, 12)
    right = {k: i % 3 == 0 for i, k in enumerate(ids)}
    write_judged(out, gold_uri, right)
    assert meta.stored_outcomes(cfg, gold_uri, out, METRIC) == right
    with pytest.raises(meta.OutcomesUnavailable, match="cannot read"):
        meta.stored_outcomes(cfg, gold_uri, str(tmp_path / "nothing-here"), METRIC)
    write_gold(gold_uri, 12, seed=1)  # other gold pairs at the same uri: the rows were judged on the old ones
    with pytest.raises(meta.OutcomesUnavailable, match="changed since"):
        meta.stored_outcomes(cfg, gold_uri, out, METRIC)


def test_a_meta_evals_outcomes_are_recomputed_from_what_it_wrote(gold_uri):
    c, root = gold_uri
    noisy = lambda: OracleTextEngine(TeacherConfig(error_rate=0.4, seed=3), c.world.shapes)  # noqa: E731
    res = meta.run(c, str(root / "gold"), str(root / "me-noisy"), engine_factory=noisy)  # skipped when done
    for name in ("all/pairwise/accuracy", "all/pointwise_ranking/accuracy"):
        outcomes = meta.stored_outcomes(c, str(root / "gold"), str(root / "me-noisy"), f"id-test/{name}")
        assert len(outcomes) == res["id-test"][name.replace("/accuracy", "/n")]
        assert sum(outcomes.values()) / len(outcomes) == pytest.approx(res["id-test"][name], abs=1e-12)


# ---------------------------------------------------------------- Minos' perturbation checks (meta_eval.perturbation)
def test_perturbation_checks_run_as_a_stage_and_report_next_to_the_split(gold_uri):
    from flywheel.datasets import read_manifest

    c, root = gold_uri
    res = meta.run(c, str(root / "gold"), str(root / "me-gold"), engine_factory=lambda: gold_engine(c.world.shapes))
    m = res["id-test"]
    for part in ("prompts", "candidates", "gold", "judged"):  # written next to the meta-eval output
        assert read_manifest(str(root / "me-gold" / "perturb" / "id-test" / part)).row_count > 0
    # the oracle judges the perturbed content: a perfect judge's correlation collapses on swapped images ...
    assert m["perturb/image_swap/unperturbed/pointwise/kendall_tau_b"] == 1.0
    assert m["perturb/image_swap/pointwise/n"] >= 10
    assert m["perturb/image_swap/pointwise/kendall_tau_b"] < 0.4
    assert m["perturb/image_swap/drop/kendall_tau_b"] > 0.6
    # ... and it scores responses with a quarter of their words replaced lower, never failing to parse
    assert m["perturb/span_swap/n"] >= 10
    assert m["perturb/span_swap/lower_share"] > 3 * m["perturb/span_swap/higher_share"]
    assert m["perturb/span_swap/parse_failure_rate"] == 0.0


def test_one_stage_judges_both_splits_and_their_perturbed_copies(gold_uri, monkeypatch):
    from flywheel.datasets import read_dataset

    c, root = gold_uri
    stages = []
    real = meta.run_stage
    monkeypatch.setattr(meta, "run_stage", lambda name, **kw: stages.append(name) or real(name, **kw))  # a spy
    out = root / "me-one-stage"
    meta.run(c, str(root / "gold"), str(out), engine_factory=lambda: gold_engine(c.world.shapes))
    assert stages == ["meta-eval-judge"]  # the actors start and load the judge once, not once per part
    combined = read_dataset(str(out / "judged"))[0].to_pylist()
    parts = {"id-test": out / "id-test", "ood-test": out / "ood-test",
             "perturb-id-test": out / "perturb" / "id-test" / "judged",
             "perturb-ood-test": out / "perturb" / "ood-test" / "judged"}
    gold_of = {"id-test": root / "gold" / "id-test" / "judgments", "ood-test": root / "gold" / "ood-test" / "judgments",
               "perturb-id-test": out / "perturb" / "id-test" / "gold",
               "perturb-ood-test": out / "perturb" / "ood-test" / "gold"}
    if not read_dataset(str(gold_of["perturb-ood-test"]))[0].num_rows:  # too few ood items here to perturb
        del parts["perturb-ood-test"]
    assert "perturb-id-test" in parts
    seen = 0
    for name, where in parts.items():
        rows, manifest = read_dataset(str(where))
        keys = {meta.item_key(g) for g in read_dataset(str(gold_of[name]))[0].to_pylist()}
        assert rows.num_rows > 0 and {meta.item_key(r) for r in rows.to_pylist()} <= keys  # its own items only
        assert manifest.upstream[0].path == str(gold_of[name])  # its gold leads its upstream (stored_outcomes)
        assert manifest.upstream[-1].path == str(out / "judged")
        seen += rows.num_rows
    assert seen == len(combined)  # every judged row went to exactly one part


def test_perturbation_checks_count_a_random_judges_failures_as_failures(gold_uri):
    c, root = gold_uri
    res = meta.run(c, str(root / "gold"), str(root / "me-zoo"))  # reuses the zoo test's outputs when present
    m = res["id-test"]
    assert m["perturb/image_swap/pointwise/parse_failure_rate"] == 1.0
    assert m["perturb/image_swap/pointwise/kendall_tau_b"] != m["perturb/image_swap/pointwise/kendall_tau_b"]  # NaN
    assert m["perturb/span_swap/baseline_parse_failure_rate"] == 1.0  # no score of the original to compare with
    assert m["perturb/span_swap/lower_share"] == 0.0


def test_teacher_meta_eval_is_shared_by_iterations_and_judged_once(gold_uri):
    c, root = gold_uri
    # the gold and the teacher are the same in every iteration, the challenger's meta-eval is not
    assert paths(c, 0)["meta-eval-teacher"] == paths(c, 3)["meta-eval-teacher"]
    assert paths(c, 0)["meta-eval"] != paths(c, 1)["meta-eval"]
    out = root / "me-teacher"
    first = meta.run(c, str(root / "gold"), str(out), role="teacher")
    judged = lambda: {p: p.stat().st_mtime_ns for p in [*Path(out).glob("*-test/manifest.json"),  # noqa: E731
                                                        *Path(out).glob("perturb/*/judged/manifest.json"),
                                                        *Path(out).glob("judged/manifest.json")]}
    written = judged()
    # a later iteration starts from another champion judge: the teacher's meta-eval is found, not redone
    later = meta.run(with_models(c, judge="models:/judge/7"), str(root / "gold"), str(out), role="teacher")
    assert json.dumps(later, sort_keys=True) == json.dumps(first, sort_keys=True)
    assert len(written) >= 4 and judged() == written  # the stage's output and its parts: not re-judged
    assert first["id-test"]["all/pointwise/n"] > 0


def test_items_without_a_sub_task_get_no_sub_task_slice():
    """A user's labelled file may leave the sub-task out: its items are scored overall and per task only."""
    gold, judged, prompts = _random_split()
    prompts = {pid: {**p, "subtask": None if p["subtask"] == "iu_relation" else p["subtask"]}
               for pid, p in prompts.items()}
    metrics = meta.score_split(gold, judged, prompts, {"color"}, set())
    subtasks = {k.split("/")[1] for k in metrics if k.startswith("subtask/")}
    assert subtasks == {"iu_count", "nlg_describe_scene"}
    assert metrics["task/iu/pointwise_ranking/n"] > metrics["subtask/iu_count/pointwise_ranking/n"]


def test_claim_checks_rate_a_description_in_the_ranking_and_one_failed_claim_fails_it():
    """No Ray: with claims among the protocols, a candidate's claim rows replace its pointwise rating."""
    prompts = {"p": {"task": "iu", "subtask": "iu_caption"}}
    gold = [{"judgment_id": f"g{i}", "prompt_id": "p", "candidate_ids": ids, "protocol": "pairwise", "aspect": None,
             "verdict": "A", "score": None} for i, ids in enumerate([["a", "b"], ["a", "c"], ["a", "d"]])]

    def row(cid, protocol, score, error=None):
        return {"prompt_id": "p", "candidate_ids": [cid], "protocol": protocol, "aspect": None, "order": None,
                "score": score, "parse_error": error}

    judged = [row("a", "pointwise", 2), row("b", "pointwise", 4), row("c", "pointwise", 1),
              row("a", "claims", 5), row("a", "claims", 4), row("b", "claims", 1), row("b", "claims", 5),
              row("c", "claims", 5), row("c", "claims", None, "no 'Rating:' line"),
              row("d", "pointwise", 3), row("d", "claims", 2)]
    holistic = meta.score_split(gold, judged, prompts, set(), set(), ("pointwise",))
    by_claims = meta.score_split(gold, judged, prompts, set(), set(), ("pointwise", "claims"))
    # by the ratings: a(2) < b(4) wrong, a(2) > c(1) right, a(2) < d(3) wrong
    assert holistic["all/pointwise_ranking/accuracy"] == pytest.approx(1 / 3)
    # by the claims: a's 4.5 > b's 3 right, a's 4.5 > d's 2 right; c has a failed claim: no rating, so wrong
    # (never its pointwise rating instead)
    assert by_claims["all/pointwise_ranking/accuracy"] == pytest.approx(2 / 3)
    assert by_claims["all/pointwise_ranking/parse_failure_rate"] == pytest.approx(1 / 3)
    # the gate's paired test reads the same outcomes; the perturbation checks read the pointwise rating itself
    outcomes = meta.pair_outcomes("all/pointwise_ranking/accuracy", gold, judged, prompts, set(), set())
    assert outcomes == {"g0": True, "g1": False, "g2": True}
    item = {"judgment_id": "ga", "prompt_id": "p", "candidate_ids": ["a"], "protocol": "pointwise", "aspect": None}
    assert meta._scores([item], judged) == {"ga": 2}


def test_claims_meta_eval_checks_only_descriptions_and_rates_them_by_their_claims(gold_uri):
    from flywheel.datasets import read_dataset

    c, root = gold_uri
    with_claims = c.model_copy(update={"meta_eval": c.meta_eval.model_copy(
        update={"protocols": ["pointwise", "claims"]})})
    res = meta.run(with_claims, str(root / "gold"), str(root / "me-claims"),
                   engine_factory=lambda: gold_engine(c.world.shapes))
    judged = read_dataset(str(root / "me-claims" / "id-test"))[0].to_pylist()
    prompts = {p["prompt_id"]: p for p in read_dataset(str(root / "gold" / "id-test" / "prompts"))[0].to_pylist()}
    claimed = {prompts[j["prompt_id"]]["subtask"] for j in judged if j["protocol"] == "claims"}
    assert claimed == {"iu_caption", "nlg_describe_scene"}
    # the perturbed copies are rated by their pointwise rows alone (what the perturbation metrics read): no claims
    perturbed = read_dataset(str(root / "me-claims" / "perturb" / "id-test" / "judged"))[0].to_pylist()
    assert perturbed and {j["protocol"] for j in perturbed} == {"pointwise"}
    assert all(j["parse_error"] is None and j["raw_output"].split("\n")[0].endswith(json.loads(j["parsed"])["claim"])
               for j in judged if j["protocol"] == "claims")
    m = res["id-test"]
    assert m["all/pointwise/exact"] == 1.0  # the pointwise items are judged as before
    assert m["subtask/iu_color/pointwise_ranking/accuracy"] == 1.0  # non-descriptions still by their ratings
    assert 0.5 < m["subtask/iu_caption/pointwise_ranking/accuracy"] <= 1.0  # the claims' own ceiling


def test_claims_meta_eval_without_images_asks_the_claim_and_the_text_alone(gold_uri):
    """judgments.claim_images=False: meta-eval asks each caption claim as the judge was taught (no image; the rows
    record it, the requests are checked in tests/stages/test_judgments_claims.py), with the text's verdicts."""
    from flywheel.datasets import read_dataset

    c, root = gold_uri
    cn = c.model_copy(update={"meta_eval": c.meta_eval.model_copy(update={"protocols": ["pointwise", "claims"]}),
                              "judgments": c.judgments.model_copy(update={"claim_images": False})})
    res = meta.run(cn, str(root / "gold"), str(root / "me-claims-text"),
                   engine_factory=lambda: gold_engine(c.world.shapes))
    judged = [j for j in read_dataset(str(root / "me-claims-text" / "id-test"))[0].to_pylist()
              if j["protocol"] == "claims"]
    prompts = {p["prompt_id"]: p for p in read_dataset(str(root / "gold" / "id-test" / "prompts"))[0].to_pylist()}
    assert any(prompts[j["prompt_id"]]["images"] for j in judged)  # captions: their prompts have an image
    assert judged and all(json.loads(j["parsed"])["with_images"] is False for j in judged)
    assert 0.5 < res["id-test"]["subtask/iu_caption/pointwise_ranking/accuracy"] <= 1.0


def test_a_judge_that_splits_claims_itself_is_rated_by_its_own_split(gold_uri):
    """judgments.claim_splitter judge: the judge lists each description's claims before checking them. The
    noiseless oracle's list is the world's parse, so its claim rows are the world splitter's; the random tiny judge
    writes no list, so each description's claims fail as one unparsed split, never as a guessed score."""
    from flywheel.datasets import read_dataset

    c, root = gold_uri
    cj = load_config(None, [f"run.workdir={c.run.workdir}", "world.suites.prompts_per_subtask=8",
                            "world.gold.prompts_per_subtask=1", "world.gold.max_pairs_per_prompt=1",
                            "judge.generation.max_new_tokens=8", "meta_eval.protocols=[pointwise, claims]",
                            "world.gold.splits=[id-test, ood-test]", "meta_eval.perturbation.enabled=false",
                            "judgments.claim_splitter=judge"])
    meta.run(cj, str(root / "gold"), str(root / "me-split"), engine_factory=lambda: gold_engine(c.world.shapes))
    split = [j for j in read_dataset(str(root / "me-split" / "id-test"))[0].to_pylist() if j["protocol"] == "claims"]
    gold_rows, prompts = meta.read_gold(str(root / "gold" / "id-test"))
    cands = {r["candidate_id"]: r for r in read_dataset(str(root / "gold" / "id-test" / "candidates"))[0].to_pylist()}
    world = Counter((g["prompt_id"], claims.raw_output(ch, "")) for g in gold_rows
                    if g["protocol"] == "pointwise" and g["aspect"] is None
                    and prompts[g["prompt_id"]]["subtask"] in cj.judgments.claim_subtasks
                    for ch in claims.checks(prompts[g["prompt_id"]], cands[g["candidate_ids"][0]], claim_texts))
    assert split and Counter((j["prompt_id"], claims.header(j["raw_output"]) + "\n") for j in split) == world
    assert all(j["parse_error"] is None for j in split)
    zoo = meta.run(with_models(cj, judge="zoo:judge"), str(root / "gold"), str(root / "me-split-zoo"))["id-test"]
    judged = [j for j in read_dataset(str(root / "me-split-zoo" / "id-test"))[0].to_pylist()
              if j["protocol"] == "claims"]
    assert judged and all(j["parse_error"].startswith("split: ") and j["score"] is None for j in judged)
    assert all(j["raw_output"].startswith("claim split: ") for j in judged)
    assert zoo["subtask/iu_caption/pointwise_ranking/accuracy"] == 0.0  # an unparsed description ranks nothing


def test_a_split_the_judge_fails_on_is_quarantined_with_its_reason(gold_uri):
    # the core alone (no Ray): an engine that errs on every split request (a timeout); the descriptions' claims
    # are quarantined saying which side failed and why, and nothing is checked or guessed for them
    from flywheel.engines.base import TextResult

    class SplitTimesOut(OracleTextEngine):
        def generate(self, requests, seed=0):
            got = super().generate(requests, seed)
            return [TextResult(error="timeout") if (r.context or {}).get("step") == "split" else g
                    for r, g in zip(requests, got)]

    c, root = gold_uri
    cj = load_config(None, [f"run.workdir={c.run.workdir}", "meta_eval.protocols=[pointwise, claims]",
                            "judgments.claim_splitter=judge"])
    base = root / "gold" / "id-test"
    gold_rows, prompts = meta.read_gold(str(base))
    out = meta.MetaEvalCore(cj, str(base / "prompts"), str(base / "candidates"),
                            engine=SplitTimesOut(c.teacher.model_copy(update={"error_rate": 0.0}),
                                                 c.world.shapes))(gold_rows)
    described = [g for g in gold_rows if g["protocol"] == "pointwise" and g["aspect"] is None
                 and prompts[g["prompt_id"]]["subtask"] in cj.judgments.claim_subtasks]
    assert described and len(out.quarantined) == len(described)
    assert all(q["reason"] == "judge: splitting the reference's claims: timeout" for q in out.quarantined)
    assert not [r for r in out.rows if r["protocol"] == "claims"]
    assert any(r["protocol"] == "pointwise" for r in out.rows)  # the rest is judged as before


def test_gold_claim_checks_need_the_world_splitter_they_are_keyed_by():
    with pytest.raises(ValueError, match="judgments.claim_splitter is 'judge': set it to world"):
        load_config(None, ["world.gold.protocols.iu=[pointwise, claims]", "judgments.claim_splitter=judge"])


@pytest.mark.slow  # 30-33 s (a gold set of its own, three meta-evals), for a protocol not on by default
def test_gold_claim_checks_score_the_judges_claims_one_by_one(gold_uri):
    """world.gold.protocols with claims: the oracle's verdict on each claim is gold, and meta-eval scores the
    judge's check of the same claim against it (`<slice>/claims/...`); a check that did not parse fails."""
    c, root = gold_uri
    cc = load_config(None, [f"run.workdir={c.run.workdir}", "world.suites.prompts_per_subtask=8",
                            "world.gold.prompts_per_subtask=1", "world.gold.max_pairs_per_prompt=1",
                            "world.gold.splits=[id-test]", "meta_eval.protocols=[pointwise, claims]",
                            "world.gold.protocols.iu=[pointwise, claims]",
                            "world.gold.protocols.nlg=[pointwise, claims]",
                            "meta_eval.perturbation.enabled=false"])
    gold.run(cc, str(root / "prompts"), str(root / "gold-claims"))
    right = meta.run(cc, str(root / "gold-claims"), str(root / "me-gc"),
                     engine_factory=lambda: gold_engine(cc.world.shapes))["id-test"]
    assert right["all/claims/n"] > 20 and right["all/claims/exact"] == 1.0
    assert right["subtask/iu_caption/claims/exact"] == 1.0 and "subtask/iu_color/claims/n" not in right
    flipping = TeacherConfig(error_rate=0.5, seed=3, error_kinds={"verdict_flip": 1.0})
    noisy = meta.run(cc, str(root / "gold-claims"), str(root / "me-gc-noisy"),
                     engine_factory=lambda: OracleTextEngine(flipping, cc.world.shapes))["id-test"]
    assert noisy["all/claims/n"] == right["all/claims/n"] and 0.2 < noisy["all/claims/exact"] < 0.8
    # a judge that writes no claim check it can be read by: every gold claim fails, none is guessed
    zoo = meta.run(with_models(cc, judge="zoo:judge"), str(root / "gold-claims"), str(root / "me-gc-zoo"))["id-test"]
    assert zoo["all/claims/parse_failure_rate"] == 1.0 and zoo["all/claims/exact"] == 0.0


def test_the_judge_is_asked_with_the_runs_seed(gold_uri):
    # a sampling judge (judge.samples) draws its analyses with run.seed, as in the labels stage, not always seed 0:
    # another seed is another draw. The core alone (no Ray), the claim splits included.
    seeds = []

    class RecordsSeeds(OracleTextEngine):
        def generate(self, requests, seed=0):
            seeds.append(seed)
            return super().generate(requests, seed)

    c, root = gold_uri
    cj = load_config(None, [f"run.workdir={c.run.workdir}", "run.seed=7", "meta_eval.protocols=[pointwise, claims]",
                            "judgments.claim_splitter=judge"])
    base = root / "gold" / "id-test"
    gold_rows, _ = meta.read_gold(str(base))
    out = meta.MetaEvalCore(cj, str(base / "prompts"), str(base / "candidates"),
                            engine=RecordsSeeds(c.teacher, c.world.shapes))(gold_rows)
    assert out.rows and len(seeds) == 2 and set(seeds) == {7}  # the splits, then the ratings and claim checks
