"""`flywheel schedule` against the local token-auth cluster, submitting through the Jobs SDK. The job is a stand-in
with jobs/iteration.py's arguments (tests/cluster/fake_iteration.py: a real iteration takes minutes) that fails
its first attempt: the scheduler must resume that iteration before starting the next, and never run two at once."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flywheel.config import REPO_ROOT

pytestmark = pytest.mark.cluster

VENV_BIN = Path(sys.executable).parent
FAKE = "tests/cluster/fake_iteration.py"


def _schedule(cluster, work: Path, name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [str(VENV_BIN / "flywheel"), "schedule", "--config", "configs/local.yaml", "--name", name, "--job", FAKE,
           "--poll", "1", *args, f"run.workdir={work}"]
    # The address and the token come from the environment, as for a person who sourced <cluster dir>/env.sh.
    return subprocess.run(cmd, cwd=REPO_ROOT, env=cluster.env(), capture_output=True, text=True, timeout=timeout)


def _ours(cluster, name: str) -> list:
    jobs = [j for j in cluster.client().list_jobs() if (j.metadata or {}).get("flywheel.schedule") == name]
    return sorted(jobs, key=lambda j: j.start_time)


def _records(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "schedule" / "decisions.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 26-37 s on 2 cores; the default suite keeps the two quicker schedule tests below
def test_schedule_resumes_a_failed_iteration_first_and_never_overlaps(local_ray_cluster, tmp_path):
    name = f"sched-{uuid.uuid4().hex[:6]}"  # this test's jobs only, whatever else the cluster ran
    (tmp_path / "fail-once-0").touch()  # iteration 0 fails its first attempt
    res = _schedule(local_ray_cluster, tmp_path, name, "--every", "4s", "--max-runs", "3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    jobs = _ours(local_ray_cluster, name)
    md = [(int(j.metadata["flywheel.iteration"]), int(j.metadata["flywheel.attempt"]), j.status.value) for j in jobs]
    assert md == [(0, 1, "FAILED"), (0, 2, "SUCCEEDED"), (1, 1, "SUCCEEDED")]
    assert all(j.submission_id.startswith(f"flywheel-{name}-it") for j in jobs)
    # the production entrypoint's shape: --config (relative to the uploaded project), --start N, --resume, workdir
    assert jobs[1].entrypoint == f"python {FAKE} --config configs/local.yaml --start 0 --resume run.workdir={tmp_path}"
    # never two at once, by the cluster's own clock: each job started after the previous one ended
    for before, after in zip(jobs, jobs[1:]):
        assert after.start_time >= before.end_time, (before.submission_id, after.submission_id)

    records = _records(tmp_path)
    decisions = [r for r in records if r["event"] == "decision"]
    assert sum(d["action"] == "submit" for d in decisions) == 3 and not any(d["action"] == "halt" for d in decisions)
    # the stand-in runs ~6 s and ticks come every 4 s: some tick found a job running and waited
    assert any(d["action"] == "wait" for d in decisions)
    resumed = next(d for d in decisions if d["resume"])
    assert resumed["iteration"] == 0 and resumed["attempt"] == 2 and "FAILED" in resumed["reason"]
    ended = {r["submission_id"]: r["status"] for r in records if r["event"] == "job-ended"}
    assert ended == {j.submission_id: j.status.value for j in jobs}
    # the jobs ran with the cluster's python: the venv's, since the cluster was started from it
    runs = [json.loads(line) for line in (tmp_path / "fake-runs.jsonl").read_text().splitlines()]
    assert [r["failed"] for r in runs] == [True, False, False]
    assert {r["python"] for r in runs} == {str(VENV_BIN / "python")}
    assert "SUBMIT" in res.stdout and "WAIT" in res.stdout  # the console log says what it decided


def test_schedule_once_resumes_a_job_the_cluster_no_longer_knows(local_ray_cluster, tmp_path):
    """The decision log is the scheduler's memory: after the cluster was replaced (its job table is gone), an
    iteration that was submitted and never seen ending is resumed, not skipped or restarted from 0."""
    name = f"sched-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "schedule" / "decisions.jsonl"
    log.parent.mkdir(parents=True)
    old = f"flywheel-{name}-it000"
    gone = [{"event": "submitted", "schedule": name, "submission_id": f"{old}3-a1-x", "iteration": 3, "attempt": 1},
            {"event": "job-ended", "schedule": name, "submission_id": f"{old}3-a1-x", "status": "SUCCEEDED"},
            {"event": "submitted", "schedule": name, "submission_id": f"{old}4-a1-x", "iteration": 4, "attempt": 1}]
    log.write_text("".join(json.dumps(r) + "\n" for r in gone))
    res = _schedule(local_ray_cluster, tmp_path, name, "--once")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    decision = [r for r in _records(tmp_path) if r["event"] == "decision"][-1]
    assert (decision["action"], decision["iteration"], decision["attempt"]) == ("submit", 4, 2)
    assert "LOST" in decision["reason"]
    jobs = _ours(local_ray_cluster, name)
    assert len(jobs) == 1 and "--start 4 --resume" in jobs[0].entrypoint
    assert local_ray_cluster.wait_for_job(jobs[0].submission_id, 120) == "SUCCEEDED"
    # --once returned at once; a second --once while nothing runs moves on to iteration 5
    res = _schedule(local_ray_cluster, tmp_path, name, "--once")
    assert res.returncode == 0
    assert [r for r in _records(tmp_path) if r["event"] == "decision"][-1]["iteration"] == 5
    local_ray_cluster.wait_for_job(_ours(local_ray_cluster, name)[-1].submission_id, 120)


def test_schedule_with_a_wrong_token_is_refused_with_a_clear_error(local_ray_cluster, tmp_path):
    env = local_ray_cluster.env(RAY_AUTH_TOKEN="not-the-token")  # wins over RAY_AUTH_TOKEN_PATH
    cmd = [str(VENV_BIN / "flywheel"), "schedule", "--once", "--config", "configs/local.yaml",
           f"run.workdir={tmp_path}"]
    res = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "refused the token" in res.stdout
    assert not (tmp_path / "schedule" / "decisions.jsonl").exists() or "submitted" not in (
        tmp_path / "schedule" / "decisions.jsonl").read_text()
