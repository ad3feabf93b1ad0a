"""Retention: deleting what old iterations keep on storage and nothing reads any more.

A schedule every 6 hours adds four iterations a day, each with its candidates (images), judgments and pairs; on a
shared store that is what fills it. An old iteration's datasets are read again only where
- a kept dataset names them upstream (every iteration's gold sets come from iteration 0's prompts);
- a preference pool still waits for them: a policy's update pools the pairs of the earlier iterations that sampled
  the same policy, and `preferences.relabel_pool` ranks their samples again (flywheel/preference_pool.py);
- the iteration is unfinished, and a resume reads them.
So `plan` keeps whole the newest `keep` finished iterations and every unfinished one; of the older ones it keeps
the preference data a pool may read, and every dataset anything kept names upstream (matched by its path below the
storage root, so a store that moved still matches), transitively; their other datasets go, with any attempt that
never wrote its manifest. What a pruned iteration keeps beside them (its record, stage clock) is what reports,
pools and resumes read; its `pruned.json` says what went and when. MLflow runs keep their artifacts. `plan_for`
adds the checkpoints of the trainings pruned iterations registered, this node's local copies of the versions they
registered and, with storage.prune_model_versions, those versions themselves (flywheel/retention_models.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow.fs as pafs

from flywheel import retention_models, storage, workdir_lock
from flywheel.config import Config
from flywheel.datasets import MANIFEST, Manifest, ManifestMismatch, read_manifest
from flywheel.iteration_record import IterationRecord
from flywheel.preference_pool import pooled_iterations
from flywheel.retention_models import LocalCopy, Version
from flywheel.train.launcher import run_dir

log = logging.getLogger(__name__)
MARKER = "pruned.json"
ITERATIONS = "iterations"
NOT_DATASETS = ("checkpoints",)  # beside the datasets under the storage root (flywheel/train/launcher.py)
POOLED_ROLES = ("policy", "generator")
# what a pool reads of an earlier iteration: its pairs, and to rank its samples again (preferences.relabel_pool)
# their prompts and candidates; relabelled pairs go to pref-relabel (flywheel/iteration.py _pool, _relabel)
POOL_READS = ("pref-prompts", "pref-candidates", "pref-curated", "pref-relabel")
WENT = ("datasets", "checkpoints", "model_copies", "model_versions")  # the parts of pruned.json


class UnreadableManifest(RuntimeError):
    """A manifest on storage cannot be read: what it names upstream is unknown, so nothing is pruned."""


@dataclass
class Found:
    name: str  # under its iteration (curated/sft), or under the storage root for shared ones (gold/id-test/...)
    uri: str
    manifest: Manifest | None  # None: an attempt that never wrote its manifest


@dataclass
class Plan:
    root: str  # the storage root
    keep: int
    kept: dict[int, str]  # iteration -> why it is kept whole
    pruned: dict[int, list[Found]] = field(default_factory=dict)  # iteration -> what goes (may be empty)
    referenced: dict[str, str] = field(default_factory=dict)  # uri in a pruned iteration that stays -> why
    # iteration -> the Ray Train run folders (checkpoints) of its registered trainings that go (plan_for)
    runs: dict[int, list[str]] = field(default_factory=dict)
    # iteration -> the local copies (<workdir>/registry/<name>/<version>-<run>) of versions it registered that go
    copies: dict[int, list[LocalCopy]] = field(default_factory=dict)
    # iteration -> the registered versions it made that go (storage.prune_model_versions)
    versions: dict[int, list[Version]] = field(default_factory=dict)
    # weights of versions an earlier prune deleted from the registry and then failed to delete (plan_for)
    orphans: list[Version] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # uri of what goes -> its bytes
    when: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    records: dict[int, IterationRecord | None] = field(default_factory=dict)  # as plan read them

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def datasets(self) -> int:
        return sum(len(v) for v in self.pruned.values())

    @property
    def checkpoint_runs(self) -> int:
        return sum(len(v) for v in self.runs.values())

    @property
    def model_copies(self) -> int:
        return sum(len(v) for v in self.copies.values())

    @property
    def model_versions(self) -> int:
        return sum(len(v) for v in self.versions.values())

    @property
    def deletes(self) -> bool:
        return bool(self.orphans) or any(self.going(n) for n in self.pruned)

    def counts(self) -> str:
        orphans = f" (and the weights of {len(self.orphans)} deleted earlier)" if self.orphans else ""
        return (f"{self.datasets} datasets, {self.checkpoint_runs} training checkpoint runs, {self.model_copies} "
                f"local model copies and {self.model_versions} registered model versions{orphans}")

    def iteration_dir(self, n: int) -> str:
        return _iteration_dir(self.root, n)

    def going(self, n: int) -> list[str]:
        """The URIs iteration n loses: its datasets, its trainings' checkpoint runs, their versions' local copies
        and weights."""
        return [*(f.uri for f in self.pruned.get(n, [])), *self.runs.get(n, []),
                *(str(c.path) for c in self.copies.get(n, [])), *(v.source for v in self.versions.get(n, []))]

    def bytes_of(self, n: int) -> int:
        return sum(self.sizes[uri] for uri in self.going(n))


def plan(storage_uri: str, keep: int, registry: dict[str, str]) -> Plan:
    """What `prune` would delete under `storage_uri`, keeping the newest `keep` finished iterations whole.
    `registry`: role -> its registered model's name (cfg.train.registry), whose gate decisions end a pool."""
    if keep < 1:
        raise ValueError(f"keep {keep}: at least the newest finished iteration is kept")
    def dirs(n: int) -> str:
        return _iteration_dir(storage_uri, n)

    numbers = sorted(int(d) for d in storage.subdirs(storage.join(storage_uri, ITERATIONS)) if d.isdigit())
    records = {n: IterationRecord.load(dirs(n)) for n in numbers}
    finished = [n for n in numbers if records[n] is not None and records[n].finished]
    kept = {n: "unfinished: a resume reads it" for n in numbers if n not in finished}
    kept |= {n: f"one of the newest {keep} finished" for n in finished[-keep:]}
    found = {n: list(_walk(dirs(n), "")) for n in numbers}
    pooled = {}  # uri -> why: the preference data of iterations a pool may read (the rest of them may go)
    for n, role in _pooled(records, registry):
        if n not in kept:
            pooled |= {f.uri: f"waits in the {role}'s preference pool" for f in found[n]
                       if f.name.split("/")[0] in POOL_READS and f.uri not in pooled}
    shared = [f for d in storage.subdirs(storage_uri) if d not in (ITERATIONS, *NOT_DATASETS)
              for f in _walk(storage.join(storage_uri, d), d)]
    roots = shared + [f for n in kept for f in found[n]] + [f for n in found for f in found[n] if f.uri in pooled]
    made_into = _referenced(storage_uri, roots, [f for n in numbers if n not in kept for f in found[n]])
    referenced = pooled | {uri: f"made into {by.removeprefix(storage_uri.rstrip('/') + '/')}"
                           for uri, by in made_into.items() if uri not in pooled}
    out = Plan(storage_uri, keep, dict(sorted(kept.items())), referenced=referenced, records=records)
    for n in finished:
        if n not in kept:
            out.pruned[n] = [f for f in found[n] if f.uri not in referenced]
            out.sizes |= {f.uri: _bytes(f.uri) for f in out.pruned[n]}
    return out


