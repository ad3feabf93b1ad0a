"""The judge-DPO guard's held-out set and how it reads the judge (no model needed to build it)."""

import math

import pytest

from flywheel.config import REPO_ROOT, load_config
from flywheel.engines.base import TextEngine, TextResult
from flywheel.engines.oracle import gold_engine
from flywheel.train.heldout import Guard, HeldoutTracker
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


def test_the_probe_rates_fresh_oracle_outputs_even_where_the_gate_reads_human_gold(tmp_path):
    labels = tmp_path / "labels.jsonl"  # a human gold file for the gate's meta-eval: not the probe's business
    labels.write_text('{"type": "ranking"}\n')
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [f"meta_eval.gold_files={{id-test: {labels}}}"])
    probe = JudgeProbe(cfg, cfg.train.judge_dpo.heldout, seed=0)
    assert len(probe.prompts) == cfg.train.judge_dpo.heldout.items and probe.gold
    assert {p["source"] for p in probe.prompts} != {"labeled"}


CLAIMS = ["judgments.protocols.iu=[pointwise, pairwise, claims]"]


class PairwiseOnClaims(TextEngine):
    """The noiseless oracle, except that it answers every claim check in the pairwise protocol's format: the
    failure runs/flip's judge DPO (with claim pairs) produced. A stand-in for a trained judge, which cannot be
    trained inside a unit test; the probe reads any TextEngine the same way."""

    def __init__(self, world):
        self.inner, self.name, self.version = gold_engine(world), "test:pairwise-on-claims", "1"

    def generate(self, requests, seed=0):
        out = self.inner.generate(requests, seed)
        return [TextResult(text="Analysis: Response A names the shapes.\nVerdict: A")
                if (r.context or {}).get("protocol") == "claims" else res for r, res in zip(requests, out)]


@pytest.fixture(scope="module")
def claims_probe():
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", CLAIMS)
    return cfg, JudgeProbe(cfg, cfg.train.judge_dpo.heldout, seed=0)


def test_a_judge_taught_claims_is_probed_on_its_claim_checks(claims_probe):
    cfg, probe = claims_probe
    m = probe.score(gold_engine(cfg.world.shapes))
    # the noiseless oracle: every claim check parses and is the oracle's verdict; descriptions ranked by claims
    assert m["claims/n"] > 50 and m["claims/format_valid"] == 1.0 and m["claims/accuracy"] == 1.0
    assert m["format_valid"] == 1.0 and m["pairwise/accuracy"] > 0.9


def test_the_guard_refuses_a_judge_that_stops_answering_claim_checks(claims_probe):
    cfg, probe = claims_probe
    start = probe.score(gold_engine(cfg.world.shapes))
    broken = probe.score(PairwiseOnClaims(cfg.world.shapes))
    # every pointwise rating still parses, so the pointwise format guard alone passes it (as it did in runs/flip)
    assert broken["format_valid"] == 1.0 and broken["claims/format_valid"] == 0.0 and broken["claims/accuracy"] == 0
    # a description whose claims do not parse has no rating: its pairs are wrong, never guessed
    assert broken["pairwise/accuracy"] < start["pairwise/accuracy"]
    guard = Guard(cfg.train.judge_dpo.heldout.max_drop, {})
    guard.set_baseline(start)
    assert any(v.startswith("claims/format_valid") for v in guard.violations(broken))
    assert guard.violations(start) == []


def test_a_judge_without_claims_has_undefined_claim_measures_that_guard_nothing():
    # local.yaml guards claims/format_valid in every run; a judge not taught claims is never claim-checked
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml")
    h = cfg.train.judge_dpo.heldout
    probe = JudgeProbe(cfg, h.model_copy(update={"items": 8}), seed=0)
    m = probe.score(gold_engine(cfg.world.shapes))
    assert m["claims/n"] == 0 and math.isnan(m["claims/format_valid"]) and m["format_valid"] == 1.0
    tracker = HeldoutTracker.from_config(h)
    tracker.observe(0, m)  # the names check passes: every guarded measure is reported
    assert tracker.guard.violations({**m, "claims/format_valid": 0.0}) == []


