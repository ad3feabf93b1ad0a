"""Does the judge read the answer it rates? On a flywheel run's preference candidates for colour, existence and
count questions (the policy's own answers, judged against the prompt's reference answer), the share of the
judge's analyses whose "The answer says X" names the response's own value, and how often it calls a wrong
answer right. A judge that copies the reference instead of reading scores every answer to a prompt alike, and
its preference pairs tie.

    .venv/bin/python bench/judge_reads_answers.py --judge <model folder> --workdir runs/local [--iteration 001]
        [--items 240]

Measured 2026-11-24 on a proof run's iteration-1 candidates (240 answers, 104 wrong): iteration 0's champion
named the wrong answers' value in 0.52 of them and called 0.65 right; the champion after three promoted rounds
(gate.judge_test none) 0.93 and 0.33. Right answers: 0.68 / 0.96 and 1.00 / 0.93.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

SUBTASKS = ("iu_color", "iu_existence", "iu_count")
SAME = {"none": "zero", "no": "zero"}  # "There are none." is read as zero in the judge's analysis


def _values(text: str) -> set[str]:
    words = re.findall(r"\w+", text.lower())
    return set(words) | {SAME.get(w, w) for w in words}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", required=True, help="A judge model folder (e.g. <workdir>/registry/judge/6/export/model).")
    ap.add_argument("--workdir", required=True, help="A flywheel run's workdir (its preference data is read).")
    ap.add_argument("--iteration", default="001")
    ap.add_argument("--items", type=int, default=240)
    ap.add_argument("--config", default="configs/local.yaml")
    args = ap.parse_args()

    from flywheel.config import load_config
    from flywheel.datasets import read_rows
    from flywheel.engines.hf import HFTextEngine
    from flywheel.judge import pointwise

    cfg = load_config(args.config, [f"run.workdir={args.workdir}"])
    base = f"{args.workdir}/data/iterations/{args.iteration}"
    prompts = {r["prompt_id"]: r for r in read_rows(f"{base}/pref-prompts")}
    cands = [c for c in read_rows(f"{base}/pref-candidates")
             if prompts[c["prompt_id"]]["subtask"] in SUBTASKS][:args.items]
    engine = HFTextEngine(args.judge, cfg.judge.generation.model_copy(update={"top_logprobs": 0,
                                                                               "max_new_tokens": 40}))
    results = engine.generate([pointwise.build(prompts[c["prompt_id"]], c, style=cfg.judge.prompt_style)
                               for c in cands], seed=cfg.run.seed)
    n = Counter()
    for c, r in zip(cands, results, strict=True):
        said = re.search(r"answer says (\w+)", r.text or "")
        kind = "right" if c["output_text"].strip() == prompts[c["prompt_id"]]["reference_text"].strip() else "wrong"
        n[kind] += 1
        n[f"{kind}/names_answer"] += bool(said) and said.group(1) in _values(c["output_text"])
        n[f"{kind}/says_right"] += "which is right" in (r.text or "")
    for kind in ("right", "wrong"):
        k = max(n[kind], 1)
        print(f"{kind:5s} answers {n[kind]:4d}: analysis names the answer's value {n[f'{kind}/names_answer'] / k:.2f}, "
              f"calls it right {n[f'{kind}/says_right'] / k:.2f}")


if __name__ == "__main__":
    main()
