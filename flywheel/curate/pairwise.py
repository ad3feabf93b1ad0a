"""FRABench's pairwise curation: swap consistency, then winner-position balance.

Row convention (flywheel.judge.pairwise): candidate_ids = [A, B] in the AB frame, `order` = the order shown
to the judge, `verdict` = the verdict in the AB frame; the verdict as emitted (in the shown order) is
`shown_verdict(row)`. An *item* is one (judge, prompt, candidate pair, aspect): its AB and BA judgments.

swap_consistency: an item is kept (both rows) only if it has exactly one parsed row per order and the two
AB-frame verdicts agree; otherwise its rows are dropped with the reason "position_inconsistent",
"missing_order" or "duplicate_order" (run the consistency filter first to reduce k samples per order to one).

balance_positions: one row per item, presenting the orders so that the emitted winner is "A" as often as "B"
(ties are left alone), within each group of items when a `group` function is given. The flywheel groups by
sub-task and aspect: balanced only as a whole, one iteration's teacher rows had "B" winning 73 times to 35 on
scene descriptions and 74 to 58 on captions, and the judge trained on such rows changed its verdict with the
order on most of those gold pairs (captions 0.57-0.96, scene descriptions 0.78-1.00 over four iterations).
Measured in two seeded 4-iteration runs that differ only in this (the same teacher rows), balanced as a whole ->
within sub-task and aspect, id-test gold pairs right in both orders (of 202): 55 -> 66, 70 -> 56, 80 -> 80,
90 -> 87; verdicts that flip with the order 0.64 -> 0.58, 0.52 -> 0.56, 0.55 -> 0.55, 0.51 -> 0.51. No gain
that outlasts one iteration: the swings both ways (McNemar p=0.05 and 0.02 in iterations 0 and 1) are as large
as two trainings of the judge differ. Kept because it removes a shortcut a judge can learn, at no cost.
In each group every item starts at its AB row (its only row if it has one); then
floor((majority - minority) / 2) items of the majority side, drawn with the seed, are swapped, which leaves the
two sides equal (or one apart when their difference is odd). A swapped item is presented by its other-order
row when it has one that names the same winner: a real judge output for the exchanged presentation, whose
emitted verdict is the flip of the original's. An item with only one row is swapped synthetically (FRABench's
"swapped and re-labelled"): candidate order exchanged (candidate_ids reversed), verdict flipped (in the row's
frame and as emitted), "Response A"/"Response B" exchanged in the analysis, a new judgment_id. Other wordings
of position in an analysis ("the first response") are not rewritten, which is why real other-order rows win.

Rows of other protocols pass through both functions unchanged.
"""
from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable

from flywheel.curate.config import PairwiseCurateConfig
from flywheel.curate.consistency import item_key, value_of
from flywheel.curate.report import FilterReport, make_report, row_key
from flywheel.judge import pairwise as pw
from flywheel.judge.base import ParseError, fields
from flywheel.records import make_id

FLIP = {"A": "B", "B": "A", "tie": "tie"}


def is_pairwise(row: dict) -> bool:
    return row.get("protocol") == pw.NAME


def pair_key(row: dict) -> tuple:
    """The item of a pairwise row: both orders share it."""
    k = item_key(row)
    return (row["judge"], k.prompt_id, k.candidate_ids, k.aspect, k.group)


def shown_verdict(row: dict) -> str:
    """The verdict as emitted, in the order shown (AB-frame verdict mapped through the row's order)."""
    return pw.to_ab(row["verdict"], row["order"])  # the AB<->BA mapping is its own inverse


def _items(rows: list[dict]) -> dict[tuple, list[int]]:
    items: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        items[pair_key(r)].append(i)
    return items


def swap_consistency(rows: Iterable[dict]) -> tuple[list[dict], FilterReport]:
    """Keep the two rows of every position-consistent item; rows of other protocols pass through."""
    rows = list(rows)
    keep = [not is_pairwise(r) for r in rows]
    dropped, stats = Counter(), Counter(passed_through=sum(keep))
    valid = []
    for i, r in enumerate(rows):
        if keep[i]:
            continue
        if r.get("parse_error") is not None:
            dropped["parse_error"] += 1
        elif value_of(r) is None or not isinstance(r.get("verdict"), str):
            dropped["no_value"] += 1
        else:
            valid.append(i)
    for idx in _items([rows[i] for i in valid]).values():
        members = [valid[j] for j in idx]
        stats["items_in"] += 1
        by_order = Counter(rows[i]["order"] for i in members)
        if any(n > 1 for n in by_order.values()):
            reason = "duplicate_order"
        elif set(by_order) != set(pw.ORDERS):
            reason = "missing_order"
        elif len({rows[i]["verdict"] for i in members}) > 1:
            reason = "position_inconsistent"
        else:
            reason = ""
        if reason:
            dropped[reason] += len(members)
            stats[f"items_{reason}"] += 1
        else:
            stats["items_out"] += 1
            for i in members:
                keep[i] = True
    out = [r for r, k in zip(rows, keep, strict=True) if k]
    return out, make_report("swap_consistency", len(rows), len(out), dropped, stats)


