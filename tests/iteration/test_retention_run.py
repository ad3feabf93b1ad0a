"""Three whole iterations with `storage.keep_iterations: 1`, as a schedule runs them: after each, the older finished
iterations lose their datasets but what is still read, and the next iteration runs on what is left (its gold from
iteration 0's prompts). The rules themselves are tested on hand-made stores in tests/test_retention.py."""

import json
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from flywheel import retention, storage
from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_manifest, verify_dataset
from flywheel.iteration import iteration_dir, paths
from flywheel.iteration_record import IterationRecord
from tiny_iteration import TINY

pytestmark = pytest.mark.slow

# The tiny random judge orders no gold pair: a negative margin promotes it, so each iteration starts from the last
# one's judge. Each iteration updates both policies on its own pairs (TINY: no pool), so no pool holds old pairs.
RUN = [*TINY, "gate.judge_test=none", "gate.judge_margin=-1", "storage.keep_iterations=1"]


def test_three_iterations_keep_one_whole_and_of_the_others_what_is_still_read(tmp_path):
    run = [f"run.workdir={tmp_path / 'wd'}", *RUN]
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), "--iterations", "3", *run],
                              stdout=out, stderr=subprocess.STDOUT, timeout=1800)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert text.count("retention: ") >= 2, text[-4000:]

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", run)
    assert all(IterationRecord.load(iteration_dir(cfg, n)).finished for n in range(3))
    left = {n: {d for d in storage.subdirs(iteration_dir(cfg, n))} for n in range(3)}
    assert left[0] == {"prompts"}  # every iteration's gold was made from it
    assert left[1] == set()
    assert {"prompts", "candidates", "labels", "curated", "pref-curated"} <= left[2]
    first = paths(cfg, 0)["prompts"]
    verify_dataset(first)
    for split in storage.subdirs(paths(cfg, 0)["gold"]):
        gold = read_manifest(storage.join(paths(cfg, 0)["gold"], split, "prompts"))
        assert gold.upstream[0].content_hash == read_manifest(first).content_hash  # the gold iteration 2 used
    marker = json.loads(storage.read_bytes(storage.join(iteration_dir(cfg, 0), retention.MARKER)))
    assert {"candidates", "labels", "curated/sft"} <= set(marker["datasets"]) and set(marker["kept"]) == {"prompts"}
    client = MlflowClient(cfg.tracking.uri)
    for n in (0, 1):
        tags = client.get_run(IterationRecord.load(iteration_dir(cfg, n)).run_id).data.tags
        assert "datasets deleted" in tags["flywheel.pruned"]
    assert "flywheel.pruned" not in client.get_run(IterationRecord.load(iteration_dir(cfg, 2)).run_id).data.tags
    assert retention.plan_for(cfg).datasets == 0
