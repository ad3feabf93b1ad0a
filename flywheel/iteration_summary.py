"""An iteration's summary as the parent run's description in the MLflow UI (markdown): what a person reviewing
the iteration reads first. Pure: a summary dict (flywheel/iteration.py `_summarize`) in, markdown out."""

from __future__ import annotations

from flywheel import stage_clock
from flywheel.evaluate import metric_names

META_COLUMNS = {"all/pairwise/accuracy": "pairwise acc.", "all/pairwise_balanced/accuracy": "balanced pairwise",
                "all/pointwise_ranking/accuracy": "ranking acc.",
                "all/pointwise/pearson": "Pearson", "all/pointwise/kendall_tau_b": "Kendall τb",
                "all/pairwise/position_bias_rate": "position bias", "all/pointwise/parse_failure_rate": "unparsed"}


# Shares shown next to a dataset's row count: rows kept of the dataset they came from.
RETENTION = {"prompts_train": "prompts", "judge_kept": "labels", "judge_sft": "judge_kept",
             "pref_pairs": "pref_candidates"}


def _cell(v: float | None) -> str:
    return "—" if v is None or v != v else f"{v:.3f}"  # not measured (e.g. a protocol meta-eval does not ask)


def _span(iterations: list[int]) -> str:
    """[4, 5, 6, 7] -> "4-7" (a pool's iterations are consecutive), [3] -> "3"."""
    return f"{iterations[0]}-{iterations[-1]}" if len(iterations) > 1 else str(iterations[0])


