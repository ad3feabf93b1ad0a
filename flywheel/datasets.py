"""Datasets on storage: Parquet data + quarantine + a manifest, checked on every read (DESIGN.md "Records").

Layout of a dataset at <uri>: its data files, listed in row order by the manifest (data.parquet when written whole
by write_dataset; part-00000.parquet, part-00001.parquet, ... when a stage writes it batch by batch, see
PartsWriter), quarantine.parquet (rejected rows with reasons, only if any), manifest.json (written last: its
presence marks a complete dataset).

Whole tables: write_dataset / read_dataset (small datasets). Streamed, in memory bounded by a batch however large
the dataset: verify_dataset / iter_dataset_batches / iter_dataset_rows to read, RowRangeReader to read one slice
(a stage's batch, inside a Ray actor), write_part + PartsWriter to write.
"""
from __future__ import annotations

import bisect
import datetime as dt
import json
import re
import uuid
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flywheel import __version__, storage
from flywheel.records import (SCHEMAS, ContentHasher, RecordLimits, content_hash, hash_lines, json_safe, restore_raw,
                              to_rows, to_table, validate)

__all__ = ["DATA", "QUARANTINE", "MANIFEST", "ManifestMismatch", "MissingManifest", "UpstreamRef", "Manifest",
           "write_dataset", "read_manifest", "read_dataset", "read_rows", "read_quarantine", "verify_dataset",
           "verify_dataset_files", "iter_dataset_batches", "iter_dataset_rows",
           "iter_quarantine", "read_data_file", "RowRangeReader",
           "part_name", "write_part", "PartsWriter"]
DATA, QUARANTINE, MANIFEST = "data.parquet", "quarantine.parquet", "manifest.json"
_PART = re.compile(r"^part-\d{5,}\.parquet$")
# Streaming reads go page by page (no pre-buffering of a whole row group): memory is bounded by a Parquet page
# plus a read buffer per column (buffer_size: 256 KiB, a few MB for a whole schema, still large enough reads for
# an object store), and pages are kept small when writing by checking their size every _WRITE_BATCH_ROWS rows
# (Parquet's default, 1024 rows, makes a page of 1024 images). They decode on the calling thread and hand freed
# memory back to the OS after each batch: measured here (pyarrow 25, mimalloc), threaded decoding with the
# allocator's caches kept grows RSS with the rows read (+25 MB for 1100 prompts, +50 MB for 22000); this way it
# stays near 15 MB whatever the size (mimalloc backs its pages with 2 MB transparent huge pages, so a few MB of
# live buffers show as ~12 MB of RSS).
_STREAM_READ = {"pre_buffer": False, "buffer_size": 1 << 18}
_WRITE_BATCH_ROWS = 64
STREAM_BATCH_ROWS = 256  # default rows per batch of the streaming readers


def _release_memory() -> None:
    pa.default_memory_pool().release_unused()
_Q_SCHEMA = pa.schema([("kind", pa.string()), ("index", pa.int64()), ("reason", pa.string()),
                       ("field", pa.string()), ("raw_json", pa.string())])


class ManifestMismatch(ValueError):
    """A dataset on storage does not match its manifest (or the manifest is unreadable)."""


class MissingManifest(FileNotFoundError):
    """No manifest.json: the dataset is incomplete (a writer died) or was not written by flywheel."""


class UpstreamRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="URI of the upstream dataset.")
    content_hash: str = Field(description="Its manifest's content_hash when this dataset was made.")


