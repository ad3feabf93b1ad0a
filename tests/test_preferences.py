"""Preference data through the *served* judge: the champion is deployed on Ray Serve and every policy candidate
is judged over HTTP; without a champion nothing is ranked. (The tiny random judge's ratings do not parse, so this
checks the plumbing and that unparsed outputs never become pairs; pair making itself is tested in tests/curate.)"""

import contextlib
import json
import os
import urllib.request

import pytest
import ray

from flywheel.config import load_config
from flywheel.datasets import read_manifest, read_rows, write_dataset
from flywheel.iteration import IterationResult, paths
from flywheel.preferences import make_preferences, pairs_vs_oracle, relabel
from flywheel.raycluster import free_port
from flywheel.serve.app import deploy
from flywheel.track import Tracker
from registry_helpers import register_judge


@pytest.fixture
def pcfg(cfg, zoo, tmp_path):
    return load_config(None, [f"run.workdir={tmp_path}", f"models.judge.path={zoo['judge']}",
                              f"models.policy.path={zoo['policy']}", f"models.generator.path={zoo['generator']}",
                              "preferences.prompts_per_subtask=1", "preferences.samples_per_prompt=2",
                              "candidates.seeded_variants=2",  # the judge's training candidates only
                              "preferences.subtasks=[iu_color, ig_single_object]", "policy.generation.max_new_tokens=6",
                              "generator.generation.num_inference_steps=2", "judge.generation.max_new_tokens=8",
                              f"serve.port={free_port()}", "serve.host=127.0.0.1", "resources.serve.num_cpus=0.5",
                              "resources.candidates.num_cpus=0.5", "resources.labeling.actors=1"])


@contextlib.contextmanager
def _iteration(cfg):
    tracker = Tracker(cfg)
    res = IterationResult(0, "")

    @contextlib.contextmanager
    def stage(name):
        with tracker.stage(name):
            yield

    with tracker.iteration(0):
        yield tracker, stage, res


def test_without_a_champion_nothing_is_ranked(pcfg):
    with _iteration(pcfg) as (tracker, stage, res):
        assert make_preferences(pcfg, pcfg, paths(pcfg, 0), 0, tracker, stage, res) == {}
    assert res.counts["pref_skipped_no_champion"] == 1


