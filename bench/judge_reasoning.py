"""Where a judge's ratings go wrong: in what it sees or in how it reasons from what it saw. On a run's gold QA items
(colour, count, existence, relation; NLG scene QA) the noiseless teacher's analysis is fed to the judge
(teacher forcing) and two next-step choices are scored by the judge's own log-probabilities:

- verdict: given the evidence ("There is a red circle in the image. The answer says no, which is"), does it
  pick "right" or "wrong" correctly? This needs no perception: both facts are on the page.
- rating: given the whole analysis, is its likeliest rating the teacher's?

A judge that ranks gold pairs poorly but scores well here cannot see; one that scores poorly here cannot compare
(measured on iteration-0 judges, 2026-11-23: 1,258 SFT steps on the policy's samples alone gave verdicts 0.50
(existence) to 0.80 (count); 4,000 steps 0.81-1.00; 1,258 steps with candidates.seeded_variants=2 0.75-0.90).

    .venv/bin/python bench/judge_reasoning.py --workdir runs/local --model <judge dir> [--split id-test]
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch

QA_SUBTASKS = ("iu_color", "iu_count", "iu_existence", "iu_relation", "nlg_scene_qa")
VERDICT = ", which is "


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="A flywheel run's workdir (its gold is read).")
    ap.add_argument("--model", required=True, help="A judge checkpoint directory (e.g. a registry export).")
    ap.add_argument("--split", default="id-test")
    ap.add_argument("--config", default="configs/local.yaml")
    args = ap.parse_args()
    torch.set_num_threads(2)

    import flywheel.models.processors  # noqa: F401  (registers the zoo judge's processor)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from flywheel import storage
    from flywheel.config import load_config
    from flywheel.datasets import read_dataset
    from flywheel.engines.base import check_text_request
    from flywheel.judge import pointwise
    from flywheel.worlds.shapes.oracle_config import TeacherConfig
    from flywheel.worlds.shapes.teacher import OracleTeacher, make_context

    cfg = load_config(args.config, [f"run.workdir={args.workdir}"])
    gold = storage.join(cfg.storage.uri, "gold", args.split)
    prompts = {r["prompt_id"]: r for r in read_dataset(storage.join(gold, "prompts"))[0].to_pylist()}
    cands = read_dataset(storage.join(gold, "candidates"))[0].to_pylist()
    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model).eval()
    teacher = OracleTeacher(TeacherConfig(error_rate=0.0), cfg.world.shapes)

    @torch.inference_mode()
    def logprob(req, prefix: str, continuation: str) -> float:
        images = check_text_request(req)
        text = processor.apply_chat_template(req.messages, add_generation_prompt=True) + prefix + continuation
        enc = processor(text=[text], images=[images] if images else None, return_tensors="pt")
        n = len(processor.tokenizer(continuation, add_special_tokens=False)["input_ids"])
        lp = model(**enc).logits[0, -n - 1:-1].float().log_softmax(-1)
        return lp.gather(-1, enc["input_ids"][0, -n:, None]).sum().item()

    right = defaultdict(lambda: [0, 0, 0, 0])  # subtask -> verdicts right, verdicts, ratings right, ratings
    for c in cands:
        p = prompts[c["prompt_id"]]
        if p["subtask"] not in QA_SUBTASKS:
            continue
        truth = pointwise.parse(teacher.answer(make_context("pointwise", p, [c])))
        req = pointwise.build(p, c, style=cfg.judge.prompt_style)
        analysis, r = "Analysis: " + truth.analysis, right[p["subtask"]]
        if VERDICT in analysis:
            cut = analysis.index(VERDICT) + len(VERDICT)
            says_right = analysis[cut:].startswith("right")
            picks_right = logprob(req, analysis[:cut], "right") > logprob(req, analysis[:cut], "wrong")
            r[0] += picks_right == says_right
            r[1] += 1
        scores = [logprob(req, analysis + "\nRating: ", str(k)) for k in range(1, 6)]
        r[2] += scores.index(max(scores)) + 1 == truth.rating
        r[3] += 1
    print(f"{'subtask':16s} {'verdict given the evidence':>28s} {'rating given the analysis':>28s}")
    for sub, (v, nv, g, ng) in sorted(right.items()):
        print(f"{sub:16s} {v:>12d}/{nv:<4d} = {v / max(nv, 1):.2f} {g:>12d}/{ng:<4d} = {g / max(ng, 1):.2f}")


if __name__ == "__main__":
    main()
