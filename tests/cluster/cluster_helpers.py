"""What the cluster tests share: a client of a private local Ray cluster (token auth, Jobs SDK, `ray job submit` as a
person types it) and the list of Ray daemons on the box (the tests must never touch other people's clusters)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flywheel.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "cluster"))
import local_cluster  # noqa: E402  (cluster/local_cluster.py: not a package, a script next to start_local.sh)

VENV_BIN = Path(sys.executable).parent
RAY_DAEMONS = ("gcs_server", "raylet", "dashboard.py", "log_monitor.py", "monitor.py")


def ray_daemons() -> dict[int, str]:
    """Ray daemons on the box by pid (taken before a test: other people's, which it must never touch)."""
    import psutil

    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if any(d in cmd for d in RAY_DAEMONS) and "ray" in cmd:
            out[p.pid] = cmd[:200]
    return out


class ClusterClient:
    """A client of a cluster started by cluster/local_cluster.py (its `info`: dashboard URL, token path, ...)."""

    def __init__(self, info: dict):
        self.info = info
        self.dashboard_url = info["dashboard_url"]
        self.token = Path(info["token_path"]).read_text().strip()

    def env(self, **extra: str) -> dict[str, str]:
        """A client's environment: the token variables, the Jobs API address, the venv first on the PATH."""
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        env |= local_cluster.client_env(self.info) | {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"}
        return env | extra

    def client(self):
        """A Jobs SDK client. The bearer header is passed explicitly: this pytest process may have read
        RAY_AUTH_MODE long before (Ray caches it), so the environment alone is not enough here. Made without
        RAY_ADDRESS / RAY_API_SERVER_ADDRESS, which the SDK prefers to the address it is given: an embedded Ray
        an earlier test started in this process (flywheel.raycluster.start_embedded) leaves RAY_ADDRESS naming
        it, and the client then waited for that gone GCS and failed."""
        from unittest import mock

        from ray.job_submission import JobSubmissionClient

        with mock.patch.dict(os.environ):
            for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
                os.environ.pop(name, None)
            return JobSubmissionClient(self.dashboard_url, headers={"Authorization": f"Bearer {self.token}"})

    def wait_for_job(self, submission_id: str, timeout: float) -> str:
        client, deadline = self.client(), time.time() + timeout
        while time.time() < deadline:
            status = client.get_job_status(submission_id).value
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                return status
            time.sleep(2)
        client.stop_job(submission_id)
        pytest.fail(f"job {submission_id} did not end within {timeout:.0f} s; logs:\n"
                    f"{client.get_job_logs(submission_id)[-3000:]}")

    def submit(self, job_args: list[str], log: Path, timeout: float, prefix: str = "test") -> tuple[str, str]:
        """`ray job submit --working-dir . -- python <job_args>` as a person runs it (it waits for the job and
        tails its log into `log`); returns the submission id and the job's final status."""
        sid = f"{prefix}-{uuid.uuid4().hex[:10]}"
        cmd = [str(VENV_BIN / "ray"), "job", "submit", "--address", self.dashboard_url, "--working-dir", ".",
               "--submission-id", sid, "--", "python", *job_args]
        with open(log, "w") as out:
            try:
                subprocess.run(cmd, cwd=REPO_ROOT, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                               timeout=timeout)
            except subprocess.TimeoutExpired:
                self.client().stop_job(sid)
                pytest.fail(f"job {sid} did not end within {timeout:.0f} s; log: {log}")
        return sid, self.wait_for_job(sid, 60)
