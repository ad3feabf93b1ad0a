"""A deliberately over-optimising policy DPO (beta 0.1 at a learning rate 50x the measured one, many passes over
16 pairs) through the real Ray Train launcher: held-out evaluation catches the collapse (answers that repeat
themselves), stops training at once, exports the state *before* the collapse, and the iteration's gate refuses
the update with the guard's reason - while training-pair reward accuracy, logged alongside, says all is well."""

import contextlib
import math

import mlflow
import pytest
from mlflow import MlflowClient

from flywheel import gate
from flywheel.iteration import IterationResult, _promote_best_update
from flywheel.train import registry
from flywheel.train.api import train
from flywheel.train.heldout_probes import TextPolicyProbe
from flywheel.train.updates import outcome_of

MAX_STEPS, EVERY, TOLERATED = 60, 5, 0.3
OVER_OPTIMISING = [
    f"train.policy_dpo.max_steps={MAX_STEPS}", "train.policy_dpo.lr=5e-3", "train.policy_dpo.beta=0.1",
    "train.policy_dpo.heldout={every_steps: %d, items: 16, target: accuracy, patience: 100, "
    "max_rise: {repetition_rate: %s}}" % (EVERY, TOLERATED),
]


# The over-optimising training all these tests read takes 48-73 s on 2 cores: over the default suite's ~30 s rule
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def collapsed(ray_local, make_cfg, datasets):
    cfg = make_cfg(*OVER_OPTIMISING)
    return cfg, train(cfg, "policy_dpo", datasets["policy_dpo"], method="dpo")


def test_guard_stops_the_collapse_and_exports_the_state_before_it(collapsed):
    cfg, res = collapsed
    f = res.final
    curves = {c["step"]: c for c in f["heldout.curves"]}
    start = curves[0]["repetition_rate"]
    assert f["heldout.guard_fired"] and f["heldout.refused"] and f["heldout.reason"].startswith("guard: repetition")
    stopped = f["heldout.stopped_at"]
    assert f["final_step"] == stopped < MAX_STEPS  # stopped at once, every worker, long before the budget
    assert sorted(curves) == list(range(0, stopped + 1, EVERY))
    assert curves[stopped]["repetition_rate"] - start > TOLERATED  # the collapse the guard saw
    best = f["heldout.best_step"]
    assert best < stopped and curves[best]["repetition_rate"] - start <= TOLERATED

    # the registered model is the best state, not the last: re-measured on the same held-out items it gives
    # the best evaluation's numbers (its LoRA adapter on the same base computes exactly what training saw)
    from peft import PeftModel

    from flywheel.train.hf import load_vlm

    export = registry.materialize(cfg, res.model_uri)
    model, processor = load_vlm(registry.resolve_base(cfg, registry.export_meta(export)["adapter_base"]))
    model = PeftModel.from_pretrained(model, str(export / "adapter"))
    again = TextPolicyProbe(cfg, cfg.train.resolved("policy_dpo").heldout, cfg.run.seed)(model, processor)
    for k in ("accuracy", "repetition_rate", "mean_words", "format_valid"):
        assert again[k] == pytest.approx(curves[best][k]), k
    assert again["repetition_rate"] - start <= TOLERATED < curves[stopped]["repetition_rate"] - start


def test_curves_and_decision_are_in_mlflow_and_on_the_version(collapsed):
    cfg, res = collapsed
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    run = client.get_run(res.mlflow_run_id)
    steps = [m.step for m in client.get_metric_history(res.mlflow_run_id, "heldout.repetition_rate")]
    assert steps == list(range(0, res.final["heldout.stopped_at"] + 1, EVERY))
    assert [m.step for m in client.get_metric_history(res.mlflow_run_id, "heldout.accuracy")] == steps
    # the training-pair reward accuracy is logged every step - and is no stopping signal (it never fell)
    rewards = client.get_metric_history(res.mlflow_run_id, "rewards/accuracies")
    assert len(rewards) >= res.final["final_step"] - 1
    assert run.data.tags["flywheel.heldout.guard_fired"] == "True"
    assert run.data.tags["flywheel.heldout.best_step"] == str(res.final["heldout.best_step"])
    mv = registry.get_version(cfg, res.model_uri)
    assert mv.tags["flywheel.heldout.refused"] == "True" and mv.tags["flywheel.method"] == "dpo"
    assert mv.tags["flywheel.heldout.reason"].startswith("guard: repetition_rate")


