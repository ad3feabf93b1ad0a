"""Why rows were quarantined, grouped, in the stage's MLflow run and in `flywheel data`; an iteration's datasets
listed with their counts."""

import json
from pathlib import Path

from mlflow import MlflowClient
from typer.testing import CliRunner

from flywheel.cli import app
from flywheel.config import load_config
from flywheel.data_view import brief, quarantine_reasons
from flywheel.iteration import paths
from flywheel.records import write_dataset
from flywheel.track import Tracker


def _prompt(**kw) -> dict:
    return {"task": "iu", "subtask": "iu_color", "query": "What colour is the circle?", "images": [],
            "reference_images": [], "aspects": ["color_accuracy"], "source": "test", "split": "train", **kw}


def _refused(uri: str):
    """3 rows, 2 of them refused by validation (an unknown task), beside 6 items the stage refused itself: 5
    endpoint refusals (numbers differ, an image in each raw row) and one of its own with a long raw row."""
    http = [{"kind": "prompt", "index": i, "reason": f"sample {i}: HTTP 400 from the endpoint after {i + 1} s",
             "field": "", "raw": {"query": f"q{i}", "images": [b"\x89PNG" + bytes(296)]}} for i in range(5)]
    own = [{"kind": "prompt", "index": 9, "reason": "a [reason] of its own", "field": "query",
            "raw": {"query": "x" * 5000}}]
    rows = [_prompt(), _prompt(task="bogus"), _prompt(task="bogus", query="Is there a square?")]
    return write_dataset(uri, "prompt", rows, config_hash="c", producer="prompts", quarantined=[*http, *own])


def test_reasons_are_grouped_with_their_numbers_masked_and_an_example_of_each(tmp_path):
    m = _refused(str(tmp_path / "d"))
    q = quarantine_reasons(m.path, top=2)
    assert q["total"] == m.quarantined == 8
    http, task = q["groups"]
    assert http["count"] == 5 and http["reason"] == "sample 0: HTTP 400 from the endpoint after 1 s"
    assert http["item"] == 0 and json.loads(http["example"]) == {"query": "q0", "images": ["<300 bytes>"]}
    assert task["count"] == 2 and task["field"] == "task" and "bogus" in task["example"]
    assert q["other"] == 1  # the group past --top
    own = quarantine_reasons(m.path)["groups"][2]
    assert own["count"] == 1 and own["example"].endswith("... (5013 characters)") and len(own["example"]) < 500


def test_brief_shows_bytes_as_their_size_and_keeps_the_rest():
    assert brief({"a": [{"$bytes": "AAAA"}, 1], "b": {"$bytes": 3}}) == {"a": ["<3 bytes>", 1], "b": {"$bytes": 3}}


def test_a_stage_run_carries_its_quarantine_reasons(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}/wd"])
    tracker = Tracker(cfg)
    m = _refused(f"{cfg.storage.uri}/prompts")
    with tracker.iteration(0), tracker.stage("prompts") as run:
        tracker.log_manifest(m)
    client = MlflowClient(tracker.uri)
    got = json.loads(open(client.download_artifacts(run.info.run_id, "quarantine/prompts.json",
                                                    str(tmp_path))).read())
    assert got == quarantine_reasons(m.path)


