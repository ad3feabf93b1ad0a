"""Labeling scale-out on the private local cluster: the judgments stage (flywheel/stages/judgments.py through the
generic runner) on one single-CPU worker node, then on two, measured in one run; and the driver's peak memory when
the stage's data is 10x larger.

    .venv/bin/python bench/labeling_scaleout.py [--prompts-per-subtask 60] [--role judge] [--repeats 2]
    .venv/bin/python bench/labeling_scaleout.py --only memory     # the driver-memory part alone

The cluster (cluster/local_cluster.py + cluster/local_nodes.py, stopped at the end; never `ray stop`): a head that
only hosts the drivers (1 CPU, no `labeling` resource) and worker nodes of 1 CPU and {labeling: 1} each, so the
stage's actors (resources.labeling = 1 CPU + 1 labeling) land one per worker node.

1. Throughput: `--role judge` (default) labels with the tiny zoo judge through transformers - a CPU-bound model
   stage; `--role teacher` uses the oracle teacher (cheap per item: it measures the runner's own overhead). With w1
   alone the stage runs 1 actor; then w2 joins and it runs 2. Each run is a fresh driver process (as a job's
   driver is) and the items/s include the actors' start and model load, as a real stage's do. The two setups
   alternate `--repeats` times and the medians are compared (the box is shared: single runs swing).
2. Driver memory: the oracle teacher over the prompts of `--memory-prompts-per-subtask` and 10x as many (two nodes),
   each in a fresh driver: the driver's RSS just before the stage and its peak during it (sampled every 20 ms;
   ru_maxrss is printed too, but it is the peak of importing torch, transformers and Ray, above the stage's).

3. Control (unless --no-control): the same core without Ray, one single-thread process on a third of the prompts,
   then two on half of those each, alternating `--repeats` times - what the machine itself gives a second process
   at that moment. On a box shared with other
   work the stage's ratio cannot beat it; the bench prints both.

Data: the oracle world's prompts and two synthetic candidates per prompt (the prompt's own images for image
tasks, a short text otherwise: the judge reads them like policy samples), written once under
runs/bench-labeling-scaleout/ with the tiny zoo (cached across runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "runs" / "bench-labeling-scaleout"  # outside /tmp: worker nodes have a private /tmp
sys.path.insert(0, str(REPO / "cluster"))
import local_cluster  # noqa: E402
import local_nodes  # noqa: E402

# configs/local.yaml's labeling as it is (judge answers of up to 128 tokens, 8 prompts per batch), one sample per item
BASE = ["world.gold.prompts_per_subtask=1", "judgments.samples_per_item=1"]


def overrides(ppsub: int) -> list[str]:
    return [f"run.workdir={WORK}", f"storage.uri={WORK}/data", f"tracking.uri=sqlite:///{WORK}/mlflow.db",
            f"world.suites.prompts_per_subtask={ppsub}", *BASE]


def data_uris(ppsub: int) -> tuple[str, str]:
    return f"{WORK}/data/p{ppsub}/prompts", f"{WORK}/data/p{ppsub}/candidates"


def make_data(ppsub: int) -> int:
    """Prompts of the oracle world and two synthetic candidates each (cached); returns the prompt count."""
    from flywheel.config import load_config
    from flywheel.datasets import MissingManifest, read_manifest, read_rows, write_dataset
    from flywheel.stages import prompts

    cfg = load_config(REPO / "configs" / "local.yaml", overrides(ppsub))
    p_uri, c_uri = data_uris(ppsub)
    prompts.run(cfg, p_uri)
    try:
        read_manifest(c_uri)
    except MissingManifest:
        rows = []
        for p in read_rows(p_uri, "prompt"):
            for k, text in enumerate(("A red circle.", "Two blue squares and a green triangle.")):
                image_task = p["task"] in ("ig", "itig")
                rows.append({"prompt_id": p["prompt_id"], "producer": "bench", "sample_index": k,
                             "output_text": None if p["task"] == "ig" else text,
                             "output_images": list(p["images"] or p["reference_images"] or []) if image_task else []})
        write_dataset(c_uri, "candidate", rows, config_hash="bench", producer="bench")
    return read_manifest(p_uri).row_count


def drive(args) -> None:
    """One stage run in this (fresh) process, a driver of the cluster; prints a JSON line."""
    info = json.loads(Path(args.cluster).read_text())
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": info["token_path"]})
    import resource

    from flywheel.config import load_config
    from flywheel.stages import judgments

    ppsub = args.ppsub
    res = f"resources.labeling={{actors: {args.actors}, num_cpus: 1, resources: {{labeling: 1}}}}"
    cfg = load_config(REPO / "configs" / "local.yaml", [*overrides(ppsub), f"ray.address={info['gcs_address']}",
                                                        res, "judge.engine=hf", "models.judge.path=zoo:judge"])
    from flywheel.raycluster import init_ray

    init_ray(cfg)
    p_uri, c_uri = data_uris(ppsub)
    out = f"{WORK}/data/p{ppsub}/labels-{args.role}-{args.actors}-{uuid.uuid4().hex[:8]}"
    sampler = RssSampler()  # the stage's own peak: ru_maxrss is the imports' peak (torch, transformers, ray)
    with sampler:
        r = judgments.run(cfg, p_uri, c_uri, out, args.role)
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"actors": args.actors, "role": args.role, "prompts": r.rows_in, "judgments":
                      r.manifest.row_count, "seconds": r.seconds, "items_per_s": r.rows_in / r.seconds,
                      "batches_per_node": sorted(p["batches"] for p in r.placement.values()),
                      "load_avg_1m": os.getloadavg()[0], "rss_before_mb": sampler.before / 2**20,
                      "rss_peak_mb": sampler.peak / 2**20, "rss_growth_mb": (sampler.peak - sampler.before) / 2**20,
                      "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


class RssSampler:
    """Peak RSS of this process while the block runs, sampled every 20 ms from a thread."""

    def __enter__(self):
        import threading

        import psutil

        self._proc, self._stop = psutil.Process(), threading.Event()
        self.before = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _bare_core(job: tuple[int, int, int, str]) -> tuple[float, float]:
    """One process of the control: the stage's core alone (no Ray), one thread, on every nparts-th prompt."""
    ppsub, part, nparts, role = job
    import torch

    torch.set_num_threads(1)
    from flywheel.config import load_config
    from flywheel.datasets import read_rows
    from flywheel.stages.judgments import JudgmentsCore

    cfg = load_config(REPO / "configs" / "local.yaml", [*overrides(ppsub), "judge.engine=hf",
                                                        "models.judge.path=zoo:judge"])
    p_uri, c_uri = data_uris(ppsub)
    rows = read_rows(p_uri, "prompt")
    mine = rows[:len(rows) // 3][part::nparts]  # a third of the stage's prompts: the control stays short
    core = JudgmentsCore(cfg, candidates_uri=c_uri, role=role)
    core(mine[:1])  # load the model before the clock starts
    t0 = time.perf_counter()
    for i in range(0, len(mine), cfg.judgments.batch_size):
        core(mine[i:i + cfg.judgments.batch_size])
    return time.perf_counter() - t0, len(mine)


def box_scaling(ppsub: int, role: str, repeats: int) -> float:
    """What this machine gives two processes over one right now: the core alone, 1 process on a third of the
    prompts vs 2 processes on half of that each, alternating `repeats` times; the ratio of the median items/s.
    On a box shared with other load this bounds the stage's ratio."""
    from multiprocessing import get_context

    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for n in (1, 2):
            with get_context("spawn").Pool(n) as pool:
                res = pool.map(_bare_core, [(ppsub, i, n, role) for i in range(n)])
            rates[n].append(sum(k for _, k in res) / max(t for t, _ in res))
            print(f"control, bare core in {n} process(es): {rates[n][-1]:.2f} prompts/s "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return statistics.median(rates[2]) / statistics.median(rates[1])


def run_driver(cluster_json: str, ppsub: int, actors: int, role: str, timeout: float = 900) -> dict:
    cmd = [sys.executable, __file__, "_drive", "--cluster", cluster_json, "--ppsub", str(ppsub), "--actors",
           str(actors), "--role", role]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"driver failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts-per-subtask", type=int, default=60, help="Throughput data: prompts per sub-task.")
    ap.add_argument("--role", choices=["judge", "teacher"], default="judge", help="Throughput: zoo judge or oracle.")
    ap.add_argument("--repeats", type=int, default=2, help="Alternating 1-node / 2-node runs.")
    ap.add_argument("--memory-prompts-per-subtask", type=int, default=10, help="Memory: 1x data (10x is 10 times).")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--only", choices=["throughput", "memory"], help="Run one part alone (memory: no throughput "
                    "runs and no control).")
    ap.add_argument("--no-control", action="store_true", help="Skip the control (the core without Ray, 1 vs 2 "
                    "processes: what the machine itself gives two processes right now).")
    args = ap.parse_args()
    if args.only == "memory" and args.skip_memory:
        ap.error("--only memory and --skip-memory exclude each other")
    throughput = args.only != "memory"
    args.skip_memory = args.skip_memory or args.only == "throughput"
    args.no_control = args.no_control or not throughput
    t_start = time.time()
    from flywheel.config import load_config
    from flywheel.models.zoo import build_zoo

    WORK.mkdir(parents=True, exist_ok=True)
    build_zoo(load_config(REPO / "configs" / "local.yaml", overrides(args.prompts_per_subtask)))
    sizes = {"throughput": make_data(args.prompts_per_subtask)} if throughput else {}
    if not args.skip_memory:
        for m in (args.memory_prompts_per_subtask, 10 * args.memory_prompts_per_subtask):
            sizes[f"memory-{m}"] = make_data(m)
    print(f"data ready in {time.time() - t_start:.0f} s: prompts {sizes}", flush=True)

    root = Path(tempfile.mkdtemp(prefix="fwb", dir="/tmp"))
    try:
        info = local_cluster.start(root, num_cpus=1)
        cluster_json = str(root / "cluster.json")
        local_nodes.add_node(info, "w1", num_cpus=1, resources={"labeling": 1})
        if throughput:
            one = [run_driver(cluster_json, args.prompts_per_subtask, 1, args.role)]
            print("1 node :", json.dumps(one[-1]), flush=True)
        local_nodes.add_node(info, "w2", num_cpus=1, resources={"labeling": 1})
        if throughput:
            two = [run_driver(cluster_json, args.prompts_per_subtask, 2, args.role)]
            print("2 nodes:", json.dumps(two[-1]), flush=True)
            for _ in range(args.repeats - 1):  # w2 stays; its `labeling` is unused by a 1-actor stage
                one.append(run_driver(cluster_json, args.prompts_per_subtask, 1, args.role))
                print("1 node :", json.dumps(one[-1]), flush=True)
                two.append(run_driver(cluster_json, args.prompts_per_subtask, 2, args.role))
                print("2 nodes:", json.dumps(two[-1]), flush=True)
            assert all(len(r["batches_per_node"]) == 1 for r in one), one
            assert all(len(r["batches_per_node"]) == 2 for r in two), two
            t1 = statistics.median(r["items_per_s"] for r in one)
            t2 = statistics.median(r["items_per_s"] for r in two)
        mem = {}
        if not args.skip_memory:
            for m in (args.memory_prompts_per_subtask, 10 * args.memory_prompts_per_subtask):
                mem[m] = run_driver(cluster_json, m, 2, "teacher", timeout=1800)
                print(f"memory, {m} prompts/sub-task:", json.dumps(mem[m]), flush=True)
    finally:
        local_cluster.stop(root)
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    control = None if args.no_control else box_scaling(args.prompts_per_subtask, args.role, args.repeats)
    if throughput:
        print(f"\nlabeling ({args.role}, {sizes['throughput']} prompts, medians of {args.repeats}): 1 node "
              f"{t1:.2f} prompts/s, 2 nodes {t2:.2f} prompts/s -> scale-out ratio {t2 / t1:.2f}x (target >= 1.3)")
    if control is not None:
        print(f"control: the bare core scales {control:.2f}x from 1 to 2 processes on this machine now (the stage "
              f"reaches {t2 / t1 / control:.0%} of that)")
    if mem:
        (a, ra), (b, rb) = sorted(mem.items())
        print(f"driver RSS during the stage (peak, growth over the driver before it): {ra['prompts']} prompts -> "
              f"{ra['rss_peak_mb']:.0f} MB (+{ra['rss_growth_mb']:.0f}); {rb['prompts']} prompts -> "
              f"{rb['rss_peak_mb']:.0f} MB (+{rb['rss_growth_mb']:.0f}): peak ratio "
              f"{rb['rss_peak_mb'] / ra['rss_peak_mb']:.2f}x, growth ratio "
              f"{rb['rss_growth_mb'] / max(ra['rss_growth_mb'], 1e-9):.1f}x for {rb['prompts'] / ra['prompts']:.0f}x "
              f"the data")
    print(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_drive":
        ap = argparse.ArgumentParser()
        ap.add_argument("_drive")
        ap.add_argument("--cluster", required=True)
        ap.add_argument("--ppsub", type=int, required=True)
        ap.add_argument("--actors", type=int, required=True)
        ap.add_argument("--role", required=True)
        drive(ap.parse_args())
    else:
        main()
