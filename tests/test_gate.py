"""The promotion gate against a real (sqlite) MLflow registry."""

import math
import shutil

import mlflow
import pytest
from scipy import stats
from stored_meta_eval import METRIC, write_gold, write_judged

from flywheel import gate
from flywheel.config import load_config
from flywheel.track import Tracker
from flywheel.train import registry


@pytest.fixture
def cfg(tmp_path):
    c = load_config(None, [f"run.workdir={tmp_path}"])
    Tracker(c)  # creates the experiment in the configured store
    return c


def _version(cfg, name="judge"):
    c = registry.client(cfg)
    try:
        c.create_registered_model(name)
    except Exception:
        pass
    with mlflow.start_run() as run:
        mlflow.log_text("weights would be here", "export/flywheel.json")
    mv = c.create_model_version(name, source=f"{run.info.artifact_uri}/export", run_id=run.info.run_id)
    return registry.describe(mv)


def test_first_version_beats_the_baseline_then_must_beat_the_champion(cfg):
    v1 = _version(cfg)
    d1 = gate.decide(cfg, v1, 0.6, "acc", 0.0, baseline=("zoo:judge", 0.2))
    assert d1.promoted and gate.champion_of(cfg, "judge") == v1 and d1.champion == "zoo:judge"
    v2 = _version(cfg)
    d2 = gate.decide(cfg, v2, 0.62, "acc", 0.05)
    assert not d2.promoted and "champion stays" in d2.reason
    assert gate.champion_of(cfg, "judge") == v1  # unchanged
    assert registry.get_version(cfg, v2).tags["flywheel.gate.decision"].startswith("refused")
    v3 = _version(cfg)
    assert gate.decide(cfg, v3, 0.7, "acc", 0.05).promoted
    assert gate.champion_of(cfg, "judge") == v3
    assert gate.recorded(cfg, v3, "acc") == 0.7


def test_without_champion_or_baseline_the_first_version_is_promoted_unless_undefined(cfg):
    """gate.judge_baseline off: iteration 0 has nothing to compare its judge with."""
    v1 = _version(cfg)
    assert not gate.decide(cfg, v1, math.nan, "acc", 0.0).promoted
    v2 = _version(cfg)
    d = gate.decide(cfg, v2, 0.3, "acc", 0.0, alpha=0.05)
    assert d.promoted and d.champion is None and "no champion or baseline to beat yet" in d.reason
    assert gate.champion_of(cfg, "judge") == v2


def test_a_defined_value_beats_an_undefined_champion_and_says_so(cfg):
    """A judge-scored baseline is NaN when none of the judge's ratings of the champion's answers parsed."""
    v1 = _version(cfg, "policy-llava")
    d = gate.decide(cfg, v1, 3.2, "judge/pointwise/score", 0.0, baseline=("world:policy", math.nan), alpha=0.05,
                    items=([3.0, 4.0], [math.nan, math.nan]))
    assert d.promoted and "the champion's is undefined (NaN)" in d.reason and "paired test not run" in d.reason
    assert "no champion or baseline" not in d.reason


def test_a_tie_or_nan_never_promotes(cfg):
    v1 = _version(cfg)
    assert not gate.decide(cfg, v1, 0.5, "acc", 0.0, baseline=("zoo:judge", 0.5)).promoted
    v2 = _version(cfg)
    assert not gate.decide(cfg, v2, math.nan, "acc", 0.0, baseline=("zoo:judge", 0.1)).promoted
    assert gate.champion_of(cfg, "judge") is None


def test_without_alpha_the_margin_rule_alone_decides(cfg):
    v1 = _version(cfg, "policy-llava")
    d = gate.decide(cfg, v1, 0.51, "accuracy", 0.0, baseline=("world:policy", 0.5))
    assert d.promoted and d.alpha is None and d.test is d.better is d.worse is d.p_value is None
    assert "McNemar" not in d.reason


def _mean(xs):
    return sum(xs) / len(xs)


