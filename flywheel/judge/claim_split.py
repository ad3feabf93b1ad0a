"""The claims protocol's divide step (RLAIF-V): a model lists the atomic claims of a text, one per line.

`judgments.claim_splitter: judge` asks the judging engine (the teacher when labelling, the judge when it rates)
for the claims of a response and of its reference before they are checked one by one (flywheel/judge/claims.py).
The oracle world's own parser (`world`) needs no model but reads only that world's text; real captions need this.

Output format: a "Claims:" line, then one "- <claim>" line per claim, or "Claims: none". The parser takes the
last "Claims:" block (a model may think before it), accepts "1." / "*" bullets, drops repeated claims, and
refuses anything else by name: an empty list, a claim too long to be atomic, or no block at all. A refused split
is a parse failure of its candidate's claim checks, never a guess at its claims.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flywheel.engines.base import TextRequest, TextResult
from flywheel.judge import base, claims
from flywheel.judge.base import ParseError, fail, strict

NONE = "none"
MAX_CLAIM_CHARS = 200  # one fact is a short sentence; a longer "claim" is a paragraph the checks cannot rate
COMPACT_TEMPLATE = "Claims of the text.\n{instance}"
TEMPLATE = (  # the long style, for judges that read instructions (a GPU judge)
    "Please split the text into atomic claims: short, self-contained statements of one fact each (one object and "
    "one of its attributes, a count, or a relation), in the text's own words, leaving nothing out and adding "
    "nothing.\n\n"
    'Write "Claims:" on a line of its own, then one claim per line starting with "- ". If the text states no '
    'fact, write "Claims: none".\n'
    """###Text###
{instance}
###Your Claims###""")
HEADER = "claim split: {side}"
_BLOCK_RE = re.compile(r"^claims:\s*(.*)$", re.IGNORECASE)
_ITEM_RE = re.compile(r"^(?:[-*\u2022]|\d+[.)])\s+(.*)$")


def build(text: str, *, style: str = "compact", rid: str | None = None) -> TextRequest:
    """The request listing the claims of `text` (text only: what a text claims is read from its words)."""
    template = COMPACT_TEMPLATE if base.check_style(style) == "compact" else TEMPLATE
    return base.request(template.format(instance=base.slot_text(text, "text")), [], rid=rid)


def format(claims: Sequence[str]) -> str:  # noqa: A001 (the protocol verb)
    """An answer the parser accepts (the oracle teacher's, and the tests')."""
    return "Claims:\n" + "\n".join(f"- {c}" for c in claims) if claims else f"Claims: {NONE}"


@strict
def parse(raw: str) -> list[str] | ParseError:
    """The claims of a split answer, in order, repeats dropped; `[]` for "Claims: none"."""
    lines = base.nonblank(raw)
    starts = [i for i, ln in enumerate(lines) if _BLOCK_RE.match(ln)]
    if not starts:
        fail('no "Claims:" line')
    head = _BLOCK_RE.match(lines[starts[-1]]).group(1).strip()
    if head:
        if head.rstrip(".").lower() != NONE:
            fail(f'"Claims:" is followed by {head[:40]!r} on its line, not by a list or "none"')
        return []
    claims: list[str] = []
    for ln in lines[starts[-1] + 1:]:
        m = _ITEM_RE.match(ln)
        if not m:
            break  # the list ends at its first line that is not an item (a model's closing remark)
        claim = base.one_line(m.group(1)).strip()
        if not claim:
            fail("an empty claim")
        if len(claim) > MAX_CLAIM_CHARS:
            fail(f"a claim of {len(claim)} characters (at most {MAX_CLAIM_CHARS}): not one fact")
        if claim not in claims:
            claims.append(claim)
    if not claims:
        fail('"Claims:" lists no claim (write "Claims: none" for a text without one)')
    return claims


def raw_output(side: str, text: str) -> str:
    """The raw output of a failed split's row: a header naming whose text was split, then the model's text."""
    return f"{HEADER.format(side=side)}\n{text.strip()}"


def sides(prompt: dict, candidate: dict) -> list[tuple[str, str]]:
    """(side, text) of the texts a candidate's claim checks need split: the reference's, then the response's,
    those that have text."""
    pairs = ((claims.RECALL, prompt.get("reference_text")), (claims.PRECISION, base.output_of(candidate)[0]))
    return [(side, text) for side, text in pairs if text]


@dataclass(frozen=True)
class Outcome:
    """What the split answers of one candidate's texts give: their claims, or why there are none."""

    claims: dict[str, list[str]] = field(default_factory=dict)  # text -> its claims, when every list parsed
    engine_error: str | None = None  # "the reference's claims: <error>": the engine failed on a side
    unparsed: ParseError | None = None  # a side's list that did not parse: raw_output(side, answer), "split: ..."


def read(text_sides: Sequence[tuple[str, str]], answers: Mapping[str, TextResult]) -> Outcome:
    """The outcome of splitting `text_sides` (from sides()), given the engine's answer for each text; an engine
    error is reported before a list that does not parse."""
    for side, text in text_sides:
        if not answers[text].ok:
            return Outcome(engine_error=f"the {side}'s claims: {answers[text].error}")
    got: dict[str, list[str]] = {}
    for side, text in text_sides:
        parsed = parse(answers[text].text)
        if isinstance(parsed, ParseError):
            raw = raw_output(side, answers[text].text)
            return Outcome(unparsed=ParseError(raw, f"split: {parsed.reason}"))
        got[text] = parsed
    return Outcome(claims=got)
