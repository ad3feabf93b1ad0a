"""Wall time per stage of one iteration, over every run that worked on it, kept beside the iteration's data.

A resumed run skips the stages an earlier run finished and reports the time they took then, not the moment the skip
took. A stage that did not finish (it raised, or the driver was killed) keeps the time spent on it too: on an
exception the time is written as the exception passes, and while a stage runs a heartbeat thread writes it every
few seconds, so a SIGKILL loses at most one heartbeat. The next run that finishes the stage reports the sum.

Beside each finished stage's time it keeps the machine's mean 1-minute load average while the stage ran (the
run that finished it) and the CPUs this process may use: a stage that ran while other jobs shared the machine
took longer than it would alone, and `busy_note` says which ones did.

The file (`<iteration>/stage-seconds.json`): {"finished": {stage: seconds}, "unfinished": {stage: seconds},
"load": {stage: mean load}, "cpus": n}. Files written before unfinished stages were kept hold the finished map
alone, and are read as such.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flywheel import storage

log = logging.getLogger(__name__)


FILE = "stage-seconds.json"  # in the iteration's directory


class StageClock:
    def __init__(self, uri: str, heartbeat_s: float = 10.0):
        self.uri = uri
        self.heartbeat_s = heartbeat_s
        state = json.loads(storage.read_bytes(uri)) if storage.exists(uri) else {}
        if not isinstance(state.get("finished"), dict):  # the earlier flat form: finished stages only
            state = {"finished": state, "unfinished": {}}
        self.done: dict[str, float] = state["finished"]
        # seconds earlier runs spent on stages they did not finish
        self.unfinished: dict[str, float] = state.get("unfinished", {})
        self.load: dict[str, float] = state.get("load", {})
        self.cpus = cpus()
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Times the block; afterwards `done[name]` is the stage's total over every run that worked on it."""
        t0 = time.perf_counter()
        stop = threading.Event()
        loads: list[float] = []

        def heartbeat() -> None:
            while not stop.wait(self.heartbeat_s):
                loads.append(os.getloadavg()[0])
                self._save_unfinished(name, time.perf_counter() - t0)

        beat = threading.Thread(target=heartbeat, name=f"stage-clock-{name}", daemon=True)
        beat.start()
        finished = False
        try:
            yield
            finished = True
        finally:
            stop.set()
            beat.join()
            seconds = time.perf_counter() - t0
            if finished:
                loads.append(os.getloadavg()[0])
                self.finished(name, seconds, sum(loads) / len(loads))
            else:
                spent = self._save_unfinished(name, seconds, keep=True)
                log.info("stage %s did not finish: %.1f s spent on it so far (%s)", name, spent, self.uri)

    def finished(self, name: str, seconds: float, load: float | None = None) -> float:
        """The stage's total over the runs that worked on it, recorded before the next stage starts (with the mean
        load while this run worked on it)."""
        with self._lock:
            first = name not in self.done
            before, lost = self.done.get(name, 0.0), self.unfinished.pop(name, 0.0)
            if not first:
                log.info("stage %s: finished by an earlier run in %.1f s (%.1f s now)", name, before, seconds)
            elif lost:
                log.info("stage %s: %.1f s now, after %.1f s in earlier runs that did not finish it", name,
                         seconds, lost)
            self.done[name] = before + lost + seconds
            if load is not None and first:  # a stage skipped on resume keeps the load it ran under
                self.load[name] = round(load, 2)
            self._write()
            return self.done[name]

    def _save_unfinished(self, name: str, seconds: float, keep: bool = False) -> float:
        """Writes this run's time on an unfinished stage on top of what earlier runs spent on it; keep: the stage
        ended here (raised), so that sum becomes what a retry in this process starts from."""
        with self._lock:
            spent = self.unfinished.get(name, 0.0) + seconds
            unfinished = {**self.unfinished, name: spent}
            if keep:
                self.unfinished = unfinished
            self._write(unfinished)
            return spent

    def _write(self, unfinished: dict[str, float] | None = None) -> None:
        state = {"finished": self.done, "unfinished": self.unfinished if unfinished is None else unfinished,
                 "load": self.load, "cpus": self.cpus}
        storage.write_bytes(self.uri, json.dumps(state, indent=1).encode())


def time_line(seconds: dict[str, float], top: int = 6) -> str:
    """The iteration's stage seconds in one line, longest first: "572 s in stages: judge-sft 272, ... (+13 more
    stages 38)". Empty when there are none."""
    if not seconds:
        return ""
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])
    line = f"{sum(seconds.values()):.0f} s in stages: " + ", ".join(f"{k} {v:.0f}" for k, v in ranked[:top])
    rest = ranked[top:]
    return line + (f" (+{len(rest)} more stages {sum(v for _, v in rest):.0f})" if rest else "")


def cpus() -> int:
    """CPUs this process may run on (a container's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# A mean load above this many times the CPUs: other work shared the machine. Measured on 2 CPUs: an iteration alone
# runs at 2.4-3.3 (Serve replicas and engine actors beside the stage's work), with a 2-thread training beside it 5.5.
BUSY = 2.0


def busy_note(load: dict[str, float], n_cpus: int | None) -> str:
    """"machine busy: load 4.1 on 2 CPUs during labels, judge-sft" for the stages that ran while the machine had
    much more work than CPUs (one iteration alone keeps the load within 1.7x the CPUs); empty when none did."""
    if not load or not n_cpus:
        return ""
    busy = {k: v for k, v in load.items() if v > BUSY * n_cpus}
    if not busy:
        return ""
    return f"machine busy: load {max(busy.values()):.1f} on {n_cpus} CPUs during {', '.join(busy)}"
