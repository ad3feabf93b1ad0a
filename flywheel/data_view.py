"""What a person asks of a dataset on storage: what it holds, where it came from, and why rows were quarantined.

A stage's MLflow run shows its quarantine count; `quarantine_reasons` says why, grouped (the stage's run carries
it as `quarantine/<dataset>.json`, and `flywheel data --dataset <name>` prints it). Reasons name values ("sample 3:
score 7 out of range 1-5"), so they are grouped with their numbers masked; each group keeps its first item's
reason, index and raw row as the example (images shown as their size, never their bytes). The judgments whose
output did not parse (rows with a parse_error, never a score) are grouped the same way, with the raw output."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any, NamedTuple

from flywheel import storage
from flywheel.datasets import MANIFEST, QUARANTINE, Manifest, iter_dataset_rows, iter_quarantine, read_manifest
from flywheel.records import json_safe

EXAMPLE_CHARS = 400  # of an example's raw row: enough to see what it was, not a page of JSON
MAX_GROUPS = 1000  # distinct reasons kept with an example; items of any further reason are counted as "other"


class ReasonGroups:
    """Items grouped by (field, reason with its numbers masked), each with its first item as the example."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], dict] = {}
        self.total = 0

    def add(self, field: str | None, reason: str | None, item: Any, example: Callable[[], str]) -> None:
        """`example` is called for a group's first item only (it may parse a raw row)."""
        self.total += 1
        field, reason = field or "", reason or ""
        key = (field, re.sub(r"\d+(\.\d+)?", "N", reason)[:200])
        if key in self.groups:
            self.groups[key]["count"] += 1
            return
        if len(self.groups) >= MAX_GROUPS:  # memory stays bounded whatever the reasons
            return
        text = example()
        if len(text) > EXAMPLE_CHARS:
            text = text[:EXAMPLE_CHARS] + f"... ({len(text)} characters)"
        self.groups[key] = {"reason": reason, "field": field, "count": 1, "item": item, "example": text}

    def add_unparsed(self, judgment: dict) -> None:
        """A judgment whose output did not parse: grouped by protocol and parse_error, its raw output the example
        (item: the judgment's id)."""
        self.add(judgment["protocol"], judgment["parse_error"], judgment.get("judgment_id"),
                 lambda: judgment.get("raw_output") or "")

    def top(self, n: int) -> dict:
        """{"total", "groups" (the n most frequent, ties in order of first appearance), "other" (items in the
        rest)}."""
        shown = sorted(self.groups.values(), key=lambda g: -g["count"])[:n]  # stable sort
        return {"total": self.total, "groups": shown, "other": self.total - sum(g["count"] for g in shown)}


def brief(raw: Any) -> Any:
    """A raw row for people: bytes (as json_safe stores them, {"$bytes": base64}) become "<N bytes>"."""
    if isinstance(raw, dict):
        if set(raw) == {"$bytes"} and isinstance(raw["$bytes"], str):
            return f"<{len(raw['$bytes']) * 3 // 4} bytes>"
        return {k: brief(v) for k, v in raw.items()}
    return [brief(v) for v in raw] if isinstance(raw, list) else raw


def _raw_example(raw_json: str) -> str:
    try:
        return json.dumps(brief(json.loads(raw_json)), ensure_ascii=False)
    except (TypeError, ValueError):  # written by us as JSON; shown as stored if it is not
        return str(raw_json)


def quarantine_reasons(uri: str, top: int = 10) -> dict:
    """ReasonGroups.top of a dataset's quarantine: why its rows were refused (item: the row's index in the
    stage's input)."""
    groups = ReasonGroups()
    for q in iter_quarantine(uri):
        groups.add(q["field"], q["reason"], q["index"], lambda q=q: _raw_example(q["raw_json"]))
    return groups.top(top)


def parse_failures(rows: Iterable[dict], top: int = 10) -> dict:
    """ReasonGroups.top of the judgments whose output did not parse, by protocol (field) and parse_error, with
    the model's raw output as the example (item: the judgment's id)."""
    groups = ReasonGroups()
    for r in rows:
        if r.get("parse_error") is not None:
            groups.add_unparsed(r)
    return groups.top(top)


class Listed(NamedTuple):
    name: str  # as `flywheel data --dataset` takes it: labels, curated/sft
    uri: str
    manifest: Manifest | None  # None: not written (yet)


def datasets_of(names: Mapping[str, str], depth: int = 2) -> list[Listed]:
    """Each named dataset; where a name holds datasets below it instead (curated/sft, gold/id-test/judgments),
    each of those (up to `depth` levels down); a name with nothing written (yet) once, without a manifest."""
    listed: list[Listed] = []
    for name, uri in names.items():
        listed.extend(_found(uri, name, depth) or [Listed(name, uri, None)])
    return listed