class Manifest(BaseModel):
    """What a dataset is and where it came from; written last, checked on every read."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="URI the dataset was written to (informative: datasets may be moved).")
    kind: str = Field(description="Record kind: prompt | candidate | judgment | pair.")
    row_count: int = Field(ge=0, description="Valid rows in the data files.")
    arrow_schema: str = Field(description="str() of the Arrow schema of the data files.")
    content_hash: str = Field(description="content_hash(): sha256 over every field of every row, in order.")
    config_hash: str = Field(description="config_hash() of the config that produced the dataset.")
    producer: str = Field(description="Stage that wrote the dataset.")
    upstream: list[UpstreamRef] = Field(default_factory=list, description="Datasets this one was made from.")
    quarantined: int = Field(0, ge=0, description="Rows in quarantine.parquet.")
    files: list[str] = Field(default_factory=lambda: [DATA], description="Data files, in row order.")
    created_at: str = Field(description="UTC ISO-8601 time of writing.")
    flywheel_version: str = Field(description="flywheel package version of the writer.")


def _ref(u: Manifest | UpstreamRef | dict) -> UpstreamRef:
    if isinstance(u, Manifest):
        return UpstreamRef(path=u.path, content_hash=u.content_hash)
    return u if isinstance(u, UpstreamRef) else UpstreamRef.model_validate(u)


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_batch_size=_WRITE_BATCH_ROWS)
    return sink.getvalue().to_pybytes()


def _quarantine_row(b: dict, kind: str) -> dict:
    return {"kind": str(b.get("kind", kind)), "index": b.get("index"), "reason": str(b.get("reason", "")),
            "field": str(b.get("field", "")), "raw_json": json.dumps(json_safe(b.get("raw")), ensure_ascii=True)}


def write_dataset(uri: str, kind: str, rows: Any, *, config_hash: str, producer: str,
                  upstream: Iterable[Manifest | UpstreamRef | dict] = (), limits: RecordLimits | None = None,
                  quarantined: Iterable[dict] = ()) -> Manifest:
    """Validate rows and write data.parquet, quarantine.parquet (if any) and manifest.json (last).

    `quarantined` takes items a stage already rejected itself (same dict shape as validate() returns)."""
    valid, bad = validate(kind, to_rows(rows), limits)
    bad = [*quarantined, *bad]
    table = to_table(kind, valid)
    manifest = Manifest(
        path=str(uri), kind=kind, row_count=table.num_rows, arrow_schema=str(SCHEMAS[kind]),
        content_hash=content_hash(kind, valid), config_hash=config_hash, producer=producer,
        upstream=[_ref(u) for u in upstream], quarantined=len(bad),
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), flywheel_version=__version__)
    storage.makedirs(uri)
    storage.remove(storage.join(uri, MANIFEST))  # a crash from here on leaves the dataset visibly incomplete
    storage.write_bytes(storage.join(uri, DATA), _parquet_bytes(table))
    if any(not isinstance(b, dict) for b in bad):
        raise TypeError("quarantined items must be dicts with kind, index, reason, field, raw (as validate returns)")
    if bad:
        q = [_quarantine_row(b, kind) for b in bad]
        storage.write_bytes(storage.join(uri, QUARANTINE), _parquet_bytes(pa.Table.from_pylist(q, schema=_Q_SCHEMA)))
    else:
        storage.remove(storage.join(uri, QUARANTINE))  # never leave a stale quarantine from an earlier write
    storage.write_bytes(storage.join(uri, MANIFEST), manifest.model_dump_json(indent=2).encode())
    return manifest


def read_manifest(uri: str) -> Manifest:
    path = storage.join(uri, MANIFEST)
    if not storage.exists(path):
        raise MissingManifest(f"no manifest at {path}: dataset incomplete or not written by flywheel")
    try:
        return Manifest.model_validate_json(storage.read_bytes(path))
    except ValidationError as e:
        raise ManifestMismatch(f"manifest at {path} is unreadable: {e}") from None


def _check_schema(uri: str, name: str, got: pa.Schema, schema: pa.Schema) -> None:
    if not got.equals(schema, check_metadata=False):
        raise ManifestMismatch(f"dataset at {uri}: {name} schema differs from the expected schema\n"
                               f"--- file:\n{got}\n--- expected:\n{schema}")


def _read_parquet(uri: str, name: str, schema: pa.Schema) -> pa.Table:
    path = storage.join(uri, name)
    if not storage.exists(path):
        raise ManifestMismatch(f"dataset at {uri}: {name} is missing")
    fs, p = storage.resolve(path)
    try:
        table = pq.read_table(p, filesystem=fs)
    except pa.ArrowInvalid as e:
        raise ManifestMismatch(f"dataset at {uri}: {name} is not readable Parquet ({e})") from None
    _check_schema(uri, name, table.schema, schema)
    return table


def _open_parquet(uri: str, name: str, schema: pa.Schema) -> pq.ParquetFile:
    """A data file opened for streaming reads (close it), its schema checked; the same refusals as _read_parquet."""
    path = storage.join(uri, name)
    if not storage.exists(path):
        raise ManifestMismatch(f"dataset at {uri}: {name} is missing")
    fs, p = storage.resolve(path)
    f = fs.open_input_file(p)
    try:
        pf = pq.ParquetFile(f, **_STREAM_READ)
        _check_schema(uri, name, pf.schema_arrow, schema)
    except pa.ArrowInvalid as e:
        f.close()
        raise ManifestMismatch(f"dataset at {uri}: {name} is not readable Parquet ({e})") from None
    except BaseException:
        f.close()
        raise
    return pf


def _checked_manifest(uri: str, kind: str | None) -> Manifest:
    """The manifest, refused unless its kind, schema and file names are this flywheel's (data not read)."""
    m = read_manifest(uri)
    where = f"dataset at {uri}"
    if kind is not None and m.kind != kind:
        raise ManifestMismatch(f"{where}: kind is {m.kind!r}, expected {kind!r}")
    if m.kind not in SCHEMAS:
        raise ManifestMismatch(f"{where}: unknown kind {m.kind!r} in manifest")
    schema = SCHEMAS[m.kind]
    if m.arrow_schema != str(schema):
        raise ManifestMismatch(f"{where}: manifest schema differs from this flywheel's {m.kind} schema "
                               f"(written by flywheel {m.flywheel_version})")
    if any("/" in name or "\\" in name or name.startswith(".") for name in m.files):
        raise ManifestMismatch(f"{where}: data file names must be plain names inside the dataset, got {m.files}")
    return m


