"""Pairwise protocol (FRABench 000, Multimodal RewardBench 004): two outputs, one aspect ->
"Analysis: ...\\nVerdict: A|B|tie".

Every pair is judged in both orders (AB and BA, Multimodal RewardBench's position swap); a BA verdict is mapped
back to the AB frame, and a pair whose two verdicts disagree there is position-inconsistent (FRABench's
swap-consistency). A task aspect is judged with the query and the prompt's reference when it has one (MT-Bench's
reference-guided judge; the pointwise request shows it too); a universal aspect (one with an output modality in
the aspect tree) WITHOUT the query, its input images and its reference, as UFEval found the query makes judges
conflate correctness with quality.

Frame convention for judgment rows: candidate_ids = [A, B] in the AB frame, `order` = the order shown to the
judge, `verdict` = the verdict mapped to the AB frame (parsed keeps the verdict as emitted).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flywheel.engines.base import TextRequest, TextResult, TokenLogprobs
from flywheel.judge import base
from flywheel.judge.base import ParseError, fail, strict

NAME = "pairwise"
VERDICTS = ("A", "B", "tie")
ORDERS = ("AB", "BA")

# ---------------------------------------------------------------- templates
INTRO = """Please act as an impartial judge for multimodal generation. Compare the two responses below on one evaluation aspect only, strictly by its definition. Do not let the order in which the responses are shown or their length affect your judgment.

Begin with your analysis, start with "Analysis:", and then on the next line, start with "Verdict:" followed by A if Response A is better, B if Response B is better, or tie if they are equally good on this aspect."""
UNIVERSAL_NOTE = "\nThe query is not shown: judge the responses on this aspect alone."
TEMPLATE = """{intro}{note}

###Aspect###
{aspect}: {definition}
{query}###Response A###
{a}
###Response B###
{b}
###Your Evaluation###"""
QUERY_SECTION = "###Query###\n{query}\n"
REFERENCE_SECTION = "###Reference Answer###\n{reference}\n"
# Used when no aspect is given: the whole output, judged with the query.
OVERALL_NAME = "overall"
OVERALL_DEFINITION = "The overall quality of the response and how well it fulfils the query."
# The compact style (see pointwise.COMPACT_TEMPLATE): the same sections without the instructions.
COMPACT_TEMPLATE = "Compare A and B on {aspect}. Verdict A, B or tie.\n{query}A: {a}\nB: {b}"
COMPACT_QUERY = "Query: {query}\n"
COMPACT_REFERENCE = "Reference: {reference}\n"
OUTPUT = "Analysis: {analysis}\nVerdict: {verdict}"
ANALYSIS, VERDICT = "Analysis", "Verdict"


# ---------------------------------------------------------------- the structured judgment
@dataclass(frozen=True)
class PairwiseJudgment:
    """An analysis (may span lines, clean_text form) and a verdict A | B | tie in the order shown."""

    analysis: str
    verdict: str

    def __post_init__(self):
        base.check_text("analysis", self.analysis, multiline=True, forbid_lines=(ANALYSIS, VERDICT))
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} not in A/B/tie")


# ---------------------------------------------------------------- build
def is_universal(aspect: Any) -> bool:
    """A universal (quality) aspect of the tree has an output modality; task aspects and the root do not."""
    return aspect is not None and getattr(aspect, "modality", None) is not None


