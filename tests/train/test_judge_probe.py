"""The judge-DPO guard's held-out set and how it reads the judge (no model needed to build it)."""

from flywheel.config import load_config
from flywheel.train.heldout_probes import JudgeProbe


def test_judge_dpo_guard_scores_written_ratings_whatever_the_judges_readout():
    cfg = load_config(None, ["judge.rating_readout=expected", "judge.generation.top_logprobs=5"])
    probe = JudgeProbe(cfg, cfg.train.judge_dpo.heldout, seed=0)
    # the guard's target was measured on written ratings (heldout_probes.JudgeProbe); asking the live model for
    # log-probabilities would only cost time
    assert probe.cfg.judge.rating_readout == "text" and probe.generation.top_logprobs == 0
    assert cfg.judge.rating_readout == "expected"  # the caller's config is untouched
    assert probe.gold and set(probe.gold.values()) <= {1, 2, 3, 4, 5}
