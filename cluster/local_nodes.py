"""Worker nodes for the private local cluster of cluster/local_cluster.py: a multi-node Ray cluster simulated on
one machine (tests/cluster/test_multinode.py, bench/labeling_scaleout.py).

    info = local_cluster.start(root, num_cpus=1)
    w1 = add_node(info, "w1", num_cpus=1, num_gpus=2, resources={"labeling": 1})
    ...
    kill_node(w1)          # the node is lost: every process of it SIGKILLed at once
    local_cluster.stop(root)   # also stops every node added here (their temp dirs lie under <root>/ray)

Each node is a `ray start --address=<head>` with its own --temp-dir (Ray 2.60 takes it per node) under
<root>/ray/nodes/<name>: the head's stop() finds its processes by that path, and kill_node() finds exactly this
node's. Ports are chosen free like the head's (Ray's defaults, e.g. the dashboard agent's 52365, collide with other
clusters on the box). Logical GPUs (`--num-gpus`) are only a number to Ray's scheduler; nothing here has CUDA.

Node-local files, simulated: with `private_tmp` (the default when this process may create mount namespaces, i.e.
root) the node's processes run in their own mount namespace where /tmp is the node's own directory
(<root>/nodes/<name>/tmp on the host), HOME is /tmp/home and the working directory /tmp/cwd. A path one node
writes under /tmp, ~ or its cwd then does not exist on the others, as on a real cluster: only storage outside
/tmp (the configured storage URI) is shared. Without that capability the node still gets its own HOME, TMPDIR
and cwd through the environment (weaker: absolute /tmp paths stay visible).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import local_cluster  # noqa: E402  (a script next to this one, not a package)


@dataclass
class LocalNode:
    name: str
    root: Path  # the cluster's directory (local_cluster's --dir)
    temp_dir: str  # the node's --temp-dir, as its processes see it
    host_dir: Path  # <root>/nodes/<name>: start.log, and tmp/ (its /tmp) or home/, tmp/, cwd/ (its env's)
    resources: dict  # what it offers: CPU, GPU and custom resources
    private_tmp: bool
    node_id: str | None = None

    def processes(self) -> list:
        """This node's processes: those whose command line names its temp dir, and their descendants (the
        node's workers and actors, whose titles Ray rewrites to ray::<name>)."""
        return _processes(re.compile(re.escape(self.temp_dir) + r"(?=/|$|[\s,;:'\"])"))


def _processes(pattern: re.Pattern) -> list:
    return local_cluster.processes_matching(pattern)


def _keep_visible(node_tmp: Path, venv: Path) -> str:
    """Shell commands that bind the venv and this checkout into the node's /tmp at their own paths when they lie
    under /tmp (a clone in a temp dir): a real node's image holds both, and without them its `ray start` is not
    found (exit 127). Run before the node's /tmp covers the host's."""
    out, paths = "", sorted(p for p in {venv.resolve(), Path(__file__).resolve().parent.parent}
                            if p.is_relative_to("/tmp"))
    for path in paths:
        if not any(path != other and path.is_relative_to(other) for other in paths):  # a venv in the checkout
            target = node_tmp / path.relative_to("/tmp")
            target.mkdir(parents=True, exist_ok=True)
            out += f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(target))} && "
    return out