def build(prompt: dict, cand_a: dict, cand_b: dict, aspect: Any = None, *, style: str = "minos",
          use_reference: bool = True) -> TextRequest:
    """One request showing cand_a as Response A and cand_b as Response B, in the full or the compact template
    (base.STYLES). aspect: a flywheel.aspects.Aspect (anything with name, definition and modality), or None for
    overall quality with the query. With the query comes the prompt's reference (use_reference), as in the
    pointwise request: MT-Bench's reference-guided judge, for questions the judge cannot answer itself. Images:
    input images and reference images (unless universal), then A's, then B's."""
    compact = base.check_style(style) == "compact"
    name = OVERALL_NAME if aspect is None else aspect.name
    definition = OVERALL_DEFINITION if aspect is None else aspect.definition
    universal = is_universal(aspect)
    images: list = []
    query = ""
    if not universal:
        qtext, qimages = base.query_block(prompt)
        query, images = (COMPACT_QUERY if compact else QUERY_SECTION).format(query=qtext), images + qimages
        rtext, rimages = base.reference_block(prompt) if use_reference else ("", [])
        if rtext:
            query += (COMPACT_REFERENCE if compact else REFERENCE_SECTION).format(reference=rtext)
            images += rimages
    a_text, a_images = base.response_block(cand_a)
    b_text, b_images = base.response_block(cand_b)
    if compact:
        text = COMPACT_TEMPLATE.format(aspect=name, query=query, a=a_text, b=b_text)
        return base.request(text, images + a_images + b_images)
    text = TEMPLATE.format(intro=INTRO, note=UNIVERSAL_NOTE if universal else "", aspect=name,
                           definition=definition, query=query, a=a_text, b=b_text)
    return base.request(text, images + a_images + b_images)


def build_both(prompt: dict, cand_a: dict, cand_b: dict, aspect: Any = None, *,
               style: str = "minos", use_reference: bool = True) -> dict[str, TextRequest]:
    """{"AB": A shown first, "BA": B shown first}: the position swap every pair is judged with."""
    return {"AB": build(prompt, cand_a, cand_b, aspect, style=style, use_reference=use_reference),
            "BA": build(prompt, cand_b, cand_a, aspect, style=style, use_reference=use_reference)}


# ---------------------------------------------------------------- verdict frames
def _check_verdict(v: str) -> str:
    if v not in VERDICTS:
        raise ValueError(f"verdict {v!r} not in A/B/tie")
    return v


def to_ab(verdict: str, order: str) -> str:
    """A verdict emitted for a request shown in `order`, expressed in the AB frame (BA: A<->B, tie stays)."""
    _check_verdict(verdict)
    if order not in ORDERS:
        raise ValueError(f"order {order!r} not in AB/BA")
    return verdict if order == "AB" or verdict == "tie" else {"A": "B", "B": "A"}[verdict]


def position_consistent(verdict_ab: str, verdict_ba: str) -> bool:
    """True when the verdict of the AB request and the verdict of the BA request, each as emitted in its own
    order, name the same candidate (or both say tie)."""
    return _check_verdict(verdict_ab) == to_ab(verdict_ba, "BA")


def combine(verdict_ab: str, verdict_ba: str) -> str | None:
    """The AB-frame verdict both orders agree on, or None when position-inconsistent."""
    return verdict_ab if position_consistent(verdict_ab, verdict_ba) else None


# ---------------------------------------------------------------- format / parse
def format(j: PairwiseJudgment) -> str:  # noqa: A001
    return OUTPUT.format(analysis=j.analysis, verdict=j.verdict)


_ANALYSIS_RE, _VERDICT_RE = base.label_re(ANALYSIS), base.label_re(VERDICT)
_VERDICT_WORDS = {"a": "A", "b": "B", "tie": "tie"}


@strict
def parse(raw: str) -> PairwiseJudgment | ParseError:
    """'Analysis: <text, may span lines>' then, on the last line, 'Verdict: A|B|tie' (any case)."""
    analysis, value = base.analysis_then(raw, _VERDICT_RE, VERDICT, _ANALYSIS_RE)
    word = value.strip()
    key = word[:-1].rstrip() if word.endswith(".") else word
    if not key:
        fail("empty verdict")
    if key.lower() not in _VERDICT_WORDS:
        fail(f"verdict {word!r} not in A/B/tie")
    return base.make(PairwiseJudgment, analysis, _VERDICT_WORDS[key.lower()])


def _verdict_of(token: str) -> str | None:
    t = token.strip().removesuffix(".").strip().lower()
    return _VERDICT_WORDS.get(t)


def verdict_probs(verdict: str, logprobs: Sequence[TokenLogprobs]) -> dict[str, float] | None:
    """The judge's probabilities of A, B and tie at the token where it wrote `verdict` (as emitted), renormalised
    among that position's top alternatives that spell a whole verdict (" A", "A" and "A." add up; a tie spelt in
    several tokens is not seen, so its mass is left out). None when no generated token spells the verdict."""
    at = next((t for t in reversed(logprobs) if _verdict_of(t.token) == verdict), None)
    if at is None:
        return None
    mass = dict.fromkeys(VERDICTS, 0.0)
    for token, lp in {**at.top, at.token: at.logprob}.items():
        v = _verdict_of(token)
        if v is not None:
            mass[v] += math.exp(lp)
    total = sum(mass.values())
    return {v: p / total for v, p in mass.items()} if total > 0 else None


