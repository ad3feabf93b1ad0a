"""Fixtures of the training-plane tests: an embedded Ray for the package, a training workdir (its own MLflow store
and storage) that reuses the session's tiny zoo, and synthetic training datasets."""

from __future__ import annotations

import pytest

from flywheel.config import REPO_ROOT, load_config

# Small, fast settings: every training runs a few steps on the tiny models through Ray Train on one CPU worker.
BASE_OVERRIDES = [
    "resources.train.actors=1", "resources.train.num_cpus=1",
    "train.batch_size=4", "train.logging_steps=1", "train.save_steps=3", "train.max_failures=0",
    "train.judge_sft.max_steps=4", "train.judge_dpo.max_steps=4", "train.policy_dpo.max_steps=4",
    "train.diffusion_dpo.max_steps=4", "train.diffusion_dpo.batch_size=4",
    # held-out evaluation is tested on its own (test_policy_updates.py); the plumbing tests train blind
    "train.judge_dpo.heldout=null", "train.policy_dpo.heldout=null", "train.diffusion_dpo.heldout=null",
    # Ray Train's controller notices a finished run at its next poll; tiny test runs finish in a few seconds
    "ray.train_poll_interval_s=0.2",
]


@pytest.fixture(scope="package")
def ray_local():
    import ray

    from flywheel import raycluster

    started = not ray.is_initialized()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(raycluster, "_EMBEDDED_ADDRESS", raycluster._EMBEDDED_ADDRESS)
        if started:
            mp.setenv("RAY_ADDRESS", "")  # tracked (delenv of an unset name is not), so that leaving undoes the
            mp.delenv("RAY_ADDRESS")      # address start_embedded sets
            raycluster.start_embedded(2, log_to_driver=False)
        yield
        if started:
            ray.shutdown()


@pytest.fixture(scope="package")
def train_workdir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("train-workdir"))


@pytest.fixture(scope="package")
def model_overrides(zoo) -> list[str]:
    return [f"models.{role}.path={zoo[name]}" for role, name in
            (("judge", "judge"), ("policy", "policy"), ("generator", "generator"))]


LOCAL = REPO_ROOT / "configs" / "local.yaml"


@pytest.fixture(scope="package")
def overrides(train_workdir, model_overrides):
    """overrides(*extra) -> the dotted overrides of the test config (for the CLI and subprocesses)."""

    def make(*extra: str) -> list[str]:
        return [f"run.workdir={train_workdir}", *model_overrides, *BASE_OVERRIDES, *extra]

    return make


@pytest.fixture(scope="package")
def make_cfg(overrides):
    """make_cfg(*overrides) -> a local config in the training workdir, tiny settings, the zoo's checkpoints."""

    def make(*extra: str):
        return load_config(LOCAL, overrides(*extra))

    return make


@pytest.fixture(scope="package")
def datasets(make_cfg):
    """Synthetic training sets on the training storage: sft, judge dpo, policy dpo, image_pref."""
    from flywheel import storage
    from flywheel.train.synthetic import write_synthetic

    cfg = make_cfg()
    root = storage.join(cfg.storage.uri, "synthetic")
    out = {
        "sft": write_synthetic(storage.join(root, "sft"), "sft", 24).path,
        "judge_dpo": write_synthetic(storage.join(root, "judge-dpo"), "dpo", 16, target="judge").path,
        "policy_dpo": write_synthetic(storage.join(root, "policy-dpo"), "dpo", 16, target="policy").path,
        "image_pref": write_synthetic(storage.join(root, "image-pref"), "image_pref", 16).path,
    }
    return out


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """The box has 2 cores shared with other work; two spinning OpenMP threads under contention are many times
    slower than one, so the in-process parts of these tests use one (Ray workers get theirs from num_cpus)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
