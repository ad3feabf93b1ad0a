"""An iteration's stage clock: a resumed run reports the time a stage took in the run that finished it."""

from flywheel.iteration import StageClock


def test_a_stage_finished_before_a_kill_keeps_its_time(tmp_path):
    uri = str(tmp_path / "it" / "stage-seconds.json")
    first = StageClock(uri)
    assert first.finished("candidates", 30.0) == 30.0
    # the driver is killed during "labels"; the next run skips candidates in a moment and redoes labels
    resumed = StageClock(uri)
    assert resumed.finished("candidates", 0.2) == 30.2
    assert resumed.finished("labels", 12.0) == 12.0
    assert StageClock(uri).done == {"candidates": 30.2, "labels": 12.0}
