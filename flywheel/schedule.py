"""Recurring flywheel iterations on a Ray cluster, submitted through the Ray Jobs API (`flywheel schedule`).

At every tick (`--every 6h`, or `--cron "0 */6 * * *"` in UTC) the scheduler lists the cluster's jobs, keeps the
ones of this schedule (metadata `flywheel.schedule` = the schedule's name, and a submission id starting with
`flywheel-<name>-`, e.g. flywheel-local-it0003-a1-20261122-093000), and decides (`decide`, pure: no Ray needed to
test it):

  - one of ours is PENDING or RUNNING      → wait: never two iterations of one flywheel at once;
  - run.workdir is locked by another run   → wait: one that is none of its active jobs (`flywheel run`, a job
                                             submitted by hand, a driver of a job the cluster lost) holds it
                                             (flywheel/workdir_lock.py);
  - none yet, or `--start` past the latest → submit iteration `--start` (default 0);
  - the latest SUCCEEDED                   → submit the next iteration;
  - the latest FAILED, STOPPED or LOST     → submit the same iteration again (`--resume`: the iteration skips every
                                             stage whose output already exists), unless it has already had
                                             `max_attempts` attempts → halt, for a person to look at it.

A job is LOST when the decision log names it but the cluster does not know it (the cluster was replaced): its
iteration cannot be known to have finished, so it is resumed. Iteration n+1 must never start before n succeeded:
a champion of n is what n+1 starts from.

Every decision goes to the log and, as one JSON line, to the decision log (`<run.workdir>/schedule/decisions.jsonl`
unless `--decision-log`), together with what the scheduler saw; a job that ended is recorded once
(`event: job-ended`). That file is also the scheduler's memory across cluster restarts.

The job is `python jobs/iteration.py --config <config> --start <n> --resume <overrides> run.workdir=<abs>`: the
working directory (the project) is uploaded with the job, so the config path is taken relative to it; the
workdir is passed as the absolute path it resolves to here, so the job writes where this process reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from flywheel import config_files

log = logging.getLogger(__name__)

SCHEDULE_KEY = "flywheel.schedule"  # job metadata: the name of the schedule the job belongs to
ITERATION_KEY = "flywheel.iteration"
ATTEMPT_KEY = "flywheel.attempt"
ACTIVE = frozenset({"PENDING", "RUNNING"})
RESUMABLE = frozenset({"FAILED", "STOPPED", "LOST"})
STATUSES = ACTIVE | RESUMABLE | {"SUCCEEDED"}


def default_name(experiment: str, workdir: str) -> str:
    """A schedule's name when none is given: its experiment and its workdir, so that two schedules of one config
    for two workdirs on one cluster never take each other's jobs for their own."""
    return f"{experiment}-{hashlib.sha256(str(workdir).encode()).hexdigest()[:8]}"


class ScheduleError(ValueError):
    """Bad schedule input (interval, cron, address, paths); the message names what is wrong."""


@dataclass(frozen=True)
class OurJob:
    """One job of this schedule, as the cluster (or, for a LOST one, the decision log) reports it."""

    submission_id: str
    iteration: int
    attempt: int
    status: str
    start_time: float | None = None  # seconds since the epoch
    end_time: float | None = None
    why: str | None = None  # a failed job's last words (`flywheel run` ends with "stopped: <why>"), see last_words

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ScheduleError(f"job {self.submission_id}: unknown status {self.status!r}")


@dataclass(frozen=True)
class Decision:
    action: Literal["submit", "wait", "halt"]
    reason: str
    iteration: int | None = None  # submit: the iteration to run
    attempt: int | None = None  # submit: 1 for a new iteration, k+1 when resuming after k attempts
    resume: bool = False  # submit: the same iteration again after a failure
    job: str | None = None  # the job the decision is about (the running one, the failed one)


