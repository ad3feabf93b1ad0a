"""Curation knobs (DESIGN.md "Curation"), mounted in the config tree as `curate:`."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flywheel.records import PROTOCOLS, TASKS
from flywheel.strict_model import StrictModel


class ConsistencyConfig(StrictModel):
    """Minos' consistency filter over the k samples of one judgment input."""

    min_samples: int = Field(1, ge=1, description="Fewest parsed samples an item needs to be kept; parse "
                             "failures do not count.")
    min_agreement: float = Field(0.0, ge=0.0, le=1.0, description="Without gold: least share of the parsed "
                                 "samples that must agree with the mode (e.g. 0.5 keeps an item only if at least half "
                                 "its samples give the modal score). Not applied when gold exists.")
    gold_tolerance: float = Field(0.0, ge=0.0, description="A sample matches a gold score when |score - gold| <= "
                                  "this (0: exact match, as Minos). Verdicts always match exactly.")


class ScoreBalanceConfig(StrictModel):
    """Dataset-level score balance: Minos' cap or the T2I third-quartile rule."""

    method: Literal["none", "cap", "q3"] = Field("q3", description="none: keep as is; cap: at most `cap` rows per "
                                                 "score value (Minos, excess removed at random); q3: target = third "
                                                 "quartile of the score buckets' sizes, smaller buckets up-sampled "
                                                 "by repetition, larger ones down-sampled at random (T2I).")
    cap: int | None = Field(None, ge=1, description="Rows per score value kept by method=cap (required for it).")
    upsample: bool = Field(True, description="q3: repeat rows of buckets below the target (false: only cut).")
    downsample: bool = Field(True, description="q3: sample buckets above the target down to it (false: only "
                             "repeat).")

    @model_validator(mode="after")
    def _cap_needed(self):
        if self.method == "cap" and self.cap is None:
            raise ValueError("score_balance.method=cap needs score_balance.cap")
        return self


class SubtaskRebalanceConfig(StrictModel):
    """T2I sub-task rebalance: the third-quartile rule over the SFT rows' sub-tasks."""

    enabled: bool = Field(True, description="Rebalance the sub-task mix of the judge SFT set.")
    protocols: list[str] = Field(["decomposed"], description="Protocols whose SFT rows are rebalanced (by their "
                                 "`subtask`, the six sample kinds for decomposed); rows of other protocols pass "
                                 "through unchanged.")
    upsample: bool = Field(True, description="Repeat rows of sub-tasks below the target (extraction, "
                           "summaries: the paper's remedy).")
    downsample: bool = Field(True, description="Sample sub-tasks above the target down to it.")


class ProtocolWeightsConfig(StrictModel):
    """How much of the judge SFT set each protocol makes, after the balances: one protocol's rows repeated (or cut)
    as a whole, each row the same number of times up to a seeded remainder."""

    weights: dict[str, float] = Field({}, description="Per protocol, the factor its SFT rows are scaled by (2: "
                                      "every row twice; 1.5: every row once and a seeded half of them again; 0.5: a "
                                      "seeded half kept). A protocol not named keeps its rows as they are. E.g. "
                                      "{claims: 2} weights claim checks up against whole ratings.")
    tasks: dict[str, float] = Field({}, description="Per task (nlg, iu, ig, itig), a factor on its SFT rows, "
                                    "times its protocol's weight: {ig: 2} puts every drawing judgment in twice, "
                                    "e.g. where the judge ranks drawings worse than text. A task not named: 1.")

    @model_validator(mode="after")
    def _known_and_positive(self):
        for field, what, known in (("weights", "protocol", PROTOCOLS), ("tasks", "task", TASKS)):
            for name, w in getattr(self, field).items():
                if name not in known:
                    raise ValueError(f"protocol_weights.{field}: {name!r} is not a {what}; one of {list(known)}")
                if not w > 0:
                    raise ValueError(f"protocol_weights.{field}.{name}: {w} must be > 0 (to train on none of a "
                                     "protocol's or task's rows, leave it out of judgments.protocols)")
        return self


