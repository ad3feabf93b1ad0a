"""Kill the driver of an iteration mid-stage, run it again: it finishes with the same results as an uninterrupted
run with the same seed (every stage skips work whose output records the same config and inputs). Killed once in the
data stages and once after the judge gate promoted the iteration's own judge: the resumed run must still start from
the models the iteration began with (flywheel/iteration_record.py), and a finished iteration is not run again."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flywheel import gate
from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_manifest
from flywheel.iteration import paths
from flywheel.train import registry
from tiny_iteration import TINY

# The tiny random judge orders no gold pair (0.0, like its base): a negative margin promotes it anyway, so the
# iteration goes on past the judge gate to preference data and policy updates, where the second kill lands.
# Served judging runs one generation per call: Serve's dynamic batches group requests by timing, and another
# batch's padding changes the floats of a rating (measured: the same run's preference labels hashed differently
# under load), which would hide what this test compares.
# One prompt per labels batch: the first kill lands after some of the teacher's batches finished, which the resume
# must take as they are.
RUN = [*TINY, "gate.judge_test=none", "gate.judge_margin=-1", "serve.max_batch_size=1", "judgments.batch_size=1"]


def _start(workdir: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), f"run.workdir={workdir}", *RUN]
    with open(workdir.with_suffix(".log"), "a") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _run(workdir: Path, kill_at: str | None = None, timeout: float = 1500,
         proc: subprocess.Popen | None = None, once: Callable[[], bool] | None = None) -> str:
    """Run an iteration (or wait for one `_start` began) to its end, or SIGKILL it 2 s after `stage <kill_at>`
    shows, or (with `once`) as soon as once() holds after that."""
    log = workdir.with_suffix(".log")
    proc = proc or _start(workdir)
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        if kill_at and f"stage {kill_at}" in log.read_text():
            if once is None:
                time.sleep(2)  # let the stage get under way
            elif not once():
                time.sleep(0.05)
                continue
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started, mid-stage
            proc.wait()
            return "killed"
        time.sleep(1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"iteration did not finish in {timeout} s; log: {log}")
    assert proc.returncode == 0, log.read_text()[-3000:]
    return "done"


def _cfg(workdir: Path):
    return load_config(None, [f"run.workdir={workdir}", *RUN])


def _trainings(workdir: Path) -> dict[str, list[str]]:
    """Per registered model, the run keys (training, settings, base, data) of its versions, oldest first."""
    client = registry.client(_cfg(workdir))
    return {m.name: [v.tags.get("flywheel.run_key") for v in sorted(
        client.search_model_versions(f"name='{m.name}'"), key=lambda v: int(v.version))]
        for m in client.search_registered_models()}


def _hashes(workdir: Path) -> dict[str, str]:
    cfg = _cfg(workdir)
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
    # the uninterrupted run beside the killed ones (each its own embedded Ray and workdir): its results must not
    # depend on timing or load either, and the test takes ~2 minutes less
    reference = _start(straight)
    try:
        # killed once the teacher's labels have a finished batch (flywheel/stages/finished_batches.py)
        labels = Path(paths(_cfg(resumed), 0)["labels"]) / "_batches"
        assert _run(resumed, kill_at="labels", once=lambda: any(labels.glob("*/*.json"))) == "killed"
        assert _run(resumed, kill_at="preference-candidates") == "killed"  # the judge gate has moved the champion
        assert gate.champion_of(_cfg(resumed), "judge") is not None
        assert _run(resumed) == "done"
    except BaseException:
        os.killpg(reference.pid, signal.SIGKILL)
        raise
    assert _run(straight, proc=reference) == "done"
    kept = re.findall(r"stage judgments-teacher: \d+ rows in .*?batches kept from an interrupted attempt (\d+)",
                      re.sub(r"\s+", " ", resumed.with_suffix(".log").read_text()))  # the log's lines are wrapped
    assert kept and int(kept[0]) >= 1  # the resume took the killed attempt's finished batches
    a, b = _hashes(straight), _hashes(resumed)
    assert a and a == b
    # the same trainings, each once: none was redone from the iteration's own new judge
    assert _trainings(straight) == _trainings(resumed)
    assert gate.champion_of(_cfg(straight), "judge") == gate.champion_of(_cfg(resumed), "judge")
    # one MLflow run for the iteration, reopened by each resume
    client = registry.client(_cfg(resumed))
    parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 "tags.`flywheel.iteration` = '0' and attributes.run_name = 'iteration-0'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # the stages the killed run finished report the time they took then, not the moment the skip took
    took = [json.loads((w / "data" / "iterations" / "000" / "stage-seconds.json").read_text())["finished"]
            for w in (straight, resumed)]
    assert took[0].keys() == took[1].keys()
    assert took[1]["candidates"] > 0.5 * took[0]["candidates"] > 0.5
    # the run that finished the labels after the killed attempt carries the time over both (its own `seconds` are
    # its attempt's); the last run's, which found them done, the total the summary reports
    labels = sorted((r for r in client.search_runs(parents[0].info.experiment_id, "tags.`flywheel.stage` = 'labels'")
                     if r.info.status == "FINISHED"), key=lambda r: r.info.start_time)
    finished = [r.data.metrics for r in labels if "seconds" in r.data.metrics]
    assert len(finished) == 1 and finished[0]["stage.seconds_total"] > finished[0]["seconds"] > 0
    assert labels[-1].data.metrics["stage.seconds_total"] == pytest.approx(took[1]["labels"])
    # run again, a finished iteration is skipped whole
    before = _trainings(resumed)
    assert _run(resumed) == "done"
    assert "iteration 0 finished earlier" in resumed.with_suffix(".log").read_text()
    assert _trainings(resumed) == before