def test_flywheel_data_lists_an_iterations_datasets_and_shows_one(tmp_path):
    runner, wd = CliRunner(), f"run.workdir={tmp_path}/wd"
    r = runner.invoke(app, ["data", wd])
    assert r.exit_code == 2 and "no iteration has started" in r.output, r.output
    r = runner.invoke(app, ["data", wd, "--dataset", "labels"])  # no iteration: the name is read as a path
    assert r.exit_code == 2 and "no iteration has started under" in r.output and "read as a path" in r.output
    r = runner.invoke(app, ["data", wd, "--iteration", "5"])
    assert r.exit_code == 2 and "--iteration 5: it has not started" in r.output and "none has" in r.output
    cfg = load_config(None, [wd])
    _refused(paths(cfg, 0)["labels"])
    write_dataset(paths(cfg, 0)["curated"] + "/sft", "prompt", [_prompt()] * 2, config_hash="c", producer="curate")
    write_dataset(paths(cfg, 1)["prompts"], "prompt", [_prompt()], config_hash="c", producer="prompts")
    r = runner.invoke(app, ["data", wd, "--iteration", "0"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "labels" in x)
    assert "prompt" in line and " 1 " in line and " 8 " in line
    assert "not written" in next(x for x in r.output.splitlines() if "candidates" in x)
    assert " 2 " in next(x for x in r.output.splitlines() if "curated/sft" in x)  # a dataset below a name
    r = runner.invoke(app, ["data", wd, "--iteration", "0", "--dataset", "curated/sft"])
    assert r.exit_code == 0 and "2 prompt rows, 0 quarantined" in r.output, r.output
    r = runner.invoke(app, ["data", wd, "--iteration", "0", "--json"])
    listed = json.loads(r.output)
    labels = Path(paths(cfg, 0)["labels"])
    assert listed["labels"]["bytes"] == sum(f.stat().st_size for f in labels.iterdir() if f.name != "manifest.json")
    assert listed["labels"]["uri"] == str(labels) and listed["candidates"] is None and "curated/sft" in listed
    r = runner.invoke(app, ["data", wd])  # the latest iteration
    assert r.exit_code == 0 and "iteration 1" in r.output, r.output
    r = runner.invoke(app, ["data", wd, "--iteration", "3"])
    assert r.exit_code == 2 and "the latest started is 1" in r.output, r.output
    r = runner.invoke(app, ["data", wd, "--iteration", "0", "--dataset", "labels", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert "1 prompt rows, 8 quarantined" in r.output and "5 sample 0: HTTP 400" in r.output
    assert "3 in other groups" in r.output
    r = runner.invoke(app, ["data", wd, "--dataset", str(tmp_path / "wd" / "nowhere")])
    assert r.exit_code == 2 and "no manifest at" in r.output and "names: prompts," in r.output, r.output
    r = runner.invoke(app, ["data", wd, "--iteration", "0", "--dataset", "labels", "--json"])
    assert json.loads(r.output)["quarantine"]["total"] == 8 and json.loads(r.output)["rows"] == []
    r = runner.invoke(app, ["data", wd, "--dataset", "prompts", "--rows", "3"])  # iteration 1's: one row
    assert r.exit_code == 0 and "row 0: " in r.output and "row 1" not in r.output, r.output
    assert json.loads(r.output.split("row 0: ")[1].splitlines()[0])["query"] == "What colour is the circle?"


def test_a_judgment_datasets_outputs_that_did_not_parse_are_shown_grouped(tmp_path):
    def judgment(k: int, **fields) -> dict:
        return {"prompt_id": "pr_1", "candidate_ids": ["ca_1"], "judge": "hf:j", "protocol": "pointwise",
                "aspect": None, "order": None, "sample_k": k, **fields}

    rows = [judgment(0, raw_output="Rating: 4", score=4.0),
            *[judgment(k, raw_output=f"I like it ({k})", parse_error=f"pointwise: no 'Rating: N' in {9 + k} chars")
              for k in range(1, 4)]]
    uri = str(tmp_path / "labels")
    write_dataset(uri, "judgment", rows, config_hash="c", producer="judgments-teacher")
    r = CliRunner().invoke(app, ["data", f"run.workdir={tmp_path}/wd", "--dataset", uri])
    assert r.exit_code == 0, r.output
    assert "outputs that did not parse (rows, never scores): 3" in r.output
    assert "3 [pointwise] pointwise: no 'Rating: N' in 10 chars" in r.output and "I like it (1)" in r.output


def test_reason_groups_stay_bounded_and_count_every_item(monkeypatch):
    from flywheel import data_view

    monkeypatch.setattr(data_view, "MAX_GROUPS", 3)
    groups = data_view.ReasonGroups()
    for i in range(10):
        groups.add("f", f"reason {'abcdefghij'[i]}", i, lambda: "x")
    top = groups.top(2)
    assert len(groups.groups) == 3 and top["total"] == 10 and top["other"] == 8


def test_flywheel_data_names_a_damaged_dataset_instead_of_a_traceback(tmp_path):
    m = _refused(str(tmp_path / "d"))
    (tmp_path / "d" / m.files[0]).write_bytes(b"not parquet")
    r = CliRunner().invoke(app, ["data", f"run.workdir={tmp_path}/wd", "--dataset", m.path, "--rows", "1"])
    assert r.exit_code == 2 and "is not readable Parquet" in r.output and "Traceback" not in r.output, r.output


def test_flywheel_data_says_storage_it_cannot_read_rather_than_no_iteration(tmp_path):
    (tmp_path / "wd" / "data").mkdir(parents=True)
    (tmp_path / "wd" / "data" / "iterations").write_text("")  # not a directory: listing it fails
    r = CliRunner().invoke(app, ["data", f"run.workdir={tmp_path}/wd"])
    assert r.exit_code == 2 and f"cannot read {tmp_path}/wd/data" in r.output, r.output
    assert "no iteration" not in r.output
