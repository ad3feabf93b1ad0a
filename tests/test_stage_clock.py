"""An iteration's stage clock: a resumed run reports the time a stage took in the run that finished it, plus the
time earlier runs spent on it without finishing (they raised, or were killed)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flywheel import stage_clock
from flywheel.stage_clock import StageClock, busy_note


def _state(uri) -> dict:
    with open(uri) as f:
        return json.load(f)


def test_a_stage_finished_before_a_kill_keeps_its_time(tmp_path):
    uri = str(tmp_path / "it" / "stage-seconds.json")
    first = StageClock(uri)
    assert first.finished("candidates", 30.0) == 30.0
    # the driver is killed during "labels"; the next run skips candidates in a moment and redoes labels
    resumed = StageClock(uri)
    assert resumed.finished("candidates", 0.2) == 30.2
    assert resumed.finished("labels", 12.0) == 12.0
    assert StageClock(uri).done == {"candidates": 30.2, "labels": 12.0}


def test_a_stage_that_raised_keeps_its_time_for_the_run_that_finishes_it(tmp_path):
    uri = str(tmp_path / "stage-seconds.json")
    clock = StageClock(uri, heartbeat_s=60)
    with pytest.raises(RuntimeError, match="worker died"), clock.stage("labels"):
        time.sleep(0.3)
        raise RuntimeError("worker died")
    assert "labels" not in clock.done
    lost = _state(uri)["unfinished"]["labels"]
    assert lost >= 0.3
    resumed = StageClock(uri)
    with resumed.stage("labels"):
        time.sleep(0.1)
    assert resumed.done["labels"] >= lost + 0.1
    state = _state(uri)
    assert (state["finished"], state["unfinished"]) == ({"labels": resumed.done["labels"]}, {})


def test_a_retry_in_the_same_process_adds_up_every_attempt(tmp_path):
    clock = StageClock(str(tmp_path / "s.json"), heartbeat_s=60)
    for _ in range(2):
        with pytest.raises(ValueError), clock.stage("judge-sft"):
            time.sleep(0.1)
            raise ValueError
    with clock.stage("judge-sft"):
        pass
    assert clock.done["judge-sft"] >= 0.2


KILLED = """
import sys, time
from flywheel import stage_clock
from flywheel.stage_clock import StageClock, busy_note
clock = StageClock(sys.argv[1], heartbeat_s=0.1)
clock.finished("candidates", 3.0)
with clock.stage("labels"):
    print("in stage", flush=True)
    time.sleep(60)
"""


def test_a_sigkilled_stage_keeps_the_time_up_to_its_last_heartbeat(tmp_path):
    uri = str(tmp_path / "stage-seconds.json")
    proc = subprocess.Popen([sys.executable, "-c", KILLED, uri], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "in stage"
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)  # no handler, no finally: only the heartbeat's writes survive
    proc.wait()
    state = _state(uri)
    assert state["finished"] == {"candidates": 3.0}
    assert 0.7 <= state["unfinished"]["labels"] <= 5.0
    resumed = StageClock(uri)
    with resumed.stage("labels"):
        pass
    assert resumed.done["labels"] >= 0.7


def test_the_earlier_flat_file_is_read_as_finished_stages(tmp_path):
    uri = tmp_path / "stage-seconds.json"
    uri.write_text(json.dumps({"candidates": 30.0}))
    clock = StageClock(str(uri))
    assert clock.done == {"candidates": 30.0} and clock.unfinished == {}
    assert clock.finished("labels", 2.0) == 2.0
    assert _state(uri) == {"finished": {"candidates": 30.0, "labels": 2.0}, "unfinished": {}, "load": {},
                           "cpus": stage_clock.cpus()}  # finished() without a load: none recorded


def test_the_time_line_names_the_longest_stages_and_adds_up_the_rest():
    from flywheel.stage_clock import time_line

    seconds = {"prompts": 3.4, "judge-sft": 271.9, "labels": 17.3, "meta-eval": 28.9, "gold": 2.8}
    assert time_line(seconds, top=2) == "324 s in stages: judge-sft 272, meta-eval 29 (+3 more stages 24)"
    assert time_line(seconds) == "324 s in stages: judge-sft 272, meta-eval 29, labels 17, prompts 3, gold 3"
    assert time_line({}) == ""


def test_each_stage_keeps_the_load_it_ran_under_and_a_resumed_skip_does_not_overwrite_it(tmp_path, monkeypatch):
    """The machine's load is faked (a busy machine cannot be summoned in a test): 4.0, then 1.0 from the resume."""
    uri = str(tmp_path / "stage-seconds.json")
    monkeypatch.setattr(stage_clock.os, "getloadavg", lambda: (4.0, 0.0, 0.0))
    clock = StageClock(uri, heartbeat_s=0.05)
    with clock.stage("labels"):
        time.sleep(0.3)
    assert clock.load == {"labels": 4.0}
    monkeypatch.setattr(stage_clock.os, "getloadavg", lambda: (1.0, 0.0, 0.0))
    resumed = StageClock(uri, heartbeat_s=0.05)
    with resumed.stage("labels"):  # finished earlier: skipped in a moment
        pass
    with resumed.stage("judge-sft"):
        time.sleep(0.2)
    state = _state(uri)
    assert state["load"] == {"labels": 4.0, "judge-sft": 1.0} and state["cpus"] == stage_clock.cpus() >= 1


def test_the_busy_note_names_the_stages_that_shared_the_machine():
    assert busy_note({"labels": 2.4, "preference-candidates": 3.33}, 2) == ""  # measured: one iteration alone
    assert busy_note({"labels": 4.12, "judge-sft": 3.3, "meta-eval": 5.54}, 2) == \
        "machine busy: load 5.5 on 2 CPUs during labels, meta-eval"
    assert busy_note({}, 2) == busy_note({"labels": 9.0}, None) == ""  # written before the load was kept
