"""The promotion gate: a challenger becomes `champion` in the MLflow registry only if it beats the current
champion on the configured metric by the configured margin; otherwise the champion stays, and the reason is
recorded either way (on the challenger's version and in the iteration's MLflow run).

The measured metric is stored on each version as a tag (`flywheel.gate.<metric>`), so a champion is not
re-evaluated every iteration (a judge's, only when the gold changed; below). A champion that is not a registered
version (iteration 0's base model) is measured by the caller and passed in.

A judge must also pass a paired test (`gate.judge_test`): its metric is an accuracy over ~200 gold pairs, whose
run-to-run noise is as large as the gains a margin could ask for. Both judges are scored on the same gold pairs,
so McNemar's exact test compares them pair by pair. A judge's per-pair outcomes are recomputed from its
meta-eval on storage, which its version names in tags (`flywheel.gate.meta_eval_uri`, `flywheel.gate.gold_uri`);
a champion whose recorded meta-eval cannot be read against the gold now in use (the gold changed since: world.gold
or meta_eval.gold_files edited; or its rows were pruned) is measured again by the iteration beside the challenger
and its version's records replaced (`measured_on`, `remeasured`), so the two are never compared across gold sets.
A champion that still has none is compared by the margin alone, and the reason says so.

What the next iteration's judge trains from is a second decision (`gate.judge_lineage`): the champion, or the
`lineage` alias, which follows each challenger unless it is significantly worse than the champion. The champion
is the best of several noisy trainings, so its gold score is biased upward (winner's curse): a challenger as good
on average falls below it, and training every round again from the champion throws that round away.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from scipy import stats

from flywheel.config import Config
from flywheel.evaluate.metric_names import per_pair_accuracy, split_of
from flywheel.train import registry

log = logging.getLogger(__name__)
CHAMPION = "champion"
LINEAGE = "lineage"  # alias of the judge the next iteration trains from (gate.judge_lineage: within_noise)


@dataclass
class Decision:
    model: str  # registered model name
    challenger: str  # models:/<name>/<version>
    champion: str | None  # what was champion before (a registry uri or a base model ref)
    metric: str
    challenger_value: float
    champion_value: float
    margin: float
    promoted: bool
    reason: str
    # The paired test (gate.judge_test, gate.downstream_test): None when it was not run (nothing to compare item by
    # item, or no champion value); with the margin rule alone it runs for the record and decides nothing
    alpha: float | None = None  # the level asked for; None: the margin rule alone
    test: str | None = None  # "McNemar" (right/wrong per item) or "Wilcoxon" (scores per item)
    better: int | None = None  # items the challenger got right and the champion wrong (McNemar's b) / scored higher
    worse: int | None = None  # the reverse (McNemar's c)
    p_value: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def champion_of(cfg: Config, name: str) -> str | None:
    """models:/<name>/<version> of the current champion, or None if the model has none yet."""
    return _aliased(cfg, name, CHAMPION)


def _aliased(cfg: Config, name: str, alias: str) -> str | None:
    try:
        mv = registry.client(cfg).get_model_version_by_alias(name, alias)
    except Exception:  # no registered model, or no alias yet
        return None
    return registry.describe(mv)


def recorded(cfg: Config, uri: str, metric: str) -> float | None:
    mv = registry.get_version(cfg, uri)
    value = mv.tags.get(f"flywheel.gate.{metric}")
    return float(value) if value is not None else None


def record(cfg: Config, uri: str, metric: str, value: float) -> None:
    mv = registry.get_version(cfg, uri)
    registry.client(cfg).set_model_version_tag(mv.name, mv.version, f"flywheel.gate.{metric}", repr(float(value)))


@dataclass(frozen=True)
class MetaEval:
    """Where a judge's meta-eval is on storage: its judged rows under `output_uri`/<split> and the gold they were
    judged against under `gold_uri`/<split>; its per-pair outcomes on the gate metric are recomputed from them."""

    output_uri: str
    gold_uri: str


META_EVAL_TAG, GOLD_TAG = "flywheel.gate.meta_eval_uri", "flywheel.gate.gold_uri"
SCORING_TAG = "flywheel.gate.judge_scoring"


def judge_scoring(cfg: Config) -> str:
    """How meta-eval reads a judge into numbers: its samples per rating, decoding, readout, request style and the
    protocols asked. Two judges scored differently (one by the mean of 20 sampled analyses, one greedily) are not
    compared: the champion is measured again the challenger's way (measured_on)."""
    return json.dumps({"samples": cfg.judge.samples, "rating_readout": cfg.judge.rating_readout,
                       "prompt_style": cfg.judge.prompt_style, "protocols": sorted(cfg.meta_eval.protocols),
                       "generation": cfg.judge.generation.model_dump(mode="json", exclude={"batch_size"})},
                      sort_keys=True)


