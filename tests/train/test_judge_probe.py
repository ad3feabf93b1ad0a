"""The judge-DPO guard's held-out set and how it reads the judge (no model needed to build it)."""

import pytest

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.heldout_probes import JudgeProbe


@pytest.mark.parametrize("readout, logprobs", [("expected", 5), ("text", 0)])
def test_judge_dpo_guard_reads_ratings_as_the_flywheel_does(readout, logprobs):
    # the judge's own generation asks for log-probs in both cases; the probe must only when it reads them
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml",
                      [f"judge.rating_readout={readout}", "judge.generation.top_logprobs=5"])
    probe = JudgeProbe(cfg, cfg.train.judge_dpo.heldout, seed=0)
    # the gate and the preference stage order outputs by judge.rating_readout; a held-out target read any other
    # way rose while the gate's metric fell (heldout_probes.JudgeProbe); written ratings need no log-probs
    assert probe.cfg.judge.rating_readout == readout
    assert probe.generation.top_logprobs == logprobs and probe.generation.temperature == 0.0
    assert probe.gold and set(probe.gold.values()) <= {1, 2, 3, 4, 5}
    # one gold output per candidate, spread over the prompts the config asks for
    assert len({c["prompt_id"] for c in probe.candidates}) == len(probe.prompts) == cfg.train.judge_dpo.heldout.items
