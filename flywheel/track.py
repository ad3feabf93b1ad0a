"""MLflow tracking: one parent run per iteration, one nested run per stage, against the configured URI only.

MLflow 3's default tracking URI is a sqlite file in the current directory and its default artifact root is
`./mlruns`; both would scatter state wherever a job happens to start. So the tracker always sets the URI from
config and creates the experiment with the configured artifact location.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Run

import flywheel
from flywheel import failures
from flywheel.config import Config

log = logging.getLogger(__name__)
_LOGGED = "_flywheel_stop_logged"  # set on an exception once a stage has logged it


CODE_VERSION_ENV = "FLYWHEEL_CODE_VERSION"  # set by whoever submits a Ray job: its upload carries no .git


def code_version() -> str:
    """The git commit of the code that ran (with '+dirty' for uncommitted changes), else the package version.
    Inside a Ray job the working dir has no .git: the submitter's version comes in FLYWHEEL_CODE_VERSION."""
    if os.environ.get(CODE_VERSION_ENV):
        return os.environ[CODE_VERSION_ENV]
    repo = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=5)
        if sha.returncode == 0:
            return sha.stdout.strip()[:12] + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return flywheel.__version__


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 1e-4}} -> {"train.lr": "0.0001"}; MLflow params are flat strings."""
    out: dict[str, str] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if not isinstance(v, str) else v
    return out


_ANSWERED: set[str] = set()  # tracking servers that answered once in this process


def check_reachable(uri: str, timeout_s: float = 10.0, again: bool = False) -> None:
    """A tracking server that does not answer fails the command now, naming it: MLflow's client would otherwise
    retry each request for over four minutes (measured, a refused port) before saying anything. Asked once per
    process (a server that goes away later gets MLflow's retries, which ride out a restart) unless `again`: a
    long-lived command's last request (`flywheel serve`'s unpin, hours after its pin) asks anew."""
    if not uri.startswith(("http://", "https://")) or (uri in _ANSWERED and not again):
        return
    import requests

    try:  # any answer will do (an auth proxy's 401 included): only a server that is not there is refused
        requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException as e:
        raise ConnectionError(f"the MLflow tracking server {uri} (tracking.uri) does not answer ({type(e).__name__}): "
                              "start it, or point tracking.uri at one that runs") from None
    _ANSWERED.add(uri)


def client(cfg: Config) -> MlflowClient:
    """A client of the config's tracking store (and registry), once the store answers."""
    check_reachable(cfg.tracking.uri)
    return MlflowClient(tracking_uri=cfg.tracking.uri, registry_uri=cfg.tracking.uri)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite:/// tracking URI (None for any other store). MLflow creates it on first use."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _as_uri(location: str) -> str:
    return location if urlparse(location).scheme not in ("", "c", "d") else Path(location).resolve().as_uri()


