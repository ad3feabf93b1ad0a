"""Downstream evaluation of the policies: held-out items, scored by the oracle against ground truth and, for a
judge-scored gate metric, by the serving judge.

Run inside a Ray task with the candidates stage's resources, so on a cluster the 7B policy lands on a GPU node.

A gate metric named `judge/...` (gate.policy_metric, gate.generator_metric) is the serving champion judge's: its
pointwise ratings of the same answers, in the same task after the policy is freed, for prompts that have no
ground truth. The oracle's metrics are still measured beside it, so in the oracle world the two can be compared
(`oracle_check`). Before and after are rated by the same judge in the same iteration, so the gate compares like
with like; a policy trained on that judge's preferences can learn its blind spots, which only the oracle shows.

A result is kept under <storage>/downstream-evals/ when the model cannot change under its name (a registered
version, a hash-named zoo or world folder): an unpromoted champion is the "before" of every iteration, and a
promoted one was the "after" of the iteration that promoted it, so each model is evaluated once per eval setting
(and per judge, for judge-scored results).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field

from flywheel import storage
from flywheel.config import Config, ModelRef

log = logging.getLogger(__name__)
# Part of a kept result's key: bump it when the oracle's scoring of held-out items changes (policy_eval.py,
# check_text.py, check_image.py), so results kept by the older code are not read back.
SCORING_VERSION = 1
# The same for a judge's scoring of them (flywheel/train/heldout_probes.py JudgeScorer). 2: answers stripped.
JUDGE_SCORING_VERSION = 2
JUDGE_METRIC_PREFIX = "judge/"
ORACLE_METRIC = {"policy": "accuracy", "generator": "score10"}  # each role's oracle metric with per-item values


@dataclass
class Downstream:
    """A model's oracle metrics on the held-out items, and per item the values some metrics average (in item
    order; every model is asked the same items), so the gate can compare two models item by item."""

    metrics: dict[str, float]
    per_item: dict[str, list[float]] = field(default_factory=dict)


def needs_judge(metric: str) -> bool:
    """A gate metric the serving judge measures (`judge/pointwise/score`), not the oracle."""
    return metric.startswith(JUDGE_METRIC_PREFIX)


def oracle_check(role: str, metric: str, before: Downstream, after: Downstream) -> dict[str, float | str]:
    """In the oracle world, what the oracle says of a judge-gated update (`metric` a judge metric): its own paired
    test on the same items (test, better, worse, p) and how well the judge's ratings of
    all these answers follow the oracle's per-item values: ROC AUC for right/wrong items (P(a right answer is
    rated above a wrong one), ties half), else Spearman's rho. Items the judge could not rate are left out."""
    from scipy import stats

    from flywheel.gate import Untestable, paired_items

    oracle = ORACLE_METRIC[role]
    out: dict[str, float | str] = {"metric": oracle, "before": before.metrics[oracle], "after": after.metrics[oracle]}
    try:
        out["test"], out["better"], out["worse"], out["p"] = paired_items(after.per_item[oracle],
                                                                          before.per_item[oracle])
    except Untestable:
        pass
    rated = [(j, o) for d in (before, after) for j, o in zip(d.per_item[metric], d.per_item[oracle], strict=True)
             if j == j]
    right = [j for j, o in rated if o == 1.0]
    wrong = [j for j, o in rated if o == 0.0]
    if len(right) + len(wrong) == len(rated) and right and wrong:
        u = stats.mannwhitneyu(right, wrong).statistic
        out["auc"] = float(u / (len(right) * len(wrong)))
    elif len(rated) > 2 and len({o for _, o in rated}) > 1 and len({j for j, _ in rated}) > 1:
        out["spearman"] = float(stats.spearmanr([j for j, _ in rated], [o for _, o in rated]).statistic)
    return out