class PairwiseCurateConfig(StrictModel):
    """FRABench: swap consistency and winner-position balance of pairwise judgments."""

    swap_consistency: bool = Field(True, description="Keep a pairwise item only if its AB and BA verdicts agree "
                                   "in the AB frame (position-inconsistent items are dropped and counted).")
    position_balance: bool = Field(True, description="Keep one row per item, choosing the shown order so that "
                                   "'A wins' and 'B wins' are equally frequent (a deterministic part of the majority "
                                   "side is swapped); false keeps both orders of every item.")
    position_balance_within: Literal["dataset", "subtask_aspect"] = Field(
        "subtask_aspect", description="Where the winners are balanced: 'dataset' over all pairwise rows at once "
        "(FRABench); 'subtask_aspect' within each prompt sub-task and aspect, so a judge cannot learn that one "
        "position wins on some kind of request (flywheel/curate/pairwise.py has the measurement).")


class JudgePairsConfig(StrictModel):
    """Minos' judge-DPO pairs: chosen = the consistent sample, rejected = the farthest sample of the same input."""

    min_delta: dict[str, float] = Field(
        {"pointwise": 2.0, "aspects": 2.0, "rubric": 0.5, "decomposed": 4.0, "pairwise": 2.0},
        description="Per protocol, the least |score(chosen) - score(rejected)| for a pair to be kept (Minos: 2 on "
                    "the 1-5 scale). Pairwise verdicts count A=+1, tie=0, B=-1, so 2 means opposite verdicts. A "
                    "protocol missing here gets no judge-DPO pairs.")


class PolicyPairsConfig(StrictModel):
    """Policy preference pairs (RLAIF-V / LLaVA-OV-Chat): best vs worst of a prompt's N samples by judge score."""

    min_margin: float = Field(1.0, ge=0.0, description="Least score(best) - score(worst) for a pair to be kept; "
                              "equal scores (ties) are always dropped.")
    protocols: list[str] | None = Field(None, description="Judgment protocols whose scores rank candidates (null: "
                                        "every single-candidate protocol with a score).")
    aspects: list[str] | None = Field(None, description="Only judgments of these aspects count (null: any aspect, "
                                      "including none).")

    @model_validator(mode="after")
    def _no_empty_filter(self):
        for name in ("protocols", "aspects"):
            if getattr(self, name) == []:
                raise ValueError(f"policy_pairs.{name}: an empty list would drop everything; use null for no filter")
        return self


class DedupConfig(StrictModel):
    prompts: bool = Field(True, description="Drop near-duplicate prompts (same task, normalised query text and "
                          "image hashes), keeping the one with the smallest prompt_id.")
    image_hash: Literal["pixels", "ahash"] = Field("pixels", description="How prompt images are compared: pixels "
                                                   "= exact decoded pixels (insensitive to PNG encoding); ahash = "
                                                   "8x8 average hash (also catches slightly altered copies).")


class CurateConfig(StrictModel):
    """Every curation knob (flywheel.curate); each function takes the part it needs."""

    seed: int = Field(0, description="Seed of every random choice in curation (down-sampling, up-sampling "
                      "remainders, which majority-side pairs are swapped); same rows + seed = same output.")
    consistency: ConsistencyConfig = Field(ConsistencyConfig(), description="Minos' consistency filter.")
    score_balance: ScoreBalanceConfig = Field(ScoreBalanceConfig(), description="Score-distribution balance.")
    claim_balance: ScoreBalanceConfig = Field(
        ScoreBalanceConfig(method="none"), description="Verdict balance of claim checks (which score_balance leaves "
        "alone): a claim's ratings (5 stated, 3 another count, 2 another colour or shape, 1 absent) balanced against "
        "each other within each prompt sub-task and claim kind (object, relation: the world's reading of the claim), "
        "on the SFT rows after the score balance (so after duplicates fold). E.g. {method: q3} evens out relations "
        "the teacher found absent four times as often as stated. Default none: claims kept as labelled.")
    subtask_rebalance: SubtaskRebalanceConfig = Field(SubtaskRebalanceConfig(), description="T2I sub-task "
                                                      "rebalance of the SFT set.")
    protocol_weights: ProtocolWeightsConfig = Field(ProtocolWeightsConfig(), description="Each protocol's share "
                                                    "of the judge SFT set, scaled after the balances.")
    pairwise: PairwiseCurateConfig = Field(PairwiseCurateConfig(), description="Swap consistency and "
                                           "winner-position balance.")
    judge_pairs: JudgePairsConfig = Field(JudgePairsConfig(), description="Judge-DPO pairs.")
    policy_pairs: PolicyPairsConfig = Field(PolicyPairsConfig(), description="Policy preference pairs.")
    dedup: DedupConfig = Field(DedupConfig(), description="Exact and near-duplicate removal.")
