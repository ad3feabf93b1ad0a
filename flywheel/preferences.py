"""Preference data for the policies from the *served* judge: fresh prompts → N candidates from the current
policies → each candidate judged through the Ray Serve app (an `http` engine pointed at its OpenAI-compatible
route; this stage never loads the judge itself) → best-vs-worst pairs with a margin, ties dropped → TRL DPO rows
for the text policy and Diffusion-DPO rows for the generator, each pair carrying the judge version that scored it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from contextlib import contextmanager

import mlflow

from flywheel import gate, storage
from flywheel.config import Config
from flywheel.datasets import Manifest, MissingManifest, read_manifest
from flywheel.stages.runner import up_to_date

log = logging.getLogger(__name__)


def preference_app_name(cfg: Config) -> str:
    """The Serve app an iteration labels through: its own name and route, never `serve.app_name`'s, so it neither
    replaces nor deletes a judge a user serves on the same cluster; per workdir, so two runs' apps stay apart.
    The labels name the served version only (HTTPTextEngine.name), so neither name nor port reaches them. A driver
    killed while labelling leaves its app on a cluster until the next preference deployment there with the same
    serve.app_name deletes it (flywheel/serve/orphans.py)."""
    return _app_prefix(cfg) + hashlib.sha256(str(cfg.run.workdir).encode()).hexdigest()[:8]


def preference_app_pattern(cfg: Config) -> re.Pattern:
    """The names preference_app_name gives, for any workdir: what the sweep of orphaned apps may delete (never an
    app a user named otherwise)."""
    return re.compile(re.escape(_app_prefix(cfg)) + "[0-9a-f]{8}")


def _app_prefix(cfg: Config) -> str:
    return f"{cfg.serve.app_name}-preferences-"


_SERVE_PORTS: dict[str, int] = {}  # embedded Ray's GCS address -> the port its Serve proxy was asked for here


def _embedded_serve_port() -> int:
    """One free port per embedded Ray: Serve keeps the port it started with, so every later deployment (the next
    iteration's) asks for that one again."""
    import ray

    from flywheel.raycluster import free_port

    gcs = ray.get_runtime_context().gcs_address
    if gcs not in _SERVE_PORTS:
        _SERVE_PORTS[gcs] = free_port()
    return _SERVE_PORTS[gcs]


@contextmanager
def served_judge(cfg: Config, judge_ref: str):
    """Deploy the judge on Ray Serve for the duration of the block (as its own app: preference_app_name); yields
    the deployment (its OpenAI-compatible base URL and the version it serves)."""
    from ray import serve

    from flywheel.raycluster import embedded_ray, init_ray
    from flywheel.serve import orphans
    from flywheel.serve.app import deploy

    c = cfg.model_copy(deep=True)
    c.serve.model = judge_ref
    c.serve.app_name = preference_app_name(cfg)
    c.serve.route_prefix = f"/{c.serve.app_name}"
    init_ray(c)
    if embedded_ray():  # a private Ray: its proxy on a free port, never beside a user's `flywheel serve` on 8000
        c.serve.port = _embedded_serve_port()
    # killed drivers' apps, this workdir's or another's; then this one's owner, before its app exists
    orphans.remove_orphans(preference_app_pattern(cfg))
    if not embedded_ray():  # an embedded Ray goes with its driver, apps and all
        orphans.hold_owner(c.serve.app_name)
    deployed = deploy(c)
    try:
        yield deployed
    finally:
        serve.delete(deployed.app_name)


def judge_config(cfg: Config, base_url: str, judge_ref: str, version: str | None = None) -> Config:
    """The config the judgments stage uses to score candidates through Serve, with `judge_ref` served (as
    `version`: a response from any other model is a failure). The engine only talks HTTP; naming the served judge
    in models.judge makes it part of the labels' stage hash."""
    c = cfg.model_copy(deep=True)
    c.models.judge.path = judge_ref
    c.judge.engine = "http"
    c.judge.http.base_url = base_url
    c.judge.http.expect_model_version = version
    c.judgments.protocols = dict(cfg.preferences.protocols)
    c.judgments.samples_per_item = 1
    # The labeling actors only wait on HTTP here; a fraction of a CPU each leaves the cores to the Serve replica.
    c.resources.labeling.num_cpus = min(c.resources.labeling.num_cpus, 0.25)
    return c


def label_served(start: Config, judge: str, jobs: list[tuple[str, str, str]], tracker=None) -> dict[str, Manifest]:
    """Judge each (prompts, candidates, output) job's candidates with `judge` served on Ray Serve; returns each
    output's manifest. The judge is deployed only if some output is not up to date, so a resume that finds every
    label done (by the manifests: judgments.run verifies the data when it runs) starts no Serve app."""
    from flywheel.stages import judgments

    labels_hash = judgments.stage_hash(judge_config(start, "", judge), "judge", served=True)  # no address in it

    def done(prompts: str, candidates: str, output: str) -> Manifest | None:
        try:
            upstream = [read_manifest(prompts), read_manifest(candidates)]
        except MissingManifest:
            return None
        return up_to_date(output, labels_hash, upstream)

    out = {o: done(pr, ca, o) for pr, ca, o in jobs}
    if all(m is not None for m in out.values()):
        log.info("preference labels by %s: all %d up to date; the judge is not deployed", judge, len(jobs))
        return out
    with served_judge(start, judge) as deployed:
        log.info("preference labels: judge %s served at %s", deployed.served.version, deployed.url)
        c = judge_config(start, deployed.openai_base_url, judge, deployed.served.version)
        for pr, ca, o in jobs:
            out[o] = judgments.run(c, pr, ca, o, "judge", tracker, served=True).manifest
    return out


def sampling_config(start: Config) -> Config:
    """The config the preference prompts and the policies' candidates are made with (cfg.preferences)."""
    c = start.model_copy(deep=True)
    c.candidates.samples_per_prompt = start.preferences.samples_per_prompt
    c.candidates.seeded_variants = 0  # DPO pairs are the policies' own samples, never the world's variants
    if start.preferences.policy_temperature is not None:
        c.policy.generation.temperature = start.preferences.policy_temperature
    return c


def make_preferences(start: Config, cfg: Config, p: dict[str, str], n: int, tracker, stage, res) -> dict:
    """Run the preference stages of iteration n; returns the curated manifests (dpo, image_pref, pairs)."""
    from flywheel.stages import candidates, curate, prompts

    judge = gate.champion_of(cfg, cfg.train.registry.judge)
    if judge is None:
        # Ranking policy samples with a judge that never passed the gate would teach the policies noise.
        log.info("iteration %d: no champion judge yet; preference data and policy updates skipped", n)
        res.counts["pref_skipped_no_champion"] = 1
        return {}
    res.models["preference_judge"] = judge
    sampling = sampling_config(start)
    with stage("preference-prompts"):
        prompts.run_fresh(sampling, p["pref-prompts"], seed=cfg.run.seed * 1000 + 500 + n, tracker=tracker)
    with stage("preference-candidates"):
        res.counts["pref_candidates"] = candidates.run(sampling, p["pref-prompts"], p["pref-candidates"],
                                                       tracker).manifest.row_count
    with stage("preference-labels"):
        labels = label_served(start, judge, [(p["pref-prompts"], p["pref-candidates"], p["pref-labels"])], tracker)
        res.counts["pref_labels"] = labels[p["pref-labels"]].row_count
    with stage("curate-policy"):
        out = curate.run_policy(start, p["pref-labels"], p["pref-prompts"], p["pref-candidates"], p["pref-curated"],
                                tracker)
        res.counts |= {f"pref_{k}": m.row_count for k, m in out.items()}
        res.pairs_vs_oracle = pairs_vs_oracle(cfg, p)
        if res.pairs_vs_oracle:
            mlflow.log_metrics({f"pairs_vs_oracle.{k}": v for k, v in res.pairs_vs_oracle.items()})
            log.info("preference pairs vs the oracle: %s", {k: v for k, v in res.pairs_vs_oracle.items()
                                                             if k.startswith("all/")})
    return out


def relabel(start: Config, judge: str, earlier: dict[int, dict[str, str]]) -> dict[int, str]:
    """Rank the preference candidates of earlier iterations (iteration -> its paths) again with `judge`, served,
    and curate new pairs from them; returns iteration -> its new pref-curated root. A pooled update then trains
    only on the current judge's rankings (preferences.relabel_pool): in runs/t6 the first iteration's judge ranked
    5 of 23 caption pairs right, the fourth's 17 of 28. The output sits under the sampled iteration's
    pref-relabel/<judge>, so a later update that wants the same samples ranked by the same judge (the other
    policy's pool, a resume) finds it done."""
    from flywheel.stages import curate

    roots = {j: storage.join(earlier[j]["pref-relabel"], re.sub(r"[^A-Za-z0-9._-]+", "-", judge).strip("-"))
             for j in sorted(earlier)}
    log.info("relabel: judge %s ranks the samples of iterations %s again", judge, sorted(earlier))
    # no tracker: the iteration's own labeling metrics stay those of its own samples
    label_served(start, judge, [(earlier[j]["pref-prompts"], earlier[j]["pref-candidates"],
                                 storage.join(root, "pref-labels")) for j, root in roots.items()])
    for j, root in roots.items():
        curate.run_policy(start, storage.join(root, "pref-labels"), earlier[j]["pref-prompts"],
                          earlier[j]["pref-candidates"], storage.join(root, "pref-curated"))
    return {j: storage.join(root, "pref-curated") for j, root in roots.items()}


def pairs_vs_oracle(cfg: Config, p: dict[str, str]) -> dict[str, float]:
    """How the iteration's preference pairs agree with the oracle (flywheel/worlds/shapes/pair_check.py); empty
    when no pair's prompt carries ground truth (data from outside the shapes world)."""
    from flywheel.datasets import iter_dataset_rows, read_rows
    from flywheel.worlds.shapes.pair_check import pair_agreement

    pairs = read_rows(f"{p['pref-curated']}/pairs")
    if not pairs:
        return {}
    # only the rows the pairs name: candidates carry images, and most candidates make no pair
    prompt_ids = {pair["prompt_id"] for pair in pairs}
    candidate_ids = {pair[k] for pair in pairs for k in ("chosen_id", "rejected_id")}
    prompts = {r["prompt_id"]: r for r in iter_dataset_rows(p["pref-prompts"]) if r["prompt_id"] in prompt_ids}
    candidates = {r["candidate_id"]: r for r in iter_dataset_rows(p["pref-candidates"])
                  if r["candidate_id"] in candidate_ids}
    agreement = pair_agreement(pairs, prompts, candidates, cfg.world.shapes)
    graded = sum(agreement.get(f"all/{verdict}", 0) for verdict in ("right", "tie", "wrong"))
    return agreement if graded else {}