def decide(jobs: Iterable[OurJob], first_iteration: int = 0, max_attempts: int = 3,
           workdir_holder: str | None = None) -> Decision:
    """What to do now, given this schedule's jobs (any order) and who else holds run.workdir's lock, if anyone —
    see the module docstring for the rules."""
    jobs = list(jobs)
    active = sorted((j for j in jobs if j.status in ACTIVE), key=lambda j: (j.iteration, j.attempt))
    if active:
        j = active[-1]
        more = f" (and {len(active) - 1} more)" if len(active) > 1 else ""
        return Decision("wait", f"{j.submission_id} (iteration {j.iteration}, attempt {j.attempt}) is {j.status}"
                        f"{more}: one iteration at a time", job=j.submission_id)
    if workdir_holder is not None:  # its job would be refused (exit 2) and count as a failed attempt
        return Decision("wait", f"run.workdir is in use by a run that is none of this schedule's active jobs "
                        f"({workdir_holder}): waiting for it to end")
    if not jobs:
        return Decision("submit", f"no job of this schedule yet: starting iteration {first_iteration}",
                        iteration=first_iteration, attempt=1)
    last = max(jobs, key=lambda j: (j.iteration, j.attempt))
    if first_iteration > last.iteration:  # --start past this schedule's jobs: the user moved on (e.g. ran it by hand)
        return Decision("submit", f"--start {first_iteration} is past this schedule's last iteration "
                        f"{last.iteration} ({last.submission_id}, {last.status}): starting iteration "
                        f"{first_iteration}", iteration=first_iteration, attempt=1, job=last.submission_id)
    if last.status == "SUCCEEDED":
        n = max(last.iteration + 1, first_iteration)
        return Decision("submit", f"iteration {last.iteration} succeeded ({last.submission_id}): starting "
                        f"iteration {n}", iteration=n, attempt=1, job=last.submission_id)
    why = f" [{last.why}]" if last.why else ""
    if last.attempt >= max_attempts:
        return Decision("halt", f"iteration {last.iteration} ended {last.status} in all {last.attempt} attempts "
                        f"(last: {last.submission_id}{why}); not resubmitting it — look at `ray job logs "
                        f"{last.submission_id}`, fix the cause, then start the schedule again with "
                        f"--max-attempts {last.attempt + 1} (resumes it), or with --start {last.iteration + 1} "
                        "once you have finished it yourself",
                        iteration=last.iteration, job=last.submission_id)
    return Decision("submit", f"iteration {last.iteration} ended {last.status} ({last.submission_id}{why}): resuming "
                    f"it (attempt {last.attempt + 1} of {max_attempts}) before any next one",
                    iteration=last.iteration, attempt=last.attempt + 1, resume=True, job=last.submission_id)


# ---------------------------------------------------------------------------- when to tick
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(text: str) -> float:
    """'30s', '10m', '6h', '1d' (also '1.5h') → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise ScheduleError(f"--every {text!r}: expected a positive number and a unit s, m, h or d (30s, 10m, 6h, "
                            "1d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Timing:
    """When ticks happen: every `every_s` seconds from the start (the first tick at once), or at the times of a
    cron expression (UTC; the first tick at the next matching time)."""

    every_s: float | None = None
    cron: str | None = None

    @classmethod
    def parse(cls, every: str | None, cron: str | None) -> Timing:
        if bool(every) == bool(cron):
            raise ScheduleError("give exactly one of --every (e.g. 6h) and --cron (e.g. '0 */6 * * *'), or --once")
        if every:
            return cls(every_s=parse_every(every))
        from croniter import croniter

        if not croniter.is_valid(cron):
            raise ScheduleError(f"--cron {cron!r}: not a valid cron expression (e.g. '0 */6 * * *': minute hour "
                                "day-of-month month day-of-week)")
        return cls(cron=cron)

    def first(self, now: float) -> float:
        return now if self.every_s else self.next_after(now)

    def next_after(self, t: float) -> float:
        if self.every_s:
            return t + self.every_s
        from croniter import croniter

        return croniter(self.cron, datetime.fromtimestamp(t, UTC)).get_next(float)

    def describe(self) -> str:
        return f"every {self.every_s:g} s" if self.every_s else f"cron '{self.cron}' (UTC)"


# ---------------------------------------------------------------------------- the decision log
class DecisionLog:
    """JSON lines: every decision, every submission and every job end seen; also the memory of submitted jobs."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": datetime.now(UTC).isoformat(timespec="seconds"), **record}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("schedule: %s line %d is not JSON; ignored", self.path, n)
        return out

    def remembered(self, schedule: str) -> dict[str, OurJob]:
        """Jobs this schedule submitted, with the last status seen (LOST if never seen ending)."""
        jobs: dict[str, OurJob] = {}
        for r in self.records():
            if r.get("schedule") != schedule:
                continue
            sid = r.get("submission_id")
            if r.get("event") == "submitted" and sid:
                jobs[sid] = OurJob(sid, int(r["iteration"]), int(r["attempt"]), "LOST")
            elif r.get("event") == "job-ended" and sid in jobs and r.get("status") in STATUSES:
                j = jobs[sid]
                jobs[sid] = OurJob(sid, j.iteration, j.attempt, r["status"], why=r.get("why"))
        return jobs


