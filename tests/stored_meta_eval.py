"""A judge's meta-eval on storage without running one: an id-test gold set of overall pairs, and the judged rows
meta-eval would write for a judge whose pointwise ratings order chosen pairs right. For tests of what reads them
back (per-pair outcomes, the gate's McNemar test). The layout and upstream manifests are meta.run's."""

from __future__ import annotations

from flywheel import storage
from flywheel.datasets import read_manifest, read_rows, write_dataset
from flywheel.records import with_ids

SPLIT = "id-test"
METRIC = f"{SPLIT}/all/pointwise_ranking/accuracy"


def _prompt(i: int) -> dict:
    return {"task": "iu", "subtask": "iu_count", "query": f"How many shapes are there? ({i})", "images": [],
            "reference_images": [], "aspects": [], "source": "test", "split": SPLIT}


def _judgment(prompt_id: str, candidate_ids: list[str], judge: str, **fields) -> dict:
    order = "AB" if len(candidate_ids) == 2 else None
    return {"prompt_id": prompt_id, "candidate_ids": candidate_ids, "judge": judge,
            "protocol": "pairwise" if order else "pointwise", "aspect": None, "order": order, "sample_k": 0,
            "raw_output": "test", **fields}


def _inputs(gold_uri: str) -> list[str]:
    base = storage.join(gold_uri, SPLIT)
    return [storage.join(base, part) for part in ("judgments", "prompts", "candidates")]


def write_gold(gold_uri: str, n: int, seed: int = 0, labeller: str = "oracle",
               variants: list[tuple[str, str]] | None = None) -> list[str]:
    """n gold pairs (one per prompt; candidate A wins) under gold_uri/id-test; returns their gold ids in order.
    Another `seed` makes another gold set (other pairs); another `labeller`, the same pairs under other ids.
    variants: pair i's candidates' gold variants (meta.variant, as the world's gold candidates carry them)."""
    prompts = with_ids("prompt", [_prompt(seed * 10_000 + i) for i in range(n)])
    cands = with_ids("candidate", [{"prompt_id": p["prompt_id"], "producer": "test", "output_text": f"{k} shapes.",
                                    "output_images": [], "sample_index": k,
                                    **({"meta": {"variant": variants[i][k]}} if variants else {})}
                                   for i, p in enumerate(prompts) for k in range(2)])
    gold = with_ids("judgment", [_judgment(p["prompt_id"], [cands[2 * i]["candidate_id"],
                                                           cands[2 * i + 1]["candidate_id"]], labeller, verdict="A")
                                 for i, p in enumerate(prompts)])
    for uri, kind, rows in zip(_inputs(gold_uri), ("judgment", "prompt", "candidate"), (gold, prompts, cands)):
        write_dataset(uri, kind, rows, config_hash="test", producer="test")
    return [g["judgment_id"] for g in gold]


def _position_biased(prompt_id: str, pair: list[str], ok: bool) -> list[dict]:
    """Both orders' rows of a judge that always writes "A" (so its strict pairwise verdict is always wrong), its
    verdict probabilities leaning to gold's A iff ok once both orders are balanced (0.6 / 0.45 vs 0.55 / 0.4)."""
    rows = []
    for order, p_a in (("AB", 0.6 if ok else 0.55), ("BA", 0.55 if ok else 0.6)):
        probs = {"A": p_a, "B": round(1 - p_a, 2), "tie": 0.0}
        rows.append(_judgment(prompt_id, pair, "judge", order=order, verdict="A" if order == "AB" else "B",
                              parsed={"verdict": "A", "order": order, "verdict_probs": probs}))
    return rows


def write_judged(output_uri: str, gold_uri: str, right: dict[str, bool],
                 balanced: dict[str, bool] | None = None) -> None:
    """A judge's meta-eval output under output_uri/id-test: pointwise ratings that order gold pair `id` right iff
    right[id] (rated the other way round when wrong; a pair not in `right` is not judged at all), with the gold as
    upstream, as run_stage records it. balanced: pairwise rows too, whose balanced verdict is right iff
    balanced[id] and whose strict verdict is always wrong (_position_biased)."""
    inputs = _inputs(gold_uri)
    rows = []
    for g in read_rows(inputs[0]):
        if g["judgment_id"] in right:
            ok = right[g["judgment_id"]]
            a, b = g["candidate_ids"]
            rows += [_judgment(g["prompt_id"], [a], "judge", score=4.0 if ok else 2.0),
                     _judgment(g["prompt_id"], [b], "judge", score=2.0 if ok else 4.0)]
        if balanced and g["judgment_id"] in balanced:
            rows += _position_biased(g["prompt_id"], g["candidate_ids"], balanced[g["judgment_id"]])
    write_dataset(storage.join(output_uri, SPLIT), "judgment", rows, config_hash="test", producer="test",
                  upstream=[read_manifest(uri) for uri in inputs])
