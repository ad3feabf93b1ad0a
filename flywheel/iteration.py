"""One flywheel iteration: the stage graph, in order, each stage a nested MLflow run.

  models → prompts → gold → candidates → labels (teacher) → curate → judge SFT → judge DPO → meta-eval → gate
  → serve the champion judge → preference prompts → policy candidates → judged through Serve → preference pairs
  → LLaVA DPO + SDXL Diffusion-DPO → downstream eval (oracle) → policy gates

Every arrow is a dataset with a manifest under <storage>/iterations/<n>/, and every stage is skipped when its
output records the same config and inputs (trainings: when an identical version is registered), so running an
iteration again after a crash — `--resume` — redoes only what had not finished, and gives the same result as an
uninterrupted run with the same seed. Iteration n+1 starts from n's champion judge and n's champion policies; an
iteration pins those start models when it begins and skips itself once finished (flywheel/iteration_record.py).
A policy's update may wait for pairs pooled over several iterations (preferences.update_min_pairs,
flywheel/preference_pool.py).
"""

from __future__ import annotations

import json
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import mlflow

from flywheel import data_view, gate, stage_clock, storage, workdir_lock
from flywheel.config import Config
from flywheel.iteration_record import ROLES, IterationRecord
from flywheel.iteration_summary import describe, right_of
from flywheel.stage_clock import StageClock
from flywheel.track import Tracker

log = logging.getLogger(__name__)


@dataclass
class IterationResult:
    iteration: int
    run_id: str
    seconds: dict[str, float] = field(default_factory=dict)
    load: dict[str, float] = field(default_factory=dict)  # mean 1-minute load average per stage (stage_clock.py)
    cpus: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    meta_eval: dict = field(default_factory=dict)
    vs_teacher: dict[str, dict] = field(default_factory=dict)  # split -> the judge vs its teacher (McNemar)
    downstream: dict = field(default_factory=dict)
    decisions: list[dict] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    pairs_vs_oracle: dict[str, float] = field(default_factory=dict)  # preference pairs the oracle agrees with
    # role -> its preference pool: {"pairs", "needs", "iterations"} (flywheel/preference_pool.py)
    pools: dict[str, dict] = field(default_factory=dict)
    # earlier iteration -> its pooled pairs ranked again by this iteration's judge (preferences.relabel_pool):
    # {"judge": who ranked them first, "before"/"after": their agreement with the oracle, if it can grade them}
    relabeled: dict[int, dict] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)  # dataset name -> rows refused, where any were
    skipped: bool = False  # finished by an earlier run (flywheel/iteration_record.py)


def iteration_dir(cfg: Config, n: int) -> str:
    return storage.join(cfg.storage.uri, "iterations", f"{n:03d}")


def paths(cfg: Config, n: int) -> dict[str, str]:
    it = iteration_dir(cfg, n)
    names = ("prompts", "prompts-train", "candidates", "labels", "curated", "meta-eval", "meta-eval-baseline",
             "pref-prompts", "pref-candidates", "pref-labels", "pref-curated", "pref-pool",
             "pref-relabel")
    # One gold set serves every iteration, and the teacher is the same in each: its meta-eval sits beside the
    # gold, so later iterations find its manifest and skip it (redone when the gold or the teacher changes).
    shared = {k: storage.join(cfg.storage.uri, k) for k in ("gold", "meta-eval-teacher")}
    return {k: storage.join(it, k) for k in names} | shared


def current(cfg: Config, role: str) -> str:
    """The model an iteration starts from: the registered champion, else the configured base model. A judge
    trains from its lineage instead when gate.judge_lineage says so (flywheel/gate.py)."""
    name = getattr(cfg.train.registry, role)
    head = gate.lineage_of(cfg, name) if role == "judge" and cfg.gate.judge_lineage == "within_noise" else None
    return head or gate.champion_of(cfg, name) or getattr(cfg.models, role).path


def with_models(cfg: Config, **refs: str) -> Config:
    c = cfg.model_copy(deep=True)
    for role, ref in refs.items():
        getattr(c.models, role).path = ref
    return c


def run_iteration(cfg: Config, n: int, tracker: Tracker | None = None) -> IterationResult:
    """Iteration n, resumed where an earlier run of it stopped; one driver per workdir at a time (WorkdirBusy)."""
    with workdir_lock.holding(cfg.run.workdir, f"iteration {n}"):
        res = _run_iteration(cfg, n, tracker)
        if cfg.storage.keep_iterations and not res.skipped:
            _prune_after(cfg, res)
        return res