def record_meta_eval(cfg: Config, uri: str, where: MetaEval) -> None:
    mv = registry.get_version(cfg, uri)
    c = registry.client(cfg)
    c.set_model_version_tag(mv.name, mv.version, META_EVAL_TAG, where.output_uri)
    c.set_model_version_tag(mv.name, mv.version, GOLD_TAG, where.gold_uri)
    c.set_model_version_tag(mv.name, mv.version, SCORING_TAG, judge_scoring(cfg))


def recorded_meta_eval(cfg: Config, uri: str) -> MetaEval | None:
    tags = registry.get_version(cfg, uri).tags
    if META_EVAL_TAG not in tags or GOLD_TAG not in tags:  # registered before the gate recorded them
        return None
    return MetaEval(tags[META_EVAL_TAG], tags[GOLD_TAG])


def measured_on(cfg: Config, uri: str, metric: str, gold_uri: str) -> bool:
    """Whether `uri`'s recorded value of `metric` was measured on the gold now at `gold_uri` and scored as `cfg`
    scores a judge now (judge_scoring; a version recorded before scorings were recorded counts as scored so), its
    meta-eval still there to test it pair by pair: recorded against that gold, its rows kept, and (a per-pair
    accuracy) giving the recorded value."""
    from flywheel.evaluate import meta

    value, where = recorded(cfg, uri, metric), recorded_meta_eval(cfg, uri)
    if value is None or where is None or where.gold_uri != gold_uri:
        return False
    now = judge_scoring(cfg)
    if registry.get_version(cfg, uri).tags.get(SCORING_TAG, now) != now:
        return False
    try:
        if _per_pair(metric):
            _outcomes(cfg, "champion", where, metric, value)
        else:
            meta.judged_against(gold_uri, where.output_uri, split_of(metric)[0])
    except (Untestable, meta.OutcomesUnavailable):
        return False
    return True


def remeasured(cfg: Config, uri: str, values: Mapping[str, float], where: MetaEval) -> None:
    """Record `uri`'s values (the gate metric and its guards) and meta-eval as measured just now on the gold now in
    use, over those recorded against another gold: the gate then compares a challenger with it on the same pairs,
    never a value from one gold set against one from another."""
    for metric, value in values.items():
        record(cfg, uri, metric, value)
    record_meta_eval(cfg, uri, where)


def _per_pair(metric: str) -> bool:
    return per_pair_accuracy(split_of(metric)[1]) is not None


class Untestable(Exception):
    """The paired test cannot be run; the message says why (the gate falls back to the margin rule)."""


def mcnemar(challenger: dict[str, bool], champion: dict[str, bool]) -> tuple[int, int, float]:
    """McNemar's exact one-sided test on the pairs both judges were scored on (pair key -> right): b pairs only the
    challenger got right, c only the champion; p = P(>= b of the b + c discordant pairs | equally good judges)."""
    shared = challenger.keys() & champion.keys()  # a pair only one judge was scored on says nothing about both
    b = sum(challenger[k] and not champion[k] for k in shared)
    c = sum(champion[k] and not challenger[k] for k in shared)
    return b, c, mcnemar_p(b, c)


