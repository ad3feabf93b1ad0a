"""Which policy updates an iteration attempts (Diffusion-DPO needs one full batch of training pairs), and what its
gate asks the downstream evaluation."""

import contextlib
from types import SimpleNamespace

import pytest

from flywheel import storage
from flywheel.config import load_config
from flywheel.iteration import (IterationResult, _too_few_pairs, _train_and_gate_policies, iteration_dir, paths,
                                with_models)
from flywheel.iteration_record import IterationRecord
from flywheel.train.synthetic import write_synthetic


def test_diffusion_dpo_is_skipped_with_its_reason_when_pairs_cannot_fill_a_batch(tmp_path):
    one_worker = load_config(None, ["train.diffusion_dpo.batch_size=8", "resources.train.actors=1"])
    two_workers = load_config(None, ["train.diffusion_dpo.batch_size=8", "resources.train.actors=2"])
    few, some = str(tmp_path / "few"), str(tmp_path / "some")
    write_synthetic(few, "image_pref", 7, size=16)
    write_synthetic(some, "image_pref", 12, size=16)
    assert "7 training pairs cannot fill one batch of 8" in _too_few_pairs(one_worker, "diffusion_dpo", few)
    assert _too_few_pairs(one_worker, "diffusion_dpo", some) is None
    assert "(16 pairs)" in _too_few_pairs(two_workers, "diffusion_dpo", some)  # a full batch on each worker
    assert _too_few_pairs(one_worker, "policy_dpo", few) is None  # TRL's DPO takes a partial batch


class _Evaluated(Exception):
    """Stops the update at its downstream evaluation: what it was asked is all this test checks."""


@pytest.mark.parametrize("metric, judge", [("judge/pointwise/score", "models:/judge/9"), ("accuracy", None)])
def test_a_judge_scored_gate_metric_has_the_judge_that_ranked_the_pairs_rate_the_answers(tmp_path, monkeypatch,
                                                                                        metric, judge):
    """gate.policy_metric judge/pointwise/score: the policy's before and after are rated by the iteration's
    serving judge (the one that ranked its preference pairs); an oracle metric asks no judge. The training is
    replaced by a finished one (this test is about what the gate asks, not about DPO)."""
    overrides = ["preferences.relabel_pool=false", f"gate.policy_metric={metric}",
                 "preferences.update_min_pairs={policy: 4, generator: 1000}"]
    cfg = load_config(None, [f"run.workdir={tmp_path}", *overrides])
    curated = paths(cfg, 0)["pref-curated"]
    write_synthetic(storage.join(curated, "dpo"), "dpo", 8, size=8, target="policy")
    write_synthetic(storage.join(curated, "image_pref"), "image_pref", 4, size=8)
    start = {"judge": "models:/judge/9", "policy": "world:policy", "generator": "world:generator"}
    IterationRecord(0, "h", start).save(iteration_dir(cfg, 0))
    monkeypatch.setattr("flywheel.train.api.train", lambda *a, **k: SimpleNamespace(model_uri="models:/policy-llava/1",
                                                                                     final={}))
    asked = []

    def evaluate(cfg, ref, judge=None):
        asked.append((ref, judge))
        raise _Evaluated

    monkeypatch.setattr("flywheel.evaluate.downstream.evaluate_policy_ref", evaluate)
    res = IterationResult(0, "", models={"preference_judge": "models:/judge/9"})
    with pytest.raises(_Evaluated):
        _train_and_gate_policies(with_models(cfg, **start), cfg, paths(cfg, 0), {"dpo": 1}, 0, None,
                                 lambda name: contextlib.nullcontext(), res)
    assert asked == [("world:policy", judge)]
