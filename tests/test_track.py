"""Tracking goes to the configured store, with parent/nested runs that a client can read back."""

import os

import mlflow
import pytest
from mlflow import MlflowClient

from flywheel.config import load_config
from flywheel.records import write_dataset
from flywheel.track import Tracker, flatten


@pytest.fixture
def tracked_cfg(tmp_path):
    return load_config(None, [f"run.workdir={tmp_path}/wd", "run.name=track-test"])


def test_parent_and_nested_runs_read_back_through_the_client(tracked_cfg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written relative to the cwd would land here
    tracker = Tracker(tracked_cfg)
    os.makedirs(tmp_path / "dl")
    manifest = write_dataset(f"{tracked_cfg.storage.uri}/prompts", "prompt", [{
        "task": "iu", "subtask": "iu_color", "query": "What colour is the circle?", "images": [],
        "reference_images": [], "aspects": ["color_accuracy"], "source": "test", "split": "train",
    }], config_hash=tracked_cfg.hash(), producer="prompts")
    with tracker.iteration(3) as parent:
        with tracker.stage("prompts") as stage:
            mlflow.log_metric("rows_out", 1)
            tracker.log_manifest(manifest)

    client = MlflowClient(tracking_uri=tracked_cfg.tracking.uri)
    p = client.get_run(parent.info.run_id)
    assert p.data.tags["flywheel.iteration"] == "3"
    assert p.data.tags["flywheel.config_hash"] == tracked_cfg.hash()
    assert p.data.params["train.lr"] == str(tracked_cfg.train.lr)
    assert p.data.params["judge.engine"] == "hf"
    s = client.get_run(stage.info.run_id)
    assert s.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert s.data.tags["flywheel.stage"] == "prompts"
    assert s.data.metrics["rows_out"] == 1 and s.data.metrics["prompts.rows"] == 1
    arts = [a.path for a in client.list_artifacts(stage.info.run_id, "manifests")]
    assert arts == ["manifests/prompts.json"]
    # Nothing leaked into the working directory, and the store is where the config says.
    assert not {"mlruns", "mlflow.db", "mlartifacts"} & set(os.listdir(tmp_path))
    cfg_art = client.download_artifacts(parent.info.run_id, "config/resolved.yaml", str(tmp_path / "dl"))
    assert "judge:" in open(cfg_art).read()
    assert os.path.exists(f"{tracked_cfg.run.workdir}/mlflow.db")
    assert client.get_experiment_by_name("track-test").artifact_location.startswith(f"file://{tracked_cfg.run.workdir}")


def test_stage_outside_iteration_is_an_error(tracked_cfg):
    with pytest.raises(RuntimeError, match="inside Tracker.iteration"):
        with Tracker(tracked_cfg).stage("x"):
            pass


def test_second_tracker_reuses_the_experiment(tracked_cfg):
    assert Tracker(tracked_cfg).experiment_id == Tracker(tracked_cfg).experiment_id


def test_flatten():
    assert (flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x", "e": {}})
            == {"a.b": "1", "a.c": "[1, 2]", "d": "x", "e": "{}"})


def test_code_version_comes_from_the_submitter_inside_a_job(monkeypatch):
    """A Ray job's working dir has no .git: the version the submitter passes wins over what git says here."""
    from flywheel.track import CODE_VERSION_ENV, code_version

    here = code_version()
    monkeypatch.setenv(CODE_VERSION_ENV, "abc123def456")
    assert code_version() == "abc123def456" != here


def test_a_stage_that_stops_says_why_on_its_run_and_the_iterations_until_a_resume(tracked_cfg):
    tracker = Tracker(tracked_cfg)
    with pytest.raises(ConnectionError), tracker.iteration(0) as parent:
        with tracker.stage("labels") as stage:
            raise ConnectionError("teacher endpoint unreachable\nmore lines the tag leaves out")
    client = MlflowClient(tracking_uri=tracked_cfg.tracking.uri)
    s, p = client.get_run(stage.info.run_id), client.get_run(parent.info.run_id)
    assert s.info.status == "FAILED"
    assert s.data.tags["flywheel.failure"] == "ConnectionError: teacher endpoint unreachable"
    assert p.data.tags["flywheel.failure"] == "stage labels: ConnectionError: teacher endpoint unreachable"
    with tracker.iteration(0, resume_run_id=parent.info.run_id) as again:  # the resume reopens the run
        assert again.info.run_id == parent.info.run_id
    assert "flywheel.failure" not in client.get_run(parent.info.run_id).data.tags
    assert client.get_run(stage.info.run_id).data.tags["flywheel.failure"]  # the stopped stage's record stays


def test_a_stop_inside_a_nested_stage_is_logged_once(tracked_cfg, caplog):
    """A training runs as a stage of its own inside its iteration's stage of the same name: one line, not two."""
    tracker = Tracker(tracked_cfg)
    with caplog.at_level("ERROR", logger="flywheel.track"):
        with pytest.raises(KeyboardInterrupt), tracker.iteration(0):
            with tracker.stage("judge-sft") as outer, tracker.stage("judge-sft") as inner:
                raise KeyboardInterrupt
    stops = [r.getMessage() for r in caplog.records if "stopped" in r.getMessage()]
    assert stops == ["stage judge-sft stopped: KeyboardInterrupt"]
    client = MlflowClient(tracking_uri=tracked_cfg.tracking.uri)  # both runs still say why, in the UI
    assert client.get_run(outer.info.run_id).data.tags["flywheel.failure"] == "KeyboardInterrupt"
    assert client.get_run(inner.info.run_id).data.tags["flywheel.failure"] == "KeyboardInterrupt"


def _http_server(status: int, answer: bool = True):
    """A local HTTP server that answers every GET with `status` (or accepts and never answers): stands in for an
    MLflow server, or an auth proxy in front of one, where only whether something answers matters."""
    import http.server
    import threading
    import time

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if not answer:
                time.sleep(3)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_tracking_server_that_does_not_answer_is_refused_at_once_naming_it(tmp_path):
    """MLflow's client retries a refused port for over four minutes before it says anything (measured): the
    tracker asks the server's /health first and stops in seconds, naming the URI and the config key."""
    import socket
    import time

    from flywheel.track import check_reachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = load_config(None, [f"run.workdir={tmp_path}/wd", f"tracking.uri=http://127.0.0.1:{port}"])
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"http://127.0.0.1:{port} \(tracking.uri\) does not answer"):
        Tracker(cfg)
    assert time.monotonic() - t0 < 30
    silent = _http_server(200, answer=False)  # accepts, never answers: refused after the timeout
    with pytest.raises(ConnectionError, match="does not answer"):
        check_reachable(f"http://127.0.0.1:{silent.server_address[1]}", timeout_s=0.5)
    silent.shutdown()


