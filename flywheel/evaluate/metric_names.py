"""Names of meta-eval metrics: `<split>/<slice>/<protocol>/<measure>`, e.g. `id-test/all/pairwise/accuracy` or
`id-test/task/iu/pointwise_ranking/accuracy` (a slice may have a slash itself). Import-light on purpose: the
config validates the gate's metric with it."""

from __future__ import annotations

# Protocols whose accuracy is a mean of one right/wrong outcome per gold pair, so two judges scored on the same
# gold pairs can be compared pair by pair (McNemar).
PER_PAIR = ("pairwise", "pointwise_ranking", "pairwise_balanced")


def split_of(metric: str) -> tuple[str, str]:
    """`id-test/all/pairwise/accuracy` -> ("id-test", "all/pairwise/accuracy"): meta-eval reports per split."""
    split, _, name = metric.partition("/")
    return split, name


# The judge protocol whose outputs a metric is computed from (ranking accuracy orders pairs by pointwise ratings).
SOURCE_PROTOCOL = {"pairwise": "pairwise", "pointwise": "pointwise", "pointwise_ranking": "pointwise",
                   "pairwise_balanced": "pairwise"}


def protocol_of(metric: str) -> str | None:
    """The protocol meta-eval must ask for `metric` to exist (`.../<protocol>/<measure>`), or None if it names
    none (e.g. a generalization count)."""
    parts = metric.split("/")
    return SOURCE_PROTOCOL.get(parts[-2]) if len(parts) >= 2 else None


def per_pair_accuracy(name: str) -> tuple[str, str] | None:
    """(slice, protocol) of a split's per-pair accuracy `<slice>/<protocol>/accuracy` (no split prefix: the names
    score_split returns), or None for any other metric."""
    parts = name.split("/")
    if len(parts) < 3 or parts[-1] != "accuracy" or parts[-2] not in PER_PAIR:
        return None
    return "/".join(parts[:-2]), parts[-2]


SUBTASK = "subtask/"


def per_subtask(metrics: dict[str, float], measure: str) -> dict[str, float]:
    """One split's `subtask/<name>/<measure>` values by sub-task name (meta-eval's per-sub-task slice)."""
    suffix = "/" + measure
    return {k[len(SUBTASK):-len(suffix)]: v for k, v in metrics.items()
            if k.startswith(SUBTASK) and k.endswith(suffix)}