def _prune_after(cfg: Config, res: IterationResult) -> None:
    """storage.keep_iterations after a finished iteration. A prune that fails does not fail the iteration, whose
    results stand: it is logged, and tagged on the iteration's run (`flywheel prune --yes` tries again)."""
    from flywheel import failures, retention

    try:
        p = retention.prune(cfg)
    except Exception as e:  # noqa: BLE001 - any reason: storage, MLflow, a damaged manifest
        why = failures.summary(e)
        log.error("retention after iteration %d failed, nothing more deleted: %s (`flywheel prune --yes` tries "
                  "again)", res.iteration, why, exc_info=True)
        try:
            mlflow.MlflowClient(cfg.tracking.uri).set_tag(res.run_id, "flywheel.retention_failed", why)
        except Exception:  # noqa: BLE001 - MLflow may be what failed: the log above says it
            pass
        return
    if p.deletes:
        log.info("retention: %s of iterations %s deleted (%.1f MB; storage.keep_iterations %d); kept whole: %s",
                 p.counts(), sorted(p.pruned), p.bytes / 1e6, p.keep,
                 ", ".join(f"{k} ({why})" for k, why in p.kept.items()))


def _run_iteration(cfg: Config, n: int, tracker: Tracker | None) -> IterationResult:
    from flywheel.evaluate import meta
    from flywheel.evaluate.versus_teacher import versus_teacher
    from flywheel.stages import base_models, candidates, curate, gold, judgments, prompts

    it_dir = iteration_dir(cfg, n)
    record = start_record(cfg, n)
    if record.finished:
        return _finished_earlier(cfg, record)
    tracker = tracker or Tracker(cfg)
    p = paths(cfg, n)
    with tracker.iteration(n, resume_run_id=record.run_id) as parent:
        res = IterationResult(n, parent.info.run_id)
        record.run_id = parent.info.run_id
        record.save(it_dir)

        clock = StageClock(storage.join(it_dir, stage_clock.FILE))
        res.cpus = clock.cpus

        @contextmanager
        def stage(name: str):
            with clock.stage(name), tracker.stage(name) as run:
                log.info("iteration %d: stage %s", n, name)
                yield
            res.seconds[name] = clock.done[name]
            # over every run that worked on the stage: a resumed stage's own metrics are its last attempt's
            tracker.client.log_metric(run.info.run_id, "stage.seconds_total", clock.done[name])
            if name in clock.load:
                res.load[name] = clock.load[name]

        judge0 = record.start["judge"]
        res.models = _start_models(record)
        start = with_models(cfg, **record.start)

        with stage("models"):
            base_models.log_to_mlflow(base_models.run(cfg))
        with stage("prompts"):  # fresh prompts every iteration; the test splits' prompts never reach train
            res.counts["prompts"] = prompts.run(start, p["prompts"], tracker, iteration=n).manifest.row_count
            res.counts["prompts_train"] = prompts.run_split(start, p["prompts"], p["prompts-train"]).row_count
        with stage("gold"):  # one gold set for every iteration (from iteration 0's draw), so they compare
            first = paths(cfg, 0)["prompts"]
            if n:  # iteration 0's prompts, drawn again should its workdir have lost them
                log.info("stage gold: from iteration 0's prompts at %s (one gold set for every iteration)", first)
                prompts.run(start, first, iteration=0)
            gold.run(start, first, p["gold"], tracker)
        with stage("candidates"):
            res.counts["candidates"] = candidates.run(start, p["prompts-train"], p["candidates"],
                                                      tracker).manifest.row_count
        with stage("labels"):
            res.counts["labels"] = judgments.run(start, p["prompts-train"], p["candidates"], p["labels"], "teacher",
                                                 tracker).manifest.row_count
        with stage("curate-judge"):
            curated = curate.run_judge(start, p["labels"], p["prompts-train"], p["candidates"], p["curated"], tracker)
            res.counts |= {f"judge_{k}": m.row_count for k, m in curated.items()}

        judge_new = _train_judge(start, p, n, tracker, stage, res)
        with stage("meta-eval"):
            res.meta_eval["challenger"] = meta.run(with_models(cfg, judge=judge_new), p["gold"], p["meta-eval"],
                                                   tracker=tracker)
            if cfg.gate.judge_baseline and not judge0.startswith("models:/"):  # iteration 0: the base stands in
                res.meta_eval["baseline"] = meta.run(start, p["gold"], p["meta-eval-baseline"])
            elif (champion := _champion_to_measure_again(cfg, p["gold"])) is not None:
                res.meta_eval["champion"] = _measure_again(cfg, champion, p)
            # The bar the flywheel aims at: the noisy teacher's own agreement with gold, on the same items.
            res.meta_eval["teacher"] = meta.run(start, p["gold"], p["meta-eval-teacher"], role="teacher")
            # above that bar beyond chance? pair by pair on the same gold (McNemar)
            res.vs_teacher = versus_teacher(cfg, p["gold"], p["meta-eval"], p["meta-eval-teacher"],
                                            list(res.meta_eval["challenger"]))
        with stage("gate-judge"):
            decision = gate_judge(cfg, judge_new, judge0, res.meta_eval, p)
            res.decisions.append(decision)
            mlflow.log_dict(decision, "gate/judge.json")

        from flywheel.preferences import make_preferences

        pref = make_preferences(start, cfg, p, n, tracker, stage, res)
        if pref:
            _train_and_gate_policies(start, cfg, p, pref, n, tracker, stage, res)
        res.quarantined = {x.name: x.manifest.quarantined for x in data_view.datasets_of(p)
                           if x.manifest and x.manifest.quarantined}
        _summarize(res)
        record.finished, record.decisions = True, res.decisions
        record.save(it_dir)
    return res


