"""An iteration's summary and galleries, as a person sees them in the MLflow UI (scripts/check_mlflow_ui.py).

The store is built with the real code: Tracker's parent and stage runs, `flywheel.review.log_gallery` on PIL-drawn
images, `flywheel.iteration._summarize` on an IterationResult with gate Decisions. The browser tests need a
Chromium binary (`bash scripts/install_chromium.sh` installs Debian's); without one they skip — unless
FLYWHEEL_REQUIRE_CHROMIUM=1, which turns the skip into a failure on machines that are meant to run them (.ci/run
sets it once it has installed chromium). The negative tests make sure the check
is not vacuous: a run without the description, and one without a gallery, must fail it.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from PIL import Image, ImageDraw

from flywheel.config import REPO_ROOT, load_config
from flywheel.gate import Decision
from flywheel.iteration import IterationResult, _summarize
from flywheel.review import log_gallery
from flywheel.track import Tracker

SCRIPT = REPO_ROOT / "scripts" / "check_mlflow_ui.py"
_spec = importlib.util.spec_from_file_location("check_mlflow_ui", SCRIPT)
ui = sys.modules.setdefault("check_mlflow_ui", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(ui)


@pytest.fixture(scope="session")
def chromium_binary() -> str:
    """Skips the browser tests where no Chromium is installed — never silently where one is required."""
    try:
        return ui.find_chromium()
    except ui.SetupError as e:
        if os.environ.get("FLYWHEEL_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"FLYWHEEL_REQUIRE_CHROMIUM=1 but {e}")
        pytest.skip("no chromium binary on this machine: `bash scripts/install_chromium.sh` installs Debian's to run "
                    "the MLflow UI check; set FLYWHEEL_REQUIRE_CHROMIUM=1 to make this a failure instead of a skip")


# ------------------------------------------------------------------------------------------------ the store


def _png(draw) -> bytes:
    im = Image.new("RGB", (56, 56), "white")
    draw(ImageDraw.Draw(im))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


RED_CIRCLE = _png(lambda d: d.ellipse((12, 12, 44, 44), fill="red"))
BLUE_SQUARE = _png(lambda d: d.rectangle((14, 14, 42, 42), fill="blue"))
RED_TRIANGLE = _png(lambda d: d.polygon([(28, 10), (46, 44), (10, 44)], fill="red"))

PROMPTS = {"p-iu": {"prompt_id": "p-iu", "task": "iu", "query": "What colour is the circle?", "images": [RED_CIRCLE]},
           "p-t2i": {"prompt_id": "p-t2i", "task": "t2i", "query": "Draw a blue square.", "images": []}}
CANDIDATES = {
    "c-right": {"candidate_id": "c-right", "prompt_id": "p-iu", "output_text": "The circle is red.",
                "output_images": []},
    "c-wrong": {"candidate_id": "c-wrong", "prompt_id": "p-iu", "output_text": "The circle is green.",
                "output_images": []},
    "c-square": {"candidate_id": "c-square", "prompt_id": "p-t2i", "output_text": None, "output_images": [BLUE_SQUARE]},
    "c-triangle": {"candidate_id": "c-triangle", "prompt_id": "p-t2i", "output_text": None,
                   "output_images": [RED_TRIANGLE]},
}
ANALYSES = {"c-right": "The answer says red, and the circle is red. The answer is right.",
            "c-wrong": "The answer says green, but the circle is red. The answer is wrong.",
            "c-square": "The image shows a blue square, as asked.",
            "c-triangle": "The image shows a red triangle; a blue square was asked for."}
JUDGMENTS = [{"candidate_ids": [cid], "analysis": a} for cid, a in ANALYSES.items()]
PAIRS = [{"kind": "policy", "prompt_id": "p-iu", "chosen_id": "c-right", "rejected_id": "c-wrong", "chosen_score": 5.0,
          "rejected_score": 1.0, "margin": 4.0, "judge": "models:/judge/2"},
         {"kind": "policy", "prompt_id": "p-t2i", "chosen_id": "c-square", "rejected_id": "c-triangle",
          "chosen_score": 5.0, "rejected_score": 2.0, "margin": 3.0, "judge": "models:/judge/2"}]


def _decision(model: str, promoted: bool, reason: str) -> dict:
    return Decision(model=model, challenger=f"models:/{model}/2", champion=f"models:/{model}/1", metric="accuracy",
                    challenger_value=0.8, champion_value=0.6, margin=0.0, promoted=promoted, reason=reason).to_dict()


def _iteration(tracker: Tracker, n: int, summarize: bool = True, gallery: bool = True) -> str:
    """A parent run as run_iteration leaves it: stage runs, the curate-policy gallery, then the summary."""
    with tracker.iteration(n) as parent:
        with tracker.stage("prompts"):
            mlflow.log_metric("rows_out", 2)
        with tracker.stage("curate-policy"):
            if gallery:
                log_gallery(PAIRS, PROMPTS, CANDIDATES, JUDGMENTS)
        if summarize:
            res = IterationResult(n, parent.info.run_id)
            res.seconds = {"prompts": 1.2, "curate-policy": 0.3, "gate-judge": 0.0}
            res.counts = {"prompts": 2, "pref_pairs": 2}
            res.meta_eval = {"challenger": {"id-test": {"all/pairwise/accuracy": 0.75,
                                                        "all/pointwise/kendall_tau_b": 0.5,
                                                        "all/pairwise/position_bias_rate": 0.1}}}
            res.downstream = {"policy": {"before": {"accuracy": 0.4}, "after": {"accuracy": 0.55},
                                         "model": "models:/policy-llava/2", "base": "world:policy"}}
            res.decisions = [_decision("judge", True, "accuracy 0.8000 > champion 0.6000 + margin 0.0"),
                             _decision("policy-llava", False, "accuracy 0.8000 ≤ champion 0.8000: champion stays")]
            _summarize(res)
    return parent.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Three iteration runs: 5 has no description (it crashed before the summary), 6 no gallery, 7 both; 7 is the
    latest, so it is what the check picks by default."""
    wd = tmp_path_factory.mktemp("ui") / "wd"
    cfg = load_config(None, [f"run.workdir={wd}", "run.name=ui-test"])
    tracker = Tracker(cfg)
    runs = {"no_summary": _iteration(tracker, 5, summarize=False), "no_gallery": _iteration(tracker, 6, gallery=False),
            "good": _iteration(tracker, 7)}
    mlflow.set_tracking_uri(None)
    return {"workdir": wd, "uri": cfg.tracking.uri, "root": str(wd / "mlartifacts"), **runs}


