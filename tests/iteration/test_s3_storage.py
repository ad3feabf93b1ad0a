"""A whole tiny iteration with its storage in an S3 bucket (`storage.uri: s3://...`, as configs/gpu_7b.yaml has it):
Ray Data's stages read and write their Parquet there, Ray Train its checkpoints, the driver its manifests, records
and stage clock; a second run finds the iteration finished there. The bucket is moto's S3 server (tests/conftest.py
s3_bucket: no object store is reachable here); the client is pyarrow's and Ray's own."""

import subprocess
import sys
from pathlib import Path

import pytest

from flywheel import storage
from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_manifest, verify_dataset
from flywheel.iteration import iteration_dir, paths
from flywheel.iteration_record import IterationRecord
from tiny_iteration import TINY

pytestmark = pytest.mark.slow


def _iteration(run: list[str], log: Path) -> str:
    with open(log, "w") as out:  # the subprocess, and the Ray it starts, inherit the bucket's AWS_* variables
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), *run], stdout=out,
                              stderr=subprocess.STDOUT, timeout=1200)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


def test_an_iteration_on_s3_storage(s3_bucket, tmp_path):
    root = f"{s3_bucket}/{tmp_path.name}"
    run = [f"run.workdir={tmp_path / 'wd'}", f"storage.uri={root}", *TINY]
    _iteration(run, tmp_path / "first.log")

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", run)
    record = IterationRecord.load(iteration_dir(cfg, 0))
    assert record.finished and iteration_dir(cfg, 0).startswith("s3://")
    p = paths(cfg, 0)
    for name in ("prompts", "candidates", "labels"):
        verify_dataset(p[name])  # rows and content hash as the manifest says, read back from the bucket
    assert read_manifest(storage.join(p["curated"], "sft")).row_count > 0
    assert storage.subdirs(storage.join(root, "checkpoints"))  # Ray Train's run folders
    assert not list((tmp_path / "wd").rglob("manifest.json"))  # nothing of the data on the local disk

    text = _iteration(run, tmp_path / "second.log")
    assert "iteration 0: finished earlier" in text, text[-2000:]  # its record and manifests found in the bucket
    assert IterationRecord.load(iteration_dir(cfg, 0)).run_id == record.run_id
