"""Dataset-level balance: Minos' score cap, the T2I third-quartile (Q3) rule over score buckets, and the T2I
sub-task rebalance (the same Q3 rule over sub-tasks).

Rows are grouped by a key function `row -> (stratum, bucket) | None`: buckets are balanced against each other
within a stratum (e.g. the score values of one protocol's aspect), and rows whose key is None pass through
unchanged. Q3 rule: target = third quartile of the stratum's non-empty bucket sizes (linear interpolation,
rounded half up); a bucket below it is up-sampled by repetition (every row floor(target/n) times, plus
target mod n rows drawn at random once more), a bucket above it is down-sampled at random. Random draws use a
seed and the rows' ids (sorted), so the same rows and seed give the same output in any input order. Output
keeps input order; the repeats of a row follow it. Deduplicate BEFORE balancing: repeats share their id.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence

import numpy as np

from flywheel.curate.config import ProtocolWeightsConfig, ScoreBalanceConfig, SubtaskRebalanceConfig
from flywheel.curate.report import FilterReport, make_report, meta_of, num, row_key

KeyFn = Callable[[dict], "tuple[Hashable, Hashable] | None"]


def score_key(row: dict) -> tuple[Hashable, Hashable] | None:
    """(stratum, score) of a judgment or SFT row, None for rows without a score (they pass through).

    judgment rows: stratum (protocol, aspect), bucket = score; verdict rows (pairwise) pass through — their
    balance is winner-position balance (flywheel.curate.pairwise).
    sft rows: bucket = meta["score"] (the rating of a pointwise/aspects/rubric target, the 0..10 score of a
    decomposed scoring or summary_scoring sample); stratum (protocol, sample kind for decomposed, aspect,
    dimension), so e.g. appearance question scores are balanced apart from relationship ones (as in T2I).
    Claim checks pass through as verdicts do: a claim's rating names its verdict (5 stated, 3 another count, 2
    another attribute, 1 absent), not a quality, and the teacher's rare off-verdict ratings (a jittered 4) were
    up-sampled into a fifth of the claim rows, teaching the judge to rate a stated claim 4 (runs/claims, 2026-11-29).
    """
    if row.get("protocol") == "claims":
        return None
    if "messages" in row or "sft_id" in row:
        m = meta_of(row)
        s = num(m.get("score"))
        if s is None:
            return None
        kind = row.get("subtask") if row.get("protocol") == "decomposed" else None
        return (row.get("protocol"), kind, m.get("aspect"), m.get("dimension")), s
    if isinstance(row.get("verdict"), str):
        return None
    s = num(row.get("score"))
    return None if s is None else ((row.get("protocol"), row.get("aspect")), s)


def claim_key(kind_of: Callable[[str], Hashable]) -> KeyFn:
    """Key of the claim balance over SFT rows: stratum (the row's sub-task, the claim's kind as `kind_of(words)`
    reads it, None where it cannot), bucket = the claim's rating, i.e. its verdict (flywheel/judge/claims.py). Rows of
    other protocols pass through."""
    def key(row: dict):
        m = meta_of(row)
        s = num(m.get("score"))
        if row.get("protocol") != "claims" or s is None:
            return None
        return (row.get("subtask"), kind_of(m.get("claim") or "")), s
    return key


def subtask_key(protocols: Sequence[str]) -> KeyFn:
    """Key of the sub-task rebalance: one stratum, bucket = the SFT row's subtask, for rows of `protocols`."""
    allowed = set(protocols)

    def key(row: dict):
        return (None, row.get("subtask")) if row.get("protocol") in allowed else None
    return key


def q3_target(sizes: Sequence[int]) -> int:
    """Third quartile of bucket sizes (numpy's linear interpolation), rounded half up; at least 1."""
    if not sizes:
        raise ValueError("no buckets")
    return max(1, math.floor(float(np.percentile(np.asarray(sizes, dtype=float), 75)) + 0.5))


def _strata(rows: list[dict], key: KeyFn) -> tuple[dict, int]:
    """{stratum: {bucket: [row index]}} (buckets in first-seen order) and the count of pass-through rows."""
    strata: dict = defaultdict(lambda: defaultdict(list))
    passed = 0
    for i, r in enumerate(rows):
        k = key(r)
        if k is None:
            passed += 1
        else:
            strata[k[0]][k[1]].append(i)
    return strata, passed


def _rng(seed: int, name: str, stratum, bucket) -> random.Random:
    return random.Random(f"{seed}|{name}|{stratum!r}|{bucket!r}")


def _counts_to_rows(rows: list[dict], counts: list[int]) -> list[dict]:
    out = []
    for r, c in zip(rows, counts, strict=True):
        out += ([r] + [dict(r) for _ in range(c - 1)]) if c else []
    return out


def resample(rows: Sequence[dict], indices: list[int], target: int, rng: random.Random, *, upsample: bool = True,
             downsample: bool = True) -> dict[int, int]:
    """How many times each row index of one bucket appears after balancing it to `target`."""
    order = sorted(indices, key=lambda i: (row_key(rows[i]), i))
    n = len(order)
    if n > target and downsample:
        keep = set(rng.sample(order, target))
        return {i: int(i in keep) for i in order}
    if n < target and upsample:
        base, extra = divmod(target, n)
        more = set(rng.sample(order, extra))
        return {i: base + (i in more) for i in order}
    return {i: 1 for i in order}