# ------------------------------------------------------------------------------------------------ no browser needed


def test_gallery_is_on_the_iteration_run_with_images_and_without_null_columns(store):
    client = MlflowClient(store["uri"])
    good = client.get_run(store["good"])
    logged = {a["path"] for a in json.loads(good.data.tags["mlflow.loggedArtifacts"])}
    assert {"gallery/chosen_vs_rejected.json", "gallery/chosen_vs_rejected-text.json"} <= logged
    stage = client.search_runs([good.info.experiment_id], f"tags.mlflow.parentRunId = '{good.info.run_id}' "
                                                          "and tags.`flywheel.stage` = 'curate-policy'")[0]
    assert "gallery/chosen_vs_rejected-text.json" in stage.data.tags["mlflow.loggedArtifacts"]  # and on the stage
    text = ui._load_json(client, good.info.run_id, "gallery/chosen_vs_rejected-text.json")
    images = ui._load_json(client, good.info.run_id, "gallery/chosen_vs_rejected.json")
    # the VQA pair shows the image its answers are about; its empty output-image columns are gone
    assert text["columns"][:2] == ["prompt", "prompt_image"] and "chosen_image" not in text["columns"]
    assert text["data"][0][1]["type"] == "image"
    row = dict(zip(text["columns"], text["data"][0]))
    assert row["chosen_analysis"] == ANALYSES["c-right"] and row["rejected_text"] == "The circle is green."
    # the generator pair shows both drawn images; the T2I prompt has none, so no prompt_image column
    assert "prompt_image" not in images["columns"]
    row = dict(zip(images["columns"], images["data"][0]))
    assert row["chosen_image"]["type"] == row["rejected_image"]["type"] == "image"


