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


def test_a_busy_workdir_is_refused_before_ray_starts(tmp_path, other_driver, monkeypatch):
    from typer.testing import CliRunner

    from flywheel.cli import app

    started = []
    monkeypatch.setattr("flywheel.raycluster.init_ray", lambda cfg: started.append(cfg))  # records; starts nothing
    r = CliRunner().invoke(app, ["run", "--config", str(REPO_ROOT / "configs/local.yaml"),
                                 f"run.workdir={tmp_path}"])
    assert r.exit_code == 2 and "in use by another flywheel run" in r.output, r.output
    assert started == [] and not (tmp_path / "data").exists()


def test_another_thread_of_the_holding_process_is_refused(tmp_path):
    import threading

    refused = []

    def other():
        try:
            with holding(tmp_path, "iteration 9"):
                pass
        except WorkdirBusy as e:
            refused.append(str(e))

    with holding(tmp_path, "iteration 4"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert refused and "another thread of this process" in refused[0]


def _holds_elsewhere(workdir) -> bool:
    """Whether another process is refused the workdir now."""
    probe = "import sys; from flywheel.workdir_lock import WorkdirBusy, holding\n" \
            "try:\n    with holding(sys.argv[1], 'probe'): print('got it')\nexcept WorkdirBusy: print('busy')"
    out = subprocess.run([sys.executable, "-c", probe, str(workdir)], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "busy"


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, other_driver):
    other_driver.send_signal(signal.SIGKILL)
    other_driver.wait()
    with holding(tmp_path, "iterations 4-5"):
        with holding(tmp_path, "iteration 4"):  # nested in one process (flywheel run, then each iteration): fine
            assert _holds_elsewhere(tmp_path)
        assert _holds_elsewhere(tmp_path)  # the inner block's end does not release the outer one's lock
    assert not _holds_elsewhere(tmp_path)  # released at the end of the block
