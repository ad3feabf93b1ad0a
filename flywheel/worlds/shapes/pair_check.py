"""Do the judge's preference pairs agree with the oracle? In the shapes world every policy sample has a true
value, the one the downstream eval measures (text: the answer or caption is correct, policy_eval.check_answer;
images: check_image's score_10). A pair is `right` when the oracle values its chosen sample above its rejected one,
`wrong` when below (DPO then teaches the policy the wrong way) and `tie` when equal (no signal).

This is the judge's quality where the flywheel spends it, beside meta-eval's quality on gold pairs; pairs whose
prompts carry no ground truth (any other data source) are counted apart, never guessed.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from flywheel.worlds.shapes.assessment import NoGroundTruth, image_of, load_meta, scene_of, spec_of, text_of
from flywheel.worlds.shapes.check_image import check_image
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.policy_eval import check_answer

UNPARSEABLE = -1.0  # an answer the checker cannot read is worse than a wrong one (as in the policy bench)


def oracle_value(prompt: dict, candidate: dict, world: ShapesWorldConfig) -> float:
    """The oracle's value of one sample: text 1/0 (unreadable -1), image score_10. Raises NoGroundTruth."""
    meta = load_meta(prompt)
    if "spec" in meta:
        return check_image(image_of(candidate), spec_of(prompt), world).score_10
    question = meta.get("question") or {"type": "caption"}
    check = check_answer(question, text_of(candidate), scene_of(prompt))
    return UNPARSEABLE if check.unparseable else float(check.correct)


def pair_agreement(pairs: list[dict], prompts: dict[str, dict], candidates: dict[str, dict],
                   world: ShapesWorldConfig) -> dict[str, float]:
    """Counts of right / tie / wrong pairs per sub-task and over all, and precision = right / (right + wrong).
    `pairs` are curated pair rows (prompt_id, chosen_id, rejected_id); prompts and candidates are keyed by id."""
    tally: dict[str, Counter] = defaultdict(Counter)
    for pair in pairs:
        prompt = prompts[pair["prompt_id"]]
        try:
            chosen = oracle_value(prompt, candidates[pair["chosen_id"]], world)
            rejected = oracle_value(prompt, candidates[pair["rejected_id"]], world)
        except NoGroundTruth:
            tally["all"]["no_ground_truth"] += 1
            continue
        verdict = "right" if chosen > rejected else "wrong" if chosen < rejected else "tie"
        for key in (prompt.get("subtask") or "unknown", "all"):
            tally[key][verdict] += 1
    out: dict[str, float] = {}
    for key, c in sorted(tally.items()):
        for verdict in ("right", "tie", "wrong", "no_ground_truth"):
            if c[verdict] or verdict != "no_ground_truth":
                out[f"{key}/{verdict}"] = float(c[verdict])
        decided = c["right"] + c["wrong"]
        out[f"{key}/precision"] = c["right"] / decided if decided else float("nan")
    return out