def test_gallery_with_a_broken_image_is_still_logged(tmp_path):
    """MLflow refuses a column mixing images and None; a broken PNG must not fail the curate stage."""
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    exp = mlflow.create_experiment("g", artifact_location=(tmp_path / "a").as_uri())
    cands = CANDIDATES | {"c-broken": {"candidate_id": "c-broken", "prompt_id": "p-t2i", "output_text": None,
                                       "output_images": [b"not a png"]}}
    pairs = PAIRS + [PAIRS[1] | {"rejected_id": "c-broken", "rejected_score": 4.0, "margin": 1.0}]
    with mlflow.start_run(experiment_id=exp) as run:
        paths = log_gallery(pairs, PROMPTS, cands, JUDGMENTS)
    t = ui._load_json(MlflowClient(), run.info.run_id, "gallery/chosen_vs_rejected.json")
    mlflow.set_tracking_uri(None)
    assert paths == ["gallery/chosen_vs_rejected.json", "gallery/chosen_vs_rejected-text.json"]
    rows = [dict(zip(t["columns"], r)) for r in t["data"]]
    assert len(rows) == 2 and all(r["rejected_image"]["type"] == "image" for r in rows)  # the broken one: a tile


def test_expected_summary_comes_from_the_summary_artifact(store):
    """What the check looks for is the iteration's data, not the markdown's wording (which changes)."""
    client = MlflowClient(store["uri"])
    run = client.get_run(store["good"])
    exp = ui.expected_summary(run, ui._summary(client, run))
    assert exp["texts"] == ["Flywheel iteration 7"]
    assert exp["pairs"] == [("meta-eval id-test", "id-test", "0.750"), ("downstream policy", "policy", "0.550")]
    assert exp["decisions"] == [("judge", "accuracy 0.8000 > champion 0.6000 + margin 0.0"),
                                ("policy-llava", "accuracy 0.8000 ≤ champion 0.8000: champion stays")]
    assert exp["tables"] == {"stage": ["prompts", "curate-policy", "gate-judge"], "dataset": ["prompts", "pref_pairs"]}
    assert ui.find_run(client, "latest").info.run_id == store["good"]


def test_missing_chromium_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CHROMIUM", raising=False)
    with pytest.raises(ui.SetupError, match="chromium not found: apt-get install -y chromium"):
        ui.find_chromium()


# ------------------------------------------------------------------------------------------------ in the browser


