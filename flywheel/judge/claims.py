"""Claim checks (RLAIF-V, seed 005, "divide-and-conquer"): rate a descriptive response by its claims, one request each.

A weak judge checks one short claim far better than a whole caption: the tiny judge ranks colour, count and
existence answers nearly perfectly and captions near chance (docs/results.md). So a caption is split into atomic
claims (a splitter supplied by the caller: the world's parser here, an LLM on a cluster), and the judge rates each
claim against a text: the response's claims against the prompt's reference (are they right?) and the reference's
claims against the response (is anything missed?). The response's score is 1 + 4 x the mean credit of all its
claims, where a claim's credit is (rating - 1) / 4: the scale of a pointwise rating, so it ranks with them.

The output format is the pointwise protocol's ("Analysis: ...\\nRating: N"), parsed by its strict parser. Each
claim is a judgment row of its own (its raw output headed by the claim, `raw_output`), so the teacher's k samples
of one claim are compared with each other and each claim is an SFT row; a response's score is read from its
rows (`candidate_scores`), and one claim that does not parse makes it a failure, never a guess.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from flywheel.engines.base import TextRequest, TextResult, TokenLogprobs
from flywheel.judge import base, pointwise
from flywheel.judge.base import IMAGE

NAME = "claims"
PRECISION, RECALL = "response", "reference"  # whose claims are checked (against the other text)
COMPACT_TEMPLATE = "Claim check. Rate 1-5.\n{instance}"
TEMPLATE = (  # the long style, for judges that read instructions (a GPU judge); the rating scale spelled out
    "Please act as an impartial evaluator. Decide whether the text states the claim, strictly from the text.\n\n"
    'Begin with your analysis, concisely, starting with "Analysis:", then on the next line "Rating:" followed by '
    "a rating from 1 to 5: 5 the text states the claim, 3 it states it with another number, 2 it states it with "
    "another colour or shape, 1 it states nothing like it.\n"
    """###Task Instance###
{instance}
###Your Evaluation###""")
INSTANCE_IMAGES = ("the input image is {slots}", "the input images are {slots}")
INSTANCE = 'the claim is "{claim}", the text is "{text}"'
HEADER = "{side} claim: {claim}"
_HEADER_RE = re.compile(rf"^({PRECISION}|{RECALL}) claim: ")


@dataclass(frozen=True)
class ClaimCheck:
    """One claim to check: whose it is (PRECISION: the response's, RECALL: the reference's), its words, the text
    it is checked against, and the request."""

    side: str
    claim: str
    against: str
    request: TextRequest
    with_images: bool = True  # False: the prompt's images were left out of the request (judgments.claim_images)


def build(claim: str, against: str, images: Sequence = (), *, style: str = "compact",
          rid: str | None = None) -> TextRequest:
    """The request checking `claim` against `against`, with the prompt's input images (a judge may look)."""
    clauses = [INSTANCE_IMAGES[len(images) != 1].format(slots=IMAGE * len(images))] if images else []
    clauses.append(INSTANCE.format(claim=base.slot_text(claim, "claim"), text=base.slot_text(against, "text")))
    sentence = ", ".join(clauses)
    template = COMPACT_TEMPLATE if base.check_style(style) == "compact" else TEMPLATE
    return base.request(template.format(instance=sentence[:1].upper() + sentence[1:] + "."), list(images), rid=rid)


def checks(prompt: dict, candidate: dict, split: Callable[[str], Sequence[str]], *,
           style: str = "compact", with_images: bool = True,
           context: Callable[[str, str], str] | None = None) -> list[ClaimCheck]:
    """The claim checks of one response: its claims against the prompt's reference, the reference's against it.
    Empty when the prompt has no reference text or the response no text (the caller judges it otherwise).
    with_images=False leaves the prompt's images out of the requests (judgments.claim_images); context(claim, text)
    narrows the text a claim is checked against (judgments.claim_context; None: the whole text)."""
    reference, (text, _) = prompt.get("reference_text"), base.output_of(candidate)
    if not reference or text is None:
        return []
    images = base.images_of(prompt, "images") if with_images else []
    rid = candidate.get("candidate_id")

    def check(side: str, claim: str, against: str) -> ClaimCheck:
        against = context(claim, against) if context else against
        return ClaimCheck(side, claim, against, build(claim, against, images, style=style, rid=rid), with_images)

    return [check(PRECISION, c, reference) for c in split(text)] + [check(RECALL, c, text) for c in split(reference)]