def apply(p: Plan, cfg: Config | None = None) -> None:
    """Delete what `p` prunes and note it in each pruned iteration's pruned.json (added to an earlier prune's);
    `cfg` names the registry its registered versions are deleted from."""
    if (p.model_versions or p.orphans) and cfg is None:
        raise ValueError("the plan deletes registered versions: apply(plan, cfg) names their registry")
    for v in p.orphans:  # first: an earlier prune's, already noted in its iteration's pruned.json
        retention_models.delete_weights(cfg, v)
        log.info("retention: the weights of %s, which an earlier prune failed to delete, deleted (%.1f MB)",
                 v.label(), p.sizes[v.source] / 1e6)
    for n, gone in p.pruned.items():
        runs, copies, versions = p.runs.get(n, []), p.copies.get(n, []), p.versions.get(n, [])
        if not p.going(n):
            continue
        it_dir = p.iteration_dir(n)
        marker = storage.join(it_dir, MARKER)
        before = json.loads(storage.read_bytes(marker)) if storage.exists(marker) else {"datasets": {}}
        before["datasets"] |= {f.name: {"rows": f.manifest.row_count if f.manifest else None,
                                        "content_hash": f.manifest.content_hash if f.manifest else None,
                                        "bytes": p.sizes[f.uri], "pruned_at": p.when} for f in gone}
        before["checkpoints"] = before.get("checkpoints", {}) | {
            storage.name(uri): {"uri": uri, "bytes": p.sizes[uri], "pruned_at": p.when} for uri in runs}
        before["model_copies"] = before.get("model_copies", {}) | {
            c.label(): {"path": str(c.path), "bytes": p.sizes[str(c.path)], "pruned_at": p.when} for c in copies}
        before["model_versions"] = before.get("model_versions", {}) | {
            v.label(): {"source": v.source, "run_id": v.run_id, "bytes": p.sizes[v.source], "pruned_at": p.when}
            for v in versions}
        before |= {"pruned_at": p.when, "keep_iterations": p.keep,
                   "kept": {f.name: by for f in _walk(it_dir, "") if (by := p.referenced.get(f.uri))}}
        storage.write_bytes(marker, json.dumps(before, indent=1).encode())  # first: a prune killed midway is named
        for f in gone:
            storage.remove_dir(f.uri)
            _remove_empty_parents(it_dir, f.name)
        for uri in [*runs, *(str(c.path) for c in copies)]:
            storage.remove_dir(uri)
        for v in versions:
            retention_models.delete_version(cfg, v)
        log.info("retention: iteration %d: %d datasets, %d training checkpoint runs, %d local model copies and %d "
                 "registered versions deleted (%.1f MB)", n, len(gone), len(runs), len(copies), len(versions),
                 p.bytes_of(n) / 1e6)