def test_a_policy_a_few_items_better_is_refused_by_mcnemar_on_its_held_out_items(cfg):
    # 120 held-out questions: the new policy answers 8 more right and 5 fewer - a margin alone would promote it
    before = [1.0] * 60 + [0.0] * 60
    after = [1.0] * 55 + [0.0] * 5 + [1.0] * 8 + [0.0] * 52
    v1 = _version(cfg, "policy-llava")
    d = gate.decide(cfg, v1, _mean(after), "accuracy", 0.0, baseline=("world:policy", _mean(before)), alpha=0.05,
                    items=(after, before))
    p = stats.binomtest(8, 13, 0.5, alternative="greater").pvalue
    assert not d.promoted and (d.test, d.better, d.worse) == ("McNemar", 8, 5) and d.p_value == pytest.approx(p)
    assert "champion stays" in d.reason and gate.champion_of(cfg, "policy-llava") is None
    v2 = _version(cfg, "policy-llava")
    after = [1.0] * 60 + [1.0] * 20 + [0.0] * 40  # 20 more right, none lost
    d2 = gate.decide(cfg, v2, _mean(after), "accuracy", 0.0, baseline=("world:policy", _mean(before)),
                     alpha=0.05, items=(after, before))
    assert d2.promoted and (d2.better, d2.worse) == (20, 0) and d2.p_value < 1e-5


def test_a_generator_is_tested_by_wilcoxon_on_its_per_prompt_scores(cfg):
    before = [float(i % 10) for i in range(120)]
    noisy = [s + (1.0, -1.0, 0.5, -0.5, 0.3)[i % 5] for i, s in enumerate(before)]  # +0.06 on average: noise
    v1 = _version(cfg, "policy-sdxl")
    d1 = gate.decide(cfg, v1, _mean(noisy), "score10", 0.0, baseline=("world:generator", _mean(before)),
                     alpha=0.05, items=(noisy, before))
    assert not d1.promoted and d1.test == "Wilcoxon" and d1.p_value >= 0.05
    better = [s + (0.8 if i % 4 else -0.2) for i, s in enumerate(before)]  # higher on 90 prompts, lower on 30
    v2 = _version(cfg, "policy-sdxl")
    d2 = gate.decide(cfg, v2, _mean(better), "score10", 0.0, baseline=("world:generator", _mean(before)),
                     alpha=0.05, items=(better, before))
    assert d2.promoted and (d2.test, d2.better, d2.worse) == ("Wilcoxon", 90, 30)
    assert d2.p_value == pytest.approx(stats.wilcoxon(better, before, alternative="greater").pvalue)


def test_per_item_values_that_do_not_give_the_gated_value_fall_back_to_the_margin_rule(cfg):
    v1 = _version(cfg, "policy-llava")
    d = gate.decide(cfg, v1, 0.6, "accuracy", 0.0, baseline=("world:policy", 0.5), alpha=0.05,
                    items=([1.0, 0.0], [1.0, 0.0]))
    assert d.promoted and d.p_value is None and "paired test not run" in d.reason and "average" in d.reason


def test_judge_ratings_that_did_not_parse_leave_the_paired_test_not_the_gate(cfg):
    """gate.policy_metric judge/pointwise/score: an answer whose rating did not parse is NaN (never a score). The
    paired test drops the items either model lacks; the means are of the rated items."""
    nan = math.nan
    before = [2.0, 3.0, 2.5, nan, 3.0] * 24
    after = [3.0, 4.0, nan, 4.5, 3.5] * 24  # higher on every item both were rated on
    rated = lambda xs: _mean([x for x in xs if not math.isnan(x)])  # noqa: E731
    v1 = _version(cfg, "policy-llava")
    d = gate.decide(cfg, v1, rated(after), "judge/pointwise/score", 0.0,
                    baseline=("world:policy", rated(before)), alpha=0.05, items=(after, before))
    assert d.promoted and (d.test, d.better, d.worse) == ("Wilcoxon", 72, 0)
    both = [(a, b) for a, b in zip(after, before) if not (math.isnan(a) or math.isnan(b))]
    want = stats.wilcoxon([a for a, _ in both], [b for _, b in both], alternative="greater").pvalue
    assert d.p_value == pytest.approx(want)
    v2 = _version(cfg, "policy-llava")
    d2 = gate.decide(cfg, v2, 4.0, "judge/pointwise/score", 0.0, baseline=(v1, 3.0), alpha=0.05,
                     items=([nan] * 3, [3.0] * 3))
    assert "paired test not run" in d2.reason