def describe(s: dict) -> str:
    """The parent run's description in the MLflow UI, most important first (the UI shows its top lines until
    "Show more" is clicked): decisions, judge quality, policy scores, then times and data volumes."""
    lines = [f"## Flywheel iteration {s['iteration']}", "", "**Promotion decisions:**"]
    pools = s.get("pools") or {}
    waits = [f"- {role}: not trained — its update waits for {p['needs']} pairs; {p['pairs']} pooled from "
             f"iterations {_span(p['iterations'])}" for role, p in pools.items() if p["pairs"] < p["needs"]]
    lines += [f"- {d['model']}: {'promoted' if d['promoted'] else 'kept champion'} — {d['reason']}"
              for d in s["decisions"]] + waits or ["- none (no model reached a gate)"]
    lines += [f"- {role}'s update trained on {p['pairs']} pairs pooled from iterations {_span(p['iterations'])}"
              for role, p in pools.items() if p["pairs"] >= p["needs"] and len(p["iterations"]) > 1]
    if relabeled := s.get("relabeled"):  # keys are strings once the summary went through JSON
        lines += [f"- the pooled pairs of iterations {', '.join(map(str, relabeled))} were ranked again by this "
                  f"iteration's judge; right by the oracle (of graded): " + ", ".join(
                      f"{j}: {right_of(r['before'])} → {right_of(r['after'])}" for j, r in relabeled.items())]
    lines += [f"- {d['model']}'s next training starts from {d['next_start']['start'] or 'the base model'} — "
              f"{d['next_start']['reason']}" for d in s["decisions"] if d.get("next_start")]
    lines += ["", "**Judge meta-eval vs gold** (the new judge; the champion it must beat; the noisy teacher it learns "
              "from)", "", "| judge | split | " + " | ".join(META_COLUMNS.values()) + " |",
              "|---|---|" + "---|" * len(META_COLUMNS)]
    for who, splits in s["meta_eval"].items():
        lines += [f"| {who} | {split} | " + " | ".join(_cell(m.get(k)) for k in META_COLUMNS) + " |"
                  for split, m in splits.items()]
    if vs := s.get("vs_teacher"):  # absent from summaries written before it
        lines += ["", vs_teacher_line(vs)]
    for split, m in s["meta_eval"].get("challenger", {}).items():
        if m.get("all/claims/n"):  # gold with claim checks (world.gold.protocols)
            lines += ["", f"*Claim checks, {split}:* gold's verdict on {_cell(m.get('all/claims/exact'))} of "
                      f"{int(m['all/claims/n'])} claims, unparsed {_cell(m.get('all/claims/parse_failure_rate'))}"]
        if "perturb/span_swap/n" in m:  # Minos' perturbation checks (flywheel/evaluate/perturbation.py)
            p = {k[len("perturb/"):]: v for k, v in m.items() if k.startswith("perturb/")}
            lines += ["", f"*Perturbation checks, {split}:* images swapped, Kendall tau-b "
                      f"{p['image_swap/unperturbed/pointwise/kendall_tau_b']:.3f} → "
                      f"{p['image_swap/pointwise/kendall_tau_b']:.3f}; word spans replaced, scored lower "
                      f"{p['span_swap/lower_share']:.1%}"
                      f" (higher {p['span_swap/higher_share']:.1%})"]
    for split, m in s["meta_eval"].get("challenger", {}).items():
        ranked = sorted((v, t) for t, v in metric_names.per_subtask(m, "pointwise_ranking/accuracy").items())
        if ranked:  # where the judge fails, worst first
            lines += ["", f"*Ranking accuracy per sub-task, {split}:* " + ", ".join(f"{t} {_cell(v)}"
                                                                               for v, t in ranked)]
    for role, d in s["downstream"].items():
        judged = " (judge/… by the serving judge, the rest by the oracle)" if "oracle_check" in d else " (oracle)"
        lines += ["", f"**{role}**{judged}, before → after: " + ", ".join(
            f"{k} {d['before'].get(k, float('nan')):.3f} → {v:.3f}" for k, v in d["after"].items()
            if not k.startswith("dim"))]
        if c := d.get("oracle_check"):
            agree = (f"ROC AUC {c['auc']:.3f}" if "auc" in c else
                     f"Spearman {c['spearman']:.3f}" if "spearman" in c else "not measurable")
            test = (f"; its {c['test']}: {c['better']:.0f} better, {c['worse']:.0f} worse, p={c['p']:.2g}"
                    if "test" in c else "")
            lines += ["", f"*The oracle's check of this judge-gated update:* {c['metric']} {c['before']:.3f} → "
                      f"{c['after']:.3f}{test}; the judge's ratings vs the oracle's per answer: {agree}"]
    pv = s.get("pairs_vs_oracle") or {}
    if pv:  # the judge's quality where it is spent (flywheel/worlds/shapes/pair_check.py)
        keys = [*sorted({k.split("/")[0] for k in pv} - {"all"}), "all"]
        lines += ["", "**Preference pairs vs the oracle** (chosen truly better / tie / worse, precision): " + "; ".join(
            f"{t} {pv[f'{t}/right']:.0f}/{pv[f'{t}/tie']:.0f}/{pv[f'{t}/wrong']:.0f} ({_cell(pv[f'{t}/precision'])})"
            for t in keys)]
    load, cpus = s.get("load") or {}, s.get("cpus")
    lines += ["", "Galleries of chosen vs rejected samples: Artifacts → `gallery/`.", "",
              f"| stage | seconds (all runs that worked on it) | mean load ({cpus} CPUs) |", "|---|---|---|"]
    lines += [f"| {k} | {v:.1f} | {load[k] if k in load else '—'} |" for k, v in s["seconds"].items()]
    if note := stage_clock.busy_note(load, cpus):
        lines += ["", f"*Times inflated: {note}.*"]
    lines += ["", "| dataset | rows | kept |", "|---|---|---|"]
    for k, v in s["counts"].items():
        src = s["counts"].get(RETENTION.get(k, ""))
        lines.append(f"| {k} | {v} | {f'{v / src:.1%} of {RETENTION[k]}' if src else ''} |")
    if q := s.get("quarantined"):
        lines += ["", "**Quarantined rows** (why, grouped: the stage's `quarantine/<dataset>.json`, or `flywheel "
                  f"data --iteration {s['iteration']} --dataset <name>`): "
                  + ", ".join(f"{k} {v}" for k, v in q.items())]
    return "\n".join(lines)


def right_of(agreement: dict) -> str:
    """"right/graded" of a pairs-vs-oracle agreement (flywheel/preferences.py pairs_vs_oracle)."""
    graded = sum(agreement.get(f"all/{v}", 0) for v in ("right", "tie", "wrong"))
    return f"{agreement['all/right']:.0f}/{graded:.0f}" if graded else "not graded"


def vs_teacher_line(vs: dict[str, dict]) -> str:
    """The judge against its teacher (flywheel/evaluate/versus_teacher.py) as one line of markdown."""
    parts = []
    for split, d in vs.items():
        if "unavailable" in d:
            parts.append(f"{split}: not compared ({d['unavailable']})")
        elif not d["pairs"]:
            parts.append(f"{split}: no gold pair scored by both")
        else:
            parts.append(f"{split}: {d['better']} pairs only the judge gets right, {d['worse']} only the teacher "
                         f"(of {d['pairs']}; one-sided McNemar p={d['p']:.2g})")
    metric = next(iter(vs.values()))["metric"]
    return f"*The judge vs its noisy teacher* ({metric}, gold pair by gold pair): " + "; ".join(parts)
