"""Judge protocols (DESIGN.md "Judge protocols"): build judge requests from prompt/candidate records, format the
exact texts a judge must emit (SFT targets), parse judge outputs strictly, and give judgment-record fields.

One module per protocol, each with its templates at the top:
  pointwise   Minos: guideline + instance -> "Analysis: ... / Rating: 1..5"
  pairwise    FRABench / Multimodal RewardBench: two outputs, one aspect, both orders -> "Analysis / Verdict: A|B|tie"
  aspects     UFEval: select aspects, then per-aspect "<aspect>: <feedback> Score: 1..5" (universal without query)
  rubric      UEval: rubric from query + reference, items graded true / false / not sure, score = fraction met
  decomposed  T2I: extraction -> caption + answers (no prompt) -> explanations + 0..10 scores
  claims      RLAIF-V: a description's claims, each checked against the other text -> "Analysis / Rating: 1..5"
    decomposed_samples  its six sub-task SFT sample kinds (requests, targets, build_samples, assemble); not a
                        protocol of its own, so not in PROTOCOLS
"""
from __future__ import annotations

from types import ModuleType

from flywheel.judge import aspects, claims, decomposed, decomposed_samples, pairwise, pointwise, rubric
from flywheel.judge.base import ParseError, is_error
from flywheel.judge.guidelines import Guideline, GuidelineError, Guidelines, get_guideline, load_guidelines

PROTOCOLS: dict[str, ModuleType] = {m.NAME: m for m in (pointwise, pairwise, aspects, rubric, decomposed, claims)}


def protocol(name: str) -> ModuleType:
    """The module of a protocol named in config (one of flywheel.records.PROTOCOLS)."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown judge protocol {name!r}; valid: {', '.join(PROTOCOLS)}") from None


__all__ = ["PROTOCOLS", "protocol", "ParseError", "is_error", "Guideline", "Guidelines", "GuidelineError",
           "get_guideline", "load_guidelines", "pointwise", "pairwise", "aspects", "rubric", "decomposed",
           "claims", "decomposed_samples"]