def test_a_baseline_naming_the_champion_is_its_value_measured_now(cfg):
    """Each iteration's judge rates the champion policy again: its value then stands over the one recorded when it
    was promoted, which another judge measured."""
    v1 = _version(cfg, "policy-llava")
    assert gate.decide(cfg, v1, 4.5, "judge/pointwise/score", 0.0, baseline=("world:policy", 3.0)).promoted
    v2 = _version(cfg, "policy-llava")
    d = gate.decide(cfg, v2, 4.0, "judge/pointwise/score", 0.0, baseline=(v1, 3.5))  # the new judge's ratings
    assert d.promoted and d.champion == v1 and d.champion_value == 3.5
    v3 = _version(cfg, "policy-llava")
    d3 = gate.decide(cfg, v3, 3.9, "judge/pointwise/score", 0.0, baseline=("world:policy", 1.0))  # not the champion
    assert not d3.promoted and d3.champion_value == 4.0


def test_a_version_is_decided_once_so_a_resumed_gate_keeps_the_decision(cfg):
    # --resume runs the gate stage again: a promoted challenger is now the champion and, decided again, would
    # be compared with itself and refused
    v1 = _version(cfg)
    first = gate.decide(cfg, v1, 0.6, "acc", 0.0, baseline=("zoo:judge", 0.2))
    again = gate.decide(cfg, v1, 0.6, "acc", 0.0)
    assert first.promoted and again == first
    assert registry.get_version(cfg, v1).tags["flywheel.gate.decision"].startswith("promoted")
    v2 = _version(cfg)
    refused = gate.refuse(cfg, v2, "acc", "held-out accuracy fell")
    again = gate.refuse(cfg, v2, "acc", "another reason")
    assert not again.promoted and again.reason == refused.reason
    assert gate.champion_of(cfg, "judge") == v1


def test_a_gate_killed_before_it_moved_the_alias_moves_it_when_resumed(cfg):
    v1 = _version(cfg)
    gate.decide(cfg, v1, 0.6, "acc", 0.0, baseline=("zoo:judge", 0.2))
    registry.client(cfg).delete_registered_model_alias("judge", gate.CHAMPION)  # the kill came in between
    assert gate.champion_of(cfg, "judge") is None
    assert gate.decide(cfg, v1, 0.6, "acc", 0.0).promoted
    assert gate.champion_of(cfg, "judge") == v1

# ------------------------------------------------------------------ the judge's paired test (gate.judge_test)
N = 202  # gold pairs, as many as the local id-test gold set has


def _outcomes(ids: list[str], both: int, only_challenger: int, only_champion: int) -> tuple[dict, dict]:
    """(challenger, champion) right/wrong per gold pair: `both` pairs both get right, then `only_challenger`,
    then `only_champion` pairs only one of them does; both get the rest wrong."""
    challenger = {k: i < both + only_challenger for i, k in enumerate(ids)}
    champion = {k: i < both or both + only_challenger <= i < both + only_challenger + only_champion
                for i, k in enumerate(ids)}
    return challenger, champion


def _meta_eval(tmp_path, name: str, gold: str, right: dict) -> tuple[gate.MetaEval, float]:
    """A judge's meta-eval on storage with these outcomes, and the metric value meta-eval reports for it."""
    out = str(tmp_path / name)
    write_judged(out, gold, right)
    return gate.MetaEval(out, gold), sum(right.values()) / len(right)


@pytest.fixture
def gold(tmp_path):
    uri = str(tmp_path / "gold")
    return uri, write_gold(uri, N)


def test_the_judge_metric_is_measured_on_gold_pairs_and_tested(cfg):
    assert cfg.gate.judge_metric == METRIC and cfg.gate.judge_alpha == 0.05  # the tests below pass alpha themselves