def mcnemar_p(b: int, c: int) -> float:
    """McNemar's exact one-sided p of b discordant pairs for the first judge against c for the second."""
    if b + c == 0:  # the judges agree on every pair: no evidence either way
        return 1.0
    return float(stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue)


def wilcoxon(challenger: list[float], champion: list[float]) -> tuple[int, int, float]:
    """Wilcoxon's signed-rank one-sided test on per-item scores of the same items (in the same order): items
    the challenger scored higher, lower, and p = P(differences at least this positive | equally good models)."""
    diff = [a - b for a, b in zip(challenger, champion, strict=True)]
    better, worse = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
    if better + worse == 0:  # the same score on every item: no evidence either way
        return better, worse, 1.0
    return better, worse, float(stats.wilcoxon(challenger, champion, alternative="greater").pvalue)


def paired_items(challenger: list[float], champion: list[float]) -> tuple[str, int, int, float]:
    """The paired test that fits per-item values of two models on the same items: McNemar for right/wrong
    (0/1) values, Wilcoxon for scores. Returns (test, better, worse, p)."""
    if len(challenger) != len(champion):
        raise Untestable(f"{len(challenger)} challenger items against {len(champion)} champion items")
    # NaN: an item one model's scorer could not rate (a judge output that did not parse) says nothing about both
    both = [(a, b) for a, b in zip(challenger, champion, strict=True) if not (math.isnan(a) or math.isnan(b))]
    if not both:
        raise Untestable("no item has a value for both models")
    challenger, champion = [a for a, _ in both], [b for _, b in both]
    if set(challenger) | set(champion) <= {0.0, 1.0}:
        return ("McNemar", *mcnemar({i: v == 1.0 for i, v in enumerate(challenger)},
                                    {i: v == 1.0 for i, v in enumerate(champion)}))
    return ("Wilcoxon", *wilcoxon(challenger, champion))


Paired = Callable[[], tuple[str, int, int, float]]  # runs the paired test: (test, better, worse, p) or Untestable


def _outcomes(cfg: Config, who: str, where: MetaEval | None, metric: str, value: float) -> dict[str, bool]:
    """`who`'s per-pair outcomes on `metric`, recomputed from its meta-eval, checked to give the value gated on."""
    from flywheel.evaluate import meta  # engines and Ray Data stages: only the judge gate needs them

    if where is None:
        raise Untestable(f"the {who} has no recorded meta-eval")
    if not _per_pair(metric):  # gate.judge_test none allows e.g. a Pearson: no pair-by-pair outcomes to test
        raise Untestable(f"{metric} is not a per-pair accuracy")
    try:
        got = meta.stored_outcomes(cfg, where.gold_uri, where.output_uri, metric)
    except meta.OutcomesUnavailable as e:
        raise Untestable(f"the {who}'s outcomes: {e}") from e
    # outcomes that do not reproduce the gated value (another config's slices, say) would test something else
    if not got or not math.isclose(sum(got.values()) / len(got), value, rel_tol=1e-9, abs_tol=1e-12):
        raise Untestable(f"the {who}'s outcomes recomputed from {where.output_uri} do not give its {metric} "
                         f"{value:.4f}")
    return got


def _checked_items(items: tuple[list[float], list[float]], value: float, champ_value: float,
                   metric: str) -> tuple[list[float], list[float]]:
    """The per-item values, if those with a value (not NaN) average to the values gated on (else they measured
    something else)."""
    for who, got, want in (("challenger", items[0], value), ("champion", items[1], champ_value)):
        rated = [v for v in got if not math.isnan(v)]
        if not rated or not math.isclose(sum(rated) / len(rated), want, rel_tol=1e-9, abs_tol=1e-9):
            raise Untestable(f"the {who}'s {len(got)} per-item values do not average to its {metric} {want:.4f}")
    return items