def balanced_verdict(probs_ab: dict[str, float] | None, probs_ba: dict[str, float] | None) -> str | None:
    """One AB-frame verdict from both orders' verdict probabilities (each as emitted in its own order): the
    argmax of their mean once the BA order's A and B are swapped back. Wang et al. 2023 ("Large Language Models
    are not Fair Evaluators") call this balanced position calibration: a position preference adds the same mass
    to A in one order and to B in the other, so it cancels, and what is left is how much more the judge prefers
    one response wherever it sits. The verdict cannot flip under the swap. None without both orders' probabilities
    (an unparsed order, or an engine without log-probabilities); an exact draw is a tie."""
    if probs_ab is None or probs_ba is None:
        return None
    mean = {"A": (probs_ab["A"] + probs_ba["B"]) / 2, "B": (probs_ab["B"] + probs_ba["A"]) / 2,
            "tie": (probs_ab["tie"] + probs_ba["tie"]) / 2}
    best = max(mean.values())
    winners = [v for v, p in mean.items() if p == best]
    return winners[0] if len(winners) == 1 else "tie"


def to_judgment_fields(x: PairwiseJudgment | ParseError, order: str,
                       logprobs: Sequence[TokenLogprobs] | None = None) -> dict:
    """verdict = the verdict in the AB frame of candidate_ids; parsed = {"verdict": as emitted, "order"} (+
    "verdict_probs", as emitted, with `logprobs`: verdict_probs); score stays null (a preference, not a rating).
    A parse failure stays a failure whatever the logprobs say."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r} not in AB/BA")
    if isinstance(x, ParseError):
        return base.error_fields(x)
    parsed: dict[str, Any] = {"verdict": x.verdict, "order": order}
    probs = verdict_probs(x.verdict, logprobs) if logprobs else None
    if probs is not None:
        parsed["verdict_probs"] = probs
    return base.fields(parsed=parsed, verdict=to_ab(x.verdict, order), analysis=x.analysis)


def result_fields(res: TextResult, order: str, readout: str = "text") -> dict:
    """The judgment fields of one engine result (which must be ok); readout: judge.rating_readout (expected
    also records the verdict's probabilities, which balanced_verdict combines across both orders). A result with
    several sampled answers (judge.samples) gives their vote (voted; engine errors left out)."""
    if res.samples:
        return voted([result_fields(s, order, readout) for s in res.samples if s.ok], order)
    return to_judgment_fields(parse(res.text), order, res.logprobs if readout == "expected" else None)


def voted(each: Sequence[dict], order: str) -> dict:
    """One verdict from the judgment fields of several sampled answers to one request: the verdict most parsed
    samples gave, a tie when two verdicts draw; the analysis of the first sample that gave it; parsed
    ["sample_verdicts"] = each sample's AB-frame verdict (None: it did not parse) and "verdict_probs" the mean of
    the samples' that have them. No sample parsed: the first sample's parse error."""
    parsed = [f for f in each if f["parse_error"] is None]
    if not parsed:
        return each[0]
    counts = Counter(f["verdict"] for f in parsed)
    top = max(counts.values())
    winners = [v for v, c in counts.items() if c == top]
    verdict = winners[0] if len(winners) == 1 else "tie"
    lead = next((f for f in parsed if f["verdict"] == verdict), parsed[0])
    out = {"verdict": to_ab(verdict, order), "order": order,  # as emitted: to_ab is its own inverse
           "sample_verdicts": [f["verdict"] for f in each]}
    probs = [f["parsed"]["verdict_probs"] for f in parsed if "verdict_probs" in f["parsed"]]
    if probs:
        out["verdict_probs"] = {v: sum(p.get(v, 0.0) for p in probs) / len(probs) for v in VERDICTS}
    return base.fields(parsed=out, verdict=verdict, analysis=lead["analysis"])
