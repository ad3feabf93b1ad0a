"""The batches of a stage's attempt that finished, kept so the next attempt does not make them again.

A stage's output is complete only with its manifest, written last. An attempt killed before that (the driver
lost, the job stopped, a batch that raised) used to leave its finished parts behind unused, and `--resume`
remade every batch: hours of GPU labelling, or an API teacher's labels paid for twice. Now each actor records a
batch it wrote (its part's name, size, hash lines, quarantine and counters: what the driver needs of it) in a small
JSON file beside the output, after the part itself is on storage. The next attempt with the same key (the stage's
config hash, its inputs' content hashes and the batch size: what decides a batch's rows) takes those batches as
they are, after checking each part still holds the rows recorded (its hash lines, not only its size: a part
rewritten in place since, or cut and padded, is made again), and sends only the others to the actors. The
cores are deterministic per batch (a retried batch rewrites the same part), so the dataset is the one an
uninterrupted attempt writes. The records are removed once the manifest is written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flywheel import storage
from flywheel.records import hash_lines

log = logging.getLogger(__name__)

DIR = "_batches"  # beside the parts; not a part name, so the manifest's clean-up leaves it to clear()


def key(stage_hash: str, upstream_hashes: list[str], batch_size: int) -> str:
    return hashlib.sha256(json.dumps([stage_hash, upstream_hashes, batch_size]).encode()).hexdigest()[:24]


def record(output: str, run_key: str, batch: int, meta: dict) -> None:
    """In the actor, after the batch's part is written: the metadata the driver takes from a finished batch."""
    data = {**meta, "lines": base64.b64encode(meta["lines"]).decode()}
    storage.write_bytes(storage.join(output, DIR, run_key, f"{batch:06d}.json"), json.dumps(data).encode())


def load(output: str, run_key: str, n_batches: int, kind: str) -> dict[int, dict]:
    """The batches an earlier attempt with this key finished, whose parts still hold the `kind` rows recorded.
    Records of other keys (another config or input) are deleted: their parts are overwritten by this attempt."""
    fs, root = storage.resolve(storage.join(output, DIR))
    found: dict[int, dict] = {}
    for entry in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        if entry.base_name != run_key:
            fs.delete_dir(entry.path) if entry.type == pafs.FileType.Directory else fs.delete_file(entry.path)
            continue
        for f in fs.get_file_info(pafs.FileSelector(entry.path)):
            meta = _read(fs, f)
            if meta is not None and meta["batch"] < n_batches and _part_intact(output, meta, kind):
                found[meta["batch"]] = meta
    if found:
        log.info("%s: %d of %d batches finished by an earlier attempt are kept", output, len(found), n_batches)
    return found


def clear(output: str) -> None:
    fs, root = storage.resolve(storage.join(output, DIR))
    if fs.get_file_info(root).type == pafs.FileType.Directory:
        fs.delete_dir(root)


def _read(fs: pafs.FileSystem, f: pafs.FileInfo) -> dict | None:
    if not f.base_name.endswith(".json"):
        return None  # e.g. a write's temp file
    try:
        with fs.open_input_stream(f.path) as s:
            meta = json.loads(s.read())
        return {**meta, "batch": int(meta["batch"]), "lines": base64.b64decode(meta["lines"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: unreadable batch record (%s); that batch is made again", f.path, e)
        return None


def _part_intact(output: str, meta: dict, kind: str) -> bool:
    if not meta["part"]:
        return True  # a batch whose rows were all quarantined writes no part
    fs, path = storage.resolve(storage.join(output, meta["part"]))
    if fs.get_file_info(path).size != meta["size"]:
        return False  # gone or another file: no need to read it
    # The manifest's content hash is built from the recorded lines, not from the files: a part whose rows differ
    # from them would pass here and fail only when the next stage reads the dataset.
    try:
        intact = hash_lines(kind, pq.read_table(path, filesystem=fs)) == meta["lines"]
    except (pa.ArrowInvalid, OSError) as e:
        intact = False
        log.warning("%s: unreadable part (%s)", path, e)
    if not intact:
        log.warning("%s: batch %d's part no longer holds the rows recorded; it is made again", path, meta["batch"])
    return intact