def _judge_gate(cfg, challenger, value, where, alpha=0.05, baseline=None):
    return gate.decide(cfg, challenger, value, METRIC, 0.0, baseline=baseline[:2] if baseline else None,
                       alpha=alpha, meta_eval=where, baseline_meta_eval=baseline[2] if baseline else None)


def test_a_challenger_a_little_better_but_not_significantly_is_refused_with_the_p_value(cfg, gold, tmp_path):
    uri, ids = gold
    mine, theirs = _outcomes(ids, both=99, only_challenger=21, only_champion=18)  # 0.594 vs 0.579
    base, base_value = _meta_eval(tmp_path, "me-base", uri, theirs)
    where, value = _meta_eval(tmp_path, "me-1", uri, mine)
    assert value > base_value
    v1 = _version(cfg)
    d = _judge_gate(cfg, v1, value, where, baseline=("world:judge", base_value, base))
    p = stats.binomtest(21, 39, 0.5, alternative="greater").pvalue
    assert not d.promoted and gate.champion_of(cfg, "judge") is None
    assert (d.test, d.better, d.worse, d.alpha) == ("McNemar", 21, 18, 0.05) and d.p_value == pytest.approx(p)
    assert "McNemar b=21 c=18 p=0.37 ≥ alpha 0.05: champion stays" in d.reason
    assert d.to_dict()["p_value"] == d.p_value
    assert registry.get_version(cfg, v1).tags["flywheel.gate.decision"].startswith("refused")
    # the margin alone would have promoted the same challenger
    margin_only = _judge_gate(cfg, _version(cfg), value, where, alpha=None, baseline=("world:judge", base_value, base))
    # ... and says that it was within noise: the test runs for the record
    assert margin_only.promoted and margin_only.alpha is None and margin_only.p_value == pytest.approx(p)
    assert "by the margin alone (McNemar b=21 c=18 p=0.37, not required)" in margin_only.reason


def test_a_clearly_better_challenger_is_promoted_then_tested_against_as_champion(cfg, gold, tmp_path):
    uri, ids = gold
    mine, theirs = _outcomes(ids, both=99, only_challenger=30, only_champion=5)
    base, base_value = _meta_eval(tmp_path, "me-base", uri, theirs)
    where1, value1 = _meta_eval(tmp_path, "me-1", uri, mine)
    v1 = _version(cfg)
    d1 = _judge_gate(cfg, v1, value1, where1, baseline=("world:judge", base_value, base))
    assert d1.promoted and gate.champion_of(cfg, "judge") == v1
    assert (d1.better, d1.worse) == (30, 5) and d1.p_value < 0.001 and "< alpha 0.05" in d1.reason
    # the next challenger meets v1, the registered champion, through the meta-eval v1's version records
    better = {k: ok or i in range(150, 153) for i, (k, ok) in enumerate(mine.items())}  # 3 more right: noise
    where2, value2 = _meta_eval(tmp_path, "me-2", uri, better)
    d2 = _judge_gate(cfg, _version(cfg), value2, where2)
    assert d2.champion == v1 and (d2.better, d2.worse) == (3, 0) and not d2.promoted
    assert gate.champion_of(cfg, "judge") == v1


def _no_tags(cfg, v1, where, value):
    gate.decide(cfg, v1, value, METRIC, 0.0, baseline=("world:judge", 0.0))  # as registered before the test existed


def _files_gone(cfg, v1, where, value):
    _judge_gate(cfg, v1, value, where, baseline=("world:judge", 0.0, None))
    shutil.rmtree(where.output_uri)


def _gold_rewritten(cfg, v1, where, value):
    _judge_gate(cfg, v1, value, where, baseline=("world:judge", 0.0, None))
    write_gold(where.gold_uri, N, seed=1)  # the same gold uri, other pairs: v1 was judged on the old ones


def _another_value(cfg, v1, where, value):
    _judge_gate(cfg, v1, value, where, baseline=("world:judge", 0.0, None))
    gate.record(cfg, v1, METRIC, value - 0.1)  # its outcomes no longer give the value it is compared by


