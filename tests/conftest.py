"""Shared fixtures: a config rooted in a temporary workdir, and the tiny zoo built once per session."""

from __future__ import annotations

import os
import sys

import pytest

from tiny_iteration import ZOO_MODELS

from flywheel.config import REPO_ROOT, Config, load_config


@pytest.fixture(scope="session")
def session_workdir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("workdir"))


@pytest.fixture(scope="session")
def cfg(session_workdir) -> Config:
    return load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={session_workdir}", *ZOO_MODELS])


@pytest.fixture(scope="session")
def zoo(cfg):
    from flywheel.models.zoo import build_zoo

    return build_zoo(cfg)


@pytest.fixture(scope="session")
def s3_bucket():
    """An S3 bucket, as `s3://flywheel`: moto's S3 server on 127.0.0.1 (no object store is reachable from these
    machines; moto answers S3's HTTP API, so pyarrow's real S3 client, the one a cluster uses, is what runs).
    pyarrow and boto3 find it through AWS_ENDPOINT_URL, as they would a MinIO."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            mp.setenv(key, value)
        boto3.client("s3").create_bucket(Bucket="flywheel")
        yield "s3://flywheel"
    server.stop()


@pytest.fixture(scope="session")
def gcs_bucket(tmp_path_factory):
    """A GCS bucket, as `gs://flywheel`: gcp-storage-emulator on 127.0.0.1 (GCS's JSON API, in memory;
    tests/gcs_emulator.py), found through CLOUD_STORAGE_EMULATOR_ENDPOINT as Google's clients find an emulator
    (flywheel/storage.py); the client that runs is pyarrow's GCS filesystem, the one a cluster on GKE uses."""
    import subprocess
    import sys
    import time
    import urllib.request

    from flywheel.raycluster import free_port

    port, log = free_port(), tmp_path_factory.mktemp("gcs") / "emulator.log"
    with open(log, "w") as out:
        script = os.path.join(os.path.dirname(__file__), "gcs_emulator.py")
        server = subprocess.Popen([sys.executable, script, str(port)], stdout=out, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b/flywheel", timeout=1)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, \
                f"the GCS emulator did not answer on {url}: {log.read_text()}"
            time.sleep(0.1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", url)
            yield "gs://flywheel"
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture(autouse=True)
def _ray_data_wait_kept_per_test():
    """Ray Data's actor wait is process-wide and init_ray sets it from each config (ray.wait_for_actors_s): a test
    that deploys with a 4 s bound must not hand it to the next test in the process, which under pytest-xdist may be
    one that starts Ray by hand and then waits only 4 s for its actors on a box busy with the other worker."""
    from ray.data.context import DataContext

    before = DataContext.get_current().wait_for_min_actors_s
    yield
    DataContext.get_current().wait_for_min_actors_s = before


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """End the test process once pytest is done with it, with pytest's exit status. What would follow is the
    interpreter's finalization, where threads the libraries leave behind (Ray's, gRPC's, torch's) crashed it once
    after every test had passed (a fresh clone on 2026-11-30: "1025 passed", then "Segmentation fault", exit 139),
    failing a suite for nothing it tests. FLYWHEEL_TEST_FINALIZE=1 lets the interpreter finalize, to look into it."""
    if _EXIT_STATUS and os.environ.get("FLYWHEEL_TEST_FINALIZE") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])