def heldout_prompts(cfg: Config, tasks: tuple[str, ...]) -> list[dict]:
    """preferences.sources' id-test prompts of `tasks` (real data's held-out prompts), at most gate.eval_items:
    a draw fixed by run.seed, so every model of a run is asked the same prompts."""
    import numpy as np

    from flywheel.stages.prompts import draw_sources

    rows, _ = draw_sources(cfg, "id-test", cfg.run.seed, counts=lambda subtask, task: cfg.gate.eval_items)
    rows = [r for r in rows if r["task"] in tasks]
    if not rows:
        raise ValueError(f"preferences.sources hold no id-test prompt of the tasks {list(tasks)} to evaluate on")
    take = np.random.default_rng([cfg.run.seed, 104729]).permutation(len(rows))[:cfg.gate.eval_items]
    return [rows[i] for i in sorted(take)]


def _no_truth(role: str, judge: str | None) -> None:
    if judge is None:
        raise ValueError(f"the {role}'s held-out prompts come from preferences.sources, which have no ground "
                         f"truth: only the judge can score them (gate.{role}_metric: judge/pointwise/score)")


def _policy(cfg: Config, ref: str, judge: str | None = None, held: list[dict] | None = None) -> Downstream:
    from flywheel.engines.hf import HFTextEngine
    from flywheel.models.zoo import resolve_model_path
    from flywheel.stages.candidates import policy_request
    from flywheel.worlds.shapes import policy_eval as pe

    gen = cfg.policy.generation.model_copy(update={"temperature": 0.0})  # greedy: the policy's own answer
    engine = HFTextEngine(resolve_model_path(ModelRef(path=ref), cfg), gen)
    if held is not None:  # real data: its held-out prompts, rated by the judge alone
        results = engine.generate([policy_request(p) for p in held], seed=cfg.run.seed)
        del engine
        out = Downstream({"items": float(len(held))})
        _add_judge_scores(cfg, judge, out, held, [{"output_text": r.text if r.ok else ""} for r in results])
        return out
    world = cfg.world.shapes
    items, results = pe.answer_text_items(engine, world, cfg.gate.eval_items, cfg.run.seed)
    del engine  # before the judge loads: one model in memory at a time
    metrics, right = pe.score_text_items(items, results)
    out = Downstream(metrics, {"accuracy": right})
    if judge is not None:
        _add_judge_scores(cfg, judge, out, pe.text_prompt_records(items, world),
                          [{"output_text": r.text if r.ok else ""} for r in results])
    return out


def _generator(cfg: Config, ref: str, judge: str | None = None, held: list[dict] | None = None) -> Downstream:
    from flywheel.engines.diffusion import DiffusersImageEngine
    from flywheel.images import to_png_bytes
    from flywheel.models.zoo import resolve_model_path
    from flywheel.worlds.shapes import policy_eval as pe
    from flywheel.worlds.shapes.spec import SPEC_KINDS as kinds  # the held-out prompts cycle over every kind

    engine = DiffusersImageEngine(resolve_model_path(ModelRef(path=ref), cfg), cfg.generator.generation)
    world, seed = cfg.world.shapes, cfg.run.seed
    if held is not None:  # real data: its held-out drawing prompts, rated by the judge alone
        from flywheel.stages.candidates import generator_request

        results = engine.generate([generator_request(p, seed * 100_003 + i) for i, p in enumerate(held)])
        del engine
        out = Downstream({"items": float(len(held))})
        _add_judge_scores(cfg, judge, out, held,
                          [{"output_images": [to_png_bytes(r.image)] if r.ok else []} for r in results])
        return out
    specs, results = pe.draw_generator_items(engine, world, cfg.gate.eval_items, seed, kinds)
    del engine
    metrics, scores = pe.score_image_items(specs, kinds, results, world)
    out = Downstream(metrics, {"score10": scores})
    if judge is not None:
        _add_judge_scores(cfg, judge, out, pe.image_prompt_records(specs, kinds, world, seed),
                          [{"output_images": [to_png_bytes(r.image)] if r.ok else []} for r in results])
    return out