@pytest.mark.parametrize("setup, why", [(_no_tags, "the champion has no recorded meta-eval"),
                                        (_files_gone, "cannot read the meta-eval"),
                                        (_gold_rewritten, "changed since"),
                                        (_another_value, "do not give its")],
                         ids=["never-recorded", "files-gone", "gold-rewritten", "value-differs"])
def test_a_champion_without_its_outcomes_falls_back_to_the_margin_rule(cfg, gold, tmp_path, setup, why):
    uri, ids = gold
    mine, theirs = _outcomes(ids, both=99, only_challenger=21, only_champion=18)  # not significant
    where1, value1 = _meta_eval(tmp_path, "me-1", uri, theirs)
    v1 = _version(cfg)
    setup(cfg, v1, where1, value1)
    assert gate.champion_of(cfg, "judge") == v1
    ids2 = write_gold(uri, N, seed=1) if setup is _gold_rewritten else ids
    mine = dict(zip(ids2, mine.values()))
    where2, value2 = _meta_eval(tmp_path, "me-2", uri, mine)
    d = _judge_gate(cfg, _version(cfg), value2, where2)
    assert d.promoted and d.p_value is None and d.better is None and d.alpha == 0.05
    assert "paired test not run" in d.reason and why in d.reason and "margin rule" in d.reason


def test_a_champion_judged_on_other_gold_is_measured_again_and_the_gate_tests_both_on_the_same_pairs(
        cfg, gold, tmp_path):
    """The gold changed after the champion was promoted (world.gold edited, a user's labels added): the iteration
    measures the champion again on the new gold and records it on its version, so the gate compares the two
    judges on the same pairs (McNemar) instead of a value from the old gold against one from the new."""
    from flywheel.iteration import _champion_to_measure_again

    uri, ids = gold
    old_right, _ = _outcomes(ids, both=180, only_challenger=0, only_champion=0)  # 0.891 on the old gold
    where1, value1 = _meta_eval(tmp_path, "me-1", uri, old_right)
    v1 = _version(cfg)
    _judge_gate(cfg, v1, value1, where1, baseline=("world:judge", 0.0, None))
    assert gate.measured_on(cfg, v1, METRIC, uri) and _champion_to_measure_again(cfg, uri) is None
    new_ids = write_gold(uri, N, seed=1)  # harder gold: the champion gets fewer of its pairs right
    assert not gate.measured_on(cfg, v1, METRIC, uri) and _champion_to_measure_again(cfg, uri) == v1
    challenger, champion = _outcomes(new_ids, both=120, only_challenger=12, only_champion=10)  # 0.653 vs 0.644
    assert sum(challenger.values()) / N < value1  # below the champion's old-gold value: the margin would refuse
    again, again_value = _meta_eval(tmp_path, "me-1-again", uri, champion)
    gate.remeasured(cfg, v1, {METRIC: again_value}, again)
    assert gate.recorded(cfg, v1, METRIC) == pytest.approx(again_value) and _champion_to_measure_again(cfg, uri) is None
    where2, value2 = _meta_eval(tmp_path, "me-2", uri, challenger)
    d = _judge_gate(cfg, _version(cfg), value2, where2, alpha=None)
    assert d.champion == v1 and d.champion_value == pytest.approx(again_value)
    assert (d.test, d.better, d.worse) == ("McNemar", 12, 10) and d.promoted  # the margin alone, on the same gold


def test_a_champion_scored_another_way_is_measured_again(cfg, gold, tmp_path):
    """judge.samples turned on after the champion was promoted greedily: its recorded value was read one way and
    the challenger's would be read another (the mean of k sampled analyses), so the champion is measured again
    the challenger's way; a version recorded before scorings were recorded counts as scored the current way."""
    from flywheel.iteration import _champion_to_measure_again

    uri, ids = gold
    where, value = _meta_eval(tmp_path, "me-1", uri, _outcomes(ids, both=180, only_challenger=0, only_champion=0)[0])
    v1 = _version(cfg)
    _judge_gate(cfg, v1, value, where, baseline=("world:judge", 0.0, None))
    assert gate.measured_on(cfg, v1, METRIC, uri)
    sampled = cfg.model_copy(deep=True)
    sampled.judge.generation.temperature, sampled.judge.samples = 0.7, 20  # (validated one at a time)
    assert not gate.measured_on(sampled, v1, METRIC, uri) and _champion_to_measure_again(sampled, uri) == v1
    mv = registry.get_version(cfg, v1)
    registry.client(cfg).delete_model_version_tag(mv.name, mv.version, gate.SCORING_TAG)  # an older version
    assert gate.measured_on(sampled, v1, METRIC, uri)