# ---------------------------------------------------------------- winner-position balance
_RESPONSE_RE = re.compile(r"\b(response)(\s+)([AB])\b", re.IGNORECASE)


def _swap_labels(text: str) -> str:
    return _RESPONSE_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{FLIP[m.group(3).upper()]}", text)


def swap_row(row: dict) -> dict:
    """A pairwise judgment row with the candidate order exchanged and the verdict flipped (module docstring).
    Raises ValueError when its raw output does not parse (a row with a verdict always does)."""
    j = pw.parse(row["raw_output"])
    if isinstance(j, ParseError):
        raise ValueError(f"cannot swap judgment {row.get('judgment_id')!r}: {j.reason}")
    swapped = pw.PairwiseJudgment(_swap_labels(j.analysis), FLIP[j.verdict])
    out = {**row, "candidate_ids": list(row["candidate_ids"])[::-1], "raw_output": pw.format(swapped),
           **fields(parsed={"verdict": swapped.verdict, "order": row["order"]}, verdict=FLIP[row["verdict"]],
                    analysis=swapped.analysis)}
    out["judgment_id"] = None
    out["judgment_id"] = make_id("judgment", out)
    return out


def balance_positions(rows: Iterable[dict], *, seed: int = 0,
                      group: Callable[[dict], Hashable] | None = None) -> tuple[list[dict], FilterReport]:
    """One row per pairwise item with emitted winners "A" and "B" equally frequent, within each group(row) when
    given (module docstring); rows of other protocols pass through."""
    rows = list(rows)
    out_rows: list[dict | None] = [r if not is_pairwise(r) else None for r in rows]
    dropped, stats = Counter(), Counter(passed_through=sum(r is not None for r in out_rows))
    pair_idx = []
    for i, r in enumerate(rows):
        if not is_pairwise(r):
            continue
        if r.get("parse_error") is not None:
            dropped["parse_error"] += 1
        elif not isinstance(r.get("verdict"), str):
            dropped["no_value"] += 1
        else:
            pair_idx.append(i)
    items = [[pair_idx[j] for j in idx] for idx in _items([rows[i] for i in pair_idx]).values()]
    presented: list[int] = []  # per item: the row index presented by default
    for members in items:
        ab = [i for i in members if rows[i]["order"] == "AB"]
        presented.append(ab[0] if ab else members[0])
    groups: dict[Hashable, list[int]] = defaultdict(list)  # group -> its items (positions in `items`)
    for n, i in enumerate(presented):
        groups[None if group is None else group(rows[i])].append(n)
    to_swap: set[int] = set()
    for key, members in groups.items():  # ungrouped: the seed stream balance_positions always drew from
        stream = f"{seed}|position_balance" if key is None else f"{seed}|position_balance|{key}"
        to_swap |= _items_to_swap(rows, presented, members, stream)
    for n, members in enumerate(items):
        i, row = presented[n], rows[presented[n]]
        if n in to_swap:
            other = [m for m in members if rows[m]["order"] != row["order"] and rows[m]["verdict"] == row["verdict"]]
            if other:
                i, row = other[0], rows[other[0]]
                stats["swapped_by_other_order"] += 1
            else:
                row = swap_row(row)
                dropped["replaced_by_swap"] += 1
                stats.update(swapped_synthetic=1, added=1)
        out_rows[i] = row
        dropped["other_order"] += len(members) - 1
    out = [r for r in out_rows if r is not None]
    final = Counter(shown_verdict(r) for r in out if is_pairwise(r))
    stats.update(items=len(items), a_wins=final["A"], b_wins=final["B"], ties=final["tie"], groups=len(groups))
    return out, make_report("position_balance", len(rows), len(out), dropped, stats)


def _items_to_swap(rows: list[dict], presented: list[int], members: list[int], seed: str) -> set[int]:
    """Of one group's items (positions in `presented`), the seeded half of the difference on the majority side."""
    side = Counter(shown_verdict(rows[presented[n]]) for n in members)
    major, minor = ("A", "B") if side["A"] >= side["B"] else ("B", "A")
    pool = sorted((n for n in members if shown_verdict(rows[presented[n]]) == major),
                  key=lambda n: row_key(rows[presented[n]]))
    return set(random.Random(seed).sample(pool, (side[major] - side[minor]) // 2))


def curate_pairwise(rows: Iterable[dict], cfg: PairwiseCurateConfig | None = None, *, seed: int = 0,
                    group: Callable[[dict], Hashable] | None = None) -> tuple[list[dict], list[FilterReport]]:
    """swap_consistency then balance_positions (within `group`), each as configured."""
    cfg = cfg or PairwiseCurateConfig()
    rows, reports = list(rows), []
    if cfg.swap_consistency:
        rows, rep = swap_consistency(rows)
        reports.append(rep)
    if cfg.position_balance:
        rows, rep = balance_positions(rows, seed=seed, group=group)
        reports.append(rep)
    return rows, reports
