"""The judge SFT set: for every kept judgment, the request the judge saw plus the canonical target -> an `sft`
row (flywheel.records); for decomposed T2I judgments, the paper's six sub-task samples instead
(flywheel.judge.decomposed_samples.build_samples).

Row fields: images + messages (the request, then the assistant target); task = the prompt's task; protocol;
subtask = the prompt's sub-task, or for decomposed samples the sample kind (content_extraction, ...,
summary_scoring: what the T2I sub-task rebalance balances); source_ids = [judgment_id, prompt_id,
*candidate_ids]; meta = {"judgment_id", "score" (the target's rating / 0..10 score, for score balance),
"aspect", "verdict", "order", for claim checks "claim" (its words, for the claim balance), and for decomposed
samples "sample_key", "dimension", "prompt_subtask"}.
The same row made from two different judgments (e.g. per-aspect rows sharing one raw output) is kept once
("duplicate"); a judgment row repeated in the input (by balancing) is repeated in the output.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from flywheel.curate.judge_io import JudgeContext, Unavailable, judge_request, judge_target
from flywheel.curate.report import FilterReport, as_json, make_report, num
from flywheel.engines.base import TextRequest
from flywheel.images import to_png_bytes
from flywheel.judge import decomposed as dc
from flywheel.judge import decomposed_samples as dcs
from flywheel.judge.base import ParseError, with_target
from flywheel.records import make_id


def png_list(images: Iterable[Any]) -> list[bytes]:
    """Request images as PNG bytes (records hold PNG bytes already; PIL images are encoded)."""
    return [bytes(i) if isinstance(i, (bytes, bytearray, memoryview)) else to_png_bytes(i) for i in images]


def judgment_id(row: dict) -> str:
    return row.get("judgment_id") or make_id("judgment", row)


def sft_row(request: TextRequest, target: str | None, *, task: str | None, protocol: str | None,
            subtask: str | None, source_ids: list[str], meta: dict | None = None) -> dict:
    """One `sft` row (id filled) from a request and the assistant text to train on (target None: the request
    already ends with the assistant turn, as decomposed samples do)."""
    ex = request if target is None else with_target(request, target)
    row = {"images": png_list(ex.images), "messages": ex.messages, "task": task, "protocol": protocol,
           "subtask": subtask, "source_ids": list(source_ids), "meta": meta}
    row["sft_id"] = make_id("sft", row)
    return row


def _dimension(key: str | None) -> str | None:
    if key is None:
        return None
    if key in (*dc.DIMENSIONS, dc.OVERALL):
        return key
    return dc.DIMENSION_OF.get(key[:1])


def decomposed_judgment(row: dict) -> dc.DecomposedJudgment:
    parsed = as_json(row.get("parsed"))
    if isinstance(parsed, dict):
        try:
            return dc.DecomposedJudgment.from_dict(parsed)
        except (KeyError, TypeError, ValueError):
            pass
    j = dc.parse_full(row["raw_output"])
    if isinstance(j, ParseError):
        raise Unavailable("unformattable", j.reason)
    return j


def decomposed_rows(row: dict, prompt: dict, candidate: dict) -> list[dict]:
    """The six sub-task sample kinds of one decomposed judgment, as sft rows."""
    j = decomposed_judgment(row)
    try:
        samples = dcs.build_samples(prompt, candidate, j)
    except ValueError as e:
        raise Unavailable("build_error", str(e)) from None
    scores = j.scores.by_key
    jid, out = judgment_id(row), []
    for s in samples:
        meta = {"judgment_id": jid, "sample_key": s.key, "dimension": _dimension(s.key),
                "prompt_subtask": prompt.get("subtask")}
        if s.kind in ("scoring", "summary_scoring"):
            meta["score"] = scores[s.key].score
        out.append(sft_row(s.request, None, task=prompt["task"], protocol=dc.NAME, subtask=s.kind,
                           source_ids=[jid, prompt["prompt_id"], candidate["candidate_id"]], meta=meta))
    return out


def judge_sft(judgments: Iterable[dict], prompts: Iterable[dict] | Mapping[str, dict],
              candidates: Iterable[dict] | Mapping[str, dict], *, requests: Mapping[str, TextRequest] | None = None,
              tree: Any = None, guidelines: Any = None, style: str = "minos") -> tuple[list[dict], FilterReport]:
    """SFT rows of kept judgments (module docstring). Judgments without a request or target are dropped and
    counted by reason (parse_error, missing_prompt, missing_candidate, no_request, build_error, unformattable,
    unknown_aspect); requests: judgment_id -> the request the judge saw (wins over rebuilding)."""
    ctx = JudgeContext.of(prompts, candidates, requests, tree, guidelines, style)
    judgments = list(judgments)
    dropped, stats, out = Counter(), Counter(), []
    made_by: dict[str, str] = {}  # sft_id -> the judgment that first made it
    for row in judgments:
        if row.get("parse_error") is not None:
            dropped["parse_error"] += 1
            continue
        try:
            if row["protocol"] == dc.NAME and judgment_id(row) not in ctx.requests:
                prompt, cands = ctx.rows_of(row)
                made = decomposed_rows(row, prompt, cands[0])
            else:
                made = [_single(row, ctx)]
        except Unavailable as e:
            dropped[e.reason] += 1
            continue
        jid = judgment_id(row)
        fresh = [r for r in made if made_by.setdefault(r["sft_id"], jid) == jid]
        if not fresh:
            dropped["duplicate"] += 1
            continue
        stats["added"] += len(fresh) - 1
        stats["judgments_used"] += 1
        for r in fresh:
            stats[f"samples_{r['subtask'] if r['protocol'] == dc.NAME else r['protocol']}"] += 1
        out += fresh
    return out, make_report("judge_sft", len(judgments), len(out), dropped, stats)


def _single(row: dict, ctx: JudgeContext) -> dict:
    prompt, _ = ctx.rows_of(row)
    request, target = judge_request(row, ctx), judge_target(row)
    jid = judgment_id(row)
    parsed = as_json(row.get("parsed")) if row["protocol"] == "claims" else None
    meta = {"judgment_id": jid, "score": num(row.get("score")), "aspect": row.get("aspect"),
            "verdict": row.get("verdict"), "order": row.get("order"),
            "claim": parsed.get("claim") if isinstance(parsed, dict) else None}  # what curate.claim_balance reads
    return sft_row(request, target, task=prompt["task"], protocol=row["protocol"], subtask=prompt.get("subtask"),
                   source_ids=[jid, prompt["prompt_id"], *row["candidate_ids"]],
                   meta={k: v for k, v in meta.items() if v is not None})
