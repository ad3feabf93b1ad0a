"""The processes a test started in a session of their own (`start_new_session=True`), and killing all of them."""

import os
import signal
import subprocess
import time


def session_pids(sid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == sid:
                    pids.append(int(d))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def kill_session(proc) -> list[int]:
    """SIGKILL everything the training process started: it leads its own session; Ray's workers sit in process
    groups of their own inside that session, so killing the process group alone would let them train on."""
    for pid in session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.time() + 30
    while session_pids(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    return session_pids(proc.pid)
