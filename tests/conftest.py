"""Shared fixtures: a config rooted in a temporary workdir, and the tiny zoo built once per session."""

from __future__ import annotations

import pytest

from tiny_iteration import ZOO_MODELS

from flywheel.config import REPO_ROOT, Config, load_config


@pytest.fixture(scope="session")
def session_workdir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("workdir"))


@pytest.fixture(scope="session")
def cfg(session_workdir) -> Config:
    return load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={session_workdir}", *ZOO_MODELS])


@pytest.fixture(scope="session")
def zoo(cfg):
    from flywheel.models.zoo import build_zoo

    return build_zoo(cfg)
