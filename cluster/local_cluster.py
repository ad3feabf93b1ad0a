"""A private local Ray cluster (one head node) with token authentication, owned by one directory.

    python cluster/local_cluster.py start [--dir DIR] [--num-cpus N]   # prints how to submit; idempotent
    python cluster/local_cluster.py status [--dir DIR]
    python cluster/local_cluster.py stop [--dir DIR]                   # stops only this cluster

Everything the cluster is lives under DIR (default /tmp/flywheel-ray, short on purpose: Ray's Unix socket paths
under it must stay below 107 characters): Ray's --temp-dir (DIR/ray), the token (DIR/auth_token, generated here,
mode 0600), the addresses and ports (DIR/cluster.json) and a file to source for clients (DIR/env.sh).

Why not `ray start` / `ray stop` as they come: other people run Ray on the same box. Every port is chosen free
(Ray's defaults 6379/8265/10001/52365 collide with any other head), the token is this cluster's own (not
~/.ray/auth_token, which other users' clusters read), and `ray stop` kills every Ray process of the user. `stop`
here kills only the processes whose command line names this cluster's temp dir, and their descendants (job
drivers, workers).

Token authentication (Ray >= 2.52): RAY_AUTH_MODE=token in the environment of `ray start` turns it on; the token
comes from RAY_AUTH_TOKEN, else the file named by RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token. Every client (`ray
job submit`, the Jobs SDK, ray.init) needs the same two variables; the job drivers inherit them from the raylet.
The job's `python` is the first on the PATH the raylet saw: this script puts the venv's bin/ first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_DIR = "/tmp/flywheel-ray"
# Listen ports are drawn from here: above Ray's default worker range (10002-19999, used by other clusters on the
# box) and below Linux's ephemeral range (32768-60999, where outgoing connections take their local port).
PORT_RANGE = (20000, 32000)
WORKER_PORTS = 200  # one per worker process; a 2-core iteration runs a few dozen at most


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_ports(n_single: int, range_len: int) -> tuple[list[int], tuple[int, int]]:
    """n_single free ports and a free contiguous range of range_len, all distinct, from PORT_RANGE."""
    rng = secrets.SystemRandom()
    lo, hi = PORT_RANGE
    for _ in range(200):
        base = rng.randrange(lo, hi - range_len)
        if all(_bindable(p) for p in range(base, base + range_len)):
            break
    else:
        raise RuntimeError(f"no free range of {range_len} ports in {PORT_RANGE}")
    singles: list[int] = []
    while len(singles) < n_single:
        p = rng.randrange(lo, hi)
        if not base <= p < base + range_len and p not in singles and _bindable(p):
            singles.append(p)
    return singles, (base, base + range_len - 1)


def _dir_pattern(root: Path) -> re.Pattern:
    # The temp dir as a whole path component: /tmp/x must not match /tmp/x2's processes.
    return re.compile(re.escape(str(root)) + r"(?=/|$|[\s,;:'\"])")


def cluster_processes(root: Path, ports: dict | None = None) -> list:
    """This cluster's processes: those whose command line names its temp dir, or its GCS and client ports (the Ray
    client server, which `ray start` leaves orphaned and which names no directory: `--address=<host>:<gcs port>
    ... --port=<client port>`), plus all their descendants. ports: the head's ports when cluster.json does not
    name them yet (a start that failed)."""
    pattern = _dir_pattern(root / "ray").pattern
    ports = ports or (_read_info(root) or {}).get("ports") or {}
    if ports.get("gcs") and ports.get("client"):
        pattern += rf"|--address=\S+:{int(ports['gcs'])}(?!\d)\s.*--port={int(ports['client'])}(?!\d)"
    return processes_matching(re.compile(pattern))


def processes_matching(pattern: re.Pattern) -> list:
    """Processes whose command line matches `pattern`, plus all their descendants (never this process)."""
    import psutil

    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and pattern.search(" ".join(p.info["cmdline"] or [])):
                found[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for p in list(found.values()):
        try:
            for c in p.children(recursive=True):
                found.setdefault(c.pid, c)
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def _read_info(root: Path) -> dict | None:
    f = root / "cluster.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _is_up(root: Path) -> bool:
    return any("gcs_server" in " ".join(p.cmdline()) for p in _alive(cluster_processes(root)))


def _alive(procs: list) -> list:
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def client_env(info: dict) -> dict[str, str]:
    """What a client (ray job submit, the Jobs SDK, flywheel schedule) needs in its environment."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": info["token_path"],
            "RAY_API_SERVER_ADDRESS": info["dashboard_url"]}


