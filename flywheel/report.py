"""The flywheel's progress across iterations, read back from MLflow: one row per iteration with the judge's
meta-eval beside the noisy teacher's, the policies' downstream scores before and after their updates, the gate
decisions and the wall time. Each row comes from the iteration's `summary/summary.json` (flywheel/iteration.py);
an iteration still running or killed before its summary has a row with its status and nothing else.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flywheel.config import Config
from flywheel.stage_clock import busy_note

# The judge metrics a row shows: (column, split, metric key of flywheel/evaluate/meta.py)
# balanced: the pairwise protocol's one verdict from both orders' probabilities (a judge read as text has none)
# claims: the share of gold claims the judge's check gives gold's verdict (gold with claim checks only)
JUDGE_METRICS = (("ranking", "all/pointwise_ranking/accuracy"), ("pairwise", "all/pairwise/accuracy"),
                 ("balanced", "all/pairwise_balanced/accuracy"), ("pearson", "all/pointwise/pearson"),
                 ("claims", "all/claims/exact"))
SPLITS = {"id": "id-test", "ood": "ood-test"}
SUBTASK_METRIC = "pointwise_ranking/accuracy"  # shown per sub-task
# and the pairwise protocol's, beside the share of its verdicts that flip when the order is swapped: where the
# ranking is fine but the pairwise accuracy is not, the verdicts follow the position
SUBTASK_PAIRWISE, SUBTASK_BIAS = "pairwise/accuracy", "pairwise/position_bias_rate"
CONFIDENCE = 0.95  # of the accuracies' intervals over the gold pairs (Wilson score interval)
# role in the summary's downstream -> the metric shown (gate.policy_metric / gate.generator_metric by default)
DOWNSTREAM = {"policy": "accuracy", "generator": "score10"}
REFUSED = "refused by its training"  # the reason's start (flywheel/gate.py: refuse)
OUTCOMES = ("promoted", "kept", "refused")  # of several decisions on one model, the first of these stands
BASE_STAGE = "models"  # builds the base checkpoints (flywheel/iteration.py): timed apart from the iteration's own


@dataclass
class IterationRow:
    iteration: int
    run_id: str
    status: str
    problem: str = ""  # why the row is empty: an unreadable summary, or what stopped it (flywheel.failure)
    judge: dict[str, float] = field(default_factory=dict)  # "<split>/<column>", e.g. "id/ranking"
    # the accuracies' CONFIDENCE intervals over the n gold pairs behind them: a small gold set moves by chance
    judge_interval: dict[str, list[float]] = field(default_factory=dict)
    teacher: dict[str, float] = field(default_factory=dict)
    # gold split -> the judge against its teacher pair by pair: {"metric", "pairs", "better", "worse", "p"}
    # (flywheel/evaluate/versus_teacher.py); empty in summaries written before it
    vs_teacher: dict[str, dict] = field(default_factory=dict)
    # ranking accuracy per sub-task, "<split>/<sub-task>" (e.g. "id/iu_caption"): where the judge fails
    subtasks: dict[str, float] = field(default_factory=dict)
    teacher_subtasks: dict[str, float] = field(default_factory=dict)
    # pairwise accuracy (right in both orders) and position-bias rate per sub-task, keyed like `subtasks`
    subtask_pairwise: dict[str, float] = field(default_factory=dict)
    subtask_position_bias: dict[str, float] = field(default_factory=dict)
    teacher_subtask_pairwise: dict[str, float] = field(default_factory=dict)
    downstream: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> {"before", "after"}
    # registered model -> "promoted", "kept" (the champion stayed) or "refused" (its own training refused it)
    outcome: dict[str, str] = field(default_factory=dict)
    # role -> [pairs pooled, pairs its update waits for]: the update did not train (flywheel/preference_pool.py)
    waiting: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = math.nan  # in the iteration's stages, the base models' build apart
    # building the base checkpoints (stage models): a fresh workdir's iteration 0 pays it once, ~1 h on CPU
    base_seconds: float = math.nan
    busy: str = ""  # the stages that ran while other work shared the machine (flywheel/stage_clock.py)
    # a RUNNING iteration's latest stage and when it started ("judge-sft since 2026-12-03 20:58 UTC"): a driver
    # killed without a word leaves its run RUNNING, and a start long ago shows it
    at_stage: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _judge_metrics(meta: dict) -> dict[str, float]:
    return {f"{short}/{col}": float(meta[split][key]) for short, split in SPLITS.items() if split in meta
            for col, key in JUDGE_METRICS if key in meta[split]}


def _per_subtask(meta: dict, measure: str = SUBTASK_METRIC) -> dict[str, float]:
    from flywheel.evaluate.metric_names import per_subtask

    return {f"{short}/{name}": float(v) for short, split in SPLITS.items()
            for name, v in per_subtask(meta.get(split, {}), measure).items()}


def _intervals(meta: dict) -> dict[str, list[float]]:
    """The Wilson interval of each accuracy column, from its share right of its n gold pairs (the meta-eval's
    `.../n` beside it); none where n is missing or 0."""
    from scipy.stats import binomtest

    out = {}
    for short, split in SPLITS.items():
        for col, key in JUDGE_METRICS:
            if not key.endswith("/accuracy") or key not in meta.get(split, {}):
                continue
            n = int(meta[split].get(key.removesuffix("accuracy") + "n") or 0)
            if n > 0 and math.isfinite(acc := float(meta[split][key])):
                ci = binomtest(round(acc * n), n).proportion_ci(CONFIDENCE, method="wilson")
                out[f"{short}/{col}"] = [float(ci.low), float(ci.high)]
    return out


def row_of(iteration: int, run_id: str, status: str, summary: dict | None,
           metrics: dict[str, str] | None = None) -> IterationRow:
    """One iteration's row from its summary (None: it wrote none yet). `metrics` names the downstream metric
    per role when the gate used others than DOWNSTREAM's."""
    row = IterationRow(iteration, run_id, status)
    if summary is None:
        return row
    meta = summary.get("meta_eval", {})
    row.judge = _judge_metrics(meta.get("challenger", {}))
    row.judge_interval = _intervals(meta.get("challenger", {}))
    row.teacher = _judge_metrics(meta.get("teacher", {}))
    row.vs_teacher = summary.get("vs_teacher") or {}
    row.subtasks = _per_subtask(meta.get("challenger", {}))
    row.teacher_subtasks = _per_subtask(meta.get("teacher", {}))
    row.subtask_pairwise = _per_subtask(meta.get("challenger", {}), SUBTASK_PAIRWISE)
    row.subtask_position_bias = _per_subtask(meta.get("challenger", {}), SUBTASK_BIAS)
    row.teacher_subtask_pairwise = _per_subtask(meta.get("teacher", {}), SUBTASK_PAIRWISE)
    names = {**DOWNSTREAM, **(metrics or {})}
    for role, d in summary.get("downstream", {}).items():
        name = names.get(role, "")
        if name in d.get("after", {}):
            row.downstream[role] = {"before": float(d["before"].get(name, math.nan)), "after": float(d["after"][name])}
    for d in summary.get("decisions", []):  # a refused method and the gated one both name the model
        now = "promoted" if d["promoted"] else "refused" if d["reason"].startswith(REFUSED) else "kept"
        before = row.outcome.get(d["model"])
        row.outcome[d["model"]] = now if before is None else min(before, now, key=OUTCOMES.index)
    counts = summary.get("counts", {})
    row.waiting = {role: [int(counts.get(f"{role}_pool_pairs", 0)), int(counts.get(f"{role}_pool_needs", 0))]
                   for role in DOWNSTREAM if counts.get(f"{role}_waits")}
    seconds = dict(summary.get("seconds", {}))
    row.base_seconds = float(seconds.pop(BASE_STAGE, math.nan))
    row.seconds = float(sum(seconds.values()))
    row.busy = busy_note(summary.get("load") or {}, summary.get("cpus"))
    return row


