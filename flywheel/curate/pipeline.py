"""The curation steps in their order, for the stage wrappers: one call per dataset family, every step's
FilterReport returned in order (log them with flywheel.curate.metrics).

Judge data (teacher judgments -> judge SFT + judge DPO):
  consistency (k samples -> 1 per item) -> swap consistency (pairwise) -> judge-DPO pairs -> winner-position
  balance (pairwise) -> SFT rows (decomposed: six sample kinds) -> score balance -> claim balance -> sub-task
  rebalance -> protocol weights.
Judge-DPO pairs are drawn before position balance (both orders of a consistent item make pairs) and after swap
consistency (an item whose verdict flips with the order has no trustworthy chosen sample). Balancing runs on
the SFT rows, so the decomposed protocol's per-question scores are balanced as the T2I paper does.

Policy data (the served judge's judgments of policy samples -> DPO / Diffusion-DPO rows):
  consistency (k samples of the judge -> 1) -> best-vs-worst pairs -> training rows.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flywheel.curate.balance import balance_scores, claim_key, rebalance_subtasks, weight_protocols
from flywheel.curate.config import CurateConfig
from flywheel.curate.consistency import consistency_filter, is_parse_error
from flywheel.curate.judge_io import by_id
from flywheel.curate.pairs import judge_pairs, policy_pairs, policy_training_rows
from flywheel.curate.pairwise import balance_positions, swap_consistency
from flywheel.curate.report import FilterReport
from flywheel.curate.sft import judge_sft
from flywheel.engines.base import TextRequest
from flywheel.judge import claims as cl


@dataclass
class JudgeData:
    kept: list[dict] = field(default_factory=list)  # judgment rows the SFT set was made from
    sft: list[dict] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)  # pair rows, kind="judge"
    dpo: list[dict] = field(default_factory=list)
    reports: list[FilterReport] = field(default_factory=list)


@dataclass
class PolicyData:
    pairs: list[dict] = field(default_factory=list)  # pair rows, kind="policy"
    dpo: list[dict] = field(default_factory=list)
    image_pref: list[dict] = field(default_factory=list)
    reports: list[FilterReport] = field(default_factory=list)


def curate_judge_data(judgments: Iterable[dict], prompts: Iterable[dict] | Mapping[str, dict],
                      candidates: Iterable[dict] | Mapping[str, dict], cfg: CurateConfig | None = None, *,
                      gold: Mapping | None = None, requests: Mapping[str, TextRequest] | None = None,
                      tree: Any = None, guidelines: Any = None, style: str = "minos",
                      claim_kind: Callable[[str], Hashable] = lambda _: None) -> JudgeData:
    """style: the prompt style the judge is trained on (config judge.prompt_style); claim_kind: a claim's kind from
    its words, what curate.claim_balance balances verdicts within (the world's reading; None: one kind)."""
    cfg = cfg or CurateConfig()
    judgments = list(judgments)
    prompts = by_id(prompts, "prompt_id")  # once: the pairs, the position groups and the SFT rows all look up
    ctx = {"requests": requests, "tree": tree, "guidelines": guidelines, "style": style}
    out = JudgeData()
    kept, rep = consistency_filter(judgments, gold, cfg.consistency)
    out.reports.append(rep)
    if cfg.pairwise.swap_consistency:
        kept, rep = swap_consistency(kept)
        out.reports.append(rep)
    out.pairs, out.dpo, rep = judge_pairs(judgments, kept, prompts, candidates, cfg.judge_pairs, **ctx)
    out.reports.append(rep)
    if cfg.pairwise.position_balance:
        kept, rep = balance_positions(kept, seed=cfg.seed, group=_position_group(prompts, cfg))
        out.reports.append(rep)
    out.kept = kept
    sft, rep = judge_sft(kept, prompts, candidates, **ctx)
    out.reports.append(rep)
    sft, rep = balance_scores(sft, cfg.score_balance, seed=cfg.seed)
    out.reports.append(rep)
    if cfg.claim_balance.method != "none":
        sft, rep = balance_scores(sft, cfg.claim_balance, seed=cfg.seed, key=claim_key(claim_kind),
                                  name="claim_balance")
        out.reports.append(rep)
    sft, rep = rebalance_subtasks(sft, cfg.subtask_rebalance, seed=cfg.seed)
    out.reports.append(rep)
    out.sft, rep = weight_protocols(sft, cfg.protocol_weights, seed=cfg.seed)
    out.reports.append(rep)
    return out


def _position_group(prompts: Mapping[str, dict], cfg: CurateConfig):
    """The group a pairwise row's winners are balanced within (curate.pairwise.position_balance_within)."""
    if cfg.pairwise.position_balance_within == "dataset":
        return None
    return lambda row: ((prompts.get(row["prompt_id"]) or {}).get("subtask"), row.get("aspect"))


def curate_policy_data(candidates: Iterable[dict], judgments: Iterable[dict],
                       prompts: Iterable[dict] | Mapping[str, dict], cfg: CurateConfig | None = None, *,
                       gold: Mapping | None = None) -> PolicyData:
    cfg = cfg or CurateConfig()
    candidates = list(candidates)
    out = PolicyData()
    judgments = list(judgments)
    # a claim the judge's output failed on fails its candidate: no score from the claims left, nor another protocol's
    failed = {j["candidate_ids"][0] for j in judgments if j["protocol"] == cl.NAME and is_parse_error(j)}
    kept, rep = consistency_filter(judgments, gold, cfg.consistency)
    out.reports.append(rep)
    kept = [j for j in kept if len(j["candidate_ids"]) != 1 or j["candidate_ids"][0] not in failed]
    out.pairs, rep = policy_pairs(candidates, kept, cfg.policy_pairs)
    out.reports.append(rep)
    out.dpo, out.image_pref, rep = policy_training_rows(out.pairs, prompts, candidates)
    out.reports.append(rep)
    return out
