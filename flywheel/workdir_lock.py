"""One flywheel iteration per working directory at a time.

Two drivers on one workdir (a `make run` beside a scheduled job, a job submitted twice) would train, register and
gate the same iteration side by side. An advisory lock (flock) on `<run.workdir>/.flywheel.lock`, held while
iterations run (`flywheel run` takes it before Ray starts), refuses the second with the first's identity; another
thread of the holding process is refused too. The lock dies with its process, so a killed run never leaves a
stale one behind. `flywheel schedule` looks at it (`holder`) to wait for runs it did not submit. On a shared file
system it holds across nodes where the file system supports flock (NFSv4, CephFS, Lustre with flock mounted);
elsewhere it only guards one node.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FILE = ".flywheel.lock"
# lock files this process holds -> the thread holding each: holding() nests in that thread (flock would refuse its
# own second open), and refuses every other thread
_HELD: dict[str, int] = {}
_ATTEMPTS, _PAUSE_S = 5, 0.05  # holder()'s look takes a shared lock for an instant: a start then tries again


class WorkdirBusy(RuntimeError):
    """Another process holds the working directory's lock."""


@contextmanager
def holding(workdir: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold the workdir's lock for the block (`what`: e.g. "iteration 3"), or raise WorkdirBusy at once. Inside a
    block of the same thread that holds it already, it is a no-op (`flywheel run` holds it before Ray starts, each
    iteration again)."""
    path = Path(workdir).resolve() / FILE
    key = str(path)
    if key in _HELD:
        if _HELD[key] != threading.get_ident():
            raise WorkdirBusy(f"{workdir} is in use by another thread of this process")
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as f:
        for attempt in range(_ATTEMPTS):
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt + 1 < _ATTEMPTS:
                    time.sleep(_PAUSE_S)
                    continue
                f.seek(0)
                holder = f.read().strip() or "a process that has not said who it is yet"
                raise WorkdirBusy(f"{workdir} is in use by another flywheel run: {holder}. Wait for it to end, or "
                                  "give this run another run.workdir") from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"what": what, "pid": os.getpid(), "host": socket.gethostname(),
                            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
        f.flush()
        _HELD[key] = threading.get_ident()
        try:
            yield
        finally:
            del _HELD[key]
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def holder(workdir: str | os.PathLike) -> str | None:
    """Who holds the workdir's lock now (as they wrote it), or None when nobody does; takes nothing."""
    path = Path(workdir).resolve() / FILE
    if not path.is_file() or str(path) in _HELD:
        return None
    with open(path, encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "a process that has not said who it is yet"
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
