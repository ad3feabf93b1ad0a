"""Three whole iterations with `storage.keep_iterations: 1`, as a schedule runs them: after each, the older finished
iterations lose their datasets but what is still read, and the next iteration runs on what is left (its gold from
iteration 0's prompts). The rules themselves are tested on hand-made stores in tests/test_retention.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flywheel import retention, storage
from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_manifest, verify_dataset
from flywheel.iteration import iteration_dir, paths
from flywheel.iteration_record import IterationRecord
from flywheel.train import registry
from tiny_iteration import TINY

pytestmark = pytest.mark.slow

# The tiny random judge orders no gold pair: a negative margin promotes it, so each iteration starts from the last
# one's judge. Its ratings of the policies' samples do not parse, so no pair is made and no update tried: each
# iteration's preference data waits in the pools of the next.
RUN = [*TINY, "gate.judge_test=none", "gate.judge_margin=-1", "storage.keep_iterations=1"]
JUDGE_DATA = {"prompts-train", "candidates", "labels", "curated", "meta-eval"}
POOL_DATA = {"pref-prompts", "pref-candidates", "pref-curated"}


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
    records = [IterationRecord.load(iteration_dir(cfg, n)) for n in range(3)]
    assert all(r.finished for r in records)
    assert not any(d["model"] != "judge" for r in records for d in r.decisions)  # no update: the pools wait
    left = {n: set(storage.subdirs(iteration_dir(cfg, n))) for n in range(3)}
    for n in (0, 1):
        assert not left[n] & JUDGE_DATA and POOL_DATA <= left[n], left
    assert "prompts" in left[0]  # every iteration's gold was made from it
    assert JUDGE_DATA | POOL_DATA <= left[2]
    first = paths(cfg, 0)["prompts"]
    verify_dataset(first)
    for split in storage.subdirs(paths(cfg, 0)["gold"]):
        gold = read_manifest(storage.join(paths(cfg, 0)["gold"], split, "prompts"))
        assert gold.upstream[0].content_hash == read_manifest(first).content_hash  # the gold iteration 2 used
    marker = json.loads(storage.read_bytes(storage.join(iteration_dir(cfg, 0), retention.MARKER)))
    assert {"candidates", "labels", "curated/sft"} <= set(marker["datasets"])
    assert marker["kept"]["prompts"].startswith("made into gold/")
    assert marker["kept"]["pref-curated/pairs"] == "waits in the policy's preference pool"
    assert marker["checkpoints"]  # the judge trainings iteration 0 registered
    # and this node's copy of the judge it registered (meta-evaluated; no judge DPO here: no DPO pairs), but not
    # that of the one iteration 2 started from (registered by iteration 1)
    assert len(marker["model_copies"]) == 1 and not any(Path(c["path"]).exists()
                                                        for c in marker["model_copies"].values())
    name, version, _ = registry.parse_uri(records[2].start["judge"])
    assert list((registry.cache_root(cfg) / name).glob(f"{version}-*/export")), records[2].start
    client = MlflowClient(cfg.tracking.uri)
    for n in (0, 1):
        assert "local model copies and 0 registered model versions deleted" in \
            client.get_run(records[n].run_id).data.tags["flywheel.pruned"]
    assert "flywheel.pruned" not in client.get_run(records[2].run_id).data.tags
    assert retention.plan_for(cfg).datasets == 0