def _add_judge_scores(cfg: Config, judge: str, out: Downstream, prompts: list[dict], outputs: list[dict]) -> None:
    """The judge's pointwise ratings of the outputs (preferences.protocols, one sample each) join the oracle's
    metrics: `judge/<protocol>/score` (their mean) and its per-item values, NaN where the judge's output did not
    parse (never a score), and `judge/<protocol>/parse_failure_rate`."""
    from flywheel.engines import make_text_engine
    from flywheel.train.heldout_probes import JudgeScorer
    from flywheel.train.registry import resolve_base

    c = cfg.model_copy(deep=True)
    c.models.judge.path = resolve_base(cfg, judge)  # a registered adapter is merged into its base once
    engine = make_text_engine(c, "judge")  # the configured engine: HF here, vLLM on a GPU cluster
    metrics, per_item = JudgeScorer(cfg, engine).score_items(prompts, outputs)
    out.metrics |= metrics
    out.per_item |= per_item


def _remote(fn, cfg: Config, ref: str, judge: str | None, held: list[dict] | None) -> Downstream:
    import ray

    from flywheel.raycluster import init_ray, remote_options

    init_ray(cfg)
    task = ray.remote(fn).options(**remote_options(cfg.resources.candidates))
    return ray.get(task.remote(cfg, ref, judge, held))


def _identity(cfg: Config, ref: str) -> str | None:
    """What names the model's weights for good, or None when they may change under the same reference (a path,
    a hub id without a revision)."""
    from flywheel.models.zoo import WORLD_PREFIX, ZOO_PREFIX, resolve_model_path
    from flywheel.train.registry import get_version, is_registry_uri

    if is_registry_uri(ref):  # an alias resolves to its version; the source names the training run's artifacts
        return get_version(cfg, ref).source
    if ref.startswith((WORLD_PREFIX, ZOO_PREFIX)):  # the folder's name carries the hash of what built it
        return resolve_model_path(ModelRef(path=ref), cfg)
    return None


def _cached(role: str, fn, cfg: Config, ref: str, judge: str | None) -> Downstream:
    held = None
    if cfg.preferences.sources:  # read here, in the driver: the files need not be on the node that evaluates
        from flywheel.stages.candidates import IMAGE_TASKS, TEXT_TASKS

        _no_truth(role, judge)
        held = heldout_prompts(cfg, TEXT_TASKS if role == "policy" else IMAGE_TASKS)
    model = _identity(cfg, ref)
    scorer = "oracle" if judge is None else _identity(cfg, judge)  # a judge's scores are its own
    if model is None or scorer is None:
        return _remote(fn, cfg, ref, judge, held)
    setting = cfg.stage_hash(f"downstream-{role}")  # the held-out items and the decoding
    if held is not None:  # real data's held-out prompts are the files' (their contents, their sub-tasks)
        setting += "|" + hashlib.sha256(json.dumps(sorted(p["prompt_id"] for p in held)).encode()).hexdigest()
    # an oracle-only result keeps the key it always had
    judged = "" if judge is None else f"|{scorer}|{cfg.stage_hash('downstream-judge')}|{JUDGE_SCORING_VERSION}"
    key = hashlib.sha256(f"{SCORING_VERSION}|{setting}|{model}{judged}".encode()).hexdigest()[:16]
    uri = storage.join(cfg.storage.uri, "downstream-evals", f"{role}-{key}.json")
    if storage.exists(uri):
        kept = json.loads(storage.read_bytes(uri))
        log.info("%s %s: evaluated earlier on the same items (%s)", role, ref, uri)
        return Downstream(kept["metrics"], kept["per_item"])
    result = _remote(fn, cfg, ref, judge, held)
    storage.write_bytes(uri, json.dumps({"ref": ref, "model": model, "judge": judge, **asdict(result)}).encode())
    return result


def evaluate_policy_ref(cfg: Config, ref: str, judge: str | None = None) -> Downstream:
    """The text policy's oracle metrics on the gate's held-out items; with `judge` (a model reference), that
    judge's ratings of the same answers too (`judge/pointwise/score`)."""
    return _cached("policy", _policy, cfg, ref, judge)


def evaluate_generator_ref(cfg: Config, ref: str, judge: str | None = None) -> Downstream:
    """The generator's oracle metrics on the gate's held-out draw prompts; with `judge`, its ratings too."""
    return _cached("generator", _generator, cfg, ref, judge)