def read_dataset(uri: str, kind: str | None = None) -> tuple[pa.Table, Manifest]:
    """Read a dataset, refusing it (ManifestMismatch) unless kind, schema, row count and content hash match.

    The whole table is returned: for a dataset too large to hold, see iter_dataset_batches."""
    m = _checked_manifest(uri, kind)
    where, schema = f"dataset at {uri}", SCHEMAS[m.kind]
    tables = [_read_parquet(uri, name, schema) for name in m.files]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if table.num_rows != m.row_count:
        raise ManifestMismatch(f"{where}: {table.num_rows} rows in data but manifest row_count is {m.row_count}")
    got = content_hash(m.kind, table)
    if got != m.content_hash:
        raise ManifestMismatch(f"{where}: content hash {got[:16]}… differs from manifest content_hash "
                               f"{m.content_hash[:16]}…: data changed after the manifest was written")
    return table, m


def read_rows(uri: str, kind: str | None = None) -> list[dict]:
    return read_dataset(uri, kind)[0].to_pylist()


def _iter_verified(uri: str, m: Manifest, batch_rows: int, file_rows: list[int] | None = None) -> Iterator[pa.Table]:
    where, schema, hasher = f"dataset at {uri}", SCHEMAS[m.kind], ContentHasher(m.kind)
    for name in m.files:
        pf = _open_parquet(uri, name, schema)
        if file_rows is not None:
            file_rows.append(pf.metadata.num_rows)
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, use_threads=False):
                if hasher.rows + batch.num_rows > m.row_count:  # stop early: more rows than the manifest says
                    raise ManifestMismatch(f"{where}: more rows in data than the manifest's row_count {m.row_count}")
                table = pa.Table.from_batches([batch], schema=schema)
                del batch
                hasher.update(table)
                yield table
                del table
                _release_memory()
        except (pa.ArrowInvalid, OSError) as e:
            raise ManifestMismatch(f"{where}: {name} is not readable Parquet ({e})") from None
        finally:
            pf.close(force=True)
    if hasher.rows != m.row_count:
        raise ManifestMismatch(f"{where}: {hasher.rows} rows in data but manifest row_count is {m.row_count}")
    got = hasher.hexdigest()
    if got != m.content_hash:
        raise ManifestMismatch(f"{where}: content hash {got[:16]}… differs from manifest content_hash "
                               f"{m.content_hash[:16]}…: data changed after the manifest was written")


def iter_dataset_batches(uri: str, kind: str | None = None,
                         batch_rows: int = STREAM_BATCH_ROWS) -> Iterator[pa.Table]:
    """The rows of a dataset in order, as tables of at most batch_rows rows, read file by file and page by page:
    memory stays bounded by a batch (and a Parquet page) however large the dataset.

    The checks of read_dataset, streamed: kind, schema and file names before the first batch, each file's schema
    when it is opened, the row count and content hash after the last batch - a dataset that does not match its
    manifest raises ManifestMismatch at the end of the iteration. So rows are only verified once the iterator is
    exhausted: act on them for good (commit a result) only then. verify_dataset() is the check alone."""
    m = _checked_manifest(uri, kind)
    yield from _iter_verified(uri, m, batch_rows)