def plan_for(cfg: Config, keep: int | None = None) -> Plan:
    """`plan` for the config's storage, keeping `keep` (default storage.keep_iterations) finished iterations, and
    what the trainings of pruned iterations left (flywheel/retention_models.py):
    - their Ray Train checkpoints: a registered version's weights are in MLflow (an identical training reuses
      it), so its run's final checkpoint (train.prune_registered keeps it) is a second copy - of a whole SDXL UNet,
      say. A run a kept iteration also names stays;
    - this node's local copies of the versions they registered (`<workdir>/registry`: downloaded to load, and
      merged into their base when they are adapters - a whole 7B model each), unless a kept iteration names the
      version (its start models, its gates' challengers and champions) or an alias points at it (champion,
      lineage). They are copies: a version needed again is downloaded again from MLflow;
    - with storage.prune_model_versions, those versions themselves (their weights in MLflow and their registry
      entry) on the same terms, and unless a gate promoted them (of those, storage.keep_promoted keeps the newest)."""
    keep = keep or cfg.storage.keep_iterations
    if keep is None:
        raise ValueError("how many finished iterations to keep: storage.keep_iterations is not set")
    from flywheel import track

    p = plan(cfg.storage.uri, keep, {role: getattr(cfg.train.registry, role) for role in POOLED_ROLES})
    db = track.sqlite_file(cfg.tracking.uri)
    if not p.kept and not p.pruned and db is not None and not db.exists():
        return p  # never run here: asking MLflow would create an empty tracking database in the workdir
    trained = retention_models.trainings(cfg, {n: p.records.get(n) for n in {*p.kept, *p.pruned}})
    ran_by_kept = {name for n in p.kept for name in trained[n]}
    mine = {n: {run_id for ids in trained[n].values() for run_id in ids} for n in p.pruned}
    copies = retention_models.local_copies(cfg)
    versions = retention_models.versions(cfg) if cfg.storage.prune_model_versions else []
    p.orphans = retention_models.orphaned(cfg)  # even with prune_model_versions off since: their versions went
    p.sizes |= {v.source: retention_models.artifact_bytes(v.source) for v in p.orphans}
    in_use = retention_models.in_use(cfg, p.records, p.kept, {c.name for c in copies} | {v.name for v in versions})
    keep_versions = in_use | retention_models.promoted(p.records, cfg.storage.keep_promoted)
    going = [v for v in versions if not retention_models.wanted((v.name, v.version), keep_versions)
             and any(v.run_id in ids for ids in mine.values())]
    # weights another version also points at stay (one training registers one version: not seen, but cheap)
    shared = {v.source for v in versions if v not in going}
    for n in p.pruned:
        p.runs[n] = [run_dir(cfg, name) for name, registered in sorted(trained[n].items())
                     if registered and name not in ran_by_kept and storage.exists(run_dir(cfg, name))]
        p.copies[n] = [c for c in copies if c.run_id in mine[n]
                       and not retention_models.wanted((c.name, c.version), in_use)]
        p.versions[n] = [v for v in going if v.run_id in mine[n] and v.source not in shared]
        p.sizes |= {uri: _bytes(uri) for uri in [*p.runs[n], *(str(c.path) for c in p.copies[n])]}
        p.sizes |= {v.source: retention_models.artifact_bytes(v.source) for v in p.versions[n]}
    return p