def _wait_for_dashboard(info: dict, timeout: float) -> None:
    token = Path(info["token_path"]).read_text().strip()
    url = info["dashboard_url"] + "/api/version"
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(1)
    raise RuntimeError(f"the dashboard at {url} did not answer within {timeout:.0f} s ({last})")


def start(root: str | Path = DEFAULT_DIR, num_cpus: int = 2, dashboard_host: str = "127.0.0.1",
          timeout: float = 180) -> dict:
    """Start the head (or find it running) and return its info (also in <root>/cluster.json)."""
    root = Path(root).resolve()
    info = _read_info(root)
    if info and _is_up(root):
        return info | {"already_running": True}
    if len(str(root / "ray" / "session_2099-01-01_00-00-00_000000_99999" / "sockets" / "plasma_store")) > 107:
        raise ValueError(f"--dir {root}: too long; Ray's Unix socket paths under it would exceed 107 characters")
    root.mkdir(parents=True, exist_ok=True)
    token_path = root / "auth_token"
    if not token_path.is_file() or not token_path.read_text().strip():
        token_path.write_text(secrets.token_hex(32))
    token_path.chmod(0o600)

    # The last head's ports again when all are free: clients that hold its addresses (a running `flywheel
    # schedule`, a shell that sourced env.sh) reach the restarted cluster without being told.
    ports = _reusable_ports(info)
    for attempt in (1, 2):  # a port found free can be taken by someone else before Ray binds it: retry once
        ports = ports or _fresh_ports()
        try:
            info = _start_head(root, token_path, num_cpus, dashboard_host, timeout, ports)
            break
        except (RuntimeError, subprocess.TimeoutExpired):  # a slow `ray start` leaves daemons: stop them too,
            stop(root, ports=ports)                         # the client server by its ports (no cluster.json)
            ports = None
            if attempt == 2:
                raise
    (root / "cluster.json").write_text(json.dumps(info, indent=2))
    (root / "env.sh").write_text("# source this file to talk to the cluster (ray job submit, flywheel schedule)\n"
                                 + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in client_env(info).items()))
    _wait_for_dashboard(info, timeout)
    return info


PORT_NAMES = ("gcs", "dashboard", "client", "node_manager", "object_manager", "agent_listen", "agent_grpc",
              "runtime_env_agent", "metrics")


def _reusable_ports(info: dict | None) -> dict | None:
    """The ports of this directory's last head, if every one (the worker range included) is free now."""
    ports = (info or {}).get("ports")
    if not ports or set(ports) != {*PORT_NAMES, "min_worker", "max_worker"}:
        return None
    wanted = [ports[n] for n in PORT_NAMES] + list(range(ports["min_worker"], ports["max_worker"] + 1))
    return ports if all(_bindable(p) for p in wanted) else None


def _fresh_ports() -> dict:
    singles, (wlo, whi) = _free_ports(len(PORT_NAMES), WORKER_PORTS)
    return dict(zip(PORT_NAMES, singles)) | {"min_worker": wlo, "max_worker": whi}


