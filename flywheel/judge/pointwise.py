"""Pointwise protocol (Minos, seed 003): task description + criterion + query + output (+ reference)
-> "Analysis: ...\\nRating: N" with N on a 1..5 Likert scale. Guidelines per task are data
(configs/guidelines/pointwise.yaml, flywheel.judge.guidelines).

The request is Minos' guideline prompt (Appendix H) with a "###Scoring Rubric###" section added, and its task
instance sentence ("The input image is <image>, the question is "...", the response is "..."."), generalised
to every combination of input images, query, output text, output images and reference.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from flywheel.engines.base import TextRequest, TextResult, TokenLogprobs
from flywheel.judge import base
from flywheel.judge.base import IMAGE, ParseError, strict
from flywheel.judge.guidelines import Guideline, get_guideline

NAME = "pointwise"
RATING_MIN, RATING_MAX = 1, 5

# ---------------------------------------------------------------- templates (Minos, Appendix H)
TEMPLATE = """Please act as an impartial and helpful evaluator for multimodal generation. Evaluate the quality of {name} strictly based on the given evaluation criterion.

Begin the evaluation by providing your analysis concisely and accurately, start with "Analysis:", and then on the next line, start with "Rating:" followed by your rating on a Likert scale from 1 to 5 (higher means better). You MUST keep to the strict boundaries of the evaluation criterion and focus solely on the issues and errors involved; otherwise, you will be penalized. Make sure you read and understand these instructions, as well as the following evaluation criterion carefully.

###Task Description###
{name}: {description}
###Evaluation Criterion###
{criterion}
###Scoring Rubric###
{rubric}
###Task Instance###
{instance}
###Your Evaluation###"""
RUBRIC_LINE = "{rating}: {text}"
# The task instance: one sentence, its clauses in this order, each present only when the record has it.
INSTANCE_INPUT_IMAGES = ("the input image is {slots}", "the input images are {slots}")
INSTANCE_QUERY = 'the {label} is "{text}"'
INSTANCE_OUTPUT_TEXT = 'the response is "{text}"'
INSTANCE_OUTPUT_IMAGES = ("the generated response image is {slots}", "the generated response images are {slots}")
INSTANCE_REFERENCE_TEXT = 'the reference answer is "{text}"'
INSTANCE_REFERENCE_IMAGES = ("the reference image is {slots}", "the reference images are {slots}")
# The compact style: the same task-instance sentence under a one-line header, for judges too small to read
# Minos' instructions (the embedded default's tiny judge trains on ~60-token requests instead of ~480). Same
# output format, same parser.
COMPACT_TEMPLATE = "{name}. Rate 1-5.\n{instance}"
OUTPUT = "Analysis: {analysis}\nRating: {rating}"
ANALYSIS, RATING = "Analysis", "Rating"


# ---------------------------------------------------------------- the structured judgment
@dataclass(frozen=True)
class PointwiseJudgment:
    """Minos' (a, s): the analysis (may span lines, in clean_text form) and a rating 1..5."""

    analysis: str
    rating: int

    def __post_init__(self):
        base.check_text("analysis", self.analysis, multiline=True, forbid_lines=(ANALYSIS, RATING))
        if isinstance(self.rating, bool) or not isinstance(self.rating, int):
            raise TypeError(f"rating: expected int, got {type(self.rating).__name__}")
        if not RATING_MIN <= self.rating <= RATING_MAX:
            raise ValueError(f"rating {self.rating} outside {RATING_MIN}–{RATING_MAX}")


# ---------------------------------------------------------------- build
def _clause(forms: tuple[str, str], n: int) -> str:
    return forms[n != 1].format(slots=IMAGE * n)


def instance(prompt: dict, candidate: dict, guideline: Guideline, *, use_reference: bool = True) -> tuple[str, list]:
    """Minos' task-instance sentence and the images its slots consume, in order."""
    clauses, images = [], []
    inputs = base.images_of(prompt, "images")
    if inputs:
        clauses.append(_clause(INSTANCE_INPUT_IMAGES, len(inputs)))
        images += inputs
    query = base.slot_text(prompt.get("query") or "", "query")
    if query:
        clauses.append(INSTANCE_QUERY.format(label=guideline.query_label, text=query))
    text, outs = base.output_of(candidate)
    if text is not None:
        clauses.append(INSTANCE_OUTPUT_TEXT.format(text=text))
    if outs:
        clauses.append(_clause(INSTANCE_OUTPUT_IMAGES, len(outs)))
        images += outs
    if use_reference:
        ref = prompt.get("reference_text")
        if ref:
            clauses.append(INSTANCE_REFERENCE_TEXT.format(text=base.slot_text(ref, "reference_text")))
        refs = base.images_of(prompt, "reference_images")
        if refs:
            clauses.append(_clause(INSTANCE_REFERENCE_IMAGES, len(refs)))
            images += refs
    sentence = ", ".join(clauses)
    return sentence[:1].upper() + sentence[1:] + ".", images