def start_record(cfg: Config, n: int) -> IterationRecord:
    """Iteration n's record: the one an earlier run wrote (its start models pinned), else a new one starting
    from the current champions (saved once the iteration's MLflow run is open)."""
    record = IterationRecord.load(iteration_dir(cfg, n))
    if record is None:
        return IterationRecord(n, cfg.hash(), {role: current(cfg, role) for role in ROLES})
    if not record.finished:
        log.info("iteration %d resumes from the models it started from: %s", n, record.start)
        if record.config_hash != cfg.hash():
            log.warning("iteration %d started with config %s and resumes with %s: stages whose inputs changed "
                        "are redone", n, record.config_hash, cfg.hash())
    return record


def _finished_earlier(cfg: Config, record: IterationRecord) -> IterationResult:
    """A finished iteration is not run again: its gates moved the champions its successors started from."""
    n = record.iteration
    following = n + 1
    while (later := IterationRecord.load(iteration_dir(cfg, following))) is not None and later.finished:
        following += 1
    log.info("iteration %d finished earlier (MLflow run %s); skipped. The next one to run is --start %d", n,
             record.run_id, following)
    if record.config_hash != cfg.hash():
        log.warning("iteration %d finished with config %s, not this one (%s): its results stand; to redo it, "
                    "use a new run.workdir", n, record.config_hash, cfg.hash())
    clock = StageClock(storage.join(iteration_dir(cfg, n), stage_clock.FILE))
    return IterationResult(n, record.run_id or "", decisions=record.decisions, models=_start_models(record),
                           seconds=dict(clock.done), load=dict(clock.load), cpus=clock.cpus, skipped=True)


def _start_models(record: IterationRecord) -> dict[str, str]:
    return {f"{role}_start": record.start[role] for role in ROLES}


def gate_judge(cfg: Config, judge_new: str, judge0: str, meta_eval: dict[str, dict], p: dict) -> dict:
    """The judge gate's decision on the challenger's meta-eval (`gate.judge_metric`, its margin and test, and
    `gate.judge_guards` read from the same meta-eval), with the lineage's next start under within_noise."""
    value = _metric(meta_eval["challenger"], cfg.gate.judge_metric)
    has_baseline = "baseline" in meta_eval
    # where each judge's meta-eval is, so the gate can compare them gold pair by gold pair (McNemar)
    base_eval = gate.MetaEval(p["meta-eval-baseline"], p["gold"]) if has_baseline else None
    judged = gate.MetaEval(p["meta-eval"], p["gold"])
    d = gate.decide(cfg, judge_new, value, cfg.gate.judge_metric, cfg.gate.judge_margin,
                    baseline=(judge0, _metric(meta_eval["baseline"], cfg.gate.judge_metric)) if has_baseline
                    else None,
                    alpha=cfg.gate.judge_alpha if cfg.gate.judge_test == "mcnemar" else None,
                    meta_eval=judged, baseline_meta_eval=base_eval,
                    guards={g: (_metric(meta_eval["challenger"], g), drop)
                            for g, drop in cfg.gate.judge_guards.items()})
    decision = d.to_dict()
    if cfg.gate.judge_lineage == "within_noise":
        decision["next_start"] = gate.continue_lineage(cfg, d, judged, cfg.gate.judge_alpha)
    return decision