def request_images(prompt: dict, parsed: Mapping) -> list:
    """The images a claim row's request carried, from its prompt and its parsed fields (`fields`): none when the
    check was asked without them."""
    return base.images_of(prompt, "images") if parsed.get("with_images", True) else []


def raw_output(check: ClaimCheck, text: str) -> str:
    """A claim row's raw output: a header naming the claim (so each claim's row is its own record, as the
    decomposed protocol prefixes its steps), then the judge's text."""
    return f"{HEADER.format(side=check.side, claim=check.claim)}\n{text.strip()}"


def header(raw: str | None) -> str | None:
    """The claim a claim row's raw output is headed by (its first line), None when it has no header."""
    first = (raw or "").partition("\n")[0]
    return first if _HEADER_RE.match(first) else None


def judge_text(raw: str) -> str:
    """The judge's own text of a claim row's raw output (raw_output without its header)."""
    first, _, rest = raw.partition("\n")
    if not _HEADER_RE.match(first):
        raise ValueError(f"not a claim row's output (no header): {first[:60]!r}")
    return rest


def to_judgment_fields(x: pointwise.PointwiseJudgment | base.ParseError,
                       logprobs: Sequence[TokenLogprobs] | None = None) -> dict:
    """A claim's judgment fields from its parsed output: a claim is rated as a pointwise response is."""
    return pointwise.to_judgment_fields(x, logprobs)


def fields(check: ClaimCheck, res: TextResult, readout: str = "text") -> dict:
    """The judgment fields of one claim check (its result ok): the pointwise fields of the judge's text, with
    parsed naming the claim; parsed["group"] keeps a candidate's claims apart as items (flywheel/curate)."""
    f = pointwise.result_fields(res, readout)
    if f["parse_error"] is not None:
        return f
    # with_images is recorded only when False, so rows asked as before any choice existed read as they did
    f["parsed"] = {"group": f"{check.side}: {check.claim}", "side": check.side, "claim": check.claim,
                   "against": check.against, **({} if check.with_images else {"with_images": False}), **f["parsed"]}
    return f


def candidate_scores(rows: Iterable[Mapping]) -> dict[tuple[str, str], float | None]:
    """(prompt_id, candidate_id) -> the score of its claim rows (one sample each: a judge's, not the teacher's
    k), None when one of them failed to parse."""
    ratings: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    for r in rows:
        if r["protocol"] == NAME:
            ok = r.get("parse_error") is None and r.get("score") is not None
            ratings[(r["prompt_id"], r["candidate_ids"][0])].append(float(r["score"]) if ok else None)
    return {k: score(v) for k, v in ratings.items()}


ROUNDING = 1e-9  # an expected rating a hair past the scale (5.000000000000001) is rounding, not a wrong rating


def credit(rating: float) -> float:
    """A claim's credit 0..1 from its (expected) rating 1..5."""
    lo, hi = pointwise.RATING_MIN, pointwise.RATING_MAX
    if not lo - ROUNDING <= rating <= hi + ROUNDING:
        raise ValueError(f"claim rating {rating} outside {lo}-{hi}")
    return min(max((rating - lo) / (hi - lo), 0.0), 1.0)


def score(ratings: Sequence[float | None]) -> float | None:
    """A response's score 1..5 from its claims' ratings; None when it has no claims or one failed to parse."""
    if not ratings or any(r is None for r in ratings):
        return None
    return pointwise.RATING_MIN + (pointwise.RATING_MAX - pointwise.RATING_MIN) * (
        sum(credit(r) for r in ratings) / len(ratings))