def _champion(cfg: Config, name: str, metric: str, baseline: tuple[str, float] | None,
              baseline_meta_eval: MetaEval | None) -> tuple[str | None, float, MetaEval | None]:
    """(ref, value, meta-eval) of what the challenger must beat: the registered champion, else `baseline`. A
    baseline that names the champion itself is its value measured just now, beside the challenger's: it stands
    over the value recorded when the champion was promoted (a judge-scored metric depends on which judge
    measured it, and the serving judge changes between iterations)."""
    current = champion_of(cfg, name)
    if current is not None and baseline is not None and baseline[0] == current:
        return current, baseline[1], baseline_meta_eval
    if current is not None:
        value = recorded(cfg, current, metric)
        if value is not None:
            return current, value, recorded_meta_eval(cfg, current)
        if baseline is not None:  # the champion was never measured on this metric: the base model's value stands
            return current, baseline[1], baseline_meta_eval
        return current, -math.inf, None
    if baseline is not None:
        return baseline[0], baseline[1], baseline_meta_eval
    return None, -math.inf, None


def _rule(metric: str, value: float, champ_value: float, margin: float, alpha: float | None,
          paired: Paired | None) -> tuple[bool, str, tuple[str, int, int, float] | None]:
    """(promoted, reason, the paired test's (test, better, worse, p) if it ran): the margin rule, then, with
    `alpha`, the paired test. Without `alpha` the test still runs where it can and its outcome goes into the
    reason, so that a promotion within noise reads as one."""
    if math.isnan(value):
        return False, f"{metric} of the challenger is undefined (NaN)", None
    if not (math.isnan(champ_value) or value > champ_value + margin):  # "beats": strictly better
        return False, f"{metric} {value:.4f} ≤ champion {champ_value:.4f} + margin {margin}: champion stays", None
    if math.isnan(champ_value):  # e.g. none of the judge's ratings of the champion's answers parsed
        beats = f"{metric} {value:.4f}, the champion's is undefined (NaN): a defined value beats it"
    elif champ_value > -math.inf:
        beats = f"{metric} {value:.4f} > champion {champ_value:.4f} + margin {margin}"
    else:
        beats = f"{metric} {value:.4f}, no champion or baseline to beat yet"
    try:
        if not math.isfinite(champ_value):
            raise Untestable("no champion value to test against")
        if paired is None:
            raise Untestable("no per-item values to compare")
        test, b, c, p = paired()
    except Untestable as e:
        return True, beats if alpha is None else f"{beats}; paired test not run ({e}): margin rule", None
    counts = f"b={b} c={c}" if test == "McNemar" else f"{b} items higher, {c} lower"
    if alpha is None:
        return True, f"{beats}, by the margin alone ({test} {counts} p={p:.2g}, not required)", (test, b, c, p)
    if p < alpha:
        return True, f"{beats} and {test} {counts} p={p:.2g} < alpha {alpha}", (test, b, c, p)
    return False, f"{beats} but {test} {counts} p={p:.2g} ≥ alpha {alpha}: champion stays", (test, b, c, p)