def test_a_metric_that_is_not_a_per_pair_accuracy_is_gated_by_the_margin_and_its_gold_still_checked(
        cfg, gold, tmp_path):
    """gate.judge_test none allows e.g. a Pearson as the judge metric: no outcomes pair by pair to test, so the
    margin alone decides instead of the gate failing, and whether the champion's value was measured on this gold
    is read from its meta-eval's upstream."""
    pearson = "id-test/all/pointwise/pearson"
    uri, ids = gold
    where1, _ = _meta_eval(tmp_path, "me-1", uri, dict.fromkeys(ids, True))
    v1 = _version(cfg)
    gate.decide(cfg, v1, 0.5, pearson, 0.0, meta_eval=where1)
    assert gate.champion_of(cfg, "judge") == v1 and gate.measured_on(cfg, v1, pearson, uri)
    where2, _ = _meta_eval(tmp_path, "me-2", uri, dict.fromkeys(ids, True))
    d = gate.decide(cfg, _version(cfg), 0.6, pearson, 0.0, meta_eval=where2)
    assert d.promoted and d.test is None and d.reason == f"{pearson} 0.6000 > champion 0.5000 + margin 0.0"
    write_gold(uri, N, seed=1)
    assert not gate.measured_on(cfg, d.challenger, pearson, uri)


def test_mcnemar_counts_only_pairs_both_judges_were_scored_on():
    challenger = {"a": True, "b": True, "c": False, "d": True, "only-mine": True}
    champion = {"a": True, "b": False, "c": True, "d": False, "only-theirs": False}
    b, c, p = gate.mcnemar(challenger, champion)
    assert (b, c) == (2, 1) and p == pytest.approx(stats.binomtest(2, 3, 0.5, alternative="greater").pvalue)
    assert gate.mcnemar({"a": True}, {"a": True}) == (0, 0, 1.0)  # no discordant pair: no evidence
    assert gate.mcnemar({k: True for k in "abcdefgh"}, {k: False for k in "abcdefgh"})[2] < 0.05


# ------------------------------------------------------------------ the judge lineage (gate.judge_lineage)
def _champion_and_challenger(cfg, gold, tmp_path, only_challenger, only_champion):
    """v1 promoted as champion over a weak baseline, then v2 gated against it with these discordant pairs."""
    uri, ids = gold
    mine, theirs = _outcomes(ids, both=120, only_challenger=only_challenger, only_champion=only_champion)
    where1, value1 = _meta_eval(tmp_path, "me-1", uri, theirs)
    v1 = _version(cfg)
    assert _judge_gate(cfg, v1, value1, where1, alpha=None, baseline=("world:judge", 0.0, None)).promoted
    where2, value2 = _meta_eval(tmp_path, "me-2", uri, mine)
    v2 = _version(cfg)
    return v1, v2, _judge_gate(cfg, v2, value2, where2, alpha=None), where2


def _start(cfg, lineage):
    from flywheel.iteration import current

    c = cfg.model_copy(deep=True)
    c.gate.judge_lineage = lineage
    return current(c, "judge")


