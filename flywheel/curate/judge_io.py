"""What a judge saw and what it must emit, for a judgment row: the request (passed in, or rebuilt with the
protocol's builder from the prompt and candidate rows) and the canonical target text (the row's raw output
parsed and formatted again by the protocol, so targets never carry a teacher's stray whitespace or casing).

Rebuilt requests: pointwise (guideline of the prompt's task/sub-task), pairwise (the order shown: BA rows show
candidate_ids[1] first; the aspect looked up in the aspect tree), aspects (the row's request group, from
UFEval step 1 on the aspect tree). Rubric grading needs the rubric and the decomposed protocol is trained on its
six sub-task samples (flywheel.curate.sft), so those need `requests` passed in for a single request.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flywheel.engines.base import TextRequest
from flywheel.judge import aspects as ap
from flywheel.judge import claims as cl
from flywheel.judge import decomposed as dc
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.judge import rubric as rb
from flywheel.judge.base import ParseError, nonblank
from flywheel.curate.report import as_json


class Unavailable(Exception):
    """No request or target for a row; `reason` is the FilterReport reason it is counted under."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def by_id(rows: Iterable[dict] | Mapping[str, dict] | None, key: str) -> dict[str, dict]:
    if rows is None:
        return {}
    if isinstance(rows, Mapping):
        return dict(rows)
    return {r[key]: r for r in rows}


@dataclass
class JudgeContext:
    """Rows a judgment refers to, plus what rebuilding its request needs. `requests` (judgment_id -> the request
    the judge saw) wins over rebuilding; tree / guidelines default to the repository's config files."""

    prompts: dict[str, dict]
    candidates: dict[str, dict]
    requests: Mapping[str, TextRequest] = field(default_factory=dict)
    tree: Any = None  # flywheel.aspects.AspectTree
    guidelines: Any = None  # flywheel.judge.guidelines.Guidelines
    style: str = "minos"  # the prompt style rebuilt requests are rendered in (config judge.prompt_style)

    @classmethod
    def of(cls, prompts, candidates, requests=None, tree=None, guidelines=None, style="minos") -> JudgeContext:
        """prompts / candidates as lists of rows or mappings id -> row."""
        return cls(by_id(prompts, "prompt_id"), by_id(candidates, "candidate_id"), dict(requests or {}), tree,
                   guidelines, style)

    def aspect_tree(self):
        if self.tree is None:
            from flywheel.aspects import AspectTree
            self.tree = AspectTree.load()
        return self.tree

    def rows_of(self, row: dict) -> tuple[dict, list[dict]]:
        prompt = self.prompts.get(row["prompt_id"])
        if prompt is None:
            raise Unavailable("missing_prompt", row["prompt_id"])
        cands = []
        for cid in row["candidate_ids"]:
            if cid not in self.candidates:
                raise Unavailable("missing_candidate", cid)
            cands.append(self.candidates[cid])
        return prompt, cands


def group_of(row: dict) -> str | None:
    parsed = as_json(row.get("parsed"))
    g = parsed.get("group") if isinstance(parsed, dict) else None
    return g if isinstance(g, str) else None


def judge_request(row: dict, ctx: JudgeContext) -> TextRequest:
    """The request the judge answered with this row's raw output (passed in, or rebuilt); Unavailable if
    neither is possible."""
    jid = row.get("judgment_id")
    if jid is not None and jid in ctx.requests:
        return ctx.requests[jid]
    prompt, cands = ctx.rows_of(row)
    proto = row["protocol"]
    try:
        if proto == pt.NAME:
            g = ctx.guidelines.get(prompt["task"], prompt.get("subtask")) if ctx.guidelines is not None else None
            return pt.build(prompt, cands[0], g, style=ctx.style)
        if proto == pw.NAME:
            a, b = cands if row["order"] == "AB" else cands[::-1]
            name = row.get("aspect")
            aspect = None if name is None else ctx.aspect_tree().aspects.get(name)
            if name is not None and aspect is None:
                raise Unavailable("unknown_aspect", name)
            return pw.build(prompt, a, b, aspect, style=ctx.style)
        if proto == ap.NAME:
            group = group_of(row)
            if group is None:
                raise Unavailable("no_request", "aspects row without parsed.group")
            reqs = ap.build(prompt, cands[0], ap.select(ctx.aspect_tree(), prompt, cands[0]))
            if group not in reqs:
                raise Unavailable("no_request", f"no {group} aspects for this prompt")
            return reqs[group]
        if proto == cl.NAME:
            parsed = as_json(row.get("parsed"))
            if not isinstance(parsed, dict) or not {"claim", "against"} <= set(parsed):
                raise Unavailable("no_request", "claims row without parsed claim and against")
            return cl.build(parsed["claim"], parsed["against"], cl.request_images(prompt, parsed), style=ctx.style)
    except (ValueError, TypeError, KeyError) as e:  # GuidelineError / AspectError are ValueErrors
        raise Unavailable("build_error", str(e)) from None
    raise Unavailable("no_request", f"{proto} requests are not rebuilt; pass them in")


_NAME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\s*:")


def _ok(x: Any) -> Any:
    if isinstance(x, ParseError):
        raise Unavailable("unformattable", x.reason)
    return x


def judge_target(row: dict) -> str:
    """The canonical text of the row's raw output: the protocol's format of its strict parse."""
    raw, proto = row["raw_output"], row["protocol"]
    if proto == pt.NAME:
        return pt.format(_ok(pt.parse(raw)))
    if proto == pw.NAME:
        return pw.format(_ok(pw.parse(raw)))
    if proto == ap.NAME:
        names = [m.group(1).lower() for ln in nonblank(raw) if (m := _NAME_RE.match(ln))]
        if not names or len(set(names)) != len(names):
            raise Unavailable("unformattable", "aspect lines missing or repeated")
        return ap.format(_ok(ap.parse(raw, names)))
    if proto == rb.NAME:
        parsed = as_json(row.get("parsed"))
        parsed = parsed if isinstance(parsed, dict) else {}
        if isinstance(parsed.get("grades"), dict) and parsed["grades"]:
            return rb.format_grades(_ok(rb.parse_grades(raw, list(parsed["grades"]))))
        sections = [s for s in rb.SECTIONS if parsed.get(s)]
        if sections:
            return rb.format_rubric(_ok(rb.parse_rubric(raw, sections)))
        raise Unavailable("unformattable", "rubric row is neither a grading nor a rubric")
    if proto == dc.NAME:
        return dc.format_full(_ok(dc.parse_full(raw)))
    if proto == cl.NAME:
        try:
            return pt.format(_ok(pt.parse(cl.judge_text(raw))))
        except ValueError as e:
            raise Unavailable("unformattable", str(e)) from None
    raise Unavailable("unformattable", f"unknown protocol {proto!r}")