def build(prompt: dict, candidate: dict, guideline: Guideline | None = None, *,
          use_reference: bool = True, style: str = "minos") -> TextRequest:
    """The judge request for one candidate, in Minos' template or the compact one (base.STYLES). guideline
    defaults to the prompt's task/sub-task entry of configs/guidelines/pointwise.yaml; images: input images, then
    output images, then reference images."""
    g = guideline or get_guideline(prompt["task"], prompt.get("subtask"))
    inst, images = instance(prompt, candidate, g, use_reference=use_reference)
    if base.check_style(style) == "compact":
        return base.request(COMPACT_TEMPLATE.format(name=g.name, instance=inst), images,
                            rid=candidate.get("candidate_id"))
    rubric = "\n".join(RUBRIC_LINE.format(rating=k, text=v) for k, v in g.rubric.items())
    text = TEMPLATE.format(name=g.name, description=g.description, criterion=g.criterion, rubric=rubric,
                           instance=inst)
    return base.request(text, images, rid=candidate.get("candidate_id"))


# ---------------------------------------------------------------- format / parse
def format(j: PointwiseJudgment) -> str:  # noqa: A001 (the protocol verb)
    return OUTPUT.format(analysis=j.analysis, rating=j.rating)


_ANALYSIS_RE, _RATING_RE = base.label_re(ANALYSIS), base.label_re(RATING)


@strict
def parse(raw: str) -> PointwiseJudgment | ParseError:
    """'Analysis: <text, may span lines>' then, on the last line, 'Rating: N' with N an integer 1..5."""
    analysis, value = base.analysis_then(raw, _RATING_RE, RATING, _ANALYSIS_RE)
    rating = base.parse_int(value, RATING_MIN, RATING_MAX, "rating")
    return base.make(PointwiseJudgment, analysis, rating)


def _rating_of(token: str) -> int | None:
    t = token.strip().removesuffix(".").strip()
    return int(t) if t.isascii() and t.isdigit() and RATING_MIN <= int(t) <= RATING_MAX else None


def expected_rating(rating: int, logprobs: Sequence[TokenLogprobs]) -> float | None:
    """The mean rating under the judge's probabilities at the token where it wrote `rating` (G-Eval's
    probability-weighted score: it orders candidates that a small judge's argmax rates equal). The ratings among
    that position's top alternatives are renormalised; tokens that spell the same rating (" 4", "4") add up.
    None when no generated token spells the rating (the caller keeps the written rating)."""
    at = next((t for t in reversed(logprobs) if _rating_of(t.token) == rating), None)
    if at is None:
        return None
    mass: dict[int, float] = {}
    for token, lp in {**at.top, at.token: at.logprob}.items():
        r = _rating_of(token)
        if r is not None:
            mass[r] = mass.get(r, 0.0) + math.exp(lp)
    total = sum(mass.values())
    if total <= 0:
        return None
    # a mean of the ratings present lies between them, but not in floating point: 5 * p / p can be 5.000000000000001
    return min(max(sum(r * p for r, p in mass.items()) / total, min(mass)), max(mass))


def to_judgment_fields(x: PointwiseJudgment | ParseError, logprobs: Sequence[TokenLogprobs] | None = None) -> dict:
    """score = the rating (1..5), or with `logprobs` its expected value (expected_rating); parsed = {"rating": N}
    (+ "expected_rating"); analysis = the analysis. A parse failure stays a failure whatever the logprobs say."""
    if isinstance(x, ParseError):
        return base.error_fields(x)
    expected = expected_rating(x.rating, logprobs) if logprobs else None
    if expected is None:
        return base.fields(parsed={"rating": x.rating}, score=x.rating, analysis=x.analysis)
    return base.fields(parsed={"rating": x.rating, "expected_rating": expected}, score=expected,
                       analysis=x.analysis)


def result_fields(res: TextResult, readout: str = "text") -> dict:
    """The judgment fields of one engine result (which must be ok); readout: judge.rating_readout. A result with
    several sampled answers (judge.samples) is rated by their mean (base.mean_rating; engine errors left out)."""
    if res.samples:
        return base.mean_rating([result_fields(s, readout) for s in res.samples if s.ok])
    return to_judgment_fields(parse(res.text), res.logprobs if readout == "expected" else None)
