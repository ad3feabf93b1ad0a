"""A restarted local cluster comes back on its last ports when they are free (clients holding its addresses, such
as a running `flywheel schedule`, reach it again), and on fresh ones when any is taken. No Ray is started here:
the real restart is tests/cluster's local_ray_cluster fixture's business."""

import socket

from cluster_helpers import local_cluster


def _info() -> dict:
    singles, (lo, hi) = local_cluster._free_ports(len(local_cluster.PORT_NAMES), 5)
    return {"ports": dict(zip(local_cluster.PORT_NAMES, singles)) | {"min_worker": lo, "max_worker": hi}}


def test_the_last_ports_are_reused_when_all_are_free():
    info = _info()
    assert local_cluster._reusable_ports(info) == info["ports"]


def test_fresh_ports_when_one_of_them_is_taken_or_nothing_is_known():
    info = _info()
    with socket.socket() as taken:
        taken.bind(("", info["ports"]["max_worker"]))  # the worker range counts too
        taken.listen()
        assert local_cluster._reusable_ports(info) is None
    assert local_cluster._reusable_ports(None) is None
    assert local_cluster._reusable_ports({"ports": {"gcs": 1}}) is None  # a cluster.json of another layout


def test_a_client_server_is_ours_only_with_our_gcs_and_client_ports(tmp_path):
    """A failed start stops the Ray client server it orphaned (it names no directory, only its GCS address), but
    never another cluster's that happens to use the same GCS port."""
    import subprocess
    import sys

    def fake_client_server(gcs: int, client: int) -> subprocess.Popen:  # the command line is all that is matched
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--address=10.0.0.9:{gcs}",
                                 "--host=10.0.0.9", f"--port={client}", "--mode=proxy"])

    ours, theirs = fake_client_server(41001, 41002), fake_client_server(41001, 41099)
    try:
        found = {p.pid for p in local_cluster.cluster_processes(tmp_path, {"gcs": 41001, "client": 41002})}
        assert ours.pid in found and theirs.pid not in found
        assert {ours.pid, theirs.pid}.isdisjoint(p.pid for p in local_cluster.cluster_processes(tmp_path))
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
