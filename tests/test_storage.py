"""flywheel/storage.py's choice of filesystem. Reads and writes in buckets are tested against servers: retention in
tests/test_retention.py, a whole iteration in tests/iteration/test_bucket_storage.py."""

import pyarrow.fs as pafs
import pytest

from flywheel import storage


def test_plain_paths_are_local_and_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fs, path = storage.resolve("data/x")
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "data" / "x")
    with pytest.raises(ValueError, match="empty storage URI"):
        storage.resolve("")


def test_gs_uris_go_to_the_emulator_the_variable_names(monkeypatch):
    monkeypatch.setenv(storage.GCS_EMULATOR_ENV, "http://127.0.0.1:4443/")
    fs, path = storage.resolve("gs://bucket/runs/x")
    assert isinstance(fs, pafs.GcsFileSystem) and path == "bucket/runs/x"
    monkeypatch.setenv(storage.GCS_EMULATOR_ENV, "127.0.0.1:4443")  # as fake-gcs-server's docs write it
    assert isinstance(storage.resolve("gs://bucket/x")[0], pafs.GcsFileSystem)
    assert isinstance(storage.resolve("file:///tmp/x")[0], pafs.LocalFileSystem)  # only gs:// is redirected
    monkeypatch.setenv(storage.GCS_EMULATOR_ENV, "ftp://127.0.0.1:4443")
    with pytest.raises(ValueError, match="CLOUD_STORAGE_EMULATOR_ENDPOINT='ftp://127.0.0.1:4443'"):
        storage.resolve("gs://bucket/x")