def _champion_to_measure_again(cfg: Config, gold_uri: str) -> str | None:
    """The judge champion, if its recorded meta-eval cannot be tested against the gold now in use the way judges
    are scored now: the gold changed since it was promoted (world.gold or meta_eval.gold_files edited, a user's
    labels added), its rows are gone, or the judge's scoring changed (judge.samples, its decoding or readout:
    gate.judge_scoring). Its recorded value measured something else, so it is measured again beside the
    challenger."""
    champion = gate.champion_of(cfg, cfg.train.registry.judge)
    if champion is None or gate.measured_on(cfg, champion, cfg.gate.judge_metric, gold_uri):
        return None
    return champion


def _measure_again(cfg: Config, champion: str, p: dict) -> dict:
    """Meta-eval of the champion on the current gold (beside the challenger's, where iteration 0 measures the base
    model), recorded on its version so the gate and its guards compare both judges on the same pairs."""
    from flywheel.evaluate import meta

    log.info("judge champion %s: its recorded meta-eval was not against the gold at %s as judges are scored now "
             "(the gold or the judge's scoring changed since, or its rows are gone); measuring it again there",
             champion, p["gold"])
    results = meta.run(with_models(cfg, judge=champion), p["gold"], p["meta-eval-baseline"])
    values = {m: _metric(results, m) for m in [cfg.gate.judge_metric, *cfg.gate.judge_guards]}
    gate.remeasured(cfg, champion, {m: v for m, v in values.items() if m == cfg.gate.judge_metric or
                                    math.isfinite(v)}, gate.MetaEval(p["meta-eval-baseline"], p["gold"]))
    return results


def _metric(results: dict, dotted: str) -> float:
    split, _, name = dotted.partition("/")
    return float(results.get(split, {}).get(name, float("nan")))


def _train_judge(cfg: Config, p: dict, n: int, tracker: Tracker, stage, res: IterationResult) -> str:
    from flywheel.train.api import train

    with stage("judge-sft"):
        sft = train(cfg, "judge_sft", storage.join(p["curated"], "sft"), base=cfg.models.judge.path,
                    tracker=tracker, iteration=n)
    judge = sft.model_uri
    dpo_data = storage.join(p["curated"], "dpo")
    if _rows(dpo_data) > 0:
        with stage("judge-dpo"):
            judge = train(cfg, "judge_dpo", dpo_data, base=sft.model_uri, tracker=tracker, iteration=n).model_uri
    res.models["judge_new"] = judge
    return judge


def _rows(uri: str) -> int:
    from flywheel.datasets import read_manifest

    return read_manifest(uri).row_count