def test_a_guarded_drop_refuses_promotion_without_reaching_the_gate(collapsed):
    cfg, res = collapsed
    assert gate.champion_of(cfg, "policy-llava") is None

    def evaluate(*_):  # a refused update is never evaluated downstream nor compared with the champion
        raise AssertionError("a refused update reached the downstream evaluation")

    outcome = outcome_of("dpo", res.model_uri, res.final)
    result = IterationResult(0, "test")
    mlflow.set_tracking_uri(cfg.tracking.uri)
    with mlflow.start_run(experiment_id=MlflowClient(cfg.tracking.uri).get_experiment_by_name(
            cfg.experiment).experiment_id):
        _promote_best_update(cfg, "policy", "zoo:policy", [outcome], evaluate, "accuracy", 0.0,
                             lambda name: contextlib.nullcontext(), result)
    (d,) = result.decisions
    assert not d["promoted"] and d["challenger"] == res.model_uri and "guard: repetition_rate" in d["reason"]
    assert math.isnan(d["challenger_value"]) and "policy" not in result.downstream
    assert gate.champion_of(cfg, "policy-llava") is None
    tag = registry.get_version(cfg, res.model_uri).tags["flywheel.gate.decision"]
    assert tag.startswith("refused by its training: guard"), tag


# ~50 s more on 2 cores (a second training and two downstream evaluations)
def test_two_methods_side_by_side_the_unrefused_one_is_gated_and_the_comparison_logged(collapsed, make_cfg,
                                                                                         datasets):
    """[dpo, bon_sft] on the same pairs: the guard refused the DPO run, so best-of-N SFT (trained blind here)
    is the one evaluated downstream and put to the gate; the comparison names both and why."""
    from flywheel.evaluate.downstream import evaluate_policy_ref

    cfg, res = collapsed
    sft = train(make_cfg("gate.eval_items=10"), "policy_dpo", datasets["policy_dpo"], method="bon_sft")
    assert "heldout.best_step" not in sft.final  # blind: compared by the downstream metric instead
    c = make_cfg("gate.eval_items=10")
    outcomes = [outcome_of("dpo", res.model_uri, res.final),
                outcome_of("bon_sft", sft.model_uri, sft.final,
                           evaluate_policy_ref(c, sft.model_uri).metrics["accuracy"], "accuracy")]
    result = IterationResult(0, "test")
    mlflow.set_tracking_uri(c.tracking.uri)
    with mlflow.start_run(experiment_id=MlflowClient(c.tracking.uri).get_experiment_by_name(
            c.experiment).experiment_id) as run:
        _promote_best_update(c, "policy", c.models.policy.path, outcomes, evaluate_policy_ref, "accuracy", 0.0,
                             lambda name: contextlib.nullcontext(), result)
    refused, gated = result.decisions
    assert refused["challenger"] == res.model_uri and not refused["promoted"]
    assert gated["challenger"] == sft.model_uri and "refused" not in gated["reason"]
    methods = result.downstream["policy"]["methods"]
    assert methods["winner"] == "bon_sft" and methods["methods"]["dpo"]["refused"]
    logged = MlflowClient(c.tracking.uri).list_artifacts(run.info.run_id, "gate")
    assert {"gate/policy-methods.json", "gate/policy.json", "gate/policy-dpo.json"} <= {a.path for a in logged}
