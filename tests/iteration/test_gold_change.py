"""The gold set changed between two iterations (here world.gold.prompts_per_subtask; in use, a user's labels
added through meta_eval.gold_files): the second iteration measures the champion judge again on the new gold,
beside its challenger, so the gate tests the two on the same pairs (McNemar) and records the champion's new
value and meta-eval on its version. Without it the gate compared a value from one gold set with one from another."""

import subprocess
import sys

import pytest

from flywheel import gate
from flywheel.config import REPO_ROOT, load_config
from flywheel.iteration import iteration_dir, paths
from flywheel.iteration_record import IterationRecord
from tiny_iteration import TINY

pytestmark = pytest.mark.slow

# a negative margin promotes the tiny random judge (it orders no gold pair), so iteration 1 meets a champion
RUN = [*TINY, "gate.judge_test=none", "gate.judge_margin=-1"]


def _iterations(tmp_path, count: int, extra: list[str]) -> str:
    log = tmp_path / f"run-{count}.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), "--iterations", str(count),
                               *extra], stdout=out, stderr=subprocess.STDOUT, timeout=1800)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


def test_a_champion_judged_on_gold_that_changed_since_is_measured_again_beside_the_challenger(tmp_path):
    run = [f"run.workdir={tmp_path / 'wd'}", *RUN]
    _iterations(tmp_path, 1, run)
    changed = [*run, "world.gold.prompts_per_subtask=2"]
    text = _iterations(tmp_path, 2, changed)

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", changed)
    first, second = (IterationRecord.load(iteration_dir(cfg, n)) for n in (0, 1))
    champion = first.decisions[0]["challenger"]
    assert first.decisions[0]["promoted"] and second.start["judge"] == champion
    d = second.decisions[0]
    assert d["champion"] == champion and d["test"] == "McNemar", d  # the paired test ran: both on the same gold
    assert "measuring it again there" in text, text[-4000:]  # and the log says why the champion was judged
    p = paths(cfg, 1)
    assert gate.recorded_meta_eval(cfg, champion) == gate.MetaEval(p["meta-eval-baseline"], p["gold"])
    assert gate.measured_on(cfg, champion, cfg.gate.judge_metric, p["gold"])
    assert d["champion_value"] == pytest.approx(gate.recorded(cfg, champion, cfg.gate.judge_metric))