def iter_dataset_rows(uri: str, kind: str | None = None, batch_rows: int = STREAM_BATCH_ROWS) -> Iterator[dict]:
    """iter_dataset_batches as rows (dicts); verified at the end of the iteration, as there."""
    for table in iter_dataset_batches(uri, kind, batch_rows):
        yield from table.to_pylist()


def verify_dataset(uri: str, kind: str | None = None, batch_rows: int = STREAM_BATCH_ROWS) -> Manifest:
    """The manifest of a dataset whose data match it (read_dataset's checks), read in bounded memory, keeping
    nothing; ManifestMismatch otherwise."""
    return verify_dataset_files(uri, kind, batch_rows)[0]


def verify_dataset_files(uri: str, kind: str | None = None,
                         batch_rows: int = STREAM_BATCH_ROWS) -> tuple[Manifest, list[int]]:
    """verify_dataset, plus the row count of each data file (in the manifest's order), for RowRangeReader."""
    m, file_rows = _checked_manifest(uri, kind), []
    for _ in _iter_verified(uri, m, batch_rows, file_rows):
        pass
    return m, file_rows


def read_data_file(uri: str, name: str, kind: str) -> pa.Table:
    """One data file of a dataset (e.g. one part, for a sample); the file is not checked against the manifest."""
    return _read_parquet(uri, name, SCHEMAS[kind])


class RowRangeReader:
    """Rows [start, stop) of a dataset already verified (verify_dataset), e.g. the stage batch a Ray actor is
    given, read from (shared) storage in memory bounded by the range and a Parquet page.

    The streaming reader stays open between calls, so ranges asked in increasing order (as an actor receives its
    batches) decode every row once; a range behind the current position, or in a later file, re-opens the file
    that holds its first row (Parquet cannot seek to a row inside a page run, so rows before it in that file are
    decoded and dropped). `file_rows` (from verify_dataset_files) spares reading every file's footer first."""

    def __init__(self, uri: str, manifest: Manifest, read_rows: int = STREAM_BATCH_ROWS,
                 file_rows: list[int] | None = None):
        self.uri, self.manifest, self.read_rows = uri, manifest, max(1, int(read_rows))
        self.schema = SCHEMAS[manifest.kind]
        self._offsets: list[int] | None = None  # first row of each file, then the total
        if file_rows is not None:
            if len(file_rows) != len(manifest.files) or sum(file_rows) != manifest.row_count:
                raise ValueError(f"file_rows {file_rows} do not fit the manifest of {uri}")
            self._offsets = [0]
            for n in file_rows:
                self._offsets.append(self._offsets[-1] + n)
        self._pf: pq.ParquetFile | None = None
        self._file, self._pos, self._it, self._pending = -1, 0, iter(()), None

    def _starts(self) -> list[int]:
        if self._offsets is None:
            offsets = [0]
            for name in self.manifest.files:  # footers only
                pf = _open_parquet(self.uri, name, self.schema)
                try:
                    offsets.append(offsets[-1] + pf.metadata.num_rows)
                finally:
                    pf.close(force=True)
            if offsets[-1] != self.manifest.row_count:
                raise ManifestMismatch(f"dataset at {self.uri}: {offsets[-1]} rows in data but manifest row_count "
                                       f"is {self.manifest.row_count}")
            self._offsets = offsets
        return self._offsets

    def _open(self, f: int) -> None:
        self.close()
        self._file, self._pos, self._pending = f, self._starts()[f], None
        self._pf = _open_parquet(self.uri, self.manifest.files[f], self.schema)
        self._it = self._pf.iter_batches(batch_size=self.read_rows, use_threads=False)

    def _next(self) -> pa.RecordBatch:
        if self._pending is not None:
            batch, self._pending = self._pending, None
            return batch
        while True:
            batch = next(self._it, None)
            if batch is not None:
                return batch
            if self._file + 1 >= len(self.manifest.files):
                raise ManifestMismatch(f"dataset at {self.uri}: data ended at row {self._pos}")
            self._open(self._file + 1)

    def read(self, start: int, stop: int) -> pa.Table:
        total = self._starts()[-1]
        if not 0 <= start <= stop <= total:
            raise IndexError(f"rows [{start}, {stop}) outside the dataset's {total} rows")
        if start == stop:
            return self.schema.empty_table()
        holder = bisect.bisect_right(self._offsets, start) - 1  # the file holding row `start`
        if self._pf is None or start < self._pos or holder != self._file:
            self._open(holder)
        out = []
        while self._pos < stop:
            batch = self._next()
            lo, hi = max(start - self._pos, 0), min(stop - self._pos, batch.num_rows)
            if lo < hi:
                out.append(batch.slice(lo, hi - lo))
            if hi < batch.num_rows:
                self._pending = batch.slice(hi)
                self._pos += hi
            else:
                self._pos += batch.num_rows
        table = pa.Table.from_batches(out, schema=self.schema)
        del out
        _release_memory()
        return table

    def close(self) -> None:
        if self._pf is not None:
            self._pf.close(force=True)
        self._pf, self._it, self._pending = None, iter(()), None