def _found(uri: str, name: str, depth: int) -> list[Listed]:
    if storage.exists(storage.join(uri, MANIFEST)):
        return [Listed(name, uri, read_manifest(uri))]
    if depth == 0:
        return []
    return [x for child in _subdirs(uri) for x in _found(storage.join(uri, child), f"{name}/{child}", depth - 1)]


def size_bytes(uri: str, m: Manifest) -> int:
    """The bytes of a dataset's data and quarantine files on storage."""
    fs, _ = storage.resolve(uri)
    paths = [storage.resolve(storage.join(uri, f))[1] for f in [*m.files, *([QUARANTINE] if m.quarantined else [])]]
    return sum(max(i.size or 0, 0) for i in fs.get_file_info(paths))


def _subdirs(uri: str) -> list[str]:
    # an absent directory lists as empty; storage that cannot be read (credentials, a mount) raises, so the
    # caller says so rather than "no iteration"
    return [d for d in storage.subdirs(uri) if not d.startswith("_")]  # not finished_batches' records


def resolve_name(names: Mapping[str, str], dataset: str) -> str:
    """A listed name (labels, curated/sft) as its URI; anything else is taken as a path or URI."""
    head, _, rest = dataset.partition("/")
    if dataset in names:
        return names[dataset]
    return storage.join(names[head], *rest.split("/")) if head in names and rest else dataset


def latest_iteration(storage_uri: str) -> int | None:
    """The highest-numbered iteration directory under the storage root, if any has been started."""
    numbers = [int(d) for d in _subdirs(storage.join(storage_uri, "iterations")) if d.isdigit()]
    return max(numbers, default=None)


def describe(uri: str, top: int = 10, rows: int = 0) -> dict:
    """A dataset's manifest, its quarantine's reasons, for judgments the outputs that did not parse (the
    judgments are read whole, streamed, and verified) and its first `rows` rows (images as their size).
    MissingManifest if it has no manifest."""
    m = read_manifest(uri)
    return {"uri": uri, "manifest": m.model_dump(mode="json"),
            "quarantine": quarantine_reasons(uri, top) if m.quarantined else None,
            "parse_failures": parse_failures(iter_dataset_rows(uri, "judgment"), top) if m.kind == "judgment"
            else None,
            "rows": [brief(json_safe(r)) for r in islice(iter_dataset_rows(uri), rows)] if rows else []}


def listing_table(n: int, listed: list[Listed], pruned: Mapping[str, str] | None = None):
    """`pruned`: dataset name -> when retention deleted it (flywheel/retention.py)."""
    from rich.table import Table

    table = Table(title=f"iteration {n}: datasets (`flywheel data --dataset <name>` shows one)")
    for col in ("dataset", "kind", "rows", "quarantined", "MB", "producer", "written (UTC)", "path"):
        table.add_column(col, justify="right" if col in ("rows", "quarantined", "MB") else "left")
    pruned = pruned or {}
    for name, uri, m in listed:
        if m is None:
            when = pruned.get(name) or next((t for k, t in pruned.items() if k.startswith(f"{name}/")), None)
            table.add_row(name, "", "", "", "", "", f"pruned {when[:19].replace('T', ' ')}" if when
                          else "not written", "")
        else:
            table.add_row(name, m.kind, str(m.row_count), str(m.quarantined) if m.quarantined else "",
                          f"{size_bytes(uri, m) / 1e6:.1f}", m.producer, m.created_at[:19].replace("T", " "), uri)
    return table


def print_description(console, shown: dict) -> None:
    m = shown["manifest"]
    console.print(f"[bold]{shown['uri']}[/bold]: {m['row_count']} {m['kind']} rows, {m['quarantined']} quarantined; "
                  f"written by {m['producer']} at {m['created_at'][:19]} (content {m['content_hash'][:12]}, "
                  f"config {m['config_hash'][:12]})")
    for u in m["upstream"]:
        console.print(f"  from {u['path']} (content {u['content_hash'][:12]})")
    for i, row in enumerate(shown["rows"]):
        console.print(f"row {i}: {json.dumps(row, ensure_ascii=False)}", markup=False, highlight=False)
    _print_groups(console, "quarantined", "row", shown["quarantine"])
    _print_groups(console, "outputs that did not parse (rows, never scores)", "judgment", shown["parse_failures"])


def _print_groups(console, what: str, item: str, groups: dict | None) -> None:
    if not groups or not groups["total"]:
        return
    console.print(f"{what}: {groups['total']}, by reason:")
    for g in groups["groups"]:
        where = f" [{g['field']}]" if g["field"] else ""
        console.print(f"  {g['count']:6d}{where} {g['reason']}", markup=False)
        console.print(f"         e.g. {item} {g['item']}: {g['example']}", style="dim", markup=False)
    if groups["other"]:
        console.print(f"  {groups['other']:6d} in other groups (--top to show more)")
