"""Does the judge read the answer it rates? On a flywheel run's preference candidates for colour, existence and
count questions (the policy's own answers, judged against the prompt's reference answer), the share of the
judge's analyses whose "The answer says X" names the response's own value, and how often it calls a wrong
answer right. A judge that copies the reference instead of reading scores every answer to a prompt alike, and
its preference pairs tie.

Then, per question type, where its verdicts go wrong. Its analysis has three steps ("There are zero squares.
The answer says two, which is wrong."): it restates the reference, reads the answer, and compares them. Each
is scored apart: `restates` (the first sentence's value is the reference's), `reads` (the value it says the
answer gives is the answer's), `follows` (its verdict is what its own two values imply, right or wrong), and
`verdict` (its verdict is the true one). A wrong verdict is blamed on the first step that failed.

    .venv/bin/python bench/judge_reads_answers.py --judge <model folder> --workdir runs/local [--iteration 001]
        [--items 360]

Measured 2026-11-24 on a proof run's iteration-1 candidates (240 answers, 104 wrong): iteration 0's champion
named the wrong answers' value in 0.52 of them and called 0.65 right; the champion after three promoted rounds
(gate.judge_test none) 0.93 and 0.33. Right answers: 0.68 / 0.96 and 1.00 / 0.93.
With the judge base that learns to read (world.base_policies.judge.reading_share), the champion after three
rounds, 360 answers (120 per type): restates 1.00 for every type and reads 0.97-0.98, but its verdict follows
its own two values for 0.65 of colour answers, 0.81 of existence and 0.98 of count; where the two colours it
wrote differ it still says right in 25 of 38. Colour (and existence) answers fail at the comparison, not at
seeing or reading.
2026-11-25, one round (1,167 steps on iteration 0's rows): with the teacher naming its comparison ("which
differs, so it is wrong") and a base taught those words (world.base_policies.judge.matching_share 0.25),
verdicts follow the judge's own two values for existence 0.57 -> 1.00 and count 0.88 -> 0.99; colour stays
at 0.68 (39 of 39 differing colours still called right), as its base tells colours apart 0.69 of the time.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

SUBTASKS = ("iu_color", "iu_existence", "iu_count")
SAME = {"none": "zero", "no": "zero"}  # "There are none." is read as zero in the judge's analysis
STEPS = ("restates", "reads", "follows")
# "The answer says two, which is wrong." (the teacher's words before 2026-11-25) or "..., which differs, so it is
# wrong." (since: the comparison is a word of its own)
VERDICT = re.compile(r"answer says ([\w ]+?), which (?:is|(?:matches|differs), so it is) (right|wrong)")
# colour since 2026-12-08: "The answer says blue. The circle is not blue but red, which differs, so it is wrong."
# (the answer's colour first, then the image's; assess_text._colour_verdict)
COLOUR_CHECK = re.compile(r"answer says (\w+)\. The \w+ is (?:not \w+ but (\w+)|(\w+)), which (?:matches|differs), "
                          r"so it is (right|wrong)")


def _values(text: str) -> set[str]:
    words = re.findall(r"\w+", text.lower())
    return set(words) | {SAME.get(w, w) for w in words}


def value(subtask: str, text: str) -> str | None:
    """The one value a sentence gives for a question type: a colour, a number word, or yes/no (existence:
    "There is no X" / "No." is no, "There is a X" / "Yes." is yes). None when it names none or several."""
    from flywheel.worlds.shapes.vocab import COLOURS, NUMBER_WORDS

    words = re.findall(r"\w+", text.lower())
    if subtask == "iu_existence":
        return "no" if "no" in words or "not" in words else "yes" if words else None
    pool = set(COLOURS) if subtask == "iu_color" else set(NUMBER_WORDS)
    found = {SAME.get(w, w) for w in words} & pool
    return found.pop() if len(found) == 1 else None


def steps(subtask: str, reference: str, answer: str, analysis: str) -> dict[str, bool]:
    """Which of the judge's three steps held on one item, and whether its verdict was the true one."""
    first, _, rest = analysis.removeprefix("Analysis:").strip().partition(".")
    said = VERDICT.search(rest)
    truth, given = value(subtask, reference), value(subtask, answer)
    restated = value(subtask, first)
    read = value(subtask, said.group(1)) if said else None
    verdict = said.group(2) == "right" if said else None
    if subtask == "iu_color" and (c := COLOUR_CHECK.search(analysis)):
        read, restated, verdict = value(subtask, c[1]), value(subtask, c[2] or c[3]), c[4] == "right"
    both = verdict is not None and restated is not None and read is not None
    return {"differ": both and restated != read, "differ_right": both and restated != read and verdict,
            "restates": restated is not None and restated == truth,
            "reads": read is not None and read == given,
            "follows": both and verdict == (restated == read),
            "verdict": verdict is not None and verdict == (truth == given)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", required=True,
                    help="A judge model folder (e.g. <workdir>/registry/judge/6/export/model).")
    ap.add_argument("--workdir", required=True, help="A flywheel run's workdir (its preference data is read).")
    ap.add_argument("--iteration", default="001")
    ap.add_argument("--items", type=int, default=360)
    ap.add_argument("--config", default="configs/local.yaml")
    args = ap.parse_args()

    from flywheel.config import load_config
    from flywheel.datasets import read_rows
    from flywheel.engines.hf import HFTextEngine
    from flywheel.judge import pointwise

    cfg = load_config(args.config, [f"run.workdir={args.workdir}"])
    base = f"{args.workdir}/data/iterations/{args.iteration}"
    prompts = {r["prompt_id"]: r for r in read_rows(f"{base}/pref-prompts")}
    rows = read_rows(f"{base}/pref-candidates")
    cands = [c for t in SUBTASKS for c in [c for c in rows if prompts[c["prompt_id"]]["subtask"] == t]
             [:args.items // len(SUBTASKS)]]  # the same share of each question type
    engine = HFTextEngine(args.judge, cfg.judge.generation.model_copy(update={"top_logprobs": 0,
                                                                               "max_new_tokens": 40}))
    results = engine.generate([pointwise.build(prompts[c["prompt_id"]], c, style=cfg.judge.prompt_style)
                               for c in cands], seed=cfg.run.seed)
    n, by_type = Counter(), {t: Counter() for t in SUBTASKS}
    for c, r in zip(cands, results, strict=True):
        prompt = prompts[c["prompt_id"]]
        got = steps(prompt["subtask"], prompt["reference_text"], c["output_text"], r.text or "")
        t = by_type[prompt["subtask"]]
        t["items"] += 1
        t.update(k for k, ok in got.items() if ok)
        if not got["verdict"]:
            t["wrong_verdicts"] += 1
            t["blame/" + next((k for k in STEPS if not got[k]), "none")] += 1
        said = re.search(r"answer says (\w+)", r.text or "")
        kind = "right" if c["output_text"].strip() == prompts[c["prompt_id"]]["reference_text"].strip() else "wrong"
        n[kind] += 1
        n[f"{kind}/names_answer"] += bool(said) and said.group(1) in _values(c["output_text"])
        n[f"{kind}/says_right"] += bool((m := VERDICT.search(r.text or "")) and m.group(2) == "right")
    for kind in ("right", "wrong"):
        k = max(n[kind], 1)
        print(f"{kind:5s} answers {n[kind]:4d}: analysis names the answer's value {n[f'{kind}/names_answer'] / k:.2f}, "
              f"calls it right {n[f'{kind}/says_right'] / k:.2f}")
    print(f"\n{'type':13s} {'items':>5s} " + " ".join(f"{k:>8s}" for k in (*STEPS, "verdict"))
          + "   wrong verdicts blamed on (first failed step); its values differ but it says right")
    for subtask, t in by_type.items():
        k = max(t["items"], 1)
        blame = ", ".join(f"{s} {t['blame/' + s]}" for s in (*STEPS, "none") if t["blame/" + s])
        print(f"{subtask:13s} {t['items']:5d} " + " ".join(f"{t[s] / k:8.2f}" for s in (*STEPS, "verdict"))
              + f"   {t['wrong_verdicts']}: {blame or '-'}; {t['differ_right']} of {t['differ']}")


if __name__ == "__main__":
    main()