# ---------------------------------------------------------------------------- the Jobs API side
def auth_headers() -> dict[str, str] | None:
    """A bearer header from RAY_AUTH_TOKEN or the file RAY_AUTH_TOKEN_PATH names; None leaves it to Ray (which,
    with RAY_AUTH_MODE=token, reads ~/.ray/auth_token)."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise ScheduleError(f"RAY_AUTH_TOKEN_PATH={path}: cannot read the Ray token ({e})") from None
        if not token:
            raise ScheduleError(f"RAY_AUTH_TOKEN_PATH={path}: the file is empty")
    return {"Authorization": f"Bearer {token}"} if token else None


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not s:
        raise ScheduleError(f"schedule name {name!r} has no letters or digits")
    return s


@dataclass
class IterationJobs:
    """Submits and lists the iteration jobs of one schedule through a `JobSubmissionClient`."""

    client: Any  # ray.job_submission.JobSubmissionClient (anything with its list_jobs / submit_job)
    name: str  # the schedule's name (default: the MLflow experiment of the config)
    config: str  # config path relative to working_dir (the job's current directory)
    overrides: list[str] = field(default_factory=list)
    working_dir: str = "."
    job_script: str = "jobs/iteration.py"

    @property
    def prefix(self) -> str:
        """Submission ids of this schedule start with it: flywheel-local-it0003-a1-20261122-093000."""
        s = slug(self.name)
        return f"{s}-" if s.startswith("flywheel") else f"flywheel-{s}-"

    def entrypoint(self, iteration: int) -> str:
        return shlex.join(["python", self.job_script, "--config", self.config, "--start", str(iteration),
                           "--resume", *self.overrides])

    def ours(self) -> list[OurJob]:
        out = []
        for d in self.client.list_jobs():
            md = d.metadata or {}
            sid = d.submission_id or ""
            if md.get(SCHEDULE_KEY) != self.name or not sid.startswith(self.prefix):
                continue
            try:
                iteration, attempt = int(md[ITERATION_KEY]), int(md.get(ATTEMPT_KEY, 1))
            except (KeyError, ValueError):
                log.warning("schedule: job %s has our name but no valid %s metadata; ignored", sid, ITERATION_KEY)
                continue
            status = getattr(d.status, "value", str(d.status))
            out.append(OurJob(sid, iteration, attempt, status, d.start_time / 1000 if d.start_time else None,
                              d.end_time / 1000 if d.end_time else None,
                              last_words(d.message) if status in ("FAILED", "STOPPED") else None))
        return out

    def submit(self, iteration: int, attempt: int) -> str:
        from flywheel.track import CODE_VERSION_ENV, code_version

        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        sid = f"{self.prefix}it{iteration:04d}-a{attempt}-{stamp}"
        # the job's upload carries no .git: pass the submitter's code version for MLflow's lineage tags
        runtime_env = {"working_dir": self.working_dir, "env_vars": {CODE_VERSION_ENV: code_version()}}
        return self.client.submit_job(
            entrypoint=self.entrypoint(iteration), submission_id=sid, runtime_env=runtime_env,
            metadata={SCHEDULE_KEY: self.name, ITERATION_KEY: str(iteration), ATTEMPT_KEY: str(attempt)})


class Scheduler:
    """The loop: tick, decide, act, log; between ticks it sleeps."""

    def __init__(self, jobs: IterationJobs, decisions: DecisionLog, first_iteration: int = 0, max_attempts: int = 3,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 workdir: str | Path | None = None):
        """workdir: run.workdir as this process sees it, to look for runs that hold its lock; None (or a path that
        is not here: the cluster's shared storage is not mounted) checks nothing."""
        if max_attempts < 1:
            raise ScheduleError(f"--max-attempts {max_attempts}: must be at least 1")
        if first_iteration < 0:
            raise ScheduleError(f"--start {first_iteration}: must be 0 or more")
        self.jobs, self.decisions = jobs, decisions
        self.first_iteration, self.max_attempts = first_iteration, max_attempts
        self.clock, self.sleep = clock, sleep
        self.workdir = workdir
        self._ended = {r["submission_id"] for r in decisions.records()
                       if r.get("event") == "job-ended" and r.get("schedule") == jobs.name}

    def known_jobs(self) -> list[OurJob]:
        """The cluster's jobs of this schedule, plus those only the decision log remembers (LOST, or ended)."""
        live = {j.submission_id: j for j in self.jobs.ours()}
        for sid, j in self.decisions.remembered(self.jobs.name).items():
            live.setdefault(sid, j)
        for j in live.values():
            if j.status not in ACTIVE and j.submission_id not in self._ended and j.status != "LOST":
                self._ended.add(j.submission_id)
                self.decisions.write({"event": "job-ended", "schedule": self.jobs.name,
                                      "submission_id": j.submission_id, "iteration": j.iteration,
                                      "attempt": j.attempt, "status": j.status, "start_time": j.start_time,
                                      "end_time": j.end_time, "why": j.why})
                log.info("schedule: %s (iteration %d, attempt %d) ended %s", j.submission_id, j.iteration, j.attempt,
                         j.status)
        return list(live.values())

    def tick(self) -> tuple[Decision, str | None]:
        """One decision, acted on; returns it and the submission id when it submitted."""
        from flywheel.workdir_lock import holder

        jobs = self.known_jobs()
        # looked at only when none of ours runs: the look takes a shared lock for an instant, which a starting job
        # of ours would have to wait out
        busy = (holder(self.workdir) if self.workdir is not None and not any(j.status in ACTIVE for j in jobs)
                else None)
        d = decide(jobs, self.first_iteration, self.max_attempts, busy)
        seen = dict(sorted(Counter(j.status for j in jobs).items()))
        self.decisions.write({"event": "decision", "schedule": self.jobs.name, **asdict(d), "seen": seen})
        (log.error if d.action == "halt" else log.info)("schedule: %s — %s", d.action.upper(), d.reason)
        if d.action != "submit":
            return d, None
        sid = self.jobs.submit(d.iteration, d.attempt)
        self.decisions.write({"event": "submitted", "schedule": self.jobs.name, "submission_id": sid,
                              "iteration": d.iteration, "attempt": d.attempt, "resume": d.resume,
                              "entrypoint": self.jobs.entrypoint(d.iteration)})
        log.info("schedule: submitted %s: %s (follow it: ray job logs -f %s)", sid, self.jobs.entrypoint(d.iteration),
                 sid)
        return d, sid

    def wait_for(self, sid: str, poll_s: float) -> str:
        """Poll until the job ends; record and return its status. A poll that cannot reach the cluster (a restart,
        the network) is logged and tried again: the job runs on without us."""
        while True:
            try:
                jobs = self.known_jobs()
            except (RuntimeError, OSError) as e:  # ConnectionError is an OSError
                error = f"{type(e).__name__}: {e}"
                self.decisions.write({"event": "error", "schedule": self.jobs.name, "error": error})
                log.error("schedule: polling %s failed (%s); polling again in %g s", sid, error, poll_s)
            else:
                job = next((j for j in jobs if j.submission_id == sid), None)
                if job is None:
                    raise ScheduleError(f"job {sid} vanished from the cluster and from the decision log")
                if job.status not in ACTIVE:
                    return job.status
            self.sleep(poll_s)

    def run(self, timing: Timing | None, once: bool = False, max_runs: int | None = None,
            poll_s: float = 30.0) -> int:
        """Tick until stopped (Ctrl-C), after one tick (`once`), or after `max_runs` submissions — then wait for
        the last one and return 0 if it succeeded. A halt returns 1."""
        if max_runs is not None and max_runs < 1:
            raise ScheduleError(f"--max-runs {max_runs}: must be at least 1")
        log.info("schedule %r: %s; decisions → %s", self.jobs.name, "one tick" if once else timing.describe(),
                 self.decisions.path)
        submitted: list[str] = []
        t = None if once else timing.first(self.clock())
        while True:
            if t is not None and (wait := t - self.clock()) > 0:
                log.info("schedule: next tick at %s", datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds"))
                self.sleep(wait)
            try:
                d, sid = self.tick()
            except (RuntimeError, OSError) as e:  # ConnectionError is an OSError
                # The cluster may be down for a while (a restart, the network): the next tick tries again.
                error = f"{type(e).__name__}: {e}"
                self.decisions.write({"event": "error", "schedule": self.jobs.name, "error": error})
                log.error("schedule: tick failed (%s)%s", error, "" if once else "; trying again at the next tick")
                if once:
                    return 1
                d, sid = Decision("wait", "tick failed"), None
            if d.action == "halt":
                return 1
            if sid:
                submitted.append(sid)
            if once:
                return 0
            if max_runs is not None and len(submitted) >= max_runs:
                status = self.wait_for(submitted[-1], poll_s)
                log.info("schedule: %d runs submitted; the last, %s, ended %s", len(submitted), submitted[-1], status)
                return 0 if status == "SUCCEEDED" else 1
            t = timing.next_after(t)
            while t <= self.clock():  # ticks missed while a tick ran are skipped, not caught up
                t = timing.next_after(t)


def last_words(message: str | None, limit: int = 300) -> str | None:
    """Why a failed job ended, from its Jobs API message (which ends with the tail of its log): the `stopped: ...`
    line `flywheel run` ends with (rich may have wrapped it), else the message's last line."""
    if not message:
        return None
    flat = " ".join(message.split())
    at = flat.rfind("stopped: ")
    words = flat[at:] if at >= 0 else message.strip().splitlines()[-1].strip()
    words = words.split(" Finished stages,")[0]  # the resume hint after it says nothing about this job
    return words if len(words) <= limit else words[: limit - 3] + "..."


def config_relative_to(config: Path, working_dir: Path) -> str:
    """The config path as the job sees it (relative to the uploaded working directory), which must also hold the
    files it extends."""
    c, w = config.resolve(), working_dir.resolve()
    if not c.is_file():
        raise ScheduleError(f"--config {config}: file not found")
    try:
        files = config_files.chain(c)
    except config_files.ConfigError as e:
        raise ScheduleError(f"--config {config}: {e}") from None
    outside = [f for f in files if not f.is_relative_to(w)]
    if outside:
        raise ScheduleError(f"--config {config}: {', '.join(map(str, outside))} must lie inside the working "
                            f"directory {w}, which is what the job gets")
    return c.relative_to(w).as_posix()


def make_client(address: str | None):
    """A Jobs API client with this cluster's token (see auth_headers)."""
    from ray.job_submission import JobSubmissionClient

    from flywheel.raycluster import cluster_address_from_env

    address = address or os.environ.get("RAY_API_SERVER_ADDRESS") or cluster_address_from_env()
    if not address:
        raise ScheduleError("no cluster: give --address http://<head>:8265 (the dashboard / Jobs API), or set "
                            "RAY_API_SERVER_ADDRESS")
    stale = os.environ.get("RAY_ADDRESS") if cluster_address_from_env() is None else None
    if stale:  # the SDK prefers RAY_ADDRESS to the address it is given: hide one an embedded Ray left behind
        os.environ.pop("RAY_ADDRESS")
    try:
        return JobSubmissionClient(address, headers=auth_headers())
    finally:
        if stale:
            os.environ["RAY_ADDRESS"] = stale
