"""Storage URIs: one code path for a local folder or a shared S3/GCS/NFS URI on a cluster.

Every dataset path in flywheel goes through here, so a stage never cares where its data lives.
Plain paths (relative or absolute, or os.PathLike) map to the local filesystem; anything with a scheme
(`s3://`, `gs://`, `file://`, `hdfs://`) goes to `pyarrow.fs.FileSystem.from_uri`, but gs:// to a GCS emulator when
CLOUD_STORAGE_EMULATOR_ENDPOINT names one.
"""
from __future__ import annotations

import os
import re
import uuid

import pyarrow.fs as pafs

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Object stores make a single PUT visible atomically, and "move" there is copy+delete (not atomic, 2x cost).
_DIRECT_WRITE = ("S3FileSystem", "GcsFileSystem")
# Google's variable for a GCS emulator: set, gs:// URIs go to it (for S3, pyarrow reads AWS_ENDPOINT_URL itself)
GCS_EMULATOR_ENV = "CLOUD_STORAGE_EMULATOR_ENDPOINT"


def is_uri(uri: str | os.PathLike) -> bool:
    """True when `uri` carries a scheme (s3://, gs://, file://, ...) rather than being a plain path."""
    return bool(_SCHEME.match(os.fspath(uri)))


def resolve(uri: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a URI or a plain local path."""
    uri = os.fspath(uri)
    if not uri:
        raise ValueError("empty storage URI")
    if uri.startswith("gs://") and os.environ.get(GCS_EMULATOR_ENV):
        return _gcs_emulator(os.environ[GCS_EMULATOR_ENV]), uri[len("gs://"):]
    if is_uri(uri):
        return pafs.FileSystem.from_uri(uri)
    # from_uri refuses relative paths ("URI has empty scheme"), so plain paths are made absolute here.
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def _gcs_emulator(endpoint: str) -> pafs.FileSystem:
    """pyarrow's GCS client pointed at an emulator (fake-gcs-server, gcp-storage-emulator), as Google's own clients
    are by CLOUD_STORAGE_EMULATOR_ENDPOINT; pyarrow's from_uri reads no such variable (it would ask Google's
    metadata server for credentials and hang). Anonymous: emulators take no credentials."""
    scheme, sep, hostport = endpoint.partition("://")
    if not sep:
        scheme, hostport = "http", endpoint
    if scheme not in ("http", "https") or not hostport.strip("/"):
        raise ValueError(f"{GCS_EMULATOR_ENV}={endpoint!r}: expected http(s)://host:port")
    return pafs.GcsFileSystem(anonymous=True, scheme=scheme, endpoint_override=hostport.strip("/"))


def join(uri: str | os.PathLike, *parts: str) -> str:
    """Join path parts onto a URI with '/', which every pyarrow filesystem (and POSIX) accepts."""
    out = os.fspath(uri)
    for part in parts:
        part = part.strip("/")
        if part:
            out = out.rstrip("/") + "/" + part if out else part
    return out


def name(uri: str | os.PathLike) -> str:
    """The file name at the end of a path or URI (Path(...).name would fold s3:// into s3:/)."""
    return os.fspath(uri).rstrip("/").rsplit("/", 1)[-1]


def exists(uri: str | os.PathLike) -> bool:
    fs, path = resolve(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def makedirs(uri: str | os.PathLike) -> None:
    fs, path = resolve(uri)
    fs.create_dir(path, recursive=True)


def read_bytes(uri: str | os.PathLike) -> bytes:
    fs, path = resolve(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes(uri: str | os.PathLike, data: bytes) -> None:
    """Write a whole file so readers see either the old file or the new one, never half of it."""
    fs, path = resolve(uri)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.create_dir(parent, recursive=True)
    if type(fs).__name__ in _DIRECT_WRITE:
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    # Local/NFS/HDFS: write a sibling temp file, then rename over the target (atomic on POSIX).
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)
    except BaseException:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_file(tmp)
        raise


def remove(uri: str | os.PathLike, missing_ok: bool = True) -> None:
    """Delete one file; absent files are fine unless missing_ok is False."""
    fs, path = resolve(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        if missing_ok:
            return
        raise FileNotFoundError(f"cannot remove {uri}: no such file")
    fs.delete_file(path)


def remove_dir(uri: str | os.PathLike) -> None:
    """Delete a directory and everything below it; an absent one is fine."""
    fs, path = resolve(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def subdirs(uri: str | os.PathLike) -> list[str]:
    """The names of the directories directly below `uri` (none if it is absent), sorted."""
    fs, path = resolve(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