def test_a_challenger_within_noise_of_the_champion_is_trained_on_but_not_served(cfg, gold, tmp_path):
    v1, v2, d, where2 = _champion_and_challenger(cfg, gold, tmp_path, only_challenger=11, only_champion=17)
    assert not d.promoted and gate.champion_of(cfg, "judge") == v1
    nxt = gate.continue_lineage(cfg, d, where2, 0.05)
    p = stats.binomtest(17, 28, 0.5, alternative="greater").pvalue
    assert nxt["start"] == v2 and gate.lineage_of(cfg, "judge") == v2
    assert f"b=17 challenger-only c=11 p={p:.2g} ≥ alpha 0.05: within noise" in nxt["reason"]
    assert _start(cfg, "within_noise") == v2 and _start(cfg, "champion") == v1  # the champion still serves
    assert gate.champion_of(cfg, "judge") == v1
    assert "within noise" in registry.get_version(cfg, v2).tags["flywheel.gate.lineage"]
    # the gate stage runs again on --resume: the same answer
    assert gate.continue_lineage(cfg, d, where2, 0.05) == nxt


def test_a_significantly_worse_challenger_is_dropped_from_the_lineage(cfg, gold, tmp_path):
    v1, v2, d, where2 = _champion_and_challenger(cfg, gold, tmp_path, only_challenger=3, only_champion=20)
    nxt = gate.continue_lineage(cfg, d, where2, 0.05)
    assert nxt["start"] == v1 and "significantly worse, the champion" in nxt["reason"]
    assert _start(cfg, "within_noise") == v1


def test_the_lineage_reuses_the_gates_paired_test_of_the_same_two_judges(cfg, gold, tmp_path, monkeypatch):
    """A challenger past the margin but refused by McNemar: the lineage reads the gate's counts the other way
    round instead of recomputing both judges' outcomes from storage."""
    from flywheel.evaluate import meta

    uri, ids = gold
    mine, theirs = _outcomes(ids, both=120, only_challenger=17, only_champion=11)  # better, not significantly
    where1, value1 = _meta_eval(tmp_path, "me-1", uri, theirs)
    v1 = _version(cfg)
    assert _judge_gate(cfg, v1, value1, where1, alpha=None, baseline=("world:judge", 0.0, None)).promoted
    where2, value2 = _meta_eval(tmp_path, "me-2", uri, mine)
    v2 = _version(cfg)
    d = _judge_gate(cfg, v2, value2, where2)
    assert not d.promoted and (d.test, d.better, d.worse) == ("McNemar", 17, 11)
    monkeypatch.setattr(meta, "stored_outcomes", lambda *a: pytest.fail("outcomes read again"))
    nxt = gate.continue_lineage(cfg, d, where2, 0.05)
    p = stats.binomtest(11, 28, 0.5, alternative="greater").pvalue
    assert nxt["start"] == v2 and f"b=11 challenger-only c=17 p={p:.2g} ≥ alpha 0.05: within noise" in nxt["reason"]


def test_a_promoted_challenger_heads_the_lineage_and_a_broken_one_does_not(cfg, gold, tmp_path):
    v1, v2, d, where2 = _champion_and_challenger(cfg, gold, tmp_path, only_challenger=30, only_champion=2)
    assert d.promoted
    assert gate.continue_lineage(cfg, d, where2, 0.05)["start"] == v2 == _start(cfg, "within_noise")
    v3 = _version(cfg)
    d3 = gate.decide(cfg, v3, math.nan, METRIC, 0.0)
    nxt = gate.continue_lineage(cfg, d3, None, 0.05)
    assert nxt["start"] == v2 and "undefined" in nxt["reason"] and _start(cfg, "within_noise") == v2


def test_without_outcomes_to_test_the_lineage_falls_back_to_the_champion(cfg, gold, tmp_path):
    v1, v2, d, where2 = _champion_and_challenger(cfg, gold, tmp_path, only_challenger=11, only_champion=17)
    shutil.rmtree(where2.output_uri)  # the challenger's meta-eval is gone
    nxt = gate.continue_lineage(cfg, d, where2, 0.05)
    assert nxt["start"] == v1 and "cannot test" in nxt["reason"] and "cannot read the meta-eval" in nxt["reason"]


