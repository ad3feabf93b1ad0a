"""Preference pools: a policy's update waits until enough pairs of its own samples have pooled.

On the embedded default an iteration's judge-ranked pairs (~80 text, ~80 image) are too few for the DPOs to move:
LLaVA DPO needs ~100-250 steps before its held-out accuracy rises, and in ten iterations every update on one
iteration's pairs was refused (docs/results.md). An earlier iteration's pairs stay on-policy while the policy that
sampled them is the one being trained, so each iteration pools its own pairs with those of the earlier iterations
that (a) started from the same policy and (b) tried no update of it - an update, promoted or refused, consumes
its pool, and a promotion starts the next from the new policy's samples. The update runs once the pool holds
`preferences.update_min_pairs[role]` pairs. A pooled pair keeps the rating of the judge that ranked it (the
champion of its iteration, named in the row) unless preferences.relabel_pool has the current judge rank the
earlier iterations' samples again when the update is due (flywheel/preferences.py relabel). Everything is
derived from the iteration records, so a resumed or repeated iteration pools the same pairs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from flywheel import storage
from flywheel.datasets import MissingManifest, read_dataset, read_manifest, read_rows, write_dataset
from flywheel.iteration_record import IterationRecord
from flywheel.stages.runner import up_to_date

log = logging.getLogger(__name__)


def pooled_iterations(record_of: Callable[[int], IterationRecord | None], n: int, role: str, registry_name: str,
                      start: str) -> list[int]:
    """The earlier iterations whose pairs join iteration n's pool for `role`, oldest first: walking back from
    n - 1, each finished one that started from the same model (`start`) and has no gate decision on
    `registry_name` (it tried no update); the walk stops at the first that fails."""
    found = []
    for j in range(n - 1, -1, -1):
        rec = record_of(j)
        if rec is None or not rec.finished or rec.start.get(role) != start:
            break
        if any(d.get("model") == registry_name for d in rec.decisions):
            break
        found.append(j)
    return found[::-1]


@dataclass
class Pool:
    uri: str  # the pooled dataset (this iteration's pairs alone when nothing pooled)
    rows: int
    iterations: list[int]  # the iterations whose pairs it holds, this one last


def pool_pairs(kind: str, sources: dict[int, str], out_uri: str, *, config_hash: str, limits=None) -> Pool:
    """Write the union of the `kind` datasets in `sources` (iteration -> uri; a missing dataset, e.g. an iteration
    that had no champion judge to rank with, adds nothing) to out_uri, each pair once; skipped when out_uri already
    holds exactly these inputs."""
    found = {}  # iteration -> manifest: the up-to-date check needs no data (image pairs carry PNGs)
    for it, uri in sorted(sources.items()):
        try:
            found[it] = read_manifest(uri)
        except MissingManifest:
            continue
    if not found:
        return Pool(out_uri, 0, [])
    if len(found) == 1:  # nothing to pool: the one dataset as it is
        (it, m), = found.items()
        return Pool(sources[it], m.row_count, [it])
    done = up_to_date(out_uri, config_hash, list(found.values()))
    if done is not None:
        return Pool(out_uri, done.row_count, list(found))
    tables = [read_dataset(sources[it], kind) for it in found]  # verified against their manifests
    rows = _unique([t.to_pylist() for t, _ in tables], f"{kind}_id")
    m = write_dataset(out_uri, kind, rows, config_hash=config_hash, producer="pool-preferences",
                      upstream=[m for _, m in tables], limits=limits)
    return Pool(out_uri, m.row_count, list(found))


def ranked_by(curated_uri: str) -> str | None:
    """Who ranked the pairs of a pref-curated dataset (each pair names its judge; several: joined by ", "), None
    when it holds no pairs or was never written."""
    try:
        judges = {r["judge"] for r in read_rows(storage.join(curated_uri, "pairs"), "pair")}
    except MissingManifest:
        return None
    return ", ".join(sorted(judges)) or None


def _unique(tables: Iterable[list[dict]], key: str) -> list[dict]:
    """Rows of every table, the first of each id (ids are content hashes: the same pair drawn twice is one)."""
    seen, out = set(), []
    for rows in tables:
        for r in rows:
            if r[key] not in seen:
                seen.add(r[key])
                out.append(r)
    return out
