"""Downstream evaluation is kept per model and eval setting: a champion that stays is the "before" of every
iteration, and is evaluated once (the real tiny zoo policy and generator, in a real Ray task)."""

import json
from pathlib import Path

import pytest
import ray
from tiny_iteration import ZOO_MODELS

from flywheel.config import REPO_ROOT, ModelRef, load_config
from flywheel.evaluate import downstream
from flywheel.models.zoo import resolve_model_path


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture()
def small(cfg, zoo):
    return cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"eval_items": 10})}, deep=True)


def _no_evaluation(*_):
    raise AssertionError("evaluated again")


@pytest.mark.parametrize("role, evaluate", [("policy", downstream.evaluate_policy_ref),
                                            ("generator", downstream.evaluate_generator_ref)])
def test_a_hash_named_model_is_evaluated_once_per_setting(ray_local, small, role, evaluate, monkeypatch):
    ref = f"zoo:{role}"
    first = evaluate(small, ref)
    assert [json.loads(k.read_text())["ref"] for k in _kept(small, role)] == [ref]
    with monkeypatch.context() as m:
        m.setattr(downstream, "_remote", _no_evaluation)
        again = evaluate(small, ref)
    assert again.metrics == pytest.approx(first.metrics, nan_ok=True) and again.per_item == first.per_item
    # other held-out items are another setting: evaluated, not read back
    more = small.model_copy(update={"gate": small.gate.model_copy(update={"eval_items": 11})}, deep=True)
    with monkeypatch.context() as m:
        m.setattr(downstream, "_remote", _no_evaluation)
        with pytest.raises(AssertionError, match="evaluated again"):
            evaluate(more, ref)


def test_a_plain_path_may_change_under_its_name_and_is_always_evaluated(small, monkeypatch):
    path = resolve_model_path(ModelRef(path="zoo:policy"), small)
    calls = []
    monkeypatch.setattr(downstream, "_remote", lambda fn, cfg, ref, judge, held: calls.append(ref) or
                        downstream.Downstream({"accuracy": 0.5}, {"accuracy": [1.0, 0.0]}))
    for _ in range(2):
        downstream.evaluate_policy_ref(small, path)
    assert calls == [path, path]
    assert all(json.loads(k.read_text())["ref"] != path for k in _kept(small, "policy"))


@pytest.mark.parametrize("role, evaluate, oracle_metric", [("policy", downstream.evaluate_policy_ref, "accuracy"),
                                                           ("generator", downstream.evaluate_generator_ref, "score10")])
def test_a_judge_scored_evaluation_rates_the_same_outputs_and_is_kept_per_judge(ray_local, small, monkeypatch, role,
                                                                                evaluate, oracle_metric):
    """gate.policy_metric / generator_metric judge/pointwise/score: the judge's ratings of the outputs join the
    oracle's metrics. The judge here is the world's oracle teacher (judge.engine=oracle), which rates like a
    trained judge would; the policies are the real tiny zoo LLaVA and SDXL."""
    oracle_only = evaluate(small, f"zoo:{role}")
    judged_cfg = small.model_copy(update={"judge": small.judge.model_copy(update={"engine": "oracle"})}, deep=True)
    judged = evaluate(judged_cfg, f"zoo:{role}", judge="zoo:judge")
    scores = judged.per_item["judge/pointwise/score"]
    assert len(scores) == 10 and all(1.0 <= s <= 5.0 for s in scores)
    assert judged.metrics["judge/pointwise/score"] == pytest.approx(sum(scores) / 10)
    assert judged.metrics["judge/pointwise/parse_failure_rate"] == 0.0
    # the oracle's own metrics are the same outputs', measured beside the judge's
    assert judged.per_item[oracle_metric] == pytest.approx(oracle_only.per_item[oracle_metric])
    assert {k: v for k, v in judged.metrics.items() if not k.startswith("judge/")} == pytest.approx(
        oracle_only.metrics, nan_ok=True)
    # kept apart from the oracle-only result and per judge: read back for this judge; a judge named by a path
    # (its weights may change under it) is always asked again
    assert {json.loads(k.read_text())["judge"] for k in _kept(small, role)} >= {None, "zoo:judge"}
    with monkeypatch.context() as m:
        m.setattr(downstream, "_remote", _no_evaluation)
        assert evaluate(judged_cfg, f"zoo:{role}", judge="zoo:judge").per_item == judged.per_item
        with pytest.raises(AssertionError, match="evaluated again"):
            evaluate(judged_cfg, f"zoo:{role}", judge=resolve_model_path(ModelRef(path="zoo:judge"), small))


def test_a_judge_whose_ratings_do_not_parse_gives_no_score(ray_local, small):
    """The zoo judge has never judged: its outputs do not parse, so every item is NaN, never a coerced rating."""
    judged = downstream.evaluate_policy_ref(small, "zoo:policy", judge="zoo:judge")
    scores = judged.per_item["judge/pointwise/score"]
    assert len(scores) == 10 and all(s != s for s in scores)
    assert judged.metrics["judge/pointwise/parse_failure_rate"] == 1.0
    assert judged.metrics["judge/pointwise/score"] != judged.metrics["judge/pointwise/score"]  # NaN