def decide(cfg: Config, challenger: str, challenger_value: float, metric: str, margin: float,
           baseline: tuple[str, float] | None = None, *, alpha: float | None = None,
           meta_eval: MetaEval | None = None, baseline_meta_eval: MetaEval | None = None,
           items: tuple[list[float], list[float]] | None = None,
           guards: Mapping[str, tuple[float, float]] | None = None) -> Decision:
    """Promote `challenger` (a registered version) if it beats the champion by `margin` on `metric` (higher is
    better). `baseline` = (ref, value) stands in for the champion when the model has none registered yet.

    With `alpha` the challenger must also be significantly better item by item (one-sided paired test). A judge
    passes where its meta-eval is (`meta_eval`; `baseline_meta_eval` for the baseline's): McNemar on the gold
    pairs both were scored on; `meta_eval` is recorded on the version, so it can be tested against once it is
    the champion. A policy passes `items` = (challenger's, champion's) per-item values of `metric` on the same
    held-out items, measured side by side: McNemar for right/wrong items, Wilcoxon for scores.

    `guards` = {metric: (the challenger's value, the largest drop allowed)}: a challenger that wins on `metric`
    is still refused if it falls more than that below the champion on a guard metric (`gate.judge_guards`). The
    guard values are recorded on the version, so its successors can be held to them once it is champion."""
    mv = registry.get_version(cfg, challenger)
    if (earlier := _decided(cfg, mv, challenger)) is not None:
        return earlier
    record(cfg, challenger, metric, challenger_value)
    for g, (value, _) in (guards or {}).items():
        if math.isfinite(value):
            record(cfg, challenger, g, value)
    if meta_eval is not None:
        record_meta_eval(cfg, challenger, meta_eval)
    champ_ref, champ_value, champ_meta_eval = _champion(cfg, mv.name, metric, baseline, baseline_meta_eval)

    def per_item() -> tuple[str, int, int, float]:
        return paired_items(*_checked_items(items, challenger_value, champ_value, metric))

    def gold_pairs() -> tuple[str, int, int, float]:
        return ("McNemar", *mcnemar(_outcomes(cfg, "challenger", meta_eval, metric, challenger_value),
                                    _outcomes(cfg, "champion", champ_meta_eval, metric, champ_value)))

    paired = per_item if items is not None else gold_pairs if meta_eval is not None else None
    promoted, reason, test = _rule(metric, challenger_value, champ_value, margin, alpha, paired)
    if promoted and guards:
        promoted, reason = _guarded(cfg, champ_ref, guards, reason)
    name, b, c, p = test if test is not None else (None, None, None, None)
    d = Decision(mv.name, challenger, champ_ref, metric, float(challenger_value), float(champ_value), margin,
                 promoted, reason, alpha, name, b, c, p)
    _settle(cfg, mv, d, ("promoted: " if promoted else "refused: ") + reason)
    log.info("gate %s: %s %s (%s)", mv.name, challenger, "promoted" if promoted else "not promoted", reason)
    return d


def _guarded(cfg: Config, champ_ref: str | None, guards: Mapping[str, tuple[float, float]],
             reason: str) -> tuple[bool, str]:
    """(promoted, reason) after the guard metrics: refused if one fell more than its allowed drop below the
    champion's recorded value. A champion with no recorded value (a base model, or promoted before the guard was
    set) is not guarded against, and the reason says so; an undefined (NaN) challenger value fails its guard."""
    unchecked = []
    for g, (value, max_drop) in guards.items():
        champ = recorded(cfg, champ_ref, g) if champ_ref and champ_ref.startswith("models:/") else None
        if champ is None or math.isnan(champ):
            unchecked.append(g)
        elif math.isnan(value) or value < champ - max_drop:
            return False, (f"{reason}, but guard {g} {value:.4f} < champion {champ:.4f} - max drop {max_drop}: "
                           "champion stays")
    return True, reason + (f"; guards not checked, no champion value: {', '.join(unchecked)}" if unchecked else "")


def refuse(cfg: Config, challenger: str, metric: str, reason: str) -> Decision:
    """Record that an update is not promoted without comparing it with the champion: its own training refused
    it (the held-out guard fired, or it never beat its starting model). The reason goes on the version."""
    mv = registry.get_version(cfg, challenger)
    if (earlier := _decided(cfg, mv, challenger)) is not None:
        return earlier
    d = Decision(mv.name, challenger, champion_of(cfg, mv.name), metric, math.nan, math.nan, 0.0, False,
                 f"refused by its training: {reason}")
    _settle(cfg, mv, d, d.reason)
    log.info("gate %s: %s refused by its training (%s)", mv.name, challenger, reason)
    return d


# A version is decided once. On `--resume` the gate stage runs again; deciding again would compare a promoted
# challenger with itself (now the champion) and overwrite its record with a refusal.
RECORD_TAG = "flywheel.gate.record"


def _decided(cfg: Config, mv, challenger: str) -> Decision | None:
    """The decision recorded on this version by an earlier run of the gate (its alias re-applied), else None."""
    raw = mv.tags.get(RECORD_TAG)
    if raw is None:
        return None
    d = Decision(**json.loads(raw))
    if d.promoted:  # a run killed between recording and the alias leaves the alias to set
        registry.client(cfg).set_registered_model_alias(mv.name, CHAMPION, mv.version)
    log.info("gate %s: %s was decided before (%s): %s", mv.name, challenger,
             "promoted" if d.promoted else "not promoted", d.reason)
    return d