@pytest.mark.slow  # ~140 s on 2 cores; the `ray job submit` iteration test labels its pool through Serve too
def test_candidates_are_judged_through_serve_by_the_champion(pcfg, zoo, monkeypatch):
    from ray import serve

    version = register_judge(pcfg, zoo["judge"])
    p = paths(pcfg, 0)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        users = deploy(pcfg.model_copy(update={"serve": pcfg.serve.model_copy(update={"model": "zoo:judge"})}))
        # an app a killed driver left (no live owner: flywheel/serve/orphans.py), and a user's app that only
        # looks alike (not a workdir hash): the sweep deletes the first alone
        hello = serve.deployment(lambda _request: "hi", ray_actor_options={"num_cpus": 0})
        stale, alike = (f"{pcfg.serve.app_name}-preferences-{tail}" for tail in ("0badc0de", "mine"))
        for name in (stale, alike):
            serve.run(hello.bind(), name=name, route_prefix=f"/{name}")
        with _iteration(pcfg) as (tracker, stage, res):
            out = make_preferences(pcfg, pcfg, p, 0, tracker, stage, res)
        # a later iteration's judge ranks these samples again (preferences.relabel_pool): served the same way
        relabeled = relabel(pcfg, version, {0: p})
        # the iteration labelled through its own app: the one a user serves under serve.app_name is untouched,
        # the stale one is gone, the look-alike kept
        apps = serve.status().applications
        assert users.app_name == "judge" and apps["judge"].status == "RUNNING" and set(apps) == {"judge", alike}
        with urllib.request.urlopen(f"{users.url}/v1/models", timeout=30) as r:
            assert json.load(r)["model_version"] == users.served.version
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
    assert res.models["preference_judge"] == version
    cands = read_rows(p["pref-candidates"])
    labels = read_rows(p["pref-labels"])
    assert len(cands) == 4 and len(labels) == len(cands)  # every candidate judged once, through HTTP
    assert not any(c["producer"].startswith("gold:") for c in cands)  # the policies' own samples, no variants
    # lineage: the served version, and nothing of where it was served (the port, the per-workdir app's route), so
    # a resume on another port or node writes the same labels
    assert {j["judge"] for j in labels} == {f"http#judge@{version}"}, labels[0]["judge"]
    assert all(j["parse_error"] and j["score"] is None and j["raw_output"] is not None for j in labels)
    assert read_manifest(out["pairs"].path).row_count == 0  # unparsed ratings never make pairs
    assert res.pairs_vs_oracle == {}  # nothing to grade
    # beside the sampled iteration's own data, under the judge's name: another update wanting it finds it done
    (root,) = [d for d in os.listdir(p["pref-relabel"])]
    assert relabeled == {0: os.path.join(p["pref-relabel"], root, "pref-curated")} and "judge" in root
    again = read_rows(os.path.join(p["pref-relabel"], root, "pref-labels"))
    assert sorted(j["candidate_ids"][0] for j in again) == sorted(c["candidate_id"] for c in cands)
    assert {j["judge"] for j in again} == {f"http#judge@{version}"}
    assert read_manifest(f"{relabeled[0]}/pairs").row_count == 0 == read_manifest(f"{relabeled[0]}/dpo").row_count
    # a resume finds every label done by its manifests and deploys nothing (Ray is down by now, too)
    def no_deploy(*_):
        raise AssertionError("deployed the judge for labels that were up to date")

    monkeypatch.setattr("flywheel.preferences.served_judge", no_deploy)
    assert relabel(pcfg, version, {0: p}) == relabeled
    with _iteration(pcfg) as (tracker, stage, res_again):
        assert make_preferences(pcfg, pcfg, p, 0, tracker, stage, res_again)["pairs"] == out["pairs"]
    assert res_again.counts["pref_labels"] == len(labels)

    # the oracle grading of pairs (flywheel/worlds/shapes/pair_check.py) reads the stage's own datasets: one
    # colour pair, written as a judge that could parse would have curated it
    a, b = [c for c in cands if c["prompt_id"] in {r["prompt_id"] for r in read_rows(p["pref-prompts"])
                                                    if r["subtask"] == "iu_color"}]
    write_dataset(f"{p['pref-curated']}/pairs", "pair", [{
        "kind": "policy", "prompt_id": a["prompt_id"], "chosen_id": a["candidate_id"],
        "rejected_id": b["candidate_id"], "chosen_score": 5.0, "rejected_score": 1.0, "margin": 4.0,
        "judge": "test", "meta": {}}], config_hash="test", producer="test")
    graded = pairs_vs_oracle(pcfg, p)
    assert sum(graded[f"iu_color/{v}"] for v in ("right", "tie", "wrong")) == 1 == graded["all/right"] + graded[
        "all/tie"] + graded["all/wrong"]


def test_preference_prompts_are_counted_per_task_or_subtask(tmp_path):
    from collections import Counter

    from flywheel.stages import prompts

    cfg = load_config(None, [f"run.workdir={tmp_path}", "preferences.subtasks=[iu_color, iu_count, ig_relation]",
                             "preferences.prompts_per_subtask={iu: 3, iu_count: 5, ig: 1}"])
    prompts.run_fresh(cfg, str(tmp_path / "pref"), seed=7)
    assert Counter(r["subtask"] for r in read_rows(str(tmp_path / "pref"))) == {
        "iu_color": 3, "iu_count": 5, "ig_relation": 1}  # a sub-task's own count wins over its task's


