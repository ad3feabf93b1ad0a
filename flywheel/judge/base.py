"""What the five judge protocols share: the ParseError result, text normalisation, strict-parse plumbing,
request assembly from templates with image slots, and the judgment-record fields.

Conventions every protocol module follows (see flywheel/judge/__init__.py):
- templates are module-level constants at the top of each protocol module, nowhere else;
- `build*` turn record dicts (prompt / candidate, see flywheel.records) into `TextRequest`s;
- `format*` turn a structured judgment into EXACTLY the text a trained judge must emit (SFT targets);
- `parse*` are strict inverses: text -> structured judgment, or a `ParseError` naming what is wrong. They
  tolerate only harmless whitespace (CRLF, indentation, trailing spaces, blank lines) and the case of labels
  and keywords; they never default, clamp or guess. `parse(format(x)) == x` for every valid x;
- `to_judgment_fields` gives the judgment-record fields parsed / score / verdict / parse_error / analysis.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from flywheel.engines.base import TextRequest

# An image slot inside a rendered template. A private-use character, so no real text collides with it;
# text from records that contains it is refused (see slot_text).
IMAGE = "\ue000"

# Labels of the shared query / response blocks (pairwise, aspects, rubric grading).
INPUT_IMAGE_LABEL = ("Input image: ", "Input images: ")  # singular, plural
REFERENCE_IMAGE_LABEL = ("Reference image: ", "Reference images: ")
TEXT_LABEL = "Text: "
IMAGE_LABEL = ("Image: ", "Images: ")
NO_TEXT = "(no text)"


# ---------------------------------------------------------------- the parse result
@dataclass(frozen=True)
class ParseError:
    """A judge output that does not parse: the raw text and a clear reason. Never an exception: stages write
    it into the judgment row (parse_error) and count it."""

    raw: str
    reason: str

    def __str__(self) -> str:
        return f"parse error: {self.reason}"


def is_error(x: Any) -> bool:
    return isinstance(x, ParseError)


class _Fail(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def fail(reason: str) -> NoReturn:
    """Abort a parse with this reason (caught by @strict and turned into a ParseError)."""
    raise _Fail(reason)


def strict(fn: Callable) -> Callable:
    """Decorator for parse functions `fn(raw: str, ...)`: returns ParseError instead of raising."""

    @functools.wraps(fn)
    def wrapper(raw: Any, *args, **kwargs):
        if not isinstance(raw, str):
            return ParseError("" if raw is None else repr(raw), f"output is not text ({type(raw).__name__})")
        if not raw.strip():
            return ParseError(raw, "empty output")
        try:
            return fn(raw, *args, **kwargs)
        except _Fail as e:
            return ParseError(raw, e.reason)

    return wrapper


# ---------------------------------------------------------------- text normalisation
def lines_of(raw: str) -> list[str]:
    """The lines of a judge output with harmless whitespace removed (CRLF, indentation, trailing blanks)."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n").strip()
    return [ln.strip() for ln in text.split("\n")]


def nonblank(raw: str) -> list[str]:
    return [ln for ln in lines_of(raw) if ln]


def clean_text(s: str) -> str:
    """Canonical multi-line text: what a parser returns for it (lines stripped, outer blank lines dropped)."""
    return "\n".join(lines_of(s))


def one_line(s: str) -> str:
    """Collapse any whitespace run (newlines included) to one space: the form one-line fields need."""
    return " ".join(s.split())


def label_re(label: str) -> re.Pattern:
    """`Label:` at the start of a line, any case, optional spaces before the colon; group 1 = the rest."""
    words = r"\s+".join(map(re.escape, label.split()))
    return re.compile(rf"^{words}\s*:\s*(.*)$", re.IGNORECASE)