def _settle(cfg: Config, mv, d: Decision, said: str) -> None:
    """Record the decision on the version (first, so a resumed run finds it) with `said` as its human-readable
    tag, then move the alias."""
    client = registry.client(cfg)
    record = d.to_dict() | {"reason": d.reason[:3000]}  # MLflow caps a tag value at 5,000 characters
    client.set_model_version_tag(mv.name, mv.version, RECORD_TAG, json.dumps(record, allow_nan=True))
    client.set_model_version_tag(mv.name, mv.version, "flywheel.gate.decision", said[:4900])
    if d.promoted:
        client.set_registered_model_alias(mv.name, CHAMPION, mv.version)


# ------------------------------------------------------------------ what the next round trains from
def lineage_of(cfg: Config, name: str) -> str | None:
    """models:/<name>/<version> the `lineage` alias names, or None."""
    return _aliased(cfg, name, LINEAGE)


def continue_lineage(cfg: Config, d: Decision, meta_eval: MetaEval | None, alpha: float) -> dict:
    """After the judge gate decided `d`: point the `lineage` alias at the judge the next iteration trains from,
    and return {"start", "reason"}: start is the reference the next round trains from (None: no champion yet).

    The challenger continues the lineage unless it is significantly worse than the champion: McNemar's exact
    one-sided test on their gold pairs (champion better) with p < alpha, or a challenger whose metric is undefined.
    Without per-pair outcomes to test, the champion is kept: a broken challenger must not become the base."""
    if d.promoted:
        start, reason = d.challenger, "the challenger was promoted: it is the champion"
    elif math.isnan(d.challenger_value):
        start, reason = d.champion, f"the challenger's {d.metric} is undefined: the champion"
    else:
        try:
            if d.champion is None or not d.champion.startswith(registry.REGISTRY_PREFIX):
                raise Untestable(f"the champion {d.champion} is not a registered judge with a meta-eval")
            if d.test == "McNemar":  # the gate tested these two on their gold pairs: the other tail of its counts
                b, c = d.worse, d.better
                p = mcnemar_p(b, c)
            else:
                champ = _outcomes(cfg, "champion", recorded_meta_eval(cfg, d.champion), d.metric, d.champion_value)
                b, c, p = mcnemar(champ, _outcomes(cfg, "challenger", meta_eval, d.metric, d.challenger_value))
        except Untestable as e:
            start, reason = d.champion, f"cannot test the challenger against the champion ({e}): the champion"
        else:
            within = p >= alpha
            start = d.challenger if within else d.champion
            reason = (f"{d.metric} {d.challenger_value:.4f} vs champion {d.champion_value:.4f}, McNemar "
                      f"champion-only b={b} challenger-only c={c} p={p:.2g} "
                      + (f"≥ alpha {alpha}: within noise, the challenger" if within
                         else f"< alpha {alpha}: significantly worse, the champion"))
    client, name = registry.client(cfg), d.model
    if start is not None and start.startswith(registry.REGISTRY_PREFIX):  # a Decision names versions, not aliases
        client.set_registered_model_alias(name, LINEAGE, registry.parse_uri(start)[1])
    else:  # the champion is the configured base model: no alias, so the next round starts from it
        try:
            client.delete_registered_model_alias(name, LINEAGE)
        except Exception:  # there was none
            pass
    nxt = {"start": start, "reason": reason}
    client.set_model_version_tag(name, registry.parse_uri(d.challenger)[1], "flywheel.gate.lineage",
                                 next_start_line(nxt)[:4900])
    log.info("gate %s lineage: %s", name, next_start_line(nxt))
    return nxt


def next_start_line(nxt: dict) -> str:
    """continue_lineage's answer in words, as the version's tag, the log, `flywheel run` and the description say it."""
    return f"next training from {nxt['start'] or 'the base model'}: {nxt['reason']}"
