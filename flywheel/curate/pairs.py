"""Preference pairs: judge-DPO pairs (Minos) and policy preference pairs (RLAIF-V / LLaVA-OV-Chat style), as
`pair` records plus the training rows made from them (`dpo` for text, `image_pref` for images).

Judge-DPO (Minos): for each item the consistency filter kept a sample of, chosen = that sample, rejected = the
parsed sample of the same item (same judge, same request) whose score is farthest from it (ties: lowest
sample_k); kept if |delta| >= min_delta[protocol]; an item whose samples all agree with the chosen one is
dropped ("no_disagreement"). Pairwise verdicts count A=+1, tie=0, B=-1. The dpo row's prompt is the judge
request, chosen / rejected the two outputs as assistant messages (the canonical text of each raw output, so the
pair differs in content, never in whitespace).

Policy pairs: per prompt, each candidate's score = the mean of its judges' scores (single-candidate judgments,
optionally filtered by protocol and aspect); best vs worst of the prompt's scored candidates (ties broken by
lowest sample_index, then id); equal scores are dropped ("tie"), margins below min_margin too. The pair's
`judge` names the judge version(s) that scored it.

Report convention here: rows_in counts items (kept judgments / prompts), rows_out the pairs made.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from flywheel.curate.config import JudgePairsConfig, PolicyPairsConfig
from flywheel.curate.consistency import group_samples, is_parse_error, sample_group, sample_order, value_of
from flywheel.curate.judge_io import JudgeContext, Unavailable, by_id, judge_request, judge_target
from flywheel.curate.report import FilterReport, make_report, meta_of, num
from flywheel.curate.sft import judgment_id, png_list
from flywheel.engines.base import TextRequest
from flywheel.judge import claims as cl
from flywheel.records import PROTOCOLS, make_id

VERDICT_VALUE = {"A": 1.0, "tie": 0.0, "B": -1.0}


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": [{"type": "text", "text": text}]}]


def numeric(value: float | str) -> float:
    return VERDICT_VALUE[value] if isinstance(value, str) else float(value)


# ---------------------------------------------------------------- judge-DPO
def judge_pairs(samples: Iterable[dict], chosen: Iterable[dict], prompts: Iterable[dict] | Mapping[str, dict],
                candidates: Iterable[dict] | Mapping[str, dict], cfg: JudgePairsConfig | None = None, *,
                requests: Mapping[str, TextRequest] | None = None, tree: Any = None,
                guidelines: Any = None, style: str = "minos") -> tuple[list[dict], list[dict], FilterReport]:
    """(pair rows, dpo rows, report) for the consistency filter's kept rows `chosen` among all judgment rows
    `samples` (their k samples, parse failures included)."""
    cfg = cfg or JudgePairsConfig()
    ctx = JudgeContext.of(prompts, candidates, requests, tree, guidelines, style)
    groups = group_samples(samples)
    chosen = list(chosen)
    dropped, pairs, dpos = Counter(), [], []
    for c in chosen:
        try:
            pair, dpo = _judge_pair(c, groups.get(sample_group(c), []), cfg, ctx)
        except Unavailable as e:
            dropped[e.reason] += 1
            continue
        pairs.append(pair)
        dpos.append(dpo)
    return pairs, dpos, make_report("judge_pairs", len(chosen), len(pairs), dropped)


def farthest(chosen: dict, group: list[dict]) -> tuple[dict | None, float]:
    """The parsed sample of the group farthest in value from `chosen` (ties: lowest sample_k) and |delta|."""
    cid, vc = judgment_id(chosen), numeric(value_of(chosen))
    others = [r for r in group if judgment_id(r) != cid and not is_parse_error(r) and value_of(r) is not None]
    if not others:
        return None, 0.0
    far = min(others, key=lambda r: (-abs(numeric(value_of(r)) - vc), sample_order(r)))
    return far, abs(numeric(value_of(far)) - vc)


def _judge_pair(c: dict, group: list[dict], cfg: JudgePairsConfig, ctx: JudgeContext) -> tuple[dict, dict]:
    proto = c["protocol"]
    if proto not in cfg.min_delta:
        raise Unavailable("unsupported_protocol", proto)
    rej, delta = farthest(c, group)
    if rej is None:
        raise Unavailable("no_other_sample")
    if delta == 0:
        raise Unavailable("no_disagreement")
    if delta < cfg.min_delta[proto]:
        raise Unavailable("delta_below_min")
    request = judge_request(c, ctx)
    t_chosen, t_rejected = judge_target(c), judge_target(rej)
    prompt, _ = ctx.rows_of(c)
    vc, vr = numeric(value_of(c)), numeric(value_of(rej))
    cid, rid = judgment_id(c), judgment_id(rej)
    pair = {"kind": "judge", "prompt_id": c["prompt_id"], "chosen_id": cid, "rejected_id": rid, "chosen_score": vc,
            "rejected_score": vr, "margin": delta, "judge": c["judge"],
            "meta": {"protocol": proto, "aspect": c.get("aspect"), "order": c.get("order"),
                     "candidate_ids": list(c["candidate_ids"]), "chosen_value": value_of(c),
                     "rejected_value": value_of(rej)}}
    pair["pair_id"] = make_id("pair", pair)
    dpo = {"target": "judge", "images": png_list(request.images), "prompt": request.messages,
           "chosen": assistant(t_chosen), "rejected": assistant(t_rejected), "chosen_score": vc,
           "rejected_score": vr, "margin": delta, "protocol": proto, "subtask": prompt.get("subtask"),
           "pair_id": pair["pair_id"], "source_ids": [cid, rid], "meta": {"judge": c["judge"]}}
    dpo["dpo_id"] = make_id("dpo", dpo)
    return pair, dpo


# ---------------------------------------------------------------- policy pairs
def candidate_scores(judgments: Iterable[dict], cfg: PolicyPairsConfig | None = None
                     ) -> dict[str, tuple[float, list[str], list[str]]]:
    """candidate_id -> (mean judge score, sorted judges, sorted protocols) over the usable judgments. A candidate
    with claim judgments (flywheel/judge/claims.py) is scored by them alone, one score from all its claims."""
    cfg = cfg or PolicyPairsConfig()
    acc: dict[str, list] = defaultdict(list)
    claimed: dict[str, list] = defaultdict(list)
    for j in judgments:
        if len(j["candidate_ids"]) != 1 or is_parse_error(j):
            continue
        if cfg.protocols is not None and j["protocol"] not in cfg.protocols:
            continue
        if j["protocol"] == cl.NAME:
            claimed[j["candidate_ids"][0]].append(j)
            continue
        if cfg.aspects is not None and j.get("aspect") not in cfg.aspects:
            continue
        s = num(j.get("score"))
        if s is not None:
            acc[j["candidate_ids"][0]].append((s, j["judge"], j["protocol"]))
    out = {c: (sum(x[0] for x in v) / len(v), sorted({x[1] for x in v}), sorted({x[2] for x in v}))
           for c, v in acc.items()}
    for c, rows in claimed.items():
        s = cl.score([num(j.get("score")) for j in rows])
        if s is None:
            out.pop(c, None)
        else:
            out[c] = (s, sorted({j["judge"] for j in rows}), [cl.NAME])
    return out


def policy_pairs(candidates: Iterable[dict], judgments: Iterable[dict],
                 cfg: PolicyPairsConfig | None = None) -> tuple[list[dict], FilterReport]:
    """Best-vs-worst `pair` rows (kind="policy"), one per prompt at most (module docstring)."""
    cfg = cfg or PolicyPairsConfig()
    scores = candidate_scores(judgments, cfg)
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for c in candidates:
        by_prompt[c["prompt_id"]].append(c)
    dropped, stats, out = Counter(), Counter(), []
    for pid, cands in by_prompt.items():
        scored = [c for c in cands if c["candidate_id"] in scores]
        stats["candidates"] += len(cands)
        stats["candidates_unscored"] += len(cands) - len(scored)
        if len(scored) < 2:
            dropped["too_few_scored"] += 1
            continue
        tiebreak = lambda c: (int(c.get("sample_index") or 0), c["candidate_id"])  # noqa: E731
        best = min(scored, key=lambda c: (-scores[c["candidate_id"]][0], *tiebreak(c)))
        worst = min(scored, key=lambda c: (scores[c["candidate_id"]][0], *tiebreak(c)))
        sb, sw = scores[best["candidate_id"]][0], scores[worst["candidate_id"]][0]
        margin = sb - sw
        if margin <= 0:
            dropped["tie"] += 1
            continue
        if margin < cfg.min_margin:
            dropped["margin_below_min"] += 1
            continue
        sb_, sw_ = scores[best["candidate_id"]], scores[worst["candidate_id"]]
        pair = {"kind": "policy", "prompt_id": pid, "chosen_id": best["candidate_id"],
                "rejected_id": worst["candidate_id"], "chosen_score": sb, "rejected_score": sw, "margin": margin,
                "judge": "+".join(sorted(set(sb_[1]) | set(sw_[1]))),
                "meta": {"n_scored": len(scored), "protocols": sorted(set(sb_[2]) | set(sw_[2]))}}
        pair["pair_id"] = make_id("pair", pair)
        out.append(pair)
    return out, make_report("policy_pairs", len(by_prompt), len(out), dropped, stats)


def policy_user_message(prompt: dict) -> list[dict]:
    """The policy's prompt as the candidates stage sent it: image parts, then the query text."""
    n = len(prompt.get("images") or [])
    return [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": prompt["query"]}]}]


def generator_prompt(prompt: dict) -> str:
    """The text the generator drew from (meta.generator_prompt when the source set one, else the query)."""
    return meta_of(prompt).get("generator_prompt") or prompt["query"]


def _modality(c: dict) -> str:
    text, images = c.get("output_text"), list(c.get("output_images") or [])
    if text is not None and not images:
        return "text"
    if text is None and len(images) == 1:
        return "image"
    return "mixed"


def policy_training_rows(pairs: Iterable[dict], prompts: Iterable[dict] | Mapping[str, dict],
                         candidates: Iterable[dict] | Mapping[str, dict]
                         ) -> tuple[list[dict], list[dict], FilterReport]:
    """(dpo rows, image_pref rows, report) of policy pairs: TRL DPO rows for text candidates (images = the
    prompt's input images), Diffusion-DPO rows for single-image candidates; other outputs (text + image,
    several images) are dropped as "mixed_output"."""
    ps, cs = by_id(prompts, "prompt_id"), by_id(candidates, "candidate_id")
    pairs = [p for p in pairs if p["kind"] == "policy"]
    dropped, dpos, prefs = Counter(), [], []
    for p in pairs:
        prompt, ch, rj = ps.get(p["prompt_id"]), cs.get(p["chosen_id"]), cs.get(p["rejected_id"])
        if prompt is None:
            dropped["missing_prompt"] += 1
            continue
        if ch is None or rj is None:
            dropped["missing_candidate"] += 1
            continue
        kinds = {_modality(ch), _modality(rj)}
        common = {"chosen_score": p["chosen_score"], "rejected_score": p["rejected_score"], "margin": p["margin"],
                  "pair_id": p["pair_id"], "source_ids": [p["chosen_id"], p["rejected_id"]]}
        if kinds == {"text"}:
            if ch["output_text"] == rj["output_text"]:
                dropped["same_output"] += 1
                continue
            protos = meta_of(p).get("protocols") or []
            row = {"target": "policy", "images": png_list(prompt.get("images") or []),
                   "prompt": policy_user_message(prompt), "chosen": assistant(ch["output_text"]),
                   "rejected": assistant(rj["output_text"]), "subtask": prompt.get("subtask"),
                   "protocol": protos[0] if len(protos) == 1 and protos[0] in PROTOCOLS else None,
                   "meta": {"judge": p["judge"]}, **common}
            row["dpo_id"] = make_id("dpo", row)
            dpos.append(row)
        elif kinds == {"image"}:
            if bytes(ch["output_images"][0]) == bytes(rj["output_images"][0]):
                dropped["same_output"] += 1
                continue
            row = {"prompt": generator_prompt(prompt), "chosen": png_list(ch["output_images"]),
                   "rejected": png_list(rj["output_images"]), "judge": p["judge"], "prompt_id": p["prompt_id"],
                   "meta": {"subtask": prompt.get("subtask")}, **common}
            row["image_pref_id"] = make_id("image_pref", row)
            prefs.append(row)
        else:
            dropped["mixed_output"] += 1
    report = make_report("policy_training_rows", len(pairs), len(dpos) + len(prefs), dropped,
                         {"dpo": len(dpos), "image_pref": len(prefs)})
    return dpos, prefs, report