def prune(cfg: Config, keep: int | None = None) -> Plan:
    """Plan and apply with `keep` (default storage.keep_iterations), holding the workdir (an iteration's driver
    would be refused meanwhile), and tag each pruned iteration's MLflow run `flywheel.pruned`, so the run that
    shows its datasets says they went."""
    from flywheel import track

    with workdir_lock.holding(cfg.run.workdir, "retention"):
        p = plan_for(cfg, keep)
        apply(p, cfg)
    if not p.pruned:
        return p
    client = track.client(cfg)
    for n, gone in p.pruned.items():
        record = p.records.get(n)
        if p.going(n) and record is not None and record.run_id:
            went = json.loads(storage.read_bytes(storage.join(p.iteration_dir(n), MARKER)))
            count = {part: len(went.get(part, {})) for part in WENT}
            mb = sum(d["bytes"] for part in WENT for d in went.get(part, {}).values()) / 1e6
            try:  # what went in every prune so far, as pruned.json has it
                client.set_tag(record.run_id, "flywheel.pruned", f"{p.when}: {count['datasets']} datasets, "
                               f"{count['checkpoints']} training checkpoint runs, {count['model_copies']} local "
                               f"model copies and {count['model_versions']} registered model versions deleted "
                               f"({mb:.1f} MB; storage.keep_iterations {p.keep}); `flywheel data --iteration {n}` "
                               "lists what is left")
            except Exception as e:  # noqa: BLE001 - a run deleted from MLflow: the data went all the same
                log.warning("retention: iteration %d's MLflow run %s not tagged: %s", n, record.run_id, e)
    return p


def plan_json(p: Plan) -> dict:
    """The plan as data: what each iteration keeps or loses, with the bytes and the reasons."""
    pruned = {n: {"datasets": [f.name for f in gone], "checkpoint_runs": [storage.name(u) for u in p.runs.get(n, [])],
                  "model_copies": [c.label() for c in p.copies.get(n, [])],
                  "model_versions": [v.label() for v in p.versions.get(n, [])], "bytes": p.bytes_of(n)}
              for n, gone in p.pruned.items()}
    return {"keep": p.keep, "bytes": p.bytes, "kept": p.kept, "pruned": pruned, "stays": p.referenced,
            "orphaned_weights": [v.label() for v in p.orphans]}


def plan_table(p: Plan):
    """The plan for people: each iteration kept whole (and why) or pruned (what goes, what stays and why)."""
    from rich.table import Table

    table = Table(title=f"retention: the newest {p.keep} finished iterations kept whole")
    for col in ("iteration", "", "MB", "why / what stays"):
        table.add_column(col, justify="right" if col in ("iteration", "MB") else "left")
    for n in sorted({*p.kept, *p.pruned}):
        if n in p.kept:
            table.add_row(str(n), "kept", "", p.kept[n])
            continue
        here = p.iteration_dir(n) + "/"
        stays = [f"{uri[len(here):]} ({why})" for uri, why in p.referenced.items() if uri.startswith(here)]
        table.add_row(str(n), f"{len(p.pruned[n])} datasets, {len(p.runs.get(n, []))} checkpoint runs, "
                      f"{len(p.copies.get(n, []))} model copies, {len(p.versions.get(n, []))} versions go",
                      f"{p.bytes_of(n) / 1e6:.1f}", "; ".join(stays))
    for v in p.orphans:
        table.add_row("", f"weights of {v.label()} go", f"{p.sizes[v.source] / 1e6:.1f}",
                      "an earlier prune deleted the version and failed to delete its weights")
    return table