def _train_and_gate_policies(start: Config, cfg: Config, p: dict, pref: dict, n: int, tracker, stage,
                             res: IterationResult) -> None:
    """Per policy: train each configured update method on the same pairs (train.<training>.methods), keep the
    best by the held-out target among those the guard did not refuse, and gate it against the champion."""
    from flywheel.evaluate.downstream import evaluate_generator_ref, evaluate_policy_ref, needs_judge
    from flywheel.train.api import train
    from flywheel.train.updates import outcome_of

    def scored(evaluate, metric: str):  # a judge-scored metric: the judge that ranked the pairs rates the answers
        return partial(evaluate, judge=res.models["preference_judge"]) if needs_judge(metric) else evaluate

    trainings = [("policy", "policy_dpo", "dpo", scored(evaluate_policy_ref, cfg.gate.policy_metric),
                  cfg.gate.policy_metric, cfg.gate.policy_margin),
                 ("generator", "diffusion_dpo", "image_pref", scored(evaluate_generator_ref, cfg.gate.generator_metric),
                  cfg.gate.generator_metric, cfg.gate.generator_margin)]
    needs = {role: cfg.preferences.update_min_pairs.get(role, 0) for role in ("policy", "generator")}
    pools = {role: _pool(cfg, p, n, role, getattr(start.models, role).path, data) for role, _, data, *_ in trainings}
    due = {role: pool for role, pool in pools.items() if pool.rows and pool.rows >= needs[role]}
    if cfg.preferences.relabel_pool and due and (curated := _relabel(start, cfg, p, n, due, stage, res)):
        pools |= {role: _pool(cfg, p, n, role, getattr(start.models, role).path, data, curated)
                  for role, _, data, *_ in trainings if role in due}
    for role, training, data, evaluate, metric, margin in trainings:
        base = getattr(start.models, role).path
        pool, need = pools[role], needs[role]
        uri = pool.uri
        if pool.rows == 0:
            log.info("iteration %d: no %s preference pairs; %s skipped", n, role, training)
            continue
        res.counts |= {f"{role}_pool_pairs": pool.rows, f"{role}_pool_iterations": len(pool.iterations),
                       f"{role}_pool_needs": need}
        res.pools[role] = {"pairs": pool.rows, "needs": need, "iterations": pool.iterations}
        if pool.rows < need:
            log.info("iteration %d: %s waits for more pairs: %d of %d pooled (iterations %s)", n, training,
                     pool.rows, need, pool.iterations)
            res.counts[f"{role}_waits"] = 1
            continue
        if len(pool.iterations) > 1:
            log.info("iteration %d: %s trains on %d pairs pooled from iterations %s", n, training, pool.rows,
                     pool.iterations)
        short = _too_few_pairs(start, training, uri)
        if short:
            log.info("iteration %d: %s skipped: %s", n, training, short)
            res.counts[f"{training}_skipped_too_few_pairs"] = 1
            continue
        methods = getattr(start.train, training).methods
        outcomes = []
        for method in methods:
            name = training.replace("_", "-") + (f"-{method}" if len(methods) > 1 else "")
            with stage(name):
                result = train(start, training, uri, base=base, tracker=tracker, iteration=n, method=method)
            fallback = None
            if "heldout.best_step" not in result.final and len(methods) > 1:  # no held-out curve to compare
                with stage(f"eval-{role}-{method}"):
                    fallback = evaluate(cfg, result.model_uri).metrics[metric]
            outcomes.append(outcome_of(method, result.model_uri, result.final, fallback, metric))
        _promote_best_update(cfg, role, base, outcomes, evaluate, metric, margin, stage, res)


def _pool(cfg: Config, p: dict, n: int, role: str, start: str, kind: str, curated: dict[int, str] | None = None):
    """Iteration n's pairs for `role`, pooled with the untrained pairs of earlier iterations that sampled the
    same policy (flywheel/preference_pool.py); `curated` names an earlier iteration's pairs ranked again."""
    from flywheel.preference_pool import pool_pairs, pooled_iterations

    earlier = pooled_iterations(lambda j: IterationRecord.load(iteration_dir(cfg, j)), n, role,
                                getattr(cfg.train.registry, role), start)
    curated = curated or {}
    sources = {j: storage.join(curated.get(j) or paths(cfg, j)["pref-curated"], kind) for j in [*earlier, n]}
    return pool_pairs(kind, sources, storage.join(p["pref-pool"], kind), config_hash=cfg.stage_hash("pool"),
                      limits=cfg.limits)


def _relabel(start: Config, cfg: Config, p: dict, n: int, due: dict, stage, res: IterationResult) -> dict[int, str]:
    """The earlier iterations in the due pools whose pairs another judge ranked, ranked again by this iteration's
    judge (preferences.relabel_pool); returns iteration -> its new pref-curated root."""
    from flywheel.preference_pool import ranked_by
    from flywheel.preferences import pairs_vs_oracle, relabel

    mine = ranked_by(p["pref-curated"])
    stale = {j: ranked_by(paths(cfg, j)["pref-curated"]) for pool in due.values() for j in pool.iterations if j != n}
    stale = {j: judge for j, judge in sorted(stale.items()) if judge != mine}
    if not stale:
        return {}
    with stage("relabel-pool"):
        curated = relabel(start, res.models["preference_judge"], {j: paths(cfg, j) for j in stale})
    for j, judge in stale.items():
        res.relabeled[j] = {"judge": judge, "before": pairs_vs_oracle(cfg, paths(cfg, j)),
                            "after": pairs_vs_oracle(cfg, paths(cfg, j) | {"pref-curated": curated[j]})}
        log.info("iteration %d: iteration %d's samples ranked again (first by %s); pairs vs the oracle, right of "
                 "graded: %s -> %s", n, j, judge, right_of(res.relabeled[j]["before"]),
                 right_of(res.relabeled[j]["after"]))
    return curated


