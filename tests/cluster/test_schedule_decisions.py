"""The scheduler's decisions (flywheel/schedule.py), without a cluster: what it does given this schedule's jobs."""

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from flywheel.cli import app
from flywheel.config import REPO_ROOT
from flywheel.schedule import (DecisionLog, IterationJobs, OurJob, ScheduleError, Scheduler, Timing, decide,
                               parse_every)


def job(iteration, attempt, status, sid=None, why=None):
    return OurJob(sid or f"flywheel-local-it{iteration:04d}-a{attempt}", iteration, attempt, status, why=why)


def test_first_tick_starts_the_first_iteration():
    d = decide([], first_iteration=0)
    assert (d.action, d.iteration, d.attempt, d.resume) == ("submit", 0, 1, False)
    assert decide([], first_iteration=4).iteration == 4


@pytest.mark.parametrize("status", ["RUNNING", "PENDING"])
def test_a_running_iteration_is_never_joined_by_another(status):
    jobs = [job(0, 1, "SUCCEEDED"), job(1, 1, status)]
    d = decide(jobs)
    assert d.action == "wait" and d.job == jobs[1].submission_id and d.iteration is None
    assert status in d.reason


def test_an_older_job_still_running_blocks_too():
    # e.g. a resumed attempt of iteration 2 still running while the history also has a later record
    d = decide([job(2, 2, "RUNNING"), job(3, 1, "FAILED")])
    assert d.action == "wait" and "it0002-a2" in d.job


def test_success_starts_the_next_iteration():
    d = decide([job(0, 1, "SUCCEEDED"), job(1, 1, "FAILED"), job(1, 2, "SUCCEEDED")])
    assert (d.action, d.iteration, d.attempt, d.resume) == ("submit", 2, 1, False)


@pytest.mark.parametrize("status", ["FAILED", "STOPPED", "LOST"])
def test_a_failed_stopped_or_lost_iteration_is_resumed_before_the_next(status):
    d = decide([job(0, 1, "SUCCEEDED"), job(1, 1, status)])
    assert (d.action, d.iteration, d.attempt, d.resume) == ("submit", 1, 2, True)
    assert status in d.reason


def test_after_max_attempts_it_halts_instead_of_looping():
    jobs = [job(1, 1, "FAILED"), job(1, 2, "FAILED"), job(1, 3, "FAILED")]
    d = decide(jobs, max_attempts=3)
    assert d.action == "halt" and d.iteration == 1 and "3 attempts" in d.reason and "ray job logs" in d.reason
    assert "--max-attempts 4" in d.reason and "--start 2" in d.reason  # what it says unblocks it does
    assert decide(jobs, max_attempts=4).action == "submit"
    moved_on = decide(jobs, first_iteration=2, max_attempts=3)  # iteration 1 finished by hand
    assert (moved_on.action, moved_on.iteration, moved_on.attempt, moved_on.resume) == ("submit", 2, 1, False)
    assert decide(jobs, first_iteration=1, max_attempts=3).action == "halt"  # --start at or before it: no skip


def test_order_of_the_listing_does_not_matter():
    jobs = [job(1, 2, "SUCCEEDED"), job(0, 1, "SUCCEEDED"), job(1, 1, "FAILED")]
    assert decide(jobs).iteration == 2 and decide(list(reversed(jobs))).iteration == 2


def test_an_unknown_status_is_an_error():
    with pytest.raises(ScheduleError, match="unknown status 'WEIRD'"):
        job(0, 1, "WEIRD")


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("10m", 600), ("6h", 21600), ("1d", 86400), ("1.5h", 5400)])
def test_every_units(text, seconds):
    assert parse_every(text) == seconds


@pytest.mark.parametrize("text", ["6", "6x", "-1h", "0s", "h", ""])
def test_bad_every_is_refused_by_name(text):
    with pytest.raises(ScheduleError, match="--every"):
        parse_every(text)


