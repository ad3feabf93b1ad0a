"""The judge against the noisy teacher it learns from, gold pair by gold pair: the project's bar is a judge above
its teacher, and on ~200 gold pairs two accuracies a few pairs apart are within chance. So each gold split gets
McNemar's exact one-sided test (flywheel.gate.mcnemar, as the judge gate uses): b = pairs only the judge gets
right, c = pairs only the teacher does, p = P(>= b of the b + c discordant pairs | equally good). Logged in the
iteration's summary (`vs_teacher`), its MLflow description and `flywheel report`.
"""

from __future__ import annotations

from flywheel.config import Config
from flywheel.evaluate import meta
from flywheel.evaluate.metric_names import per_pair_accuracy, split_of


def compared_metric(cfg: Config) -> str | None:
    """The per-pair accuracy compared (no split prefix): the judge gate's, if it is one, else the ranking or the
    pairwise accuracy meta-eval measures; None if it measures neither."""
    name = split_of(cfg.gate.judge_metric)[1]
    if per_pair_accuracy(name) is not None:
        return name
    asked = cfg.meta_eval.protocols
    return ("all/pointwise_ranking/accuracy" if "pointwise" in asked
            else "all/pairwise/accuracy" if "pairwise" in asked else None)


def versus_teacher(cfg: Config, gold_uri: str, judge_uri: str, teacher_uri: str,
                   splits: list[str]) -> dict[str, dict]:
    """Gold split (of `splits`, those meta-eval scored) -> {"metric", "pairs" both were scored on, "better",
    "worse", "p"} for the judge whose meta-eval is under `judge_uri` against the teacher's under `teacher_uri`,
    or {"metric", "unavailable": why}."""
    from flywheel.gate import mcnemar  # the gate pulls in the model registry

    name = compared_metric(cfg)
    if name is None:
        return {}
    out: dict[str, dict] = {}
    for split in splits:
        try:
            judge = meta.stored_outcomes(cfg, gold_uri, judge_uri, f"{split}/{name}")
            teacher = meta.stored_outcomes(cfg, gold_uri, teacher_uri, f"{split}/{name}")
        except meta.OutcomesUnavailable as e:
            out[split] = {"metric": name, "unavailable": str(e)}
            continue
        better, worse, p = mcnemar(judge, teacher)
        out[split] = {"metric": name, "pairs": len(judge.keys() & teacher.keys()), "better": better, "worse": worse,
                      "p": p}
    return out