def iteration_rows(cfg: Config) -> list[IterationRow]:
    """Every iteration of the config's experiment, oldest first; the latest run of an iteration number wins."""
    from mlflow.exceptions import MlflowException

    from flywheel import track

    db = track.sqlite_file(cfg.tracking.uri)
    if db is not None and not db.exists():
        return []  # never run here: reading would create an empty tracking database in a workdir by mistake
    client = track.client(cfg)
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], "tags.`flywheel.iteration` != ''", order_by=["start_time ASC"],
                              max_results=10_000)
    latest = {int(r.data.tags["flywheel.iteration"]): r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    metrics = {"policy": cfg.gate.policy_metric, "generator": cfg.gate.generator_metric}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, run in sorted(latest.items()):
            problem, summary = "", None
            try:
                got = client.download_artifacts(run.info.run_id, "summary/summary.json", f"{tmp}/{n}")
                summary = json.loads(Path(got).read_text())
            except (MlflowException, OSError):
                pass  # running, or killed before its summary
            except ValueError as e:
                problem = f"summary/summary.json is not JSON: {e}"
            row = row_of(n, run.info.run_id, run.info.status, summary, metrics)
            stopped = run.data.tags.get("flywheel.failure")  # set by a stage that stopped, until a resume
            row.problem = problem or (f"stopped at {stopped}; the same command again resumes it" if stopped else "")
            if run.info.status == "RUNNING":
                row.at_stage = _latest_stage(client, exp.experiment_id, run.info.run_id)
            rows.append(row)
    return rows


def _latest_stage(client, experiment_id: str, run_id: str) -> str:
    """The name and start of the iteration's latest stage run: "judge-sft since 2026-12-03 20:58 UTC"."""
    from datetime import datetime, timezone

    runs = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return ""
    start = datetime.fromtimestamp(runs[0].info.start_time / 1000, tz=timezone.utc)
    return f"{runs[0].data.tags.get('flywheel.stage', runs[0].info.run_name)} since {start:%Y-%m-%d %H:%M} UTC"