def can_private_tmp() -> bool:
    """Whether this process may give a node its own mount namespace (root, or CAP_SYS_ADMIN)."""
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def add_node(info: dict, name: str, *, num_cpus: float, num_gpus: float = 0, resources: dict | None = None,
             private_tmp: bool | None = None, timeout: float = 120) -> LocalNode:
    """Start a worker node joined to the head described by `info` (local_cluster.start's result) and wait until
    the head lists it alive. `name` must be unique within the cluster (it names the node's directory)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,16}", name):
        raise ValueError(f"node name {name!r}: 1-16 letters, digits, - or _ (it becomes a path)")
    root = Path(info["dir"])
    private_tmp = can_private_tmp() if private_tmp is None else private_tmp
    host_dir = root / "nodes" / name
    if host_dir.exists():
        raise ValueError(f"node {name} already exists in {root} (names are not reused: its logs stay for reading)")
    temp_dir = f"{info['temp_dir']}/nodes/{name}"
    (host_dir / "tmp").mkdir(parents=True)
    names = ["node_manager", "object_manager", "agent_listen", "agent_grpc", "runtime_env_agent", "metrics"]
    singles, (wlo, whi) = local_cluster._free_ports(len(names), 100)
    ports = dict(zip(names, singles))
    venv_bin = Path(info["python"]).parent
    offered = {k: float(v) for k, v in (resources or {}).items()}
    cmd = [str(venv_bin / "ray"), "start", "--address", info["gcs_address"], "--temp-dir", temp_dir,
           "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus),
           "--resources", json.dumps(offered), "--disable-usage-stats",
           "--node-manager-port", str(ports["node_manager"]), "--object-manager-port", str(ports["object_manager"]),
           "--dashboard-agent-listen-port", str(ports["agent_listen"]),
           "--dashboard-agent-grpc-port", str(ports["agent_grpc"]),
           "--runtime-env-agent-port", str(ports["runtime_env_agent"]),
           "--metrics-export-port", str(ports["metrics"]), "--min-worker-port", str(wlo), "--max-worker-port", str(whi)]
    token = Path(info["token_path"]).read_text().strip()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS",
                                                            "RAY_AUTH_TOKEN_PATH", "TMPDIR")}
    # The token itself, not its path: with a private /tmp the head's token file is not visible on the node.
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"}
    if private_tmp:
        # The node's /tmp is its host directory; HOME and cwd live inside it, so ~ and relative paths are private.
        node_tmp = shlex.quote(str(host_dir / "tmp"))
        script = (f"{_keep_visible(host_dir / 'tmp', venv_bin.parent)}mount --rbind {node_tmp} /tmp && "
                  f"mkdir -p /tmp/home /tmp/cwd {shlex.quote(temp_dir)} && cd /tmp/cwd && "
                  f"exec env HOME=/tmp/home {shlex.join(cmd)}")
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
        cwd = None
    else:
        for d in ("home", "cwd", "tmp"):
            (host_dir / d).mkdir(exist_ok=True)
        env |= {"HOME": str(host_dir / "home"), "TMPDIR": str(host_dir / "tmp")}
        argv, cwd = cmd, host_dir / "cwd"
    node = LocalNode(name, root, temp_dir, host_dir, {"CPU": float(num_cpus), "GPU": float(num_gpus), **offered},
                     private_tmp)
    with open(host_dir / "start.log", "a") as log:
        log.write("$ " + shlex.join(argv) + "\n")
        log.flush()
        try:
            proc = subprocess.run(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:  # the daemons it forked are up: never leave them behind
            kill_node(node)
            raise
    if proc.returncode != 0:
        kill_node(node)
        raise RuntimeError(f"ray start of node {name} failed (exit {proc.returncode}); see {host_dir / 'start.log'}")
    try:
        node.node_id = _wait_alive(info, node, timeout)
    except BaseException:
        kill_node(node)
        raise
    return node


def _alive_nodes(info: dict) -> list[dict]:
    """The head's view of the nodes (the dashboard's /nodes API; the token as a bearer header)."""
    import urllib.request

    token = Path(info["token_path"]).read_text().strip()
    req = urllib.request.Request(info["dashboard_url"] + "/nodes?view=summary",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data = json.loads(r.read())
    return [n["raylet"] for n in data["data"]["summary"] if n.get("raylet", {}).get("state") == "ALIVE"]


def _wait_alive(info: dict, node: LocalNode, timeout: float) -> str:
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            for n in _alive_nodes(info):
                if all(abs(float(n.get("resourcesTotal", {}).get(k, 0)) - v) < 1e-6
                       for k, v in node.resources.items()) and _raylet_of(node, n):
                    return n["nodeId"]
        except Exception as e:  # noqa: BLE001 (the dashboard may not answer yet)
            last = e
        time.sleep(1)
    raise RuntimeError(f"node {node.name} did not join the cluster within {timeout:.0f} s ({last}); "
                       f"see {node.host_dir}")


def _raylet_of(node: LocalNode, n: dict) -> bool:
    """The head's node entry `n` is this node: its raylet socket lies under the node's temp dir."""
    return str(n.get("rayletSocketName", "")).startswith(node.temp_dir + "/")


def kill_node(node: LocalNode) -> list[int]:
    """The node is lost, as when a machine dies: SIGKILL every one of its processes at once (raylet, agents,
    workers, actors), no draining. Returns their pids."""
    import psutil

    procs = node.processes()
    local_cluster.signal_all(procs, "kill")
    psutil.wait_procs(procs, timeout=10)
    late = node.processes()  # a worker the raylet was spawning as we killed it
    local_cluster.signal_all(late, "kill")
    return sorted({p.pid for p in procs} | {p.pid for p in late})