def test_any_answer_from_the_tracking_server_counts_as_there():
    from flywheel.track import check_reachable

    proxy = _http_server(401)  # an auth proxy in front of MLflow: there, only the client's requests need the token
    check_reachable(f"http://127.0.0.1:{proxy.server_address[1]}")
    proxy.shutdown()
    check_reachable("sqlite:////nonexistent/never-probed.db")  # only http(s) stores are asked


def test_serves_unpin_asks_again_a_server_that_answered_its_pin(tmp_path):
    """`flywheel serve` pins, serves for hours, then unpins: a tracking server gone meanwhile is refused in seconds
    (asked anew), not after MLflow's minutes of retries; every other client asks a server once per process."""
    import time

    from flywheel.serve.model import ServedModel, unpin
    from flywheel.track import check_reachable

    server = _http_server(200)
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    check_reachable(uri)  # it answered once (the pin)
    server.shutdown()
    server.server_close()
    check_reachable(uri)  # once per process: not asked again
    cfg = load_config(None, [f"run.workdir={tmp_path}/wd", f"tracking.uri={uri}"])
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"{uri} \(tracking.uri\) does not answer"):
        unpin(cfg, ServedModel(ref="models:/judge@champion", uri="models:/judge/3", version="models:/judge/3"),
              "judge")
    assert time.monotonic() - t0 < 30
