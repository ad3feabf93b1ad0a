"""Downstream evaluation is kept per model and eval setting: a champion that stays is the "before" of every
iteration, and is evaluated once (the real tiny zoo policy and generator, in a real Ray task)."""

import json
from pathlib import Path

import pytest
import ray

from flywheel.config import ModelRef
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
    monkeypatch.setattr(downstream, "_remote", lambda fn, cfg, ref: calls.append(ref) or downstream.Downstream(
        {"accuracy": 0.5}, {"accuracy": [1.0, 0.0]}))
    for _ in range(2):
        downstream.evaluate_policy_ref(small, path)
    assert calls == [path, path]
    assert all(json.loads(k.read_text())["ref"] != path for k in _kept(small, "policy"))


def _kept(cfg, role: str) -> list[Path]:
    return sorted(Path(cfg.storage.uri, "downstream-evals").glob(f"{role}-*.json"))