def test_cron_ticks_at_the_cron_times_in_utc():
    t = Timing.parse(None, "0 */6 * * *")
    now = datetime(2026, 11, 22, 7, 30, tzinfo=UTC).timestamp()
    first = t.first(now)
    assert datetime.fromtimestamp(first, UTC) == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert datetime.fromtimestamp(t.next_after(first), UTC) == datetime(2026, 11, 22, 18, 0, tzinfo=UTC)


def test_every_ticks_at_once_then_at_the_interval():
    t = Timing.parse("10m", None)
    assert t.first(1000.0) == 1000.0 and t.next_after(1000.0) == 1600.0


@pytest.mark.parametrize("every,cron,match", [(None, None, "exactly one"), ("6h", "0 * * * *", "exactly one"),
                                              (None, "61 * * * *", "not a valid cron")])
def test_timing_needs_exactly_one_valid_rule(every, cron, match):
    with pytest.raises(ScheduleError, match=match):
        Timing.parse(every, cron)


def test_the_decision_log_remembers_jobs_and_their_ends(tmp_path):
    log = DecisionLog(tmp_path / "d.jsonl")
    log.write({"event": "submitted", "schedule": "s", "submission_id": "a", "iteration": 0, "attempt": 1})
    log.write({"event": "job-ended", "schedule": "s", "submission_id": "a", "status": "SUCCEEDED"})
    log.write({"event": "submitted", "schedule": "s", "submission_id": "b", "iteration": 1, "attempt": 1})
    log.write({"event": "submitted", "schedule": "other", "submission_id": "c", "iteration": 9, "attempt": 1})
    with open(log.path, "a") as f:
        f.write("not json\n")
    jobs = log.remembered("s")
    assert {k: (j.iteration, j.status) for k, j in jobs.items()} == {"a": (0, "SUCCEEDED"), "b": (1, "LOST")}
    # a job the cluster forgot (it was replaced) is resumed, not skipped
    assert decide(jobs.values()).iteration == 1 and decide(jobs.values()).resume
    assert all("time" in json.loads(line) for line in log.path.read_text().splitlines()[:4])


@pytest.mark.parametrize("args,message", [
    (["--every", "5x"], "--every '5x'"),
    (["--every", "1h", "--cron", "0 * * * *"], "exactly one"),
    (["--cron", "0 0 0 0 0 0 0"], "not a valid cron"),
    (["--every", "1h", "--config", "{outside}"], "must lie inside the working directory"),
    (["--every", "1h", "--job", "jobs/nope.py"], "--job jobs/nope.py: no such file"),
    (["--once", "--max-attempts", "0"], "--max-attempts 0"),
    (["--once"], "Failed to connect to Ray at address: http://127.0.0.1:9"),  # all input fine; no cluster there
])
def test_cli_refuses_bad_input_naming_it(args, message, tmp_path):
    outside = tmp_path / "elsewhere.yaml"  # a valid config, but the job (which gets the working dir) can't see it
    outside.write_text((REPO_ROOT / "configs" / "local.yaml").read_text())
    args = [str(outside) if a == "{outside}" else a for a in args]
    # The address is a closed port: every input is checked before the cluster is contacted.
    res = CliRunner().invoke(app, ["schedule", "--address", "http://127.0.0.1:9", *args, f"run.workdir={tmp_path}"],
                             env={"RAY_API_SERVER_ADDRESS": "", "RAY_ADDRESS": ""})
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_cli_without_a_cluster_address_says_how_to_give_one(tmp_path):
    res = CliRunner().invoke(app, ["schedule", "--once", f"run.workdir={tmp_path}"],
                             env={"RAY_API_SERVER_ADDRESS": "", "RAY_ADDRESS": ""})
    assert res.exit_code == 2 and "--address http://<head>:8265" in res.output


