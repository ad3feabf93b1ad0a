"""One private local Ray cluster for the whole session, started exactly as a person would (cluster/start_local.sh:
`ray start --head` from the venv, token auth on, every port free-chosen, its own short temp dir) and stopped by
killing only that cluster's processes — never `ray stop`, which would take down every Ray on the box."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from flywheel.config import REPO_ROOT

from cluster_helpers import ClusterClient, local_cluster, ray_daemons

class LocalCluster(ClusterClient):
    def __init__(self, info: dict):
        super().__init__(info)
        self.dir = Path(info["dir"])
        self.gcs_address = info["gcs_address"]


@pytest.fixture(scope="session")
def local_ray_cluster():
    foreign_before = ray_daemons()
    # Short on purpose: Ray's Unix socket paths under it must stay below 107 characters.
    root = Path(tempfile.mkdtemp(prefix="fwr", dir="/tmp"))
    script = REPO_ROOT / "cluster" / "start_local.sh"
    t0 = time.time()
    out = subprocess.run(["bash", str(script), "start", "--dir", str(root), "--num-cpus", "2", "--json"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        start_log = (root / "start.log").read_text() if (root / "start.log").exists() else ""
        subprocess.run(["bash", str(script), "stop", "--dir", str(root)], timeout=120)
        pytest.fail(f"start_local.sh failed:\n{out.stdout}\n{out.stderr}\n{start_log}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"local Ray cluster up in {time.time() - t0:.0f} s: {info['dashboard_url']} ({root})")
    try:
        yield LocalCluster(info)
    finally:
        ours = {p.pid for p in local_cluster.cluster_processes(root)}
        stopped = subprocess.run(["bash", str(script), "stop", "--dir", str(root)], capture_output=True, text=True,
                                 timeout=120)
        left = local_cluster.cluster_processes(root)
        foreign_killed = {pid: cmd for pid, cmd in foreign_before.items() if pid in ours}
        assert stopped.returncode == 0, stopped.stderr
        assert not left, f"processes of the test cluster survived its stop: {[p.pid for p in left]}"
        assert not foreign_killed, f"the stop touched processes of another cluster: {foreign_killed}"
        shutil.rmtree(root, ignore_errors=True)  # kept above when something failed: its logs are the evidence