@pytest.mark.parametrize("counts, error", [
    ("{iu: 3}", r"no count for \['ig_relation'\]"),
    ("{iu: 3, ig: 1, nlg: 2}", r"names \['nlg'\]"),
    ("{iu: 0, ig: 1}", "iu_color gets 0 prompts"),
])
def test_a_count_map_that_misses_or_names_a_wrong_subtask_fails_at_load(counts, error):
    with pytest.raises(ValueError, match=error):
        load_config(None, ["preferences.subtasks=[iu_color, ig_relation]", f"preferences.prompts_per_subtask={counts}"])


def test_policy_candidates_sample_at_the_preference_temperature():
    from flywheel.preferences import sampling_config

    cfg = load_config(None, ["policy.generation.temperature=0.7", "preferences.samples_per_prompt=6"])
    assert sampling_config(cfg).policy.generation.temperature == 0.7  # unset: the policy's own sampling
    hot = sampling_config(load_config(None, ["policy.generation.temperature=0.7",
                                             "preferences.policy_temperature=1.3"]))
    assert hot.policy.generation.temperature == 1.3
    assert sampling_config(cfg).candidates.samples_per_prompt == 6
    assert sampling_config(cfg).candidates.seeded_variants == 0  # the policies' own samples only


def test_labels_through_serve_are_keyed_by_the_served_judge_not_the_iterations_start():
    """A relabel by judge X of an earlier iteration's samples is up to date for any later iteration that serves X,
    whichever judge that iteration started from, and never for another judge."""
    from flywheel.preferences import judge_config
    from flywheel.stages.judgments import stage_hash

    a = load_config(None, ["models.judge.path=models:/judge/6"])
    b = load_config(None, ["models.judge.path=models:/judge/8"])

    def labels_hash(cfg, served, url="http://127.0.0.1:8000/v1"):
        return stage_hash(judge_config(cfg, url, served), "judge", served=True)

    assert labels_hash(a, "models:/judge/8") == labels_hash(b, "models:/judge/8") != labels_hash(b, "models:/judge/9")
    # the served judge's address (a node's IP on a cluster) is not part of it; an outside API's is
    assert labels_hash(a, "models:/judge/8", "http://10.0.0.7:8000/v1") == labels_hash(a, "models:/judge/8")
    assert (stage_hash(judge_config(a, "http://10.0.0.7:8000/v1", "x"), "judge")
            != stage_hash(judge_config(a, "http://127.0.0.1:8000/v1", "x"), "judge"))


def test_an_embedded_ray_serves_preferences_on_a_free_port_of_its_own(tmp_path, monkeypatch):
    """Not beside a `flywheel serve` on 8000 (Serve binds with SO_REUSEPORT: the two would share it)."""
    from flywheel import raycluster
    from flywheel.preferences import _embedded_serve_port, preference_app_name
    from flywheel.raycluster import embedded_ray, init_ray

    # init_ray points RAY_ADDRESS at the Ray it starts and remembers it: both are put back as they were after
    monkeypatch.setenv("RAY_ADDRESS", "unset-by-this-test")
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(raycluster, "_EMBEDDED_ADDRESS", raycluster._EMBEDDED_ADDRESS)
    cfg = load_config(None, [f"run.workdir={tmp_path}", "ray.num_cpus=1"])
    assert cfg.ray.address is None and not embedded_ray()
    init_ray(cfg)
    try:
        assert embedded_ray()
        port = _embedded_serve_port()
        assert port != cfg.serve.port and _embedded_serve_port() == port  # one per embedded Ray, kept
    finally:
        ray.shutdown()
    assert not embedded_ray()
    other = load_config(None, [f"run.workdir={tmp_path}/other"])
    assert preference_app_name(cfg) != preference_app_name(other)  # two workdirs, two apps
    assert preference_app_name(cfg).startswith(f"{cfg.serve.app_name}-preferences-")