class FlakyCluster:
    """Stands in for a Jobs API that is unreachable for a while (a cluster restart: hard to stage for real here);
    after that, jobs finish the moment they are listed once."""

    def __init__(self, down_for: int):
        self.down_for, self.jobs = down_for, []

    def list_jobs(self):
        if self.down_for > 0:
            self.down_for -= 1
            raise ConnectionError("Failed to connect to Ray at address: http://head:8265.")
        listed = [SimpleNamespace(**j) for j in self.jobs]
        for j in self.jobs:
            j["status"] = "SUCCEEDED"
        return listed

    def submit_job(self, *, entrypoint, submission_id, runtime_env, metadata):
        self.jobs.append({"submission_id": submission_id, "metadata": metadata, "status": "RUNNING",
                          "start_time": None, "end_time": None, "entrypoint": entrypoint})
        return submission_id


def test_the_loop_survives_an_unreachable_cluster_and_goes_on_at_the_next_tick(tmp_path):
    cluster = FlakyCluster(down_for=2)
    jobs = IterationJobs(cluster, "flywheel-local", "configs/local.yaml", ["run.workdir=/w"])
    now = [1000.0]
    scheduler = Scheduler(jobs, DecisionLog(tmp_path / "d.jsonl"), clock=lambda: now[0],
                          sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert scheduler.run(Timing.parse("1h", None), max_runs=2, poll_s=5) == 0
    records = DecisionLog(tmp_path / "d.jsonl").records()
    assert [r["event"] for r in records][:2] == ["error", "error"]  # two ticks (an hour apart) found no cluster
    assert [j["entrypoint"] for j in cluster.jobs] == [
        "python jobs/iteration.py --config configs/local.yaml --start 0 --resume run.workdir=/w",
        "python jobs/iteration.py --config configs/local.yaml --start 1 --resume run.workdir=/w"]
    # ticks: +0h and +1h no cluster, +2h submits 0, +3h finds it running, +4h submits 1 (then waits for it)
    assert [r.get("action") for r in records if r["event"] == "decision"] == ["submit", "wait", "submit"]
    assert 1000.0 + 4 * 3600 <= now[0] < 1000.0 + 5 * 3600


def test_once_with_an_unreachable_cluster_fails(tmp_path):
    jobs = IterationJobs(FlakyCluster(down_for=1), "flywheel-local", "configs/local.yaml")
    assert Scheduler(jobs, DecisionLog(tmp_path / "d.jsonl")).run(None, once=True) == 1


def test_waiting_for_the_last_run_survives_a_cluster_that_is_briefly_unreachable(tmp_path):
    cluster, calls = FlakyCluster(down_for=0), []
    listing = cluster.list_jobs

    def blip():  # the first poll after the submission finds no cluster
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("Failed to connect to Ray at address: http://head:8265.")
        return listing()

    cluster.list_jobs = blip
    jobs = IterationJobs(cluster, "flywheel-local", "configs/local.yaml", ["run.workdir=/w"])
    scheduler = Scheduler(jobs, DecisionLog(tmp_path / "d.jsonl"), sleep=lambda s: None)
    assert scheduler.run(Timing.parse("1h", None), max_runs=1, poll_s=5) == 0  # it succeeded: exit 0
    events = [r["event"] for r in DecisionLog(tmp_path / "d.jsonl").records()]
    assert events[events.index("submitted") + 1] == "error" and len(calls) >= 3


def test_two_workdirs_of_one_config_are_two_schedules_by_default():
    from flywheel.schedule import default_name

    a, b = default_name("flywheel-local", "/w/runs/a"), default_name("flywheel-local", "/w/runs/b")
    assert a != b and a.startswith("flywheel-local-") and a == default_name("flywheel-local", "/w/runs/a")


def test_a_run_it_did_not_submit_on_its_workdir_makes_it_wait():
    holder = '{"what": "iteration 2", "pid": 4242}'
    for jobs in ([], [job(0, 1, "SUCCEEDED")], [job(1, 1, "FAILED")]):
        d = decide(jobs, workdir_holder=holder)
        assert d.action == "wait" and holder in d.reason and d.iteration is None


def test_the_scheduler_waits_while_another_process_holds_the_workdir(tmp_path):
    import subprocess
    import sys

    hold = "import sys, time; from flywheel.workdir_lock import holding\n" \
           "with holding(sys.argv[1], 'iteration 0'):\n    print('held', flush=True); sys.stdin.readline()"
    other = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # e.g. a `flywheel run` started by hand
    try:
        assert other.stdout.readline().strip() == "held"
        cluster = FlakyCluster(down_for=0)
        scheduler = Scheduler(IterationJobs(cluster, "flywheel-local", "configs/local.yaml"),
                              DecisionLog(tmp_path / "d.jsonl"), workdir=tmp_path)
        d, sid = scheduler.tick()
        assert d.action == "wait" and '"iteration 0"' in d.reason and sid is None and cluster.jobs == []
        other.communicate("\n", timeout=30)  # it ends, and with it its lock
        d, sid = scheduler.tick()
        assert d.action == "submit" and d.iteration == 0 and [j["submission_id"] for j in cluster.jobs] == [sid]
    finally:
        other.kill()


def test_a_config_and_every_file_it_extends_must_reach_the_job(tmp_path):
    from flywheel.schedule import config_relative_to

    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    (tmp_path / "base.yaml").write_text("run: {seed: 1}\n")  # outside the uploaded working dir
    (work / "configs" / "base.yaml").write_text("run: {seed: 2}\n")
    mine = work / "configs" / "mine.yaml"
    mine.write_text("extends: ../../base.yaml\n")
    with pytest.raises(ScheduleError, match=r"base\.yaml must lie inside the working directory"):
        config_relative_to(mine, work)
    mine.write_text("extends: base.yaml\n")
    assert config_relative_to(mine, work) == "configs/mine.yaml"
    mine.write_text("extends: gone.yaml\n")
    with pytest.raises(ScheduleError, match="names no file"):
        config_relative_to(mine, work)


def test_a_failed_jobs_last_words_reach_the_decision_log_and_the_reasons(tmp_path):
    """The Jobs API's message of a failed job ends with its log's tail: `flywheel run`'s "stopped: ..." (wrapped
    by rich) is what a person needs to read first, in the decision log and in a halt's reason."""
    from flywheel.schedule import last_words

    message = ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
               "  File \"...\", line 9\n[11/30/26 02:20:17] ERROR iteration stopped\nstopped: CapReached: stage "
               "judgments-teacher: http.cost 201 passed\nits cap 200 after 35 of 60 batches\nFinished stages, and the "
               "finished batches of the one that stopped, are kept: the same command again resumes there.\n")
    why = "stopped: CapReached: stage judgments-teacher: http.cost 201 passed its cap 200 after 35 of 60 batches"
    assert last_words(message) == why
    assert last_words("Job was intentionally stopped.") == "Job was intentionally stopped." and last_words("") is None

    cluster = FlakyCluster(down_for=0)
    cluster.list_jobs = lambda: [SimpleNamespace(
        submission_id="flywheel-local-it0000-a1-x", status="FAILED", start_time=None, end_time=None,
        message=message, metadata={"flywheel.schedule": "flywheel-local", "flywheel.iteration": "0",
                                   "flywheel.attempt": "1"})]
    cluster.submit_job = lambda **kw: kw["submission_id"]
    scheduler = Scheduler(IterationJobs(cluster, "flywheel-local", "configs/local.yaml"),
                          DecisionLog(tmp_path / "d.jsonl"), max_attempts=2)
    d, _ = scheduler.tick()
    assert d.action == "submit" and d.resume and why in d.reason
    ended = [r for r in DecisionLog(tmp_path / "d.jsonl").records() if r["event"] == "job-ended"]
    assert ended[0]["why"] == why
    log = DecisionLog(tmp_path / "d.jsonl")  # a cluster that forgot the job: the log still says why it ended
    log.write({"event": "submitted", "schedule": "s", "submission_id": "a", "iteration": 0, "attempt": 1})
    log.write({"event": "job-ended", "schedule": "s", "submission_id": "a", "status": "FAILED", "why": why})
    assert log.remembered("s")["a"].why == why
    assert why in decide([job(0, 1, "FAILED", why=why), job(0, 2, "FAILED", why=why)], max_attempts=2).reason