def _own_processes(marker: str) -> list[str]:
    """Processes whose command line mentions `marker` (a temporary path only this test uses)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(f"{d.name}: {cmd[:200]}")
    return out


@pytest.mark.slow
def test_cli_sees_summary_and_galleries_then_stops_everything(store, tmp_path, chromium_binary):
    """The command a person runs: its own server and browser on the latest iteration; exit 0, what it saw, the
    screenshots — and afterwards no server, worker or browser process of its own is left."""
    tmp = Path(tempfile.mkdtemp(prefix="uitest-", dir="/tmp"))  # short: Chromium's socket path limit
    try:
        _cli_run(store, tmp, tmp_path / "shots")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cli_run(store, tmp: Path, out: Path) -> None:
    env = os.environ | {"TMPDIR": str(tmp)}  # the server's cwd and Chromium's profile go there: findable below
    p = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(store["workdir"]), "--out", str(out),
                        "--prefix", "it"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    for line in ["ok   summary: 'Flywheel iteration 7' visible",
                 "ok   summary: meta-eval id-test (id-test … 0.750) visible",
                 "ok   summary: downstream policy (policy … 0.550) visible",
                 "ok   summary: decision judge: 'accuracy 0.8000 > champion 0.6000 + margin 0.0' visible",
                 "ok   summary: decision policy-llava: 'accuracy 0.8000 ≤ champion 0.8000: champion stays' visible",
                 "ok   summary: stage table (3 stages) visible", "ok   summary: dataset table (2 datasets) visible",
                 "ok   gallery gallery/chosen_vs_rejected-text.json: image column 'prompt_image' visible",
                 "ok   gallery gallery/chosen_vs_rejected.json: image column 'chosen_image' visible",
                 "ok   gallery gallery/chosen_vs_rejected.json: image column 'rejected_image' visible",
                 "ok   gallery gallery/chosen_vs_rejected-text.json: column 'chosen_analysis' visible",
                 f"ok   gallery gallery/chosen_vs_rejected-text.json: the full chosen_analysis "
                 f"{ANALYSES['c-right'][:60]!r} visible after clicking its cell",
                 "OK: the summary and the galleries are visible"]:
        assert line in p.stdout, p.stdout
    assert re.search(r"ok   summary: all \d+ blocks of the description visible", p.stdout), p.stdout
    assert f"/runs/{store['good']}" in p.stdout
    shots = sorted(x.name for x in out.iterdir())
    assert shots == ["it-gallery-chosen_vs_rejected-text.png", "it-gallery-chosen_vs_rejected.png",
                     "it-summary.png"]
    for s in out.iterdir():
        im = Image.open(s)
        assert im.width >= 800 and im.height >= 300 and s.stat().st_size <= ui.MAX_SCREENSHOT_BYTES
    assert _own_processes(str(tmp)) == [] and _own_processes(store["uri"]) == []
    # the server's working directory and the browser's profile are removed (MLflow's db_init_lock file may stay)
    assert [x for x in tmp.iterdir() if x.is_dir()] == []


@pytest.fixture(scope="module")
def server(store, chromium_binary):
    with ui.mlflow_server(store["uri"], store["root"]) as url:
        yield url
    assert _own_processes(store["uri"]) == []  # the fixture's server is gone too


@pytest.mark.slow
def test_check_fails_when_the_summary_is_missing(store, server):
    """A run whose description was never written (the iteration stopped before _summarize) must fail the check,
    naming what is not there — the gallery on it is fine."""
    with pytest.raises(ui.UICheckFailed) as e:
        ui.check(store["uri"], store["no_summary"], server_url=server)
    problems = e.value.problems
    assert "summary: 'Flywheel iteration 5' not on the page" in problems
    assert all(p.startswith("summary:") for p in problems), problems  # the galleries were seen
    assert any("image column 'prompt_image' visible" in c for c in e.value.report.checked)


@pytest.mark.slow
def test_check_sees_only_what_is_on_screen(store, server):
    """Before "Show more" the description is in the page but cut off (the dataset table) or under the collapsed
    box's fade (the decisions, its first block after the heading): not visible."""
    with pytest.raises(ui.UICheckFailed) as e:
        ui.check(store["uri"], store["good"], server_url=server, expand=False)
    clipped = "is clipped (collapsed or scrolled out of a container)"
    assert any(p.startswith("summary: decision judge: 'accuracy 0.8000 > champion 0.6000 + margin 0.0' is ")
               for p in e.value.problems), e.value.problems
    assert f"summary: dataset table (2 datasets) {clipped}" in e.value.problems
    assert any(p.startswith("summary: block ") and p.endswith(clipped) for p in e.value.problems)
    assert "summary: 'Flywheel iteration 7' visible" in e.value.report.checked  # the heading shows when collapsed


@pytest.mark.slow
def test_check_fails_when_there_is_no_gallery(store, server):
    with pytest.raises(ui.UICheckFailed) as e:
        ui.check(store["uri"], store["no_gallery"], server_url=server)
    assert e.value.problems == [f"no gallery table (gallery/*.json logged with mlflow.log_table) on run "
                                f"{store['no_gallery']} or its stage runs"]
    assert "summary: 'Flywheel iteration 6' visible" in e.value.report.checked