# ---- held-out human labels (train.judge_dpo.heldout.gold_file): the probe for data the oracle world never saw
class RatesByWord(TextEngine):
    """Rates an output 5 when it says "right", 1 otherwise, or answers prose when `parses` is off. A stand-in for
    a trained judge (none can be trained inside a unit test); the probe reads any TextEngine the same way."""

    name, version = "test:rates-by-word", "1"

    def __init__(self, parses: bool = True):
        self.parses = parses

    def generate(self, requests, seed=0):
        def rate(req):
            text = req.context["candidates"][0]["output_text"]
            return f"Analysis: checked.\nRating: {5 if 'right' in text else 1}" if self.parses else "No idea."
        return [TextResult(text=rate(r)) for r in requests]


def _labeled_probe(tmp_path, items):
    from labeled_sets import pair, png_b64, point, write_jsonl

    q = {"task": "iu", "subtask": "vqa", "query": "What colour is this?", "images": [png_b64("red")]}
    rows = [point(q, "Red, the right one.", 5), point(q, "Blue.", 1), point(q, "Green.", 2),
            pair(q, "Green.", "It is right: red.", "B"), pair(q, "Crimson, right.", "Pink.", "A")][:items]
    path = write_jsonl(tmp_path / "heldout.jsonl", rows, tail="not json\n")
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [f"train.judge_dpo.heldout.gold_file={path}"])
    return JudgeProbe(cfg, cfg.train.judge_dpo.heldout, seed=0, gold_text=path.read_text())


def test_a_labeled_heldout_set_is_probed_instead_of_oracle_gold(tmp_path):
    probe = _labeled_probe(tmp_path, 5)
    assert {p["source"] for p in probe.prompts} == {"labeled"}  # the file's prompts, no oracle prompt
    assert sorted(probe.gold.values()) == [1.0, 2.0, 5.0] and len(probe.gold_pairs) == 2
    m = probe.score(RatesByWord())
    # three point pairs (5>1, 5>2, 2>1: the last a tie at 1-1, wrong) and two labelled pairs ordered by ratings
    assert m["pairwise/accuracy"] == pytest.approx(4 / 5)
    assert m["format_valid"] == 1.0 and m["pointwise/accuracy"] == pytest.approx(2 / 3)
    assert m["claims/n"] == 0  # labels carry no claim checks
    broken = probe.score(RatesByWord(parses=False))  # parse failures are failures, never scores
    assert broken["format_valid"] == 0.0 and broken["pairwise/accuracy"] == 0.0


def test_a_heldout_set_with_pairs_only_is_rated_output_by_output(tmp_path):
    probe = _labeled_probe(tmp_path, 5)
    pairs = "".join(ln + "\n" for ln in (tmp_path / "heldout.jsonl").read_text().splitlines() if '"pairwise"' in ln)
    pairs_only = JudgeProbe(probe.cfg, probe.cfg.train.judge_dpo.heldout, seed=0, gold_text=pairs)
    assert pairs_only.gold == {} and len(pairs_only.candidates) == 4  # each output rated, against no label
    m = pairs_only.score(RatesByWord())
    assert m["pairwise/accuracy"] == 1.0 and m["format_valid"] == 1.0


def test_a_heldout_gold_file_is_refused_where_it_cannot_work(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("not json\n")
    local = REPO_ROOT / "configs" / "local.yaml"
    with pytest.raises(ValueError, match="labeled sets are the judge's held-out probe"):
        load_config(local, [f"train.policy_dpo.heldout.gold_file={labels}"])
    with pytest.raises(ValueError, match="the labels the gate scores the judge on"):
        load_config(local, [f"train.judge_dpo.heldout.gold_file={labels}",
                            f"meta_eval.gold_files={{id-test: {labels}}}"])
    cfg = load_config(local, [f"train.judge_dpo.heldout.gold_file={labels}"])
    with pytest.raises(ValueError, match=f"gold_file: {labels} holds no valid item \\(1 refused, e.g. line 1"):
        JudgeProbe(cfg, cfg.train.judge_dpo.heldout, seed=0, gold_text=labels.read_text())
