"""`flywheel eval`: any judge on any labeled set — bring your own human labels.

The labeled set is JSONL, one item per line, in one of two documented formats (images are base64 PNG/JPEG):

  {"type": "pointwise", "prompt": {"task": "iu", "subtask": "vqa", "query": "...", "images": ["<b64>"]},
   "response": {"text": "...", "images": []}, "score": 4}
  {"type": "pairwise", "prompt": {...}, "response_a": {...}, "response_b": {...}, "winner": "A"}

`prompt` takes the prompt-record fields (task, subtask, query, images, reference_text); `score` is the gold
rating on the pointwise protocol's 1-5 scale; `winner` is "A" or "B" (ties are not gold and are refused). Each
pairwise item is judged in both orders. A line that is not a valid item is reported with its line number and
skipped (counted); the judge's unparseable outputs count as failures, never as scores.

The same files can be an iteration's gold (`meta_eval.gold_files`): `gold_rows` turns their items into the gold
set layout flywheel/stages/gold.py writes, so meta-eval and the judge's gate score against human labels.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from pathlib import Path

from flywheel import storage
from flywheel.engines import TextEngine
from flywheel.evaluate.metrics import PairItem, PointItem, one_verdict_metrics, pairwise_metrics, pointwise_metrics
from flywheel.judge import pairwise, pointwise
from flywheel.records import validate

log = logging.getLogger(__name__)


def _record(kind: str, obj: dict, where: str, **extra) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object")
    images = []
    for k, b in enumerate(obj.get("images", []) or []):
        try:
            images.append(base64.b64decode(b, validate=True))
        except (binascii.Error, TypeError) as e:
            raise ValueError(f"{where}.images[{k}]: not base64 ({e})") from None
    if kind == "prompt":
        row = {"task": obj.get("task"), "subtask": obj.get("subtask"), "query": obj.get("query"), "images": images,
               "reference_text": obj.get("reference_text"), "reference_images": [], "aspects": [],
               "source": "labeled", "split": extra.get("split", "id-test")}
    else:
        row = {"prompt_id": extra["prompt_id"], "producer": "labeled", "output_text": obj.get("text"),
               "output_images": images, "sample_index": extra["index"]}
    valid, bad = validate(kind, [row])
    if bad:
        raise ValueError(f"{where}: {bad[0]['reason']}")
    return valid[0]


def load_labeled(path: str | Path, split: str = "id-test") -> tuple[list[dict], list[str]]:
    """Items as {"type", "prompt", "candidates": [..], "gold", "line"}, their prompts in `split`; and the reasons
    of the lines that were refused."""
    return parse_labeled(storage.read_bytes(path).decode("utf-8"), split)  # a local path or a storage URI


def parse_labeled(text: str, split: str = "id-test") -> tuple[list[dict], list[str]]:
    """load_labeled on a file's text."""
    items, refused = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            kind = obj.get("type")
            if kind not in ("pointwise", "pairwise"):
                raise ValueError(f"line {n}: type must be 'pointwise' or 'pairwise', got {kind!r}")
            prompt = _record("prompt", obj.get("prompt"), f"line {n}: prompt", split=split)
            if kind == "pointwise":
                score = obj.get("score")
                if not isinstance(score, (int, float)) or not 1 <= score <= 5:
                    raise ValueError(f"line {n}: score must be a number in 1..5, got {score!r}")
                cands = [_record("candidate", obj.get("response"), f"line {n}: response",
                                 prompt_id=prompt["prompt_id"], index=0)]
                gold = float(score)
            elif kind == "pairwise":
                if obj.get("winner") not in ("A", "B"):
                    raise ValueError(f"line {n}: winner must be 'A' or 'B' (ties are not gold), "
                                     f"got {obj.get('winner')!r}")
                # index 0 for every output: the same output of a prompt is one candidate wherever it appears
                cands = [_record("candidate", obj.get(f"response_{s}"), f"line {n}: response_{s}",
                                 prompt_id=prompt["prompt_id"], index=0) for s in "ab"]
                if cands[0]["candidate_id"] == cands[1]["candidate_id"]:
                    raise ValueError(f"line {n}: response_a and response_b are the same output")
                gold = obj["winner"]
        except json.JSONDecodeError as e:
            refused.append(f"line {n}: not JSON ({e})")
            continue
        except (ValueError, AttributeError) as e:
            refused.append(str(e) if str(e).startswith("line") else f"line {n}: {e}")
            continue
        items.append({"type": kind, "prompt": prompt, "candidates": cands, "gold": gold, "line": n})
    return items, refused


def require_items(items: list[dict], refused: list[str], where: str) -> list[dict]:
    """The valid items of a labeled set a stage needs (gold, a held-out probe): none is an error naming `where`
    (the setting and the file), and the refused lines are logged with the first reason."""
    if not items:
        raise ValueError(f"{where} holds no valid item"
                         + (f" ({len(refused)} refused, e.g. {refused[0]})" if refused else " (it is empty)"))
    if refused:
        log.warning("%s: %d of %d lines refused, e.g. %s", where, len(refused), len(refused) + len(items), refused[0])
    return items