def _resample_buckets(rows: list[dict], strata: dict, target: Callable[[dict, list[int]], int], *, seed: int,
                      name: str, upsample: bool = True, downsample: bool = True) -> list[int]:
    """How many times each row appears once every bucket is resampled (`resample`) to `target(its stratum's buckets,
    its indices)`; rows in no bucket stay once."""
    counts = [1] * len(rows)
    for stratum, buckets in strata.items():
        for bucket, idx in buckets.items():
            for i, c in resample(rows, idx, target(buckets, idx), _rng(seed, name, stratum, bucket),
                                 upsample=upsample, downsample=downsample).items():
                counts[i] = c
    return counts


def rebalance(rows: Iterable[dict], key: KeyFn, *, seed: int = 0, upsample: bool = True, downsample: bool = True,
              name: str = "q3_rebalance") -> tuple[list[dict], FilterReport]:
    """The Q3 rule (module docstring) over the buckets of each stratum."""
    rows = list(rows)
    strata, passed = _strata(rows, key)
    counts = _resample_buckets(rows, strata, lambda buckets, _: q3_target([len(v) for v in buckets.values()]),
                               seed=seed, name=name, upsample=upsample, downsample=downsample)
    stats = {"passed_through": passed, "strata": len(strata), "buckets": sum(len(b) for b in strata.values()),
             "added": sum(c - 1 for c in counts if c > 1)}
    return _counts_to_rows(rows, counts), make_report(name, len(rows), sum(counts), {"downsampled": counts.count(0)},
                                                      stats)


def cap(rows: Iterable[dict], cap_per_bucket: int, key: KeyFn = score_key, *, seed: int = 0,
        name: str = "score_cap") -> tuple[list[dict], FilterReport]:
    """Minos' score balance: at most `cap_per_bucket` rows per bucket (score value) of each stratum; the excess is
    removed at random."""
    if cap_per_bucket < 1:
        raise ValueError(f"cap must be >= 1, got {cap_per_bucket}")
    rows = list(rows)
    strata, passed = _strata(rows, key)
    counts = _resample_buckets(rows, strata, lambda *_: cap_per_bucket, seed=seed, name=name, upsample=False)
    stats = {"passed_through": passed, "strata": len(strata), "buckets": sum(len(b) for b in strata.values())}
    return _counts_to_rows(rows, counts), make_report(name, len(rows), sum(counts), {"over_cap": counts.count(0)},
                                                      stats)


def balance_scores(rows: Iterable[dict], cfg: ScoreBalanceConfig | None = None, *, seed: int = 0,
                   key: KeyFn = score_key, name: str = "score_balance") -> tuple[list[dict], FilterReport]:
    """Score balance chosen by config: none | cap (Minos) | q3 (T2I)."""
    cfg = cfg or ScoreBalanceConfig()
    rows = list(rows)
    if cfg.method == "cap":
        return cap(rows, cfg.cap, key, seed=seed, name=name)
    if cfg.method == "q3":
        return rebalance(rows, key, seed=seed, upsample=cfg.upsample, downsample=cfg.downsample, name=name)
    return rows, make_report(name, len(rows), len(rows), {})


def rebalance_subtasks(rows: Iterable[dict], cfg: SubtaskRebalanceConfig | None = None, *,
                       seed: int = 0) -> tuple[list[dict], FilterReport]:
    """T2I sub-task rebalance of SFT rows: the Q3 rule over the `subtask` of rows of cfg.protocols."""
    cfg = cfg or SubtaskRebalanceConfig()
    rows = list(rows)
    if not cfg.enabled:
        return rows, make_report("subtask_rebalance", len(rows), len(rows), {})
    return rebalance(rows, subtask_key(cfg.protocols), seed=seed, upsample=cfg.upsample, downsample=cfg.downsample,
                     name="subtask_rebalance")


def weight_protocols(rows: Iterable[dict], cfg: ProtocolWeightsConfig | None = None, *,
                     seed: int = 0) -> tuple[list[dict], FilterReport]:
    """Each named protocol's (and task's) SFT rows scaled by its weight as a whole: the bucket's target is
    round(n x weight), reached by the Q3 rule's repetition or cut (`resample`), so a weight of 1.5 repeats a seeded
    half once. A row's weight is its protocol's times its task's; a bucket is a protocol, or a protocol's rows of a
    named task."""
    cfg = cfg or ProtocolWeightsConfig()
    rows = list(rows)

    def bucket(r: dict):
        p, t = r.get("protocol"), r.get("task")
        if t in cfg.tasks:
            return None, (p, t)
        return (None, p) if p in cfg.weights else None

    def weight(r: dict) -> float:
        return cfg.weights.get(r.get("protocol"), 1.0) * cfg.tasks.get(r.get("task"), 1.0)

    strata, _ = _strata(rows, bucket)
    # one bucket per protocol (per protocol and task where a task is named), its target round(n x weight), half up
    counts = _resample_buckets(rows, strata, lambda buckets, idx: max(1, math.floor(
        len(idx) * weight(rows[idx[0]]) + 0.5)), seed=seed, name="protocol_weights")
    stats = {"added": sum(c - 1 for c in counts if c > 1), "buckets": sum(len(b) for b in strata.values())}
    return _counts_to_rows(rows, counts), make_report("protocol_weights", len(rows), sum(counts),
                                                      {"downweighted": counts.count(0)}, stats)
