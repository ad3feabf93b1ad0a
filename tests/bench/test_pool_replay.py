"""bench/pool_replay.py imports the loop's own training and evaluation entry points: a rename there must fail here,
not the first time someone replays a pool (a replay trains for about a minute, too long for this suite)."""

import subprocess
import sys

from flywheel.config import REPO_ROOT


def test_the_replay_bench_loads_and_documents_its_options():
    out = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "pool_replay.py"), "--help"], capture_output=True,
                         text=True, check=True, cwd=REPO_ROOT).stdout
    assert all(opt in out for opt in ("--pool", "--seeds", "--min-margin", "--base", "--models-from"))
