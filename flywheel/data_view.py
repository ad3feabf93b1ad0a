"""What a person asks of a dataset on storage: what it holds, where it came from, and why rows were quarantined.

A stage's MLflow run shows its quarantine count; `quarantine_reasons` says why, grouped (the stage's run carries
it as `quarantine/<dataset>.json`, and `flywheel data <dataset>` prints it). Reasons name values ("sample 3:
score 7 out of range 1-5"), so they are grouped with their numbers masked; each group keeps its first item's
reason, index and raw row as the example (images shown as their size, never their bytes)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from flywheel import storage
from flywheel.datasets import MANIFEST, Manifest, iter_quarantine, read_manifest

EXAMPLE_CHARS = 400  # of an example's raw row: enough to see what it was, not a page of JSON


def _group_key(field: str, reason: str) -> tuple[str, str]:
    return field, re.sub(r"\d+(\.\d+)?", "N", reason)[:200]


def brief(raw: Any) -> Any:
    """A raw row for people: bytes (as json_safe stores them, {"$bytes": base64}) become "<N bytes>"."""
    if isinstance(raw, dict):
        if set(raw) == {"$bytes"} and isinstance(raw["$bytes"], str):
            return f"<{len(raw['$bytes']) * 3 // 4} bytes>"
        return {k: brief(v) for k, v in raw.items()}
    return [brief(v) for v in raw] if isinstance(raw, list) else raw


def quarantine_reasons(uri: str, top: int = 10) -> dict:
    """{"total", "groups": [{"reason", "field", "count", "index", "example"}], "other"}: the `top` most frequent
    groups of a dataset's quarantine (ties in order of first appearance), and how many items the rest hold."""
    groups: dict[tuple[str, str], dict] = {}
    total = 0
    for item in iter_quarantine(uri):
        total += 1
        key = _group_key(item["field"] or "", item["reason"] or "")
        if key in groups:
            groups[key]["count"] += 1
            continue
        try:
            example = json.dumps(brief(json.loads(item["raw_json"])), ensure_ascii=False)
        except (TypeError, ValueError):  # written by us as JSON; shown as stored if it is not
            example = str(item["raw_json"])
        if len(example) > EXAMPLE_CHARS:
            example = example[:EXAMPLE_CHARS] + f"... ({len(example)} characters)"
        groups[key] = {"reason": item["reason"], "field": item["field"] or "", "count": 1, "index": item["index"],
                       "example": example}
    ranked = sorted(groups.values(), key=lambda g: -g["count"])  # stable: first appearance breaks ties
    shown = ranked[:top]
    return {"total": total, "groups": shown, "other": total - sum(g["count"] for g in shown)}


def datasets_of(names: Mapping[str, str]) -> list[tuple[str, Manifest | None]]:
    """Each named dataset's manifest, or None where it has not been written (yet)."""
    return [(name, read_manifest(uri) if storage.exists(storage.join(uri, MANIFEST)) else None)
            for name, uri in names.items()]


def latest_iteration(storage_uri: str) -> int | None:
    """The highest-numbered iteration directory under the storage root, if any has been started."""
    import pyarrow.fs as pafs

    fs, path = storage.resolve(storage.join(storage_uri, "iterations"))
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError:
        return None
    numbers = [int(i.base_name) for i in infos if i.type == pafs.FileType.Directory and i.base_name.isdigit()]
    return max(numbers, default=None)


def describe(uri: str, top: int = 10) -> dict:
    """A dataset's manifest and its quarantine's reasons (MissingManifest if it has none)."""
    m = read_manifest(uri)
    return {"uri": uri, "manifest": m.model_dump(mode="json"),
            "quarantine": quarantine_reasons(uri, top) if m.quarantined else None}


def listing_table(n: int, listed: list[tuple[str, Manifest | None]]):
    from rich.table import Table

    table = Table(title=f"iteration {n}: datasets (`flywheel data --dataset <name>` shows one)")
    for col in ("dataset", "kind", "rows", "quarantined", "producer", "written (UTC)", "path"):
        table.add_column(col, justify="right" if col in ("rows", "quarantined") else "left")
    for name, m in listed:
        if m is None:
            table.add_row(name, "", "", "", "", "not written", "")
        else:
            table.add_row(name, m.kind, str(m.row_count), str(m.quarantined) if m.quarantined else "",
                          m.producer, m.created_at[:19].replace("T", " "), m.path)
    return table


def print_description(console, shown: dict) -> None:
    m, q = shown["manifest"], shown["quarantine"]
    console.print(f"[bold]{shown['uri']}[/bold]: {m['row_count']} {m['kind']} rows, {m['quarantined']} quarantined; "
                  f"written by {m['producer']} at {m['created_at'][:19]} (content {m['content_hash'][:12]}, "
                  f"config {m['config_hash'][:12]})")
    for u in m["upstream"]:
        console.print(f"  from {u['path']} (content {u['content_hash'][:12]})")
    if not q:
        return
    console.print(f"quarantined: {q['total']}, by reason:")
    for g in q["groups"]:
        where = f" [{g['field']}]" if g["field"] else ""
        console.print(f"  {g['count']:6d}{where} {g['reason']}", markup=False)
        console.print(f"         e.g. item {g['index']}: {g['example']}", style="dim", markup=False)
    if q["other"]:
        console.print(f"  {q['other']:6d} in other groups (--top to show more)")
