"""`flywheel report`'s tables: a measure per row, an iteration per column and the noisy teacher's last, so a
report reads at 80 columns (an iteration per row made 15 columns that a terminal cut to "0.861±0…").
The rows come from flywheel/report.py."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from flywheel.report import SPLITS, IterationRow

# shown when some iteration has them: balanced needs probabilities, claims gold with claim checks
OPTIONAL = ("/balanced", "/claims")


def num(v: float | None) -> str:
    return "—" if v is None or v != v else f"{v:.3f}"


def versus(d: dict | None) -> str:
    """The judge against its teacher on one split: "15/13 p=0.35" (pairs only the judge / only the teacher
    gets right, McNemar's one-sided p)."""
    if not d:  # a summary written before the comparison
        return "—"
    if "unavailable" in d:
        return "not compared"
    return f"{d['better']}/{d['worse']} p={d['p']:.2g}" if d["pairs"] else "no shared pairs"


def _judged(r: IterationRow, c: str) -> str:  # with the larger side of its interval: "0.738±0.06"
    lo, hi = r.judge_interval.get(c, (None, None))
    v = r.judge.get(c)
    return num(v) if lo is None or v is None else f"{num(v)}±{max(v - lo, hi - v):.2f}"


def _marked(text: str, other_gold: bool) -> str:  # †: judged on other gold than the teacher column's
    return text + "†" if other_gold and text != "—" else text


def latest_teacher(rows: list[IterationRow]) -> dict[str, float]:
    """The teacher of the latest iteration that has one: the teacher column's."""
    return next((r.teacher for r in reversed(rows) if r.teacher), {})


def on_other_gold(rows: list[IterationRow]) -> list[IterationRow]:
    """The rows whose teacher differs from the teacher column's: judged on another gold set (world.gold or
    meta_eval.gold_files changed since), so their values are not read against that column."""
    teacher = latest_teacher(rows)
    return [r for r in rows if r.teacher and r.teacher != teacher]


def _move(r: IterationRow, role: str, refused: bool) -> str:
    d = r.downstream.get(role)
    if d:
        return f"{num(d['before'])} → {num(d['after'])}"
    if role in r.waiting:  # its update waits for more pooled pairs
        return "pairs {}/{}".format(*r.waiting[role])
    return "refused" if refused else "—"  # an update its training refused is never evaluated downstream


def progress_table(rows: list[IterationRow], title: str, registry: dict[str, str]) -> Table:
    """The judge vs gold (and vs its teacher pair by pair), the policies before → after, promotions and time.
    registry: role -> its registered model's name (an outcome "refused" there shows as such)."""
    cols = [f"{s}/{c}" for s in SPLITS for c in ("ranking", "pairwise", "balanced", "pearson", "claims")]
    cols = [c for c in cols if not c.endswith(OPTIONAL) or any(c in r.judge for r in rows)]
    teacher, other = latest_teacher(rows), {r.iteration for r in on_other_gold(rows)}
    t = Table(title=title)
    t.add_column("iteration")
    for r in rows:
        t.add_column(str(r.iteration), justify="right")
    t.add_column("teacher", justify="right")
    t.add_row("status", *(r.status for r in rows), "(noisy)", end_section=True)
    for c in cols:  # the teacher judged on the gold set the judges share: the bar the judge aims at (†: other gold)
        t.add_row(c.replace("/", " "), *(_marked(_judged(r, c), r.iteration in other) for r in rows),
                  num(teacher.get(c)),
                  end_section=c == cols[-1])
    if any(r.vs_teacher for r in rows):
        for short, split in SPLITS.items():
            t.add_row(f"{short} vs teacher", *(versus(r.vs_teacher.get(split)) for r in rows), "",
                      end_section=short == "ood")
    for role, label in (("policy", "LLaVA accuracy"), ("generator", "SDXL score10")):
        t.add_row(label, *(_move(r, role, r.outcome.get(registry[role]) == "refused") for r in rows), "")
    t.add_row("promoted", *(", ".join(m for m, o in r.outcome.items() if o == "promoted")
                            or ("none" if r.outcome else "—") for r in rows), "")
    t.add_row("seconds", *("—" if r.seconds != r.seconds else f"{r.seconds:.0f}" + ("*" if r.busy else "")
                           for r in rows), "")
    if any(r.base_seconds >= 1 for r in rows):  # a fresh workdir built its bases (checked: not NaN, not a skip)
        t.add_row("+ base build s", *(f"{r.base_seconds:.0f}" if r.base_seconds >= 1 else "" for r in rows), "")
    return t


def subtask_table(rows: list[IterationRow], title: str, field: str, cell) -> Table:
    """The sub-tasks of each row's `field` (rows) by iteration (columns), the teacher's `teacher_<field>` last;
    cell(row, key) -> the text of one cell."""
    keys = sorted({k for r in rows for k in getattr(r, field)}, key=lambda k: (not k.startswith("id/"), k))
    t = Table(title=title)
    t.add_column("sub-task")
    for r in rows:
        t.add_column(str(r.iteration), justify="right")
    teacher = next((getattr(r, f"teacher_{field}") for r in reversed(rows) if getattr(r, f"teacher_{field}")), {})
    t.add_column("teacher", justify="right")
    other = {r.iteration for r in on_other_gold(rows)}
    for k in keys:
        t.add_row(k, *(_marked(cell(r, k), r.iteration in other) for r in rows), num(teacher.get(k)))
    return t


def _with_bias(row: IterationRow, key: str) -> str:
    bias = row.subtask_position_bias.get(key)
    return num(row.subtask_pairwise.get(key)) + ("" if bias is None or bias != bias else f" ({bias:.2f})")


def print_report(console: Console, rows: list[IterationRow], experiment: str, registry: dict[str, str],
                 shown_of: int) -> None:
    """The tables and their notes; rows: the iterations shown, the latest `len(rows)` of `shown_of`."""
    window = "" if len(rows) == shown_of else f", the latest {len(rows)} of {shown_of} iterations"
    console.print(progress_table(rows, f"{experiment}: the judge vs gold, the policies before → after (oracle)"
                                 f"{window}", registry))
    if any(r.subtasks for r in rows):
        console.print(subtask_table(rows, "the judge's ranking accuracy per sub-task (gold pairs ordered by its "
                                    "ratings)", "subtasks", lambda r, k: num(r.subtasks.get(k))))
    if any(r.subtask_pairwise for r in rows):
        console.print(subtask_table(rows, "the judge's pairwise accuracy per sub-task (right in both orders; in "
                                    "brackets, the share of its verdicts that flip when the order is swapped)",
                                    "subtask_pairwise", _with_bias))
    for r in rows:
        if r.at_stage:
            console.print(f"iteration {r.iteration} is at stage {r.at_stage}")
        if r.busy:
            console.print(f"* iteration {r.iteration}: {r.busy}")
        if r.problem:
            console.print(f"[yellow]iteration {r.iteration} (MLflow run {r.run_id}): {r.problem}[/yellow]")
    for r in on_other_gold(rows):
        there = ", ".join(f"{c.replace('/', ' ')} {num(v)}" for c, v in r.teacher.items() if c in r.judge)
        console.print(f"† iteration {r.iteration} was judged on other gold than the teacher column's (the gold set "
                      f"changed since); its teacher there: {there}")
    if versus_rows := [r for r in rows if r.vs_teacher]:
        metric = next(iter(versus_rows[-1].vs_teacher.values()))["metric"]
        console.print(f"vs teacher: the judge against its noisy teacher gold pair by gold pair ({metric}): pairs "
                      "only the judge gets right / only the teacher does, and McNemar's one-sided p that the judge "
                      "is the better (above its teacher beyond chance when p < 0.05).")
    if any(r.judge_interval for r in rows):
        console.print("±: the larger side of the accuracy's 95% Wilson interval over the gold pairs it counts "
                      "(--json has the intervals): judges that differ by less may differ by chance.")
    if window:
        console.print(f"Earlier iterations: --last {shown_of}, or --json for all.")
    console.print("Each iteration's whole summary: its MLflow run's description and summary/summary.json.")
