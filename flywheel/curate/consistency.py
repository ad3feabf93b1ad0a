"""Minos' consistency filter: from the k samples a judge gave for one input, keep the one that matches the
gold (human / oracle) score when gold exists — else the mode of the k samples.

An *item* is one judgment input: (prompt_id, candidate_ids, protocol, aspect, order[, group]) — see ItemKey —
and the k samples of it are the judgment rows of one judge on that item (sample_k = 0..k-1). Per item:
- samples with a parse_error are dropped (counted as "parse_error"; they are already recorded as such);
- samples with neither a score nor a verdict (e.g. a rubric-drafting step) are dropped as "no_value";
- fewer than `min_samples` parsed samples: the item is dropped ("too_few_samples");
- gold exists: keep the matching sample (|score - gold| <= gold_tolerance, or the same verdict), else drop
  the item ("gold_mismatch", as Minos discards it);
- no gold: the mode of the parsed values; two or more values tied for the mode drop the item ("mode_tie"); a
  mode held by less than `min_agreement` of the parsed samples drops it ("low_agreement").
Among several matching samples the one with the lowest sample_k is kept (then the smallest judgment_id), so the
result does not depend on row order. The other samples of a kept item are counted as "not_selected".

The value of a sample is its verdict when it has one (pairwise, already in the AB frame), else its score.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from flywheel.curate.config import ConsistencyConfig
from flywheel.curate.report import FilterReport, as_json, make_report, num, row_key


class ItemKey(NamedTuple):
    """One judgment input. `group` is the request among several of one candidate, on rows without an aspect: the
    aspects protocol's request group (universal | task), or the claims protocol's claim (its side and words), so
    one candidate's requests are not mixed; None otherwise."""

    prompt_id: str
    candidate_ids: tuple[str, ...]
    protocol: str
    aspect: str | None = None
    order: str | None = None
    group: str | None = None


def item_key(row: dict) -> ItemKey:
    group = None
    if row.get("aspect") is None:
        parsed = as_json(row.get("parsed"))
        if isinstance(parsed, dict) and isinstance(parsed.get("group"), str):
            group = parsed["group"]
    return ItemKey(row["prompt_id"], tuple(row["candidate_ids"]), row["protocol"], row.get("aspect"),
                   row.get("order"), group)


def sample_group(row: dict) -> tuple:
    """The samples of one judge on one item share this key."""
    return (row["judge"], *item_key(row))


def value_of(row: dict) -> float | str | None:
    """The value samples vote with: the (AB-frame) verdict if any, else the score; None if neither."""
    v = row.get("verdict")
    return v if isinstance(v, str) else num(row.get("score"))


def is_parse_error(row: dict) -> bool:
    return row.get("parse_error") is not None


def sample_order(row: dict) -> tuple:
    """Preference among equally good samples: lowest sample_k, then smallest id."""
    return (int(row.get("sample_k") or 0), row_key(row))


def _gold_for(key: ItemKey, gold: Mapping | None) -> Any:
    """The gold value of an item: looked up by its exact key, then (pairwise gold given once for both orders)
    by the key with order=None. Keys may be ItemKeys or plain tuples of its fields in order; trailing fields
    left out are None, e.g. (prompt_id, candidate_ids, protocol)."""
    if not gold:
        return None
    for k in (key, key._replace(order=None)):
        if tuple(k) in gold:
            return gold[tuple(k)]
    return None


def _full(key) -> tuple:
    """A gold key as a full ItemKey tuple (trailing fields may be left out: they default to None)."""
    key = tuple(key)
    return key + (None,) * (len(ItemKey._fields) - len(key))


def _matches(value: Any, target: Any, tol: float) -> bool:
    if isinstance(target, str) or isinstance(value, str):
        return value == target
    return abs(float(value) - float(target)) <= tol


def group_samples(rows: Iterable[dict]) -> dict[tuple, list[dict]]:
    """Rows by sample_group, in order of first appearance."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[sample_group(r)].append(r)
    return groups


def consistency_filter(rows: Iterable[dict], gold: Mapping | None = None,
                       cfg: ConsistencyConfig | None = None) -> tuple[list[dict], FilterReport]:
    """One consistent sample per item (see the module docstring). gold: item key (an ItemKey, or a tuple of its
    leading fields) -> gold score, or gold verdict in the AB frame (a key with order None covers both orders)."""
    cfg = cfg or ConsistencyConfig()
    rows = list(rows)
    gold = {_full(k): v for k, v in (gold or {}).items()}
    dropped, stats, out = Counter(), Counter(), []
    for _, samples in group_samples(rows).items():
        stats["items_in"] += 1
        parsed = []
        for r in samples:
            if is_parse_error(r):
                dropped["parse_error"] += 1
            elif value_of(r) is None:
                dropped["no_value"] += 1
            else:
                parsed.append(r)
        reason, kept = _select(parsed, _gold_for(item_key(samples[0]), gold), cfg, stats)
        if kept is None:
            dropped[reason] += len(parsed)
            stats[f"items_{reason}"] += 1
            continue
        out.append(kept)
        dropped["not_selected"] += len(parsed) - 1
        stats["items_out"] += 1
    return out, make_report("consistency", len(rows), len(out), dropped, stats)


def _select(parsed: list[dict], gold: Any, cfg: ConsistencyConfig, stats: Counter) -> tuple[str, dict | None]:
    if not parsed:
        return "no_parsed_sample", None
    if len(parsed) < cfg.min_samples:
        return "too_few_samples", None
    if gold is not None:
        hits = [r for r in parsed if _matches(value_of(r), gold, cfg.gold_tolerance)]
        if not hits:
            return "gold_mismatch", None
        stats["items_gold"] += 1
        return "", min(hits, key=sample_order)
    counts = Counter(value_of(r) for r in parsed)
    (mode, top), *rest = counts.most_common()
    if rest and rest[0][1] == top:
        return "mode_tie", None
    if top / len(parsed) < cfg.min_agreement:
        return "low_agreement", None
    stats["items_mode"] += 1
    return "", min((r for r in parsed if value_of(r) == mode), key=sample_order)
