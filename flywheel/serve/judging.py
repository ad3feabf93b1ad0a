"""The judging routes as plain functions: a validated body -> the TextRequests to generate (built with the judge
protocols' own builders) and a function that turns their results into the response items (parsed strictly with
the protocols' parsers: an output that does not parse is returned with its reason, never as a score).

Each `plan_*` checks the limits (413) and the records (422) before anything is generated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flywheel.aspects import AspectTree
from flywheel.config import ServeLimitsConfig
from flywheel.engines.base import TextRequest, TextResult
from flywheel.judge import aspects as ap
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.judge.base import FIELDS
from flywheel.serve.schemas import (AspectsBody, CandidateIn, PairwiseBody, PointwiseBody, PromptIn, count_images,
                                    count_items, decode_png, invalid)


@dataclass
class Plan:
    requests: list[TextRequest]
    assemble: Callable[[list[TextResult]], list[dict]]


# ---------------------------------------------------------------- records
def _n_images(*records: PromptIn | CandidateIn) -> int:
    n = 0
    for r in records:
        n += len(r.output_images) if isinstance(r, CandidateIn) else len(r.images) + len(r.reference_images)
    return n


def prompt_record(p: PromptIn, where: str, limits: ServeLimitsConfig) -> dict:
    rec = p.model_dump()
    rec["images"] = [decode_png(s, f"{where}.images[{i}]", limits) for i, s in enumerate(p.images)]
    rec["reference_images"] = [decode_png(s, f"{where}.reference_images[{i}]", limits)
                               for i, s in enumerate(p.reference_images)]
    return rec


def candidate_record(c: CandidateIn, where: str, limits: ServeLimitsConfig) -> dict:
    rec = c.model_dump()
    rec["output_images"] = [decode_png(s, f"{where}.output_images[{i}]", limits)
                            for i, s in enumerate(c.output_images)]
    return rec


def _build(where: str, fn: Callable, *args, **kwargs) -> Any:
    """Run a protocol builder; a record it refuses is the client's error (422), with the builder's reason."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError, KeyError) as e:
        reason = str(e) if not isinstance(e, KeyError) else f"missing field {e}"
        raise invalid(f"{where}: {reason}") from None


def outcome(result: TextResult, fields: Callable[[TextResult], dict]) -> dict:
    """One generation as a response object: the raw text and the judgment fields, or the engine's error."""
    if not result.ok:
        return {"raw": None, "error": result.error, **{f: None for f in FIELDS}}
    return {"raw": result.text, "error": None, **fields(result)}


# ---------------------------------------------------------------- pointwise
def _pointwise_outcome(result: TextResult, readout: str) -> dict:
    return outcome(result, lambda r: pt.result_fields(r, readout))


def plan_pointwise(body: PointwiseBody, limits: ServeLimitsConfig, style: str = "minos",
                   readout: str = "text") -> Plan:
    count_items(len(body.items), limits)
    count_images(sum(_n_images(it.prompt, it.candidate) for it in body.items), limits)
    requests = []
    for i, it in enumerate(body.items):
        where = f"items[{i}]"
        prompt = prompt_record(it.prompt, f"{where}.prompt", limits)
        cand = candidate_record(it.candidate, f"{where}.candidate", limits)
        requests.append(_build(where, pt.build, prompt, cand, use_reference=it.use_reference, style=style))

    def assemble(results: list[TextResult]) -> list[dict]:
        return [{"candidate_id": it.candidate.candidate_id, **_pointwise_outcome(r, readout)}
                for it, r in zip(body.items, results, strict=True)]

    return Plan(requests, assemble)


# ---------------------------------------------------------------- pairwise
def plan_pairwise(body: PairwiseBody, limits: ServeLimitsConfig, tree: AspectTree, style: str = "minos",
                  readout: str = "text") -> Plan:
    count_items(len(body.items), limits)
    count_images(sum(_n_images(it.prompt, it.candidate_a, it.candidate_b) for it in body.items), limits)
    requests, slots = [], []
    for i, it in enumerate(body.items):
        where = f"items[{i}]"
        aspect = None
        if it.aspect is not None:
            aspect = tree.aspects.get(it.aspect)
            if aspect is None:
                raise invalid(f"{where}.aspect: unknown aspect {it.aspect!r} (names are in configs/aspects.yaml)")
        prompt = prompt_record(it.prompt, f"{where}.prompt", limits)
        a = candidate_record(it.candidate_a, f"{where}.candidate_a", limits)
        b = candidate_record(it.candidate_b, f"{where}.candidate_b", limits)
        for order in it.orders:
            first, second = (a, b) if order == "AB" else (b, a)
            requests.append(_build(where, pw.build, prompt, first, second, aspect, style=style,
                                   use_reference=it.use_reference))
            slots.append((i, order))

    def assemble(results: list[TextResult]) -> list[dict]:
        out = [{"candidate_ids": [it.candidate_a.candidate_id, it.candidate_b.candidate_id], "aspect": it.aspect,
                "orders": {}} for it in body.items]
        for (i, order), r in zip(slots, results, strict=True):
            out[i]["orders"][order] = outcome(r, lambda res, o=order: pw.result_fields(res, o, readout))
        for item in out:
            probs = [((item["orders"].get(k) or {}).get("parsed") or {}).get("verdict_probs") for k in pw.ORDERS]
            item["verdict_balanced"] = pw.balanced_verdict(*probs)  # None unless both orders have probabilities
            verdicts = [o["verdict"] for o in item["orders"].values()]
            if len(verdicts) == 2 and None not in verdicts:
                item["position_consistent"] = verdicts[0] == verdicts[1]  # both already in the AB frame
                item["verdict"] = verdicts[0] if item["position_consistent"] else None
            else:
                item["position_consistent"] = None
                item["verdict"] = verdicts[0] if len(verdicts) == 1 else None
        return out

    return Plan(requests, assemble)


# ---------------------------------------------------------------- aspects
def plan_aspects(body: AspectsBody, limits: ServeLimitsConfig, tree: AspectTree) -> Plan:
    count_items(len(body.items), limits)
    count_images(sum(_n_images(it.prompt, it.candidate) for it in body.items), limits)
    requests, slots = [], []
    for i, it in enumerate(body.items):
        where = f"items[{i}]"
        if not it.prompt.subtask:
            raise invalid(f"{where}.prompt.subtask: required by the aspects protocol (a sub-task of the tree)")
        prompt = prompt_record(it.prompt, f"{where}.prompt", limits)
        cand = candidate_record(it.candidate, f"{where}.candidate", limits)
        selection = _build(where, ap.select, tree, prompt, cand)
        for group, req in _build(where, ap.build, prompt, cand, selection).items():
            requests.append(req)
            slots.append((i, group, ap.expected(selection, group)))

    def assemble(results: list[TextResult]) -> list[dict]:
        out: list[dict] = [{"candidate_id": it.candidate.candidate_id, "groups": {}} for it in body.items]
        for (i, group, expected), r in zip(slots, results, strict=True):
            res = outcome(r, lambda x, e=expected, g=group: ap.to_judgment_fields(ap.parse(x.text, e), g))
            out[i]["groups"][group] = {"aspects": expected, **res}
        for item in out:
            scores: dict[str, int] = {}
            for g in item["groups"].values():
                if g["parsed"]:
                    scores.update(g["parsed"]["scores"])
            complete = all(g["parsed"] for g in item["groups"].values())
            item["scores"] = scores
            # the mean over every selected aspect, only when every group parsed (a partial mean would mislead)
            item["score"] = sum(scores.values()) / len(scores) if complete and scores else None
        return out

    return Plan(requests, assemble)