def analysis_then(raw: str, final_re: re.Pattern, final: str, analysis_re: re.Pattern) -> tuple[str, str]:
    """Split 'Analysis: <text, may span lines>' + a last line '<final>: <value>' (pointwise, pairwise): returns
    (analysis, value as written). Call inside a @strict parser: a deviation fails with its reason."""
    lines = nonblank(raw)
    finals = [i for i, ln in enumerate(lines) if final_re.match(ln)]
    analyses = [i for i, ln in enumerate(lines) if analysis_re.match(ln)]
    if not finals:
        fail(f"no '{final}:' line")
    if len(finals) > 1:
        fail(f"{len(finals)} '{final}:' lines, expected 1")
    if not analyses:
        fail("no 'Analysis:' line")
    if len(analyses) > 1:
        fail(f"{len(analyses)} 'Analysis:' lines, expected 1")
    if analyses[0] != 0:
        fail("text before 'Analysis:'")
    if finals[0] != len(lines) - 1:
        fail(f"text after the '{final}:' line")
    body = lines_of(raw)  # keep blank lines inside the analysis
    start = next(i for i, ln in enumerate(body) if analysis_re.match(ln))
    end = next(i for i, ln in enumerate(body) if final_re.match(ln))
    analysis = clean_text("\n".join([analysis_re.match(body[start]).group(1), *body[start + 1:end]]))
    if not analysis:
        fail("empty analysis")
    return analysis, final_re.match(body[end]).group(1)


def inline_re(label: str) -> re.Pattern:
    """`Label:` anywhere as a word (so 'helmet:' does not contain 'met:')."""
    return re.compile(rf"\b{re.escape(label)}\s*:", re.IGNORECASE)


def check_text(name: str, value: Any, *, multiline: bool = False, forbid_lines: Sequence[str] = (),
               forbid_inline: Sequence[str] = ()) -> None:
    """Validate a free-text field of a structured judgment so that format -> parse reproduces it exactly.

    The value must be non-empty and already in canonical form (clean_text, or one_line unless multiline);
    forbid_lines: labels no line may start with; forbid_inline: labels that may not occur at all.
    Raises ValueError naming the field; use clean_text / one_line to build valid values.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{name}: empty")
    if IMAGE in value:
        raise ValueError(f"{name}: contains the reserved image marker U+E000")
    if multiline:
        if value != clean_text(value):
            raise ValueError(f"{name}: not in canonical form (pass it through clean_text()): {value!r}")
    elif value != one_line(value):
        raise ValueError(f"{name}: must be one line with single spaces (pass it through one_line()): {value!r}")
    for label in forbid_lines:
        if any(label_re(label).match(ln) for ln in value.split("\n")):
            raise ValueError(f"{name}: a line starts with the reserved label '{label}:'")
    for label in forbid_inline:
        if inline_re(label).search(value):
            raise ValueError(f"{name}: contains the reserved label '{label}:'")


def make(cls: type, *args: Any) -> Any:
    """Construct a structured judgment inside a parser: a failed validation becomes the parse's reason."""
    try:
        return cls(*args)
    except (ValueError, TypeError) as e:
        fail(str(e))


def parse_int(text: str, lo: int, hi: int, what: str, of: str = "") -> int:
    """An integer in [lo, hi] written as digits (one trailing period allowed: 'Rating: 4.' as in Minos).
    Reasons read "<what> 7<of> outside 1–5", e.g. what="score", of=" for 'fluency'"."""
    t = text.strip()
    if t.endswith("."):
        t = t[:-1].rstrip()
    if not t:
        fail(f"empty {what}{of}")
    if not re.fullmatch(r"[+-]?\d+", t):
        fail(f"{what} {text.strip()!r}{of} is not an integer {lo}–{hi}")
    v = int(t)
    if not lo <= v <= hi:
        fail(f"{what} {v}{of} outside {lo}–{hi}")
    return v