def test_a_challenger_kept_out_by_the_base_model_leaves_no_lineage_alias(cfg, gold, tmp_path):
    """Iteration 0 with gate.judge_baseline: the champion is the configured base, not a registered version."""
    uri, ids = gold
    mine, theirs = _outcomes(ids, both=120, only_challenger=11, only_champion=17)
    base, base_value = _meta_eval(tmp_path, "me-base", uri, theirs)
    where, value = _meta_eval(tmp_path, "me-1", uri, mine)
    d = _judge_gate(cfg, _version(cfg), value, where, alpha=None, baseline=("world:judge", base_value, base))
    assert not d.promoted
    nxt = gate.continue_lineage(cfg, d, where, 0.05)
    assert nxt["start"] == "world:judge" and "not a registered judge" in nxt["reason"]
    assert gate.lineage_of(cfg, "judge") is None and _start(cfg, "within_noise") == cfg.models.judge.path


def test_a_judge_that_wins_but_falls_on_a_guard_metric_stays_out(cfg):
    """gate.judge_guards: the id-test winner that lost ood-test (runs/claims iteration 4: 0.886 -> 0.523) is
    refused when a guard is set; within the allowed drop it is promoted."""
    ood = "ood-test/all/pointwise_ranking/accuracy"
    v1 = _version(cfg)
    first = gate.decide(cfg, v1, 0.84, "acc", 0.0, guards={ood: (0.886, 0.15)})
    assert first.promoted and f"guards not checked, no champion value: {ood}" in first.reason
    assert gate.recorded(cfg, v1, ood) == 0.886
    v2 = _version(cfg)
    d = gate.decide(cfg, v2, 0.89, "acc", 0.0, guards={ood: (0.523, 0.15)})
    assert not d.promoted and gate.champion_of(cfg, "judge") == v1
    assert f"but guard {ood} 0.5230 < champion 0.8860 - max drop 0.15: champion stays" in d.reason
    assert registry.get_version(cfg, v2).tags["flywheel.gate.decision"].startswith("refused")
    v3 = _version(cfg)
    assert not gate.decide(cfg, v3, 0.9, "acc", 0.0, guards={ood: (math.nan, 0.15)}).promoted  # undefined fails
    v4 = _version(cfg)
    d = gate.decide(cfg, v4, 0.89, "acc", 0.0, guards={ood: (0.75, 0.15)})  # 0.136 below: allowed
    assert d.promoted and "guard" not in d.reason and gate.champion_of(cfg, "judge") == v4


def test_the_iterations_judge_gate_reads_its_guards_from_the_challengers_meta_eval(cfg, gold, tmp_path):
    """flywheel.iteration.gate_judge, as the gate-judge stage calls it: the guard's value is the challenger's own
    meta-eval value of that metric (runs/claims iterations 2 and 4), and a guard-refused challenger still
    continues the lineage when it is within noise on the gate's metric (judge_lineage: within_noise)."""
    from flywheel.iteration import gate_judge

    ood = "ood-test/all/pointwise_ranking/accuracy"
    cfg.gate.judge_guards = {ood: 0.15}
    assert cfg.gate.judge_lineage == "within_noise" and "baseline" not in cfg.gate.judge_metric
    uri, ids = gold
    right4, right2 = _outcomes(ids, 150, 15, 5)  # iteration 4 wins 15 / 5 pairs against iteration 2

    def gate_it(name, right, ood_value):
        write_judged(str(tmp_path / name), uri, right)
        split, _, metric = METRIC.partition("/")
        meta_eval = {"challenger": {split: {metric: sum(right.values()) / len(right)},
                                    "ood-test": {"all/pointwise_ranking/accuracy": ood_value}}}
        return gate_judge(cfg, _version(cfg), "world:judge", meta_eval,
                          {"meta-eval": str(tmp_path / name), "gold": uri, "meta-eval-baseline": None})

    first = gate_it("it2", right2, 0.886)
    assert first["promoted"] and "guards not checked" in first["reason"]
    assert gate.recorded(cfg, first["challenger"], ood) == pytest.approx(0.886)
    d = gate_it("it4", right4, 0.523)
    assert not d["promoted"] and f"but guard {ood} 0.5230 < champion 0.8860" in d["reason"]
    assert gate.champion_of(cfg, "judge") == first["challenger"]
    assert d["next_start"]["start"] == d["challenger"]  # within noise on id-test: it goes on the lineage