def evaluate_labeled(engine: TextEngine, items: list[dict], style: str = "minos",
                     readout: str = "text", seed: int = 0) -> dict[str, float]:
    """The engine's metrics on labeled items; style: the prompt style the judge was trained on; readout: how a
    pointwise score is read (judge.rating_readout; `expected` also scores each pair by one verdict from both
    orders' probabilities, `pairwise_balanced/...`, as meta-eval does); seed: the sampling seed (run.seed)."""
    jobs = []
    for it in items:
        p, c = it["prompt"], it["candidates"]
        if it["type"] == "pointwise":
            jobs.append((it, None, pointwise.build(p, c[0], style=style)))
        else:
            jobs += [(it, order, req) for order, req in pairwise.build_both(p, c[0], c[1], style=style).items()]
    results = engine.generate([r for _, _, r in jobs], seed=seed)
    points, verdicts, probs = {}, {}, {}
    for (it, order, _), res in zip(jobs, results, strict=True):
        if order is None:
            score = pointwise.result_fields(res, readout)["score"] if res.ok else None
            points[it["line"]] = PointItem(str(it["line"]), it["gold"], score)
        else:
            fields = pairwise.result_fields(res, order, readout) if res.ok else {"verdict": None, "parsed": None}
            verdicts.setdefault(it["line"], {})[order] = fields["verdict"]
            probs.setdefault(it["line"], {})[order] = (fields["parsed"] or {}).get("verdict_probs")
    lines = [it["line"] for it in items if it["type"] == "pairwise"]
    gold = {it["line"]: it["gold"] for it in items}
    pairs = [PairItem(str(n), gold[n], verdicts[n].get("AB"), verdicts[n].get("BA")) for n in lines]
    balanced = [PairItem(str(n), gold[n], pairwise.balanced_verdict(probs[n].get("AB"), probs[n].get("BA")))
                for n in lines]
    out = {}
    if points:
        out |= {f"pointwise/{k}": v for k, v in pointwise_metrics(list(points.values())).items()}
    if pairs:
        out |= {f"pairwise/{k}": v for k, v in pairwise_metrics(pairs).items()}
    if any(i.verdict_ab is not None for i in balanced):  # only a judge read with its probabilities has these
        out |= {f"pairwise_balanced/{k}": v for k, v in one_verdict_metrics(balanced).items()}
    return out


UNLABELLED = "unlabelled"  # parsed key of a gold row the judge rates only to order the pairs its output is in


def gold_rows(items: list[dict], labeller: str) -> tuple[list[dict], list[dict], list[dict]]:
    """Labeled items (load_labeled) as a gold set's prompts, candidates and judgments (flywheel/stages/gold.py),
    judged by `labeller`: a pointwise item is a pointwise row with its score; a pairwise item a pairwise row in
    the order AB with the winner as verdict. Each output of a pair that has no pointwise label also gets a
    pointwise row without a score (parsed {"unlabelled": true}): meta-eval has the judge rate it, so that the
    pair is ordered by its ratings (pointwise_ranking) as oracle gold pairs are, while no rating is scored against
    a label that does not exist. Prompts and outputs repeated across lines are kept once (ids are contents)."""
    prompts: dict[str, dict] = {}
    candidates: dict[str, dict] = {}
    rows, rated, in_pairs = [], set(), {}
    for it in items:
        p, cands = it["prompt"], it["candidates"]
        prompts.setdefault(p["prompt_id"], p)
        for c in cands:
            candidates.setdefault(c["candidate_id"], c)
        row = {"prompt_id": p["prompt_id"], "candidate_ids": [c["candidate_id"] for c in cands], "judge": labeller,
               "aspect": None, "sample_k": 0, "raw_output": f"{labeller}, line {it['line']}", "parse_error": None,
               "analysis": None, "parsed": None, "score": None, "verdict": None}
        if it["type"] == "pointwise":
            rated.add((p["prompt_id"], cands[0]["candidate_id"]))
            rows.append(row | {"protocol": "pointwise", "order": None, "score": it["gold"]})
        else:
            rows.append(row | {"protocol": "pairwise", "order": "AB", "verdict": it["gold"]})
            for c in cands:
                in_pairs.setdefault((p["prompt_id"], c["candidate_id"]), it["line"])
    for (pid, cid), line in in_pairs.items():
        if (pid, cid) not in rated:
            rows.append({"prompt_id": pid, "candidate_ids": [cid], "judge": labeller, "protocol": "pointwise",
                         "aspect": None, "order": None, "sample_k": 0, "analysis": None, "score": None,
                         "verdict": None, "parse_error": None, "parsed": {UNLABELLED: True},
                         "raw_output": f"{labeller}, line {line}: an output of a pair, not rated by the labels"})
    return list(prompts.values()), list(candidates.values()), rows
