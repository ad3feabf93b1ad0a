"""scripts/install_chromium.sh, which .ci/run calls before the tests so that the MLflow UI check runs: a no-op where
a Chromium is on PATH, and a clear failure (exit 1, the reason on stderr) where it cannot install one."""

import shutil
import subprocess

from flywheel.config import REPO_ROOT

SCRIPT = str(REPO_ROOT / "scripts" / "install_chromium.sh")
BASH = shutil.which("bash")


def _run(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, SCRIPT], env={"PATH": path}, capture_output=True, text=True, timeout=60)


def test_a_chromium_on_path_is_kept_and_nothing_is_installed(tmp_path):
    fake = tmp_path / "chromium"  # stands in for an installed browser: the script only looks it up
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    res = _run(str(tmp_path))  # no apt-get on this PATH: an install attempt would fail
    assert res.returncode == 0 and res.stdout.strip() == f"chromium: {fake}"


def test_without_chromium_or_apt_get_it_fails_saying_why(tmp_path):
    res = _run(str(tmp_path))
    assert res.returncode == 1
    assert "no apt-get on this machine; install Chromium yourself" in res.stderr
