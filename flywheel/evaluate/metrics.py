"""Meta-evaluation metrics of a judge against gold labels (scipy for every statistic).

Pointwise: Pearson, Spearman and Kendall tau-b between judge and gold scores (Minos, the T2I paper), exact-match
rate (the judged score's nearest rating equals gold), and the parse-failure rate — a failed parse is never
imputed a score: it counts against coverage and against accuracy-type metrics, and correlations are computed
on the parsed items only (with their count).
Pairwise: accuracy of verdicts vs the gold winner (ties excluded from gold, as FRABench and Multimodal
RewardBench do), with a verdict judged in both orders counted right only when both orders agree with gold, and
the position-bias rate: the share of items whose verdict flips when the order is swapped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PointItem:
    key: str  # the item (prompt + candidate); groups also carry split/task/aspect for slicing
    gold: float
    judged: float | None  # None: the judge's output did not parse


@dataclass(frozen=True)
class PairItem:
    key: str
    gold: str  # "A" | "B" (ties are not gold items)
    verdict_ab: str | None  # the verdict judged in order AB (None: unparsed / not judged)
    verdict_ba: str | None = None  # the verdict judged in order BA, mapped back to the AB frame


def _nan_if_few(x: float, n: int) -> float:
    return float(x) if n >= 3 and not math.isnan(x) else float("nan")


def pointwise_metrics(items: Sequence[PointItem]) -> dict[str, float]:
    n = len(items)
    parsed = [i for i in items if i.judged is not None]
    out = {"n": float(n), "parsed": float(len(parsed)),
           "parse_failure_rate": (n - len(parsed)) / n if n else float("nan")}
    if len(parsed) >= 3:
        g = np.array([i.gold for i in parsed], dtype=float)
        j = np.array([i.judged for i in parsed], dtype=float)
        constant = np.ptp(g) == 0 or np.ptp(j) == 0  # correlation undefined for a constant series
        out["pearson"] = float("nan") if constant else _nan_if_few(stats.pearsonr(g, j).statistic, len(g))
        out["spearman"] = float("nan") if constant else _nan_if_few(stats.spearmanr(g, j).statistic, len(g))
        out["kendall_tau_b"] = float("nan") if constant else _nan_if_few(
            stats.kendalltau(g, j, variant="b").statistic, len(g))
        out["mae"] = float(np.mean(np.abs(g - j)))
    else:
        out |= {"pearson": float("nan"), "spearman": float("nan"), "kendall_tau_b": float("nan"),
                "mae": float("nan")}
    # the nearest rating equals gold (the same as equality for written ratings; an expected rating rounds)
    out["exact"] = sum(1 for i in parsed if abs(i.judged - i.gold) < 0.5) / n if n else float("nan")
    return out


def pair_correct(item: PairItem) -> bool:
    """The judge got the pair right: it gave a verdict and every verdict it gave (both orders, when judged in
    both) names the gold winner. An item without a usable verdict is wrong, never a guess."""
    verdicts = [v for v in (item.verdict_ab, item.verdict_ba) if v is not None]
    return bool(verdicts) and all(v == item.gold for v in verdicts)


def pairwise_metrics(items: Sequence[PairItem]) -> dict[str, float]:
    n = len(items)
    if not n:
        return {"n": 0.0, "accuracy": float("nan"), "position_bias_rate": float("nan"),
                "parse_failure_rate": float("nan")}
    right = sum(pair_correct(i) for i in items)
    flips = both = 0
    for i in items:
        if i.verdict_ab is not None and i.verdict_ba is not None:
            both += 1
            flips += i.verdict_ab != i.verdict_ba
    return {
        "n": float(n),
        "accuracy": right / n,  # the mean of pair_correct: a paired test compares judges item by item
        "position_bias_rate": flips / both if both else float("nan"),
        "parse_failure_rate": sum(1 for i in items if i.verdict_ab is None and i.verdict_ba is None) / n,
    }


def one_verdict_metrics(items: Sequence[PairItem]) -> dict[str, float]:
    """Accuracy, count and parse-failure rate of pairs given one verdict each (ordered by pointwise ratings, or
    balanced from both orders' probabilities): a position-bias rate needs two verdicts, so it is left out."""
    m = pairwise_metrics(items)
    return {k: m[k] for k in ("n", "accuracy", "parse_failure_rate")}


def pairs_from_points(items: Iterable[tuple[str, str, float, float | None, float, float | None]]) -> list[PairItem]:
    """Pairwise items from pointwise scores: (key, ..., gold_a, judged_a, gold_b, judged_b) → verdicts by the
    higher score (equal judged scores are a tie, which never matches a gold winner)."""
    out = []
    for key, _, gold_a, judged_a, gold_b, judged_b in items:
        if gold_a == gold_b:
            continue
        gold = "A" if gold_a > gold_b else "B"
        verdict = None
        if judged_a is not None and judged_b is not None:
            verdict = "A" if judged_a > judged_b else "B" if judged_b > judged_a else "tie"
        out.append(PairItem(key, gold, verdict))
    return out