def count_word(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------- records -> request pieces
def slot_text(s: Any, what: str = "text") -> str:
    """Record text safe to put into a template (never contains an image slot)."""
    if not isinstance(s, str):
        raise TypeError(f"{what}: expected str, got {type(s).__name__}")
    if IMAGE in s:
        raise ValueError(f"{what} contains the reserved image marker U+E000")
    return s


def images_of(record: dict, key: str) -> list:
    imgs = record.get(key)
    return [] if imgs is None else list(imgs)


def output_of(candidate: dict) -> tuple[str | None, list]:
    """(output_text, output_images) of a candidate record; one of them must be present."""
    text, images = candidate.get("output_text"), images_of(candidate, "output_images")
    if text is None and not images:
        raise ValueError(f"candidate {candidate.get('candidate_id')!r} has neither output_text nor output_images")
    return (None if text is None else slot_text(text, "output_text")), images


def output_modality(candidate: dict) -> str:
    """'text', 'image' or 'image-text' (the aspect tree's modalities) from what the candidate holds."""
    text, images = output_of(candidate)
    return "image-text" if text is not None and images else ("image" if images else "text")


def image_line(labels: tuple[str, str], n: int) -> str:
    return labels[n != 1] + IMAGE * n


def query_block(prompt: dict) -> tuple[str, list]:
    """The query text, then its input images (IU, editing) on a line of their own."""
    text, images = slot_text(prompt.get("query") or "", "query"), images_of(prompt, "images")
    lines = [text] if text else []
    if images:
        lines.append(image_line(INPUT_IMAGE_LABEL, len(images)))
    return "\n".join(lines), images


def reference_block(prompt: dict) -> tuple[str, list]:
    """The prompt's reference answer text, then its reference images on a line of their own ("" when none)."""
    text = slot_text(prompt.get("reference_text") or "", "reference_text")
    images = images_of(prompt, "reference_images")
    lines = [text] if text else []
    if images:
        lines.append(image_line(REFERENCE_IMAGE_LABEL, len(images)))
    return "\n".join(lines), images


def response_block(candidate: dict) -> tuple[str, list]:
    """A candidate's output: bare text; or 'Image(s): <slots>'; or both labelled (ITIG)."""
    text, images = output_of(candidate)
    if not images:
        return text, []
    if text is None:
        return image_line(IMAGE_LABEL, len(images)), images
    return f"{TEXT_LABEL}{text}\n{image_line(IMAGE_LABEL, len(images))}", images


# How the pointwise and pairwise protocols render a request: Minos' full instructions and rubric, or a compact
# header over the same fields (for tiny judges). The multi-step protocols have one style.
STYLES = ("minos", "compact")


def check_style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"prompt style {style!r} not in {'/'.join(STYLES)}")
    return style


def request(text: str, images: Sequence[Any], *, rid: str | None = None) -> TextRequest:
    """One user message from rendered template text; each IMAGE slot becomes an image part, in order."""
    return TextRequest(messages=[{"role": "user", "content": content_parts(text, len(images))}],
                       images=list(images), id=rid)


def content_parts(text: str, n_images: int) -> list[dict]:
    pieces = text.split(IMAGE)
    if len(pieces) - 1 != n_images:
        raise ValueError(f"template has {len(pieces) - 1} image slot(s) but {n_images} image(s) were given")
    parts: list[dict] = []
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def with_target(req: TextRequest, target: str) -> TextRequest:
    """An SFT example: the request's messages plus the assistant turn the judge must learn to emit."""
    return TextRequest(messages=[*req.messages, {"role": "assistant", "content": [{"type": "text", "text": target}]}],
                       images=list(req.images), id=req.id)


def render(req: TextRequest, image_token: str = "<image>") -> str:
    """Readable text of a request (image parts shown as image_token): for logs, galleries and tests."""
    out = []
    for m in req.messages:
        content = m["content"]
        body = content if isinstance(content, str) else "".join(
            p.get("text", "") if p.get("type") == "text" else image_token for p in content)
        out.append(f"[{m['role']}]\n{body}")
    return "\n".join(out)


# ---------------------------------------------------------------- judgment-record fields
FIELDS = ("parsed", "score", "verdict", "parse_error", "analysis")


def fields(*, parsed: Any = None, score: float | None = None, verdict: str | None = None,
           analysis: str | None = None) -> dict:
    return {"parsed": parsed, "score": None if score is None else float(score), "verdict": verdict,
            "parse_error": None, "analysis": analysis}


def error_fields(err: ParseError) -> dict:
    return {"parsed": None, "score": None, "verdict": None, "parse_error": err.reason, "analysis": None}


# ---------------------------------------------------------------- several sampled answers (judge.samples)
def mean_rating(each: Sequence[dict]) -> dict:
    """One rating from the judgment fields of several sampled answers to one request: the first parsed sample's
    fields with score = the mean of the parsed samples' scores, and parsed["sample_scores"] = each sample's score
    (None: it did not parse). No sample parsed: the first sample's parse error (never a made-up score)."""
    parsed = [f for f in each if f["parse_error"] is None]
    if not parsed:
        return each[0]
    lead = parsed[0]
    score = sum(f["score"] for f in parsed) / len(parsed)
    return {**lead, "score": score, "parsed": {**lead["parsed"], "sample_scores": [f["score"] for f in each]}}
