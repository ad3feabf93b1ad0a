"""`flywheel serve` joined to a real cluster: `--block` ends only its own app on Ctrl-C, never the other apps the
cluster's Serve holds (another judge a user serves, an iteration's preference judge)."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from cluster_helpers import VENV_BIN
from mlflow import MlflowClient
from registry_helpers import register_judge

from flywheel.config import REPO_ROOT, load_config
from flywheel.raycluster import free_port

pytestmark = pytest.mark.cluster


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _serve(cluster, judge: str, app: str, mode: str, workdir) -> subprocess.Popen:
    # serve.port: where Serve's proxy starts if it is not running yet (8000 may be someone else's); a running one
    # keeps its port, and the printed URL says which
    args = [str(VENV_BIN / "flywheel"), "serve", mode, "--config", "configs/local.yaml", f"run.workdir={workdir}",
            f"serve.model={judge}", f"serve.app_name={app}", f"serve.route_prefix=/{app}",
            f"serve.port={free_port()}"]
    return subprocess.Popen(args, cwd=REPO_ROOT, env=cluster.env(RAY_ADDRESS=cluster.gcs_address),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _read_until(proc: subprocess.Popen, until: str, timeout: float = 300) -> list[str]:
    """The process's output lines up to the one containing `until`, failing after `timeout` s: a deploy that waits
    for CPUs must not hang the session."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    out, deadline = [], time.time() + timeout
    while not out or until not in out[-1]:
        try:
            out.append(lines.get(timeout=max(0.1, deadline - time.time())))
        except queue.Empty:
            pytest.fail(f"no {until!r} within {timeout:.0f} s:\n{''.join(out)}")
    return out


def _url_of(proc: subprocess.Popen, until: str) -> tuple[str, str]:
    """(the app's URL that `flywheel serve` printed, its output up to the line containing `until`)."""
    out = _read_until(proc, until)
    urls = [m.group(1) for line in out if (m := re.search(r"serving at (http://\S+)", line))]
    assert urls, "".join(out)
    return urls[-1], "".join(out)


@pytest.mark.slow  # ~70 s on 2 cores (two Serve apps from two CLI processes)
def test_a_blocking_serve_on_a_cluster_ends_only_its_own_app(local_ray_cluster, zoo, tmp_path):
    """Each serves a registered version, pinned by its app's alias (retention keeps what an alias names): the
    blocking one's alias goes with its app, the detached one's stays with its app."""
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={tmp_path}"])
    registry = MlflowClient(cfg.tracking.uri)
    served = {app: register_judge(cfg, zoo["judge"], alias=None, tag=app) for app in ("keeper", "blocker")}
    keeper = blocker = None
    try:
        keeper = _serve(local_ray_cluster, served["keeper"], "keeper", "--detach", tmp_path)
        keeper_url, out = _url_of(keeper, "keeps running on the cluster")
        assert keeper.wait(timeout=120) == 0, out
        assert "then delete the alias 'serving-keeper'" in out.replace("\n", "")
        blocker = _serve(local_ray_cluster, served["blocker"], "blocker", "--block", tmp_path)
        blocker_url, out = _url_of(blocker, "Ctrl-C to stop")
        assert _status(f"{blocker_url}/healthz") == 200 == _status(f"{keeper_url}/healthz")
        aliases = registry.get_registered_model("judge").aliases
        assert {a: f"models:/judge/{v}" for a, v in aliases.items()} == {
            "serving-keeper": served["keeper"], "serving-blocker": served["blocker"]}
        blocker.send_signal(signal.SIGINT)
        assert blocker.wait(timeout=120) == 0, out
        assert _status(f"{blocker_url}/healthz") == 404  # its app is gone ...
        assert _status(f"{keeper_url}/healthz") == 200  # ... and the other app, and Serve itself, still answer
        assert set(registry.get_registered_model("judge").aliases) == {"serving-keeper"}
    finally:
        for proc in (keeper, blocker):
            if proc is not None:
                proc.kill()
        # the keeper's replica holds one of the cluster's two CPUs: give it back to the tests after this one
        subprocess.run([sys.executable, "-c", "import ray; from ray import serve; ray.init(); "
                        "serve.delete('keeper')"], env=local_ray_cluster.env(RAY_ADDRESS=local_ray_cluster.gcs_address),
                       timeout=120, check=False)


DRIVER = """
import sys, time
import ray
from ray import serve
from flywheel.serve import orphans
ray.init()
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})

@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
def hello(_request):
    return "hi"

orphans.hold_owner(sys.argv[2])
serve.run(hello.bind(), name=sys.argv[2], route_prefix="/" + sys.argv[2])
print("deployed", flush=True)
time.sleep(600)
"""
SWEEP = """
import re, sys, time
import ray
from flywheel.serve import orphans
ray.init()
deadline = time.time() + 60  # Ray frees a dead driver's actors within seconds
while orphans.owner_alive(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.5)
print("removed", orphans.remove_orphans(re.compile(sys.argv[2])), flush=True)
"""


def test_the_app_of_a_killed_driver_is_deleted_by_the_next_sweep(local_ray_cluster):
    """flywheel/serve/orphans.py on a real cluster: a driver holds its app's owner and is SIGKILLed; its app stays
    on the cluster (Serve keeps it) until another driver's sweep deletes it."""
    env = local_ray_cluster.env(RAY_ADDRESS=local_ray_cluster.gcs_address)
    app = "orph-preferences-00c0ffee"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(free_port()), app], cwd=REPO_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    swept = False
    try:
        _read_until(driver, "deployed", timeout=180)
        driver.kill()
        driver.wait(timeout=30)
        sweep = subprocess.run([sys.executable, "-c", SWEEP, app, "orph-preferences-[0-9a-f]{8}"], cwd=REPO_ROOT,
                               env=env, capture_output=True, text=True, timeout=180)
        assert f"removed ['{app}']" in sweep.stdout, sweep.stdout + sweep.stderr
        status = subprocess.run([sys.executable, "-c", "import ray; from ray import serve; ray.init(); "
                                 "print(sorted(serve.status().applications))"], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and app not in status.stdout, status.stdout + status.stderr
        swept = True
    finally:
        driver.kill()
        driver.wait(timeout=30)
        if not swept:  # the app must not hold on into the session's later tests
            subprocess.run([sys.executable, "-c", f"import ray; from ray import serve; ray.init(); "
                            f"serve.delete({app!r})"], env=env, timeout=120, check=False)
