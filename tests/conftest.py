"""Shared fixtures: a config rooted in a temporary workdir, and the tiny zoo built once per session."""

from __future__ import annotations

import pytest

from flywheel.config import REPO_ROOT, Config, load_config


@pytest.fixture(scope="session")
def session_workdir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("workdir"))


@pytest.fixture(scope="session")
def cfg(session_workdir) -> Config:
    # Tests use the random zoo models: the trained world bases take minutes (they have their own tests).
    return load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={session_workdir}",
                                                                "models.judge.path=zoo:judge",
                                                                "models.policy.path=zoo:policy",
                                                                "models.generator.path=zoo:generator"])


@pytest.fixture(scope="session")
def zoo(cfg):
    from flywheel.models.zoo import build_zoo

    return build_zoo(cfg)
