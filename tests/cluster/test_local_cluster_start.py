"""A `ray start` that does not finish in time (a slow box, a stuck daemon) leaves nothing running: the head's
daemons it had already started, and the Ray client server it orphans, are stopped, and the error is raised."""

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from cluster_helpers import local_cluster

pytestmark = pytest.mark.cluster


def _attempts(root: Path) -> list[dict]:
    """The GCS and client ports of each `ray start --head` that start.log records."""
    text = (root / "start.log").read_text()
    return [{"gcs": int(g), "client": int(c)}
            for g, c in re.findall(r"ray start --head .*?--port (\d+) .*?--ray-client-server-port (\d+)", text)]


def _left_running(root: Path) -> list:
    """Processes a start under `root` left: wider than what stop() matches, any process naming the temp dir or
    either attempt's GCS port."""
    pattern = re.compile(re.escape(str(root)) + "|"
                         + "|".join(rf"--address=\S+:{a['gcs']}(?!\d)" for a in _attempts(root)))
    return local_cluster._alive(local_cluster.processes_matching(pattern))


@pytest.mark.slow  # ~34 s of `ray start` and `ray stop`; CI runs it (make test-slow)
def test_a_timed_out_start_leaves_no_daemons_behind():
    # 3 s is long enough for `ray start` to have launched the GCS, the raylet and the client server on these
    # 2-core boxes (its logs below say so), too short for it to finish (5-10 s here). A busier or slower box
    # may not reach the client server by then: that start must leave nothing either, and a longer one is tried.
    for timeout in (3, 5, 8):
        root = Path(tempfile.mkdtemp(prefix="fwt", dir="/tmp"))  # short: Ray's socket paths live under it
        try:
            try:
                local_cluster.start(root, num_cpus=1, timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            else:
                pytest.skip(f"ray start finished within {timeout} s on this machine: no timed-out start to clean up")
            assert len(_attempts(root)) == 2  # tried twice
            client_server = list(root.glob("ray/session_*/logs/ray_client_server*"))
            time.sleep(5)  # anything still spawning shows up by now
            left = _left_running(root)
            assert left == [], f"processes of the timed-out start still run: {[p.cmdline() for p in left]}"
        finally:
            for ports in _attempts(root) if (root / "start.log").is_file() else []:
                local_cluster.stop(root, ports=ports)
            shutil.rmtree(root, ignore_errors=True)
        if client_server:
            return
    pytest.fail("no timed-out start got as far as the Ray client server (8 s): its orphan's clean-up is untested")


def test_a_node_whose_start_times_out_is_killed(local_ray_cluster):
    """On the session's cluster (a head of its own would cost its start): the node never joins it."""
    import local_nodes  # on the path through cluster_helpers

    info, root = local_ray_cluster.info, local_ray_cluster.dir
    if (root / "nodes" / "slow").exists():
        pytest.skip("the session's cluster already has a node named slow (this test ran before in the session)")
    try:
        # with a private /tmp where this process may make one: from a clone under /tmp (CI's) its venv and
        # checkout stay visible to the node, or its `ray start` would not be found (exit 127, not a timeout)
        node = local_nodes.add_node(info, "slow", num_cpus=1, timeout=2)
    except subprocess.TimeoutExpired:
        node = None
    except RuntimeError as e:  # its start finished in time but it joined too late: add_node killed it
        if "did not join" not in str(e):
            raise  # e.g. exit 127: the node could not see the venv
        pytest.skip("the node's ray start finished within 2 s on this machine: no start timed out")
    if node is not None:
        local_nodes.kill_node(node)
        pytest.skip("the node's ray start finished within 2 s on this machine: nothing timed out to kill")
    time.sleep(5)
    node_dir = re.compile(re.escape(f"{info['temp_dir']}/nodes/slow") + r"(?=/|$|\s)")
    left = local_cluster._alive(local_cluster.processes_matching(node_dir))
    assert left == [], f"processes of the timed-out node still run: {[p.cmdline() for p in left]}"
    assert local_cluster._is_up(root)  # the head is untouched
