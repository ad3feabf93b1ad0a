"""Kill the driver of an iteration mid-stage, run it again: it finishes with the same results as an uninterrupted
run with the same seed (every stage skips work whose output records the same config and inputs)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_manifest
from flywheel.iteration import paths
from tiny_iteration import TINY



def _run(workdir: Path, kill_at: str | None = None, timeout: float = 1500) -> str:
    cmd = [sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), f"run.workdir={workdir}", *TINY]
    log = workdir.with_suffix(".log")
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while proc.poll() is None and time.time() < deadline:
            if kill_at and f"stage {kill_at}" in log.read_text():
                time.sleep(2)  # let the stage get under way
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started, mid-stage
                proc.wait()
                return "killed"
            time.sleep(1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"iteration did not finish in {timeout} s; log: {log}")
    assert proc.returncode == 0, log.read_text()[-3000:]
    return "done"


def _hashes(workdir: Path) -> dict[str, str]:
    cfg = load_config(None, [f"run.workdir={workdir}", *TINY])
    out = {}
    for name, uri in paths(cfg, 0).items():
        for sub in ("", "/sft", "/dpo", "/pairs", "/kept", "/image_pref"):
            try:
                out[name + sub] = read_manifest(uri + sub).content_hash
            except FileNotFoundError:
                pass
    return out


@pytest.mark.slow
def test_killed_iteration_resumes_to_the_same_result(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _run(straight) == "done"
    assert _run(resumed, kill_at="labels") == "killed"
    assert _run(resumed) == "done"
    a, b = _hashes(straight), _hashes(resumed)
    assert a and a == b
    # the stages the killed run finished report the time they took then, not the moment the skip took
    took = [json.loads((w / "data" / "iterations" / "000" / "stage-seconds.json").read_text())
            for w in (straight, resumed)]
    assert took[0].keys() == took[1].keys()
    assert took[1]["candidates"] > 0.5 * took[0]["candidates"] > 0.5
