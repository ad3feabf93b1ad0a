"""A whole tiny iteration with its storage in a bucket (`storage.uri: s3://...`, as configs/gpu_7b.yaml has it, or
gs://...): Ray Data's stages read and write their Parquet there, Ray Train its checkpoints, the driver its manifests,
records and stage clock; a second run finds the iteration finished there. No object store is reachable here: the S3
bucket is moto's server, the GCS one gcp-storage-emulator (tests/conftest.py); the clients are pyarrow's and Ray's."""

import subprocess
import sys
from pathlib import Path

import pytest

from flywheel import storage
from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_manifest, verify_dataset
from flywheel.iteration import iteration_dir, paths
from flywheel.iteration_record import IterationRecord
from flywheel.train import registry
from tiny_iteration import TINY

pytestmark = pytest.mark.slow


def _iteration(run: list[str], log: Path) -> str:
    with open(log, "w") as out:  # the subprocess, and the Ray it starts, inherit the variables that find the bucket
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), *run], stdout=out,
                              stderr=subprocess.STDOUT, timeout=1200)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


@pytest.mark.parametrize("bucket", ["s3_bucket", "gcs_bucket"])
def test_an_iteration_in_a_bucket(bucket, tmp_path, request):
    root = f"{request.getfixturevalue(bucket)}/{tmp_path.name}"
    run = [f"run.workdir={tmp_path / 'wd'}", f"storage.uri={root}", *TINY]
    _iteration(run, tmp_path / "first.log")

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", run)
    record = IterationRecord.load(iteration_dir(cfg, 0))
    assert record.finished and iteration_dir(cfg, 0).startswith(root)
    p = paths(cfg, 0)
    for name in ("prompts", "candidates", "labels"):
        verify_dataset(p[name])  # rows and content hash as the manifest says, read back from the bucket
    assert read_manifest(storage.join(p["curated"], "sft")).row_count > 0
    checkpoints = storage.join(root, "checkpoints")
    trainings = storage.subdirs(checkpoints)  # Ray Train's run folders
    assert trainings and all(any(d.startswith("checkpoint_") for d in storage.subdirs(storage.join(
        checkpoints, t))) for t in trainings)  # listed, as retention lists them (GCS: from marker objects)
    client = registry.client(cfg)  # a registered version names its Ray Train checkpoint by URI, scheme and all
    marks = [v.tags.get("flywheel.checkpoint", "") for m in client.search_registered_models()
             for v in client.search_model_versions(f"name='{m.name}'")]
    assert marks and all(c.startswith(checkpoints + "/") for c in marks), marks
    assert not list((tmp_path / "wd").rglob("manifest.json"))  # nothing of the data on the local disk

    text = _iteration(run, tmp_path / "second.log")
    assert "iteration 0: finished earlier" in text, text[-2000:]  # its record and manifests found in the bucket
    assert IterationRecord.load(iteration_dir(cfg, 0)).run_id == record.run_id
