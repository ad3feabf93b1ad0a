"""Prompt sources a user can bring: JSONL or Parquet files in the prompt schema, and plain text lists.

Each reader yields prompt rows plus quarantined items (a malformed line is reported with its line number and
kept raw, never dropped silently). Aspects left empty are filled from the aspect tree (UFEval's step 1).
The oracle world's task suites are the other source (flywheel/worlds/).

JSONL line format: the prompt record fields (`task`, `subtask`, `query`, optional `split`, `source`,
`reference_text`, `meta`), with images either inline as base64 PNG/JPEG strings in `images` or as file paths
relative to the JSONL file in `image_paths`.

A path is a local file or a storage URI (s3://, gs://, file://: flywheel/storage.py), so a cluster reads the
files from the object store its outputs go to instead of a job's uploaded working directory.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from flywheel import storage
from flywheel.aspects import AspectError, AspectTree

log = logging.getLogger(__name__)
_OPTIONAL = {"split": "train", "reference_text": None, "reference_images": [], "meta": None, "aspects": []}


def _quarantine(index: int, reason: str, raw: Any, field: str = "") -> dict:
    return {"kind": "prompt", "index": index, "reason": reason, "field": field, "raw": raw}


def fill_aspects(rows: list[dict], tree: AspectTree) -> tuple[list[dict], list[dict]]:
    """Select aspects for rows that have none; a row naming an unknown task/sub-task is quarantined."""
    out, bad = [], []
    for i, row in enumerate(rows):
        if row.get("aspects"):
            out.append(row)
            continue
        try:
            names = tree.select(row.get("task"), row.get("subtask")).names
        except AspectError as e:
            bad.append(_quarantine(i, f"aspects: {e}", row, "subtask"))
            continue
        out.append({**row, "aspects": names})
    return out, bad


def _decode_images(values: list, where: str) -> list[bytes]:
    images = []
    for k, v in enumerate(values):
        if not isinstance(v, str):
            raise ValueError(f"{where}images[{k}]: expected a base64 string, got {type(v).__name__}")
        try:
            images.append(base64.b64decode(v, validate=True))
        except binascii.Error as e:
            raise ValueError(f"{where}images[{k}]: not base64 ({e})") from None
    return images


def read_jsonl(path: str | Path, source: str | None = None) -> tuple[list[dict], list[dict]]:
    path = str(path)
    name, parent = storage.name(path), path.rsplit("/", 1)[0] if "/" in path else "."
    rows, bad = [], []
    for n, line in enumerate(storage.read_bytes(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            bad.append(_quarantine(n, f"line {n}: not valid UTF-8 JSON ({e})", line))
            continue
        if not isinstance(obj, dict):
            bad.append(_quarantine(n, f"line {n}: expected a JSON object, got {type(obj).__name__}", obj))
            continue
        try:
            images = _decode_images(obj.pop("images", []) or [], f"line {n}: ")
            for k, rel in enumerate(obj.pop("image_paths", []) or []):
                if not isinstance(rel, str):
                    raise ValueError(f"line {n}: image_paths[{k}]: expected a path, got {type(rel).__name__}")
                file = rel if rel.startswith("/") or storage.is_uri(rel) else storage.join(parent, rel)
                if not storage.exists(file):
                    raise ValueError(f"line {n}: image_paths[{k}]: {rel} not found next to {name}")
                images.append(storage.read_bytes(file))
        except ValueError as e:
            bad.append(_quarantine(n, str(e), obj, "images"))
            continue
        rows.append({**_OPTIONAL, "source": source or name, **obj, "images": images})
    return rows, bad


def read_parquet(path: str | Path, source: str | None = None) -> tuple[list[dict], list[dict]]:
    fs, inside = storage.resolve(path)
    rows = pq.read_table(inside, filesystem=fs).to_pylist()
    return [{**_OPTIONAL, "source": source or storage.name(path), **r} for r in rows], []


def read_text_list(path: str | Path, task: str, subtask: str, split: str = "train",
                   source: str | None = None) -> tuple[list[dict], list[dict]]:
    """One query per non-empty line, all of one task/sub-task (e.g. a list of text-to-image prompts)."""
    rows, bad = [], []
    for n, line in enumerate(storage.read_bytes(path).splitlines(), start=1):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            bad.append(_quarantine(n, f"line {n}: invalid UTF-8 ({e})", line, "query"))
            continue
        if text:
            rows.append({**_OPTIONAL, "task": task, "subtask": subtask, "query": text, "images": [],
                         "split": split, "source": source or storage.name(path)})
    return rows, bad


def read_source(spec: dict, tree: AspectTree) -> tuple[list[dict], list[dict]]:
    """Dispatch on a source spec from config: {"type": "jsonl"|"parquet"|"text", "path": ..., ...}."""
    kind = spec.get("type")
    args = {k: v for k, v in spec.items() if k != "type"}
    readers = {"jsonl": read_jsonl, "parquet": read_parquet, "text": read_text_list}
    if kind not in readers:
        raise ValueError(f"prompt source type {kind!r}: expected one of {', '.join(readers)}")
    rows, bad = readers[kind](**args)
    rows, bad_aspects = fill_aspects(rows, tree)
    return rows, bad + bad_aspects


def read_sources(specs: list[dict], tree: AspectTree) -> tuple[list[dict], list[dict]]:
    """Every source's rows, in order, and their quarantined items."""
    rows, bad = [], []
    for spec in specs:
        got, refused = read_source(spec, tree)
        log.info("prompts: %d rows from %s (%d quarantined)", len(got), spec["path"], len(refused))
        rows += got
        bad += refused
    return rows, bad


def files_digest(paths: list[str]) -> str:
    """sha256 of the files' contents, in order: a stage reading them is redone when one is edited in place (a
    missing file hashes as such; its reader names it)."""
    h = hashlib.sha256()
    for path in paths:
        try:
            h.update(hashlib.sha256(storage.read_bytes(path)).digest())
        except OSError:  # a missing file (FileNotFoundError) or an object store's missing key
            h.update(b"missing:" + str(path).encode())
    return h.hexdigest()[:16]
