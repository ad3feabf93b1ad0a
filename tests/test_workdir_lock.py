"""One iteration per working directory: a second driver is refused at once, naming the first; a killed holder
leaves no stale lock (a real second process holds it here)."""

import signal
import subprocess
import sys

import pytest

from flywheel.config import REPO_ROOT, load_config
from flywheel.iteration import run_iteration
from flywheel.workdir_lock import WorkdirBusy, holding

HOLD = "import sys, time; from flywheel.workdir_lock import holding\n" \
       "with holding(sys.argv[1], 'iteration 3'):\n    print('held', flush=True); time.sleep(120)"


@pytest.fixture
def other_driver(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_driver_is_refused_naming_the_first(tmp_path, other_driver):
    cfg = load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}"])
    with pytest.raises(WorkdirBusy, match=rf'in use by another flywheel run: .*"iteration 3".*"pid": '
                                          rf'{other_driver.pid}'):
        run_iteration(cfg, 4)  # refused before it reads or writes anything
    assert not (tmp_path / "data").exists()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, other_driver):
    other_driver.send_signal(signal.SIGKILL)
    other_driver.wait()
    with holding(tmp_path, "iteration 4"):
        with pytest.raises(WorkdirBusy, match="iteration 4"):  # and it holds against a second holder in turn
            with holding(tmp_path, "iteration 5"):
                pass
    with holding(tmp_path, "iteration 5"):  # released at the end of the block
        pass