def _kept(cfg, role: str) -> list[Path]:
    return sorted(Path(cfg.storage.uri, "downstream-evals").glob(f"{role}-*.json"))


def _judged(right: list[float], ratings: list[float], oracle: str = "accuracy") -> downstream.Downstream:
    return downstream.Downstream({oracle: sum(right) / len(right)},
                                 {oracle: right, "judge/pointwise/score": ratings})


def test_the_oracle_checks_a_judge_gated_update_item_by_item():
    """In the oracle world a judge-gated update is checked: the oracle's own paired test on the same items, and how
    often the judge rates a right answer above a wrong one (ROC AUC, ties half); unrated answers are left out."""
    nan = float("nan")
    before = _judged([1.0, 0.0, 0.0, 0.0], [4.0, 2.0, 2.0, nan])
    after = _judged([1.0, 1.0, 1.0, 0.0], [4.0, 4.0, 3.0, 2.0])
    c = downstream.oracle_check("policy", "judge/pointwise/score", before, after)
    assert (c["metric"], c["before"], c["after"]) == ("accuracy", 0.25, 0.75)
    assert (c["test"], c["better"], c["worse"]) == ("McNemar", 2, 0) and c["p"] == pytest.approx(0.25)
    # right answers rated 4, 4, 4, 3 against wrong ones 2, 2, 2: every right one above every wrong one
    assert c["auc"] == 1.0
    swapped = _judged([1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 5.0])  # the judge prefers the wrong answer
    assert downstream.oracle_check("policy", "judge/pointwise/score", before, swapped)["auc"] == pytest.approx(2 / 12)
    images = downstream.oracle_check("generator", "judge/pointwise/score",
                                     _judged([2.0, 5.0, 7.0], [1.0, 3.0, 2.0], "score10"),
                                     _judged([3.0, 6.0, 9.0], [1.5, 3.5, 4.5], "score10"))
    assert images["test"] == "Wilcoxon" and "auc" not in images and -1.0 <= images["spearman"] <= 1.0


def test_the_judge_rates_a_policys_answer_as_the_candidates_stage_stores_it(small):
    """A decoded answer starts with a space (" Yes."); the candidates stage strips it, so the judge trained on
    stripped answers. Unstripped, the runs/t13 judge rated wrong existence answers as right (AUC 0.455 -> 1.0
    stripped). The judge here is the world's oracle teacher, spied on for what it is shown."""
    from flywheel.engines.oracle import OracleTextEngine
    from flywheel.train.heldout_probes import JudgeScorer
    from flywheel.worlds.shapes import policy_eval as pe

    shown = []

    class Spy(OracleTextEngine):
        def generate(self, requests, **kw):
            shown.extend(r.context["candidates"][0]["output_text"] for r in requests)
            return super().generate(requests, **kw)

    items = [it for it in pe.text_items(small.world.shapes, 8, 0) if it[3]["type"] == "existence"]
    prompts = pe.text_prompt_records(items, small.world.shapes)
    metrics, per_item = JudgeScorer(small, Spy(small.teacher, small.world.shapes)).score_items(
        prompts, [{"output_text": " Yes.\n"} for _ in items])
    assert shown == ["Yes."] * len(items) and len(per_item["judge/pointwise/score"]) == len(items)


def test_real_datas_held_out_prompts_are_read_in_the_driver_and_key_the_kept_result(small, tmp_path, monkeypatch):
    from labeled_sets import write_jsonl

    def prompts_file(queries):
        return write_jsonl(tmp_path / "p.jsonl", [{"task": "nlg", "subtask": "summarization", "query": q,
                                                    "split": s} for q, s in queries])

    path = prompts_file([("Sum up a.", "train"), ("Sum up b.", "id-test"), ("Sum up c.", "id-test")])
    c = load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={small.run.workdir}", *ZOO_MODELS, f"storage.uri={tmp_path / 'data'}", "gate.eval_items=10",
        f"preferences.sources=[{{type: jsonl, path: {path}}}]", "preferences.subtasks=[summarization]",
        "gate.policy_metric=judge/pointwise/score", "gate.generator_metric=judge/pointwise/score",
        "train.policy_dpo.heldout=null", "train.diffusion_dpo.heldout=null"])
    calls = []  # the node that evaluates gets the prompts themselves: it may not see the driver's files
    monkeypatch.setattr(downstream, "_remote", lambda fn, cfg, ref, judge, held: calls.append(
        sorted(p["query"] for p in held)) or downstream.Downstream({"items": 2.0}, {"judge/pointwise/score": [4, 5]}))
    for _ in range(2):
        downstream.evaluate_policy_ref(c, "zoo:policy", judge="zoo:judge")
    assert calls == [["Sum up b.", "Sum up c."]]  # kept, then read back: the same model on the same prompts
    prompts_file([("Sum up a.", "train"), ("Sum up b.", "id-test"), ("Sum up d.", "id-test")])
    downstream.evaluate_policy_ref(c, "zoo:policy", judge="zoo:judge")
    assert calls[-1] == ["Sum up b.", "Sum up d."]  # other held-out prompts: evaluated again
    with pytest.raises(ValueError, match="no ground truth: only the judge can score them"):
        downstream.evaluate_policy_ref(c, "zoo:policy")  # refused in the driver, before any model is loaded
    assert len(calls) == 2