def pruned_names(iteration_dir: str) -> dict[str, str]:
    """Dataset name -> when it was pruned, from the iteration's pruned.json (empty if it never was)."""
    marker = storage.join(iteration_dir, MARKER)
    if not storage.exists(marker):
        return {}
    raw = json.loads(storage.read_bytes(marker))
    return {name: d["pruned_at"] for name, d in raw["datasets"].items()}


def _iteration_dir(storage_uri: str, n: int) -> str:
    return storage.join(storage_uri, ITERATIONS, f"{n:03d}")


def _pooled(records: dict[int, IterationRecord | None], registry: dict[str, str]) -> Iterator[tuple[int, str]]:
    """(iteration, role) for the earlier iterations a pool of the newest iteration, or of the next, may read."""
    started = [n for n, r in records.items() if r is not None]
    if not started:
        return
    newest = max(started)
    # each unfinished iteration, which pools when resumed, and the next, which starts from the newest's models
    # unless it promoted one (then its pool is empty whatever the start)
    pooling = {m: records[m].start for m in started if not records[m].finished} | {newest + 1: records[newest].start}
    for m, start in pooling.items():
        for role in POOLED_ROLES:
            for n in pooled_iterations(records.get, m, role, registry[role], start.get(role, "")):
                yield n, role


def _walk(uri: str, name: str) -> Iterator[Found]:
    """The datasets at or below `uri`: a folder with a manifest is one; a folder with files and no manifest is an
    attempt that never finished; any other folder is walked into."""
    if storage.exists(storage.join(uri, MANIFEST)):
        try:
            yield Found(name, uri, read_manifest(uri))
        except ManifestMismatch as e:
            raise UnreadableManifest(f"{uri}: {e}; fix or delete it before pruning") from e
        return
    fs, path = storage.resolve(uri)
    entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    if name and any(e.type == pafs.FileType.File for e in entries):
        yield Found(name, uri, None)
        return
    for e in sorted(entries, key=lambda e: e.base_name):
        if e.type == pafs.FileType.Directory:
            yield from _walk(storage.join(uri, e.base_name), f"{name}/{e.base_name}" if name else e.base_name)


def _referenced(storage_uri: str, roots: list[Found], candidates: list[Found]) -> dict[str, str]:
    """uri -> the kept dataset naming it upstream (directly or through others), for the candidates any root
    names. An upstream is matched by its path below the storage root (iterations/000/prompts), so a store that
    moved still matches; not by content hash, which equal datasets share (every empty one; the meta-eval's
    perturbed gold, the same in each iteration)."""
    top = storage_uri.rstrip("/") + "/"
    by_path = {f.uri.removeprefix(top): f for f in candidates if f.uri.startswith(top)}
    out: dict[str, str] = {}
    todo = [(f, f.uri) for f in roots if f.manifest is not None]
    while todo:
        f, root = todo.pop()
        for up in f.manifest.upstream:
            parts = up.path.rstrip("/").split("/")
            found = next((g for k in range(len(parts)) if (g := by_path.get("/".join(parts[k:]))) is not None), None)
            if found is not None and found.uri not in out and found.manifest is not None:
                out[found.uri] = root
                todo.append((found, root))
    return out


def _bytes(uri: str) -> int:
    fs, path = storage.resolve(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(max(i.size or 0, 0) for i in infos if i.type == pafs.FileType.File)


def _remove_empty_parents(it_dir: str, name: str) -> None:
    """After curated/sft went, curated/ too if nothing is left in it."""
    parts = name.split("/")[:-1]
    while parts:
        d = storage.join(it_dir, *parts)
        fs, path = storage.resolve(d)
        if fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
            return
        storage.remove_dir(d)
        parts.pop()