# ---------------------------------------------------------------- a dataset written in parts
def part_name(index: int) -> str:
    """The data file of batch `index` of a dataset written in parts: a retried batch rewrites the same file."""
    return f"part-{index:05d}.parquet"


def write_part(uri: str, index: int, kind: str, table: pa.Table) -> dict:
    """Write one part of a dataset (rows already validated, e.g. by validate() in the actor that made them) and
    return PartsWriter.add_part's arguments: {"part": file name ("" for no rows: nothing written), "rows",
    "lines": hash_lines(), "size": file size in bytes}. The file is written whole (storage.write_bytes), so a reader or
    a retry of the batch never meets half of it."""
    if not table.schema.equals(SCHEMAS[kind], check_metadata=False):
        raise ValueError(f"part {index} of {uri}: schema differs from the {kind} schema")
    if table.num_rows == 0:
        return {"part": "", "rows": 0, "lines": b"", "size": 0}
    data, name = _parquet_bytes(table), part_name(index)
    storage.write_bytes(storage.join(uri, name), data)
    return {"part": name, "rows": table.num_rows, "lines": hash_lines(kind, table), "size": len(data)}


class PartsWriter:
    """The writer of a dataset whose data files are written elsewhere (write_part, e.g. in Ray actors): it takes
    the parts' metadata in row order, hashing as they come, streams quarantine items to quarantine.parquet, and
    writes the manifest last (finish). Nothing it holds grows with the rows but the list of file names.

    Constructing it removes the old manifest: from then until finish() the dataset is visibly incomplete."""

    def __init__(self, uri: str, kind: str, *, config_hash: str, producer: str,
                 upstream: Iterable[Manifest | UpstreamRef | dict] = (), quarantine_rows: int = 256):
        if kind not in SCHEMAS:
            raise ValueError(f"unknown kind {kind!r}")
        self.uri, self.kind, self.config_hash, self.producer = str(uri), kind, config_hash, producer
        self.upstream = [_ref(u) for u in upstream]
        self.files: list[str] = []
        self.row_count = self.quarantined = 0
        self._sizes: dict[str, int] = {}
        self._hasher = ContentHasher(kind)
        self._q_rows, self._q_pending, self._q_writer, self._q_stream, self._q_tmp = quarantine_rows, [], None, None, ""
        storage.makedirs(self.uri)
        storage.remove(storage.join(self.uri, MANIFEST))

    def add_part(self, part: str, rows: int, lines: bytes, size: int | None = None) -> None:
        """The next part in row order: its file name ("" when it has no rows), row count, hash_lines and size."""
        if rows and not part or part and not _PART.match(part) and part != DATA:
            raise ValueError(f"bad part {part!r} with {rows} rows for {self.uri}")
        if part in self._sizes:
            raise ValueError(f"part {part} of {self.uri} added twice")
        if self._hasher.update_lines(lines) != rows:
            raise ValueError(f"part {part} of {self.uri}: {rows} rows but hash lines for another count")
        if part:
            self.files.append(part)
            self._sizes[part] = -1 if size is None else int(size)
        self.row_count += rows

    def add_quarantined(self, items: Iterable[dict]) -> None:
        """Quarantine items (validate()'s shape: kind, index, reason, field, raw), in order."""
        for b in items:
            if not isinstance(b, dict):
                raise TypeError("quarantined items must be dicts with kind, index, reason, field, raw")
            self._q_pending.append(_quarantine_row(b, self.kind))
            self.quarantined += 1
        if len(self._q_pending) >= self._q_rows:
            self._flush_quarantine()

    def _flush_quarantine(self) -> None:
        if not self._q_pending:
            return
        if self._q_writer is None:
            fs, path = storage.resolve(storage.join(self.uri, QUARANTINE))
            direct = type(fs).__name__ in storage._DIRECT_WRITE  # object stores: a PUT is visible whole
            self._q_tmp = path if direct else f"{path}.tmp-{uuid.uuid4().hex}"
            self._q_stream = fs.open_output_stream(self._q_tmp)
            self._q_writer = pq.ParquetWriter(self._q_stream, _Q_SCHEMA, compression="zstd")
        self._q_writer.write_table(pa.Table.from_pylist(self._q_pending, schema=_Q_SCHEMA))
        self._q_pending = []

    def _close_quarantine(self) -> None:
        if self._q_writer is not None:
            self._q_writer.close()
            self._q_stream.close()
            self._q_writer = self._q_stream = None

    def finish(self) -> Manifest:
        """Check the parts are on storage as written, put quarantine.parquet in place, drop data files of an
        earlier write that the manifest does not list, and write the manifest."""
        fs, root = storage.resolve(self.uri)
        for name, size in self._sizes.items():
            info = fs.get_file_info(f"{root}/{name}")
            if info.type == pafs.FileType.NotFound or size >= 0 and info.size != size:
                raise ManifestMismatch(f"dataset at {self.uri}: part {name} is missing or not the file written "
                                       f"({info.size} bytes on storage, {size} written)")
        self._flush_quarantine()
        self._close_quarantine()
        q_path = f"{root}/{QUARANTINE}"
        if self._q_tmp and self._q_tmp != q_path:
            fs.move(self._q_tmp, q_path)
        elif not self._q_tmp:
            storage.remove(storage.join(self.uri, QUARANTINE))  # never leave a stale quarantine from an earlier write
        self._q_tmp = ""
        keep = set(self.files)
        for info in fs.get_file_info(pafs.FileSelector(root)):
            if (info.base_name == DATA or _PART.match(info.base_name)) and info.base_name not in keep:
                fs.delete_file(info.path)
        manifest = Manifest(
            path=self.uri, kind=self.kind, row_count=self.row_count, arrow_schema=str(SCHEMAS[self.kind]),
            content_hash=self._hasher.hexdigest(), config_hash=self.config_hash, producer=self.producer,
            upstream=self.upstream, quarantined=self.quarantined, files=list(self.files),
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), flywheel_version=__version__)
        storage.write_bytes(storage.join(self.uri, MANIFEST), manifest.model_dump_json(indent=2).encode())
        return manifest

    def abort(self) -> None:
        """Drop the temporary quarantine file; the dataset stays without a manifest (incomplete)."""
        try:
            self._close_quarantine()
        finally:
            if self._q_tmp:
                fs, _ = storage.resolve(self.uri)
                if fs.get_file_info(self._q_tmp).type != pafs.FileType.NotFound:
                    fs.delete_file(self._q_tmp)
                self._q_tmp = ""


def iter_quarantine(uri: str, batch_rows: int = STREAM_BATCH_ROWS) -> Iterator[dict]:
    """A dataset's quarantine items one at a time, as stored (`raw_json` not parsed): a large quarantine read
    without holding it."""
    if not read_manifest(uri).quarantined:
        return
    pf = _open_parquet(uri, QUARANTINE, _Q_SCHEMA)
    try:
        for batch in pf.iter_batches(batch_size=batch_rows):
            yield from batch.to_pylist()
    finally:
        pf.close(force=True)


def read_quarantine(uri: str) -> list[dict]:
    """Quarantine items of a dataset, with `raw` restored to the original row (bytes included)."""
    m = read_manifest(uri)
    if not m.quarantined:
        return []
    items = _read_parquet(uri, QUARANTINE, _Q_SCHEMA).to_pylist()
    if len(items) != m.quarantined:
        raise ManifestMismatch(f"dataset at {uri}: {len(items)} quarantined rows but manifest says {m.quarantined}")
    return [{**{k: it[k] for k in ("kind", "index", "reason", "field")},
             "raw": restore_raw(json.loads(it["raw_json"]))} for it in items]