def _too_few_pairs(cfg: Config, training: str, uri: str) -> str | None:
    """Why the Diffusion-DPO loop cannot train on this dataset (None: it can). It draws only full batches, one per
    worker, from the pairs left after its held-out split (TRL's DPO takes a partial batch, so it always can)."""
    if training != "diffusion_dpo":
        return None
    from flywheel.datasets import read_rows
    from flywheel.train.heldout_pairs import split_pairs

    s = cfg.train.resolved(training)
    rows = [{"prompt": r["prompt"]} for r in read_rows(uri, "image_pref")]
    kept, _ = split_pairs(rows, s.heldout.pairs_fraction if s.heldout else 0.0,
                          s.heldout.pairs_max if s.heldout else None)
    need = s.batch_size * cfg.resources.train.actors
    if len(kept) >= need:
        return None
    return f"{len(kept)} training pairs cannot fill one batch of {s.batch_size} per worker ({need} pairs)"


def _promote_best_update(cfg: Config, role: str, base: str, outcomes: list, evaluate, metric: str, margin: float,
                         stage, res: IterationResult) -> None:
    """The gate of one policy's updates: refused ones (guard fired, or no held-out gain) never reach
    gate.decide - they get a refusal with the guard's reason; the best of the others is evaluated downstream
    and gated against the champion. The method comparison is logged either way."""
    from flywheel.evaluate.downstream import ORACLE_METRIC, needs_judge, oracle_check
    from flywheel.train.updates import choose_update

    choice = choose_update(outcomes)
    for o in choice.outcomes:
        log.info("%s update %s (%s): %s %.4g%s", role, o.method, o.model, o.measure, o.value,
                 f" - refused: {o.reason}" if o.refused else " - chosen" if o is choice.winner else "")
    if choice.winner is not None:
        new = choice.winner.model
        with stage(f"eval-{role}"):
            before = evaluate(cfg, base)
            after = evaluate(cfg, new)
            res.downstream[role] = {"before": before.metrics, "after": after.metrics, "model": new, "base": base,
                                    "methods": choice.comparison()}
            mlflow.log_metrics({f"{role}.before.{k}": v for k, v in before.metrics.items() if v == v} |
                               {f"{role}.after.{k}": v for k, v in after.metrics.items() if v == v})
            if needs_judge(metric) and ORACLE_METRIC[role] in after.per_item:  # the oracle world can check it
                check = res.downstream[role]["oracle_check"] = oracle_check(role, metric, before, after)
                mlflow.log_metrics({f"{role}.oracle_check.{k}": float(v) for k, v in check.items()
                                    if not isinstance(v, str) and v == v})  # the test's name is in the summary
    with stage(f"gate-{role}"):
        mlflow.log_dict(choice.comparison(), f"gate/{role}-methods.json")
        for o in choice.refused:
            d = gate.refuse(cfg, o.model, metric, o.reason or "refused")
            res.decisions.append(d.to_dict())
            mlflow.log_dict(d.to_dict(), f"gate/{role}-{o.method}.json")
        if choice.winner is not None:
            # both answered the same held-out items just now: the gate compares them item by item
            paired = metric in after.per_item and metric in before.per_item
            d = gate.decide(cfg, choice.winner.model, after.metrics[metric], metric, margin,
                            baseline=(base, before.metrics[metric]),
                            alpha=cfg.gate.downstream_alpha if cfg.gate.downstream_test == "paired" else None,
                            items=(after.per_item[metric], before.per_item[metric]) if paired else None)
            res.decisions.append(d.to_dict())
            mlflow.log_dict(d.to_dict(), f"gate/{role}.json")


def _summarize(res: IterationResult) -> None:
    mlflow.log_metrics({f"seconds.{k}": v for k, v in res.seconds.items()} |
                       {f"count.{k}": float(v) for k, v in res.counts.items()} |
                       {f"quarantined.{k}": float(v) for k, v in res.quarantined.items()})
    summary = {"iteration": res.iteration, "seconds": res.seconds, "load": res.load, "cpus": res.cpus,
               "counts": res.counts, "meta_eval": res.meta_eval, "vs_teacher": res.vs_teacher,
               "downstream": res.downstream, "decisions": res.decisions, "models": res.models,
               "pairs_vs_oracle": res.pairs_vs_oracle, "pools": res.pools,
               "relabeled": res.relabeled, "quarantined": res.quarantined}
    mlflow.log_dict(summary, "summary/summary.json")
    mlflow.set_tag("mlflow.note.content", describe(summary))
    log.info("iteration %d done: %s", res.iteration, json.dumps(res.decisions, default=str)[:500])