class Tracker:
    """Opens runs in the configured MLflow store. Use `iteration()` around a whole iteration, `stage()` inside."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.uri = cfg.tracking.uri
        if (db := sqlite_file(self.uri)) is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(self.uri)
        self.client = client(cfg)
        exp = self.client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            location = cfg.tracking.artifact_location
            self.experiment_id = self.client.create_experiment(
                cfg.experiment, artifact_location=_as_uri(location) if location else None
            )
        else:
            self.experiment_id = exp.experiment_id
        mlflow.set_experiment(experiment_id=self.experiment_id)
        self.parent: Run | None = None

    @contextmanager
    def iteration(self, iteration: int, run_name: str | None = None, tags: Mapping[str, str] = (),
                  resume_run_id: str | None = None) -> Iterator[Run]:
        """The parent run: resolved config as params and as a YAML artifact, identifying tags. `resume_run_id`
        reopens a killed iteration's run when it has the same config, so the MLflow UI shows one run per
        iteration; its stage runs left RUNNING by the kill are marked KILLED."""
        all_tags = {
            "flywheel.iteration": str(iteration),
            "flywheel.config_hash": self.cfg.hash(),
            "flywheel.code_version": code_version(),
            **dict(tags),
        }
        reopen = self._reopenable(resume_run_id)
        if resume_run_id and not reopen:
            all_tags["flywheel.resumes_run"] = resume_run_id
        start = dict(run_id=reopen) if reopen else dict(experiment_id=self.experiment_id,
                                                        run_name=run_name or f"iteration-{iteration}")
        with mlflow.start_run(**start, tags=all_tags) as run:
            self.parent = run
            if reopen:
                self._end_orphaned_stages(reopen)
                if "flywheel.failure" in run.data.tags:  # the attempt that stopped there is over; its stage keeps it
                    self.client.delete_tag(reopen, "flywheel.failure")
                log.info("tracking: iteration %d resumes MLflow run %s in %s", iteration, reopen, self.uri)
            else:
                params = flatten(self.cfg.model_dump(mode="json"))
                items = list(params.items())
                for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
                    mlflow.log_params(dict(items[i : i + 100]))
                mlflow.log_text(self.cfg.to_yaml(), "config/resolved.yaml")
                log.info("tracking: iteration %d is MLflow run %s in %s", iteration, run.info.run_id, self.uri)
            try:
                yield run
            finally:
                self.parent = None

    def _reopenable(self, run_id: str | None) -> str | None:
        """`run_id` if it can be reopened: it exists and logged the same config (params cannot change)."""
        if not run_id:
            return None
        try:
            run = self.client.get_run(run_id)
        except Exception:  # deleted, or another store
            return None
        same = run.data.tags.get("flywheel.config_hash") == self.cfg.hash()
        return run_id if same and run.info.lifecycle_stage == "active" else None

    def _end_orphaned_stages(self, parent_id: str) -> None:
        children = self.client.search_runs(
            [self.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'RUNNING'")
        for child in children:
            self.client.set_terminated(child.info.run_id, status="KILLED")

    @contextmanager
    def stage(self, name: str, tags: Mapping[str, str] = ()) -> Iterator[Run]:
        """A nested run for one stage of the current iteration."""
        if self.parent is None:
            raise RuntimeError(f"stage '{name}' must run inside Tracker.iteration()")
        # experiment_id is explicit: a nested run otherwise lands in the active experiment (MLflow's "Default",
        # whose artifacts go to ./mlruns in whatever directory the job started in).
        with mlflow.start_run(run_name=name, nested=True, experiment_id=self.experiment_id,
                              tags={"flywheel.stage": name, **dict(tags)}) as run:
            log.info("stage %s: MLflow run %s", name, run.info.run_id)
            try:
                yield run
            except BaseException as e:  # the run ends FAILED (KILLED for a Ctrl-C); the tag says why, in the UI
                why = failures.summary(e)
                if not getattr(e, _LOGGED, False):  # a nested stage (a training inside its iteration stage) said it
                    log.error("stage %s stopped: %s", name, why)
                    try:
                        setattr(e, _LOGGED, True)
                    except AttributeError:  # an exception type without attributes: said twice, not lost
                        pass
                mlflow.set_tag("flywheel.failure", why)
                if self.parent is not None:
                    self.client.set_tag(self.parent.info.run_id, "flywheel.failure", f"stage {name}: {why}")
                raise

    def log_manifest(self, manifest: Any) -> None:
        """A dataset manifest as an artifact, plus its counts as metrics of the active run."""
        data = manifest.model_dump(mode="json") if hasattr(manifest, "model_dump") else dict(manifest)
        name = Path(str(data.get("path", "dataset"))).name or "dataset"
        mlflow.log_dict(data, f"manifests/{name}.json")
        mlflow.log_metrics({f"{name}.rows": float(data.get("row_count", 0)),
                            f"{name}.quarantined": float(data.get("quarantined", 0))})
        if data.get("quarantined"):  # the count says how many; this says why, grouped, with an example of each
            from flywheel.data_view import quarantine_reasons

            mlflow.log_dict(quarantine_reasons(str(data["path"])), f"quarantine/{name}.json")

    def ui_hint(self) -> str:
        """How a person opens this store in the MLflow UI."""
        if self.uri.startswith(("http://", "https://")):
            return f"open {self.uri}"
        return f"mlflow ui --backend-store-uri {self.uri} --host 127.0.0.1 --port 5000   # then open http://127.0.0.1:5000"