def _start_head(root: Path, token_path: Path, num_cpus: int, dashboard_host: str, timeout: float,
                ports: dict) -> dict:
    wlo, whi = ports["min_worker"], ports["max_worker"]
    venv_bin = Path(sys.executable).parent
    cmd = [str(venv_bin / "ray"), "start", "--head", "--temp-dir", str(root / "ray"),
           "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus), "--disable-usage-stats",
           "--port", str(ports["gcs"]), "--dashboard-host", dashboard_host, "--dashboard-port", str(ports["dashboard"]),
           "--ray-client-server-port", str(ports["client"]), "--node-manager-port", str(ports["node_manager"]),
           "--object-manager-port", str(ports["object_manager"]),
           "--dashboard-agent-listen-port", str(ports["agent_listen"]),
           "--dashboard-agent-grpc-port", str(ports["agent_grpc"]),
           "--runtime-env-agent-port", str(ports["runtime_env_agent"]),
           "--metrics-export-port", str(ports["metrics"]),
           "--min-worker-port", str(wlo), "--max-worker-port", str(whi)]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN")}
    # The venv first on the PATH: a job's `python` is the first the raylet finds.
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path),
            "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"}
    # `ray start` gives the dashboard 60 s by default, a loaded box may need more: it gets the start's timeout
    env.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", str(int(timeout)))
    with open(root / "start.log", "a") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"ray start failed (exit {proc.returncode}); see {root / 'start.log'}")
    return {"dir": str(root), "temp_dir": str(root / "ray"), "token_path": str(token_path),
            "gcs_address": f"127.0.0.1:{ports['gcs']}", "dashboard_url": f"http://127.0.0.1:{ports['dashboard']}",
            "client_address": f"ray://127.0.0.1:{ports['client']}", "ports": ports, "num_cpus": num_cpus,
            "python": str(venv_bin / "python")}


def signal_all(procs: list, how: str) -> None:
    """`how` = terminate | kill, on each process; one that already exited is skipped."""
    import psutil

    for p in procs:
        try:
            getattr(p, how)()
        except psutil.NoSuchProcess:
            pass


def stop(root: str | Path = DEFAULT_DIR, grace: float = 10, ports: dict | None = None) -> list[int]:
    """Stop this cluster's processes only (SIGTERM, then SIGKILL after `grace` s); returns their pids.
    ports: see cluster_processes."""
    import psutil

    root = Path(root).resolve()
    procs = cluster_processes(root, ports)
    signal_all(procs, "terminate")
    _, alive = psutil.wait_procs(procs, timeout=grace)
    signal_all(alive, "kill")
    psutil.wait_procs(alive, timeout=5)
    # Processes started while we were stopping (a worker the raylet was spawning) are caught by a second pass.
    late = _alive(cluster_processes(root, ports))
    for p in late:
        p.kill()
    return sorted({p.pid for p in procs} | {p.pid for p in late})


def describe(info: dict) -> str:
    env = Path(info["dir"]) / "env.sh"
    return "\n".join([
        f"Ray head (token auth on) in {info['dir']}",
        f"  GCS address:   {info['gcs_address']}   (ray.address for drivers on this box)",
        f"  dashboard:     {info['dashboard_url']}   (Jobs API and dashboard: both want the token)",
        f"  token:         {info['token_path']}",
        "Submit a job:",
        f"  source {env}",
        "  .venv/bin/ray job submit --working-dir . -- python jobs/iteration.py --config configs/local.yaml "
        "run.workdir=$PWD/runs/local",
        "Schedule iterations:",
        f"  source {env} && .venv/bin/flywheel schedule --config configs/local.yaml --every 6h "
        "run.workdir=$PWD/runs/local",
        f"Stop it:  bash cluster/start_local.sh stop --dir {info['dir']}",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--dir", default=os.environ.get("FLYWHEEL_RAY_DIR", DEFAULT_DIR),
                    help="Directory that owns the cluster (temp dir, token, addresses). Keep it short.")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs the head offers to Ray.")
    ap.add_argument("--dashboard-host", default="127.0.0.1", help="Address the dashboard (Jobs API) binds to.")
    ap.add_argument("--json", action="store_true", help="Print the cluster info as JSON (start/status).")
    args = ap.parse_args(argv)
    root = Path(args.dir).resolve()
    if args.action == "start":
        info = start(root, args.num_cpus, args.dashboard_host)
        print(json.dumps(info) if args.json else ("(already running) " if info.get("already_running") else "")
              + describe(info))
        return 0
    if args.action == "status":
        info = _read_info(root)
        if not info or not _is_up(root):
            print(f"no cluster running in {root}")
            return 1
        print(json.dumps(info) if args.json else describe(info))
        return 0
    pids = stop(root)
    print(f"stopped {len(pids)} processes of the cluster in {root}" if pids else f"no cluster running in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
