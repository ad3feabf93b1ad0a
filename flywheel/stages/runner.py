"""The thin Ray Data wrapper every data-plane stage shares: read dataset(s) → map a pure core → write a dataset.

A stage's logic is a *core*: a class whose constructor loads what it needs (a model, a world) and whose
`__call__(rows) -> CoreOutput` maps input rows to output rows plus quarantined items. Cores know nothing of Ray
and are tested alone. This module shards the input, places the cores as an actor pool with the stage's
resources from config, validates outputs inside the actors (so bad rows are caught where they are made), and
writes the output dataset + quarantine + manifest, logging counts and throughput to the stage's MLflow run.

The driver never holds the stage's rows: it verifies the inputs streaming (datasets.verify_dataset), hands Ray
Data one small descriptor per batch (its index), and each actor reads its batch's input rows from storage
(RowRangeReader), runs the core, validates, and writes the batch's valid rows as one part of the output
dataset (part-<batch>.parquet) itself. The driver receives per batch only counts, the part's name and size, the
rows' content-hash lines and the quarantine items, in input order, and writes quarantine.parquet and the
manifest (datasets.PartsWriter). Storage must be shared by every node (a storage URI, never node-local paths).

An output whose manifest already records the same stage-config hash and the same upstream content hashes is
not recomputed: that is what makes a killed iteration resumable stage by stage.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flywheel import storage
from flywheel.config import StageResources
from flywheel.datasets import (Manifest, MissingManifest, PartsWriter, RowRangeReader, UpstreamRef, read_data_file,
                               read_manifest, verify_dataset, verify_dataset_files, write_part)
from flywheel.records import RecordLimits, json_safe, restore_raw, to_table, validate
from flywheel.stages import finished_batches

log = logging.getLogger(__name__)


class CapReached(RuntimeError):
    """A stage stopped at its cap (e.g. an API teacher's cost): not a failure of its work, which is kept."""


class _CapLedger:
    """What a capped stage's batches have cost so far, over all its actors and nodes (one small Ray actor per
    stage). The driver reads batches in input order, so one slow batch hides what later ones, finished by other
    actors, cost: each actor asks here before it starts a batch, and only the batches already running when the cap
    was passed (at most one per actor) add to the bill."""

    def __init__(self, cap: float, spent: float):
        self.cap, self.spent = cap, spent

    def passed(self) -> tuple[bool, float]:
        return self.spent > self.cap, self.spent

    def add(self, cost: float) -> None:
        self.spent += cost


@dataclass
class CoreOutput:
    rows: list[dict] = field(default_factory=list)
    quarantined: list[dict] = field(default_factory=list)  # {kind, index, reason, field, raw}
    # Counters of this batch's work that add up over the stage (e.g. an HTTP engine's tokens and cost): summed
    # over every batch and actor, logged to the stage's run and kept on its StageResult. Never in the records.
    counters: dict[str, float] = field(default_factory=dict)


@dataclass
class StageResult:
    manifest: Manifest
    skipped: bool
    rows_in: int
    seconds: float
    # Where the batches ran (a side channel, never in the records): node id -> {batches, rows_in, actors: [
    # "<actor id>/<pid>"]}. An actor id with two pids is an actor Ray restarted (e.g. after its node was lost).
    placement: dict[str, dict] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # CoreOutput.counters summed over the batches
    batches_kept: int = 0  # batches an interrupted attempt finished, taken as they were (finished_batches)
    rows_made: int = 0  # input rows this attempt ran (rows_in less the kept batches'): what `seconds` timed

    @property
    def actor_restarts(self) -> int:
        """Restarts of the stage's actors that went on to process a batch (distinct pids per actor id - 1)."""
        pids: dict[str, set[str]] = {}
        for p in self.placement.values():
            for a in p["actors"]:
                actor, _, pid = a.partition("/")
                pids.setdefault(actor, set()).add(pid)
        return sum(len(v) - 1 for v in pids.values())


class _CoreActor:
    """map_batches adapter: for each batch index it is given, read the batch's input rows from storage, run the
    core, validate its rows, write them as the batch's part of the output, and return one small row of metadata.

    The valid rows go to storage (images stay binary, and never pass through the driver); the returned row holds
    the part's name, size and content-hash lines, the quarantine as JSON (its `index` relative to the batch) and
    where the batch ran. A retried batch (its actor or node lost) rewrites the same part file."""

    def __init__(self, core_factory: Callable[[], Any], kind: str, limits: RecordLimits, source: str,
                 source_manifest: Manifest, source_file_rows: list[int], output: str, batch_size: int, run_key: str,
                 cap: tuple[str, Any] | None = None):
        import ray

        self.cap = cap  # (counter, the stage's _CapLedger actor) or None
        self.core = core_factory()
        self.kind, self.limits, self.output, self.batch_size, self.run_key = kind, limits, output, batch_size, run_key
        self.reader = RowRangeReader(source, source_manifest, read_rows=batch_size, file_rows=source_file_rows)
        self.n_rows = source_manifest.row_count
        ctx = ray.get_runtime_context()  # where this actor runs: reported with each batch (stats, not records)
        self.node, self.actor = ctx.get_node_id(), f"{ctx.get_actor_id()}/{os.getpid()}"

    def __call__(self, batch: pa.Table) -> dict[str, list]:
        import ray

        res: dict[str, list] = {k: [] for k in _BATCH_FIELDS}
        for i in batch.column("batch").to_pylist():
            passed, spent = ray.get(self.cap[1].passed.remote()) if self.cap else (False, 0.0)
            if passed:  # not started, not paid: the driver stops the stage when it reaches this batch
                meta = {"batch": i, "n_in": 0, "part": "", "rows": 0, "lines": b"", "size": 0, "quarantine": "[]",
                        "node": self.node, "actor": self.actor, "counters": "{}", "capped": spent}
                for k in _BATCH_FIELDS:
                    res[k].append(meta[k])
                continue
            start = i * self.batch_size
            rows = self.reader.read(start, min(start + self.batch_size, self.n_rows)).to_pylist()
            out = self.core(rows)
            valid, bad = validate(self.kind, out.rows, self.limits)
            part = write_part(self.output, i, self.kind, to_table(self.kind, valid))
            del valid
            quarantine = [{**q, "raw": json_safe(q.get("raw"))} for q in [*out.quarantined, *bad]]
            meta = {"batch": i, "n_in": len(rows), **part, "quarantine": json.dumps(quarantine), "node": self.node,
                    "actor": self.actor, "counters": json.dumps(out.counters), "capped": 0.0}
            finished_batches.record(self.output, self.run_key, i, meta)
            if self.cap:
                ray.get(self.cap[1].add.remote(float(out.counters.get(self.cap[0], 0.0))))
            for k in _BATCH_FIELDS:
                res[k].append(meta[k])
        return res


# capped: 0.0 for a batch made, else what the stage had cost (> its cap > 0) when its actor declined to start it
_BATCH_FIELDS = ("batch", "n_in", "part", "rows", "lines", "size", "quarantine", "node", "actor", "counters",
                 "capped")


class _Progress:
    """The share of a running stage's batches done, as metrics of its MLflow run (`progress.batches`,
    `progress.fraction`, stepped by batches done): a long stage is followed in the MLflow UI while it runs, not
    only once it ends. At most one log every PROGRESS_EVERY_S seconds, and the last."""

    def __init__(self, n_batches: int, tracked: bool):
        self.n, self.tracked, self.last = n_batches, tracked, 0.0

    def batch_done(self, done: int) -> None:
        now = time.monotonic()
        if not self.tracked or (done < self.n and now - self.last < PROGRESS_EVERY_S):
            return
        import mlflow

        self.last = now
        mlflow.log_metrics({"progress.batches": done, "progress.fraction": done / self.n}, step=done)


PROGRESS_EVERY_S = 15.0


def _absolute(uri: str) -> str:
    """A plain path made absolute in the driver: actors on other nodes run in other working directories."""
    return uri if storage.is_uri(uri) else os.path.abspath(os.path.expanduser(uri))


def _samples(output: str, manifest: Manifest, parts: int = 4) -> list[dict]:
    """Rows of a few parts spread over the output (first, ..., last): enough for log_samples, never all rows."""
    names = manifest.files
    picked = sorted({round(k * (len(names) - 1) / max(parts - 1, 1)) for k in range(parts)}) if names else []
    return [r for k in picked for r in read_data_file(output, names[k], manifest.kind).to_pylist()]


def up_to_date(output: str, stage_hash: str, upstream: list[Manifest]) -> Manifest | None:
    """The manifest at `output` if it was written with `stage_hash` from exactly `upstream` (by content), else None."""
    try:
        m = read_manifest(output)
    except MissingManifest:
        return None
    want = [UpstreamRef(path=u.path, content_hash=u.content_hash) for u in upstream]
    if m.config_hash == stage_hash and [u.content_hash for u in m.upstream] == [u.content_hash for u in want]:
        return m
    return None


def run_stage(
    name: str,
    *,
    inputs: list[str],
    output: str,
    kind: str,
    core_factory: Callable[[], Any],
    resources: StageResources,
    batch_size: int,
    stage_hash: str,
    limits: RecordLimits | None = None,
    tracker: Any = None,
    cap: tuple[str, float] | None = None,
) -> StageResult:
    """Run one stage over the rows of `inputs[0]` (other inputs are context the core reads itself). cap: (counter,
    limit): the stage stops with CapReached once the counter summed over finished batches passes the limit; from
    then on no actor starts a batch."""
    import ray

    from flywheel.raycluster import ActorsDidNotStart, actor_ask, ask_text, warn_if_no_node_fits

    limits = limits or RecordLimits()
    # each input verified once, streaming (never held whole); the first is the stage's input, read by the actors
    source, file_rows = verify_dataset_files(inputs[0])
    upstream = [source, *(verify_dataset(uri) for uri in inputs[1:])]
    done = up_to_date(output, stage_hash, upstream)
    if done is not None:
        log.info("stage %s: %s is up to date (%d rows); skipped", name, output, done.row_count)
        return StageResult(done, skipped=True, rows_in=upstream[0].row_count if upstream else 0, seconds=0.0)

    t0 = time.perf_counter()
    n_batches = -(-source.row_count // batch_size)
    run_key = finished_batches.key(stage_hash, [u.content_hash for u in upstream], batch_size)
    kept = finished_batches.load(_absolute(output), run_key, n_batches, kind)  # an interrupted attempt's batches
    todo = [i for i in range(n_batches) if i not in kept]
    writer = PartsWriter(output, kind, config_hash=stage_hash, producer=name, upstream=upstream)
    n_in, placement, counters = 0, {}, Counter()
    progress = _Progress(n_batches, tracker is not None)
    short = warn_if_no_node_fits(f"stage {name}: each of its actors", resources) if todo else None
    ledger = None
    if cap is not None and todo:  # kept batches were paid for too
        spent = sum(float(json.loads(m["counters"]).get(cap[0], 0.0)) for m in kept.values())
        ledger = ray.remote(_CapLedger).options(num_cpus=0).remote(cap[1], spent)
    made = iter(())
    try:
        if todo:
            ctx = ray.data.DataContext.get_current()
            ctx.execution_options.preserve_order = True  # same input, same output order: ids and hashes are stable
            # One block per batch: Ray Data hands an actor a whole block per task, so a single block would send
            # every batch to one actor (and one node) whatever the pool's size. A block holds a batch's index only:
            # the actor reads the batch's rows from storage.
            ds = ray.data.from_items([{"batch": i} for i in todo], override_num_blocks=len(todo))
            # A lost node's actors are restarted wherever the resources exist and their batches retried there: Ray
            # Data's actor pool defaults (max_restarts=-1, max_task_retries=-1), which the stage's exactly-once
            # output depends on (tests/stages/test_runner.py checks them). Passing them again here is a deprecated
            # `ray_remote_args` use in Ray 2.60, removed in 2.64.
            made = iter(ds.map_batches(
                _CoreActor,
                fn_constructor_kwargs={"core_factory": core_factory, "kind": kind, "limits": limits,
                                       "source": _absolute(inputs[0]), "source_manifest": source,
                                       "source_file_rows": file_rows, "output": _absolute(output),
                                       "batch_size": batch_size, "run_key": run_key,
                                       "cap": (cap[0], ledger) if ledger else None},
                batch_size=1,  # one batch index per call
                batch_format="pyarrow",
                compute=ray.data.ActorPoolStrategy(size=resources.actors),
                num_cpus=resources.num_cpus,
                num_gpus=resources.num_gpus,
                resources=dict(resources.resources) or None,
            ).iter_rows())  # streamed, in input order (preserve_order): one batch's metadata at a time
        for expected in range(n_batches):
            part = kept.get(expected) or next(made, None)
            if part is None or int(part["batch"]) != expected:
                got = "nothing" if part is None else f"batch {part['batch']}"
                raise RuntimeError(f"stage {name}: {got} came back where batch {expected} was due")
            if part.get("capped"):  # its actor found the cap passed by batches the driver has not read yet
                raise CapReached(f"stage {name}: {cap[0]} {part['capped']:.4g} passed its cap {cap[1]:g} with "
                                 f"batches left ({expected} of {n_batches} read in order); the finished batches are "
                                 "kept: raise the cap and run again to go on")
            writer.add_part(part["part"], int(part["rows"]), part["lines"], int(part["size"]))
            writer.add_quarantined({**q, "index": n_in + int(q.get("index") or 0), "raw": restore_raw(q["raw"])}
                                   for q in json.loads(part["quarantine"]))
            n_in += int(part["n_in"])
            counters.update(json.loads(part["counters"]))
            if cap is not None and counters[cap[0]] > cap[1] and expected + 1 < n_batches:  # work left to stop
                raise CapReached(f"stage {name}: {cap[0]} {counters[cap[0]]:.4g} passed its cap {cap[1]:g} after "
                                 f"{expected + 1} of {n_batches} batches; the finished batches are kept: raise the cap "
                                 "and run again to go on")
            progress.batch_done(expected + 1)
            p = placement.setdefault(part["node"], {"batches": 0, "rows_in": 0, "actors": []})
            p["batches"] += 1
            p["rows_in"] += int(part["n_in"])
            if part["actor"] not in p["actors"]:
                p["actors"].append(part["actor"])
        if next(made, None) is not None:
            raise RuntimeError(f"stage {name}: more batches came back than the {n_batches} sent")
        if n_in != source.row_count:  # every input row through exactly once, retried batches included
            raise RuntimeError(f"stage {name}: {n_in} rows came back from {source.row_count} input rows")
        manifest = writer.finish()
        finished_batches.clear(_absolute(output))
    except ray.exceptions.GetTimeoutError as e:  # Ray Data's wait_for_min_actors_s (set by ray.wait_for_actors_s)
        writer.abort()
        if "starting actors" not in str(e):
            raise
        wait = ray.data.DataContext.get_current().wait_for_min_actors_s
        raise ActorsDidNotStart(f"stage {name}: its {resources.actors} actor(s) did not start in {wait:g} s "
                                f"(ray.wait_for_actors_s): each asks {ask_text(actor_ask(resources))}; "
                                f"{short or 'a live node has that, but it was not free'}") from e
    except BaseException:
        writer.abort()
        raise
    finally:
        if hasattr(made, "close"):  # a stage stopped early shuts its Ray Data execution down now, not at exit
            made.close()
        if ledger is not None:
            ray.kill(ledger)
    seconds = time.perf_counter() - t0
    made_in = n_in - sum(int(m["n_in"]) for m in kept.values())
    result = StageResult(manifest, skipped=False, rows_in=n_in, seconds=seconds, placement=placement,
                         counters=dict(counters), batches_kept=len(kept), rows_made=made_in)
    log.info("stage %s: %d rows in → %d out, %d quarantined, %.1f s → %s; batches per node %s, actor restarts %d, "
             "batches kept from an interrupted attempt %d", name, n_in, manifest.row_count, manifest.quarantined,
             seconds, output, {k[:8]: v["batches"] for k, v in placement.items()}, result.actor_restarts, len(kept))
    if manifest.quarantined:
        log.info("stage %s: why %d rows were quarantined: flywheel data --dataset %s", name, manifest.quarantined,
                 output)
    if tracker is not None:
        import mlflow

        from flywheel.review import log_samples

        mlflow.log_metrics({"rows_in": n_in, "rows_out": manifest.row_count, "quarantined": manifest.quarantined,
                            "seconds": seconds, "items_per_s": made_in / seconds if seconds else 0.0,
                            "ray.nodes": len(placement), "ray.actor_restarts": result.actor_restarts,
                            "batches_kept": len(kept)})
        mlflow.log_dict(placement, "ray/placement.json")
        if counters:
            mlflow.log_metrics(dict(counters))
        tracker.log_manifest(manifest)
        log_samples(_samples(output, manifest), kind, name)
    return result
