"""Does the judge compare a colour answer with the reference, or call every answer "matches"? In 6 of 8 seed-1
trainings of the claims recipe the judge writes "The answer says blue, which matches, so it is right" of a wrong
colour answer, so 16-27 of the 80 id-test colour pairs flip (docs/results.md, runs/s1s48). This trains a judge base
on a finished run's own curated SFT rows of the chosen sub-tasks (the loop's rows, the loop's request) and prints,
as it trains, what it writes of the run's id-test gold colour-question candidates: per gold variant (correct,
wrong, verbose, unreadable), how often its analysis says "matches", "differs", or neither (-).

    .venv/bin/python bench/answer_compare_probe.py --run runs/s1s48 --judge runs/s1s48/models/judge-base-<hash>
        [--subtasks iu_color,iu_count,iu_existence,nlg_scene_qa] [--protocols pointwise,pairwise]
        [--repeat iu_color=3] [--balance] [--reword verify-but] [--show 3] [--steps 600] [--evals 3]
        [--config configs/local_claims.yaml]

Measured 2026-12-07 on runs/s1s48's rows and the seed-1 judge base (600 steps, batch 16, lr 5e-4, ~3 minutes each;
"wrong: differs" is the comparison learned, out of 16):
- iu_color pointwise rows alone (548 matches, 113 differs): wrong: differs 12, 14, 16 at steps 200, 400, 600;
- iu_color and nlg_scene_qa, both protocols: 1, 14, 16;
- iu_color and iu_count: 2, 11, 7; iu_color and iu_existence: 7, 14, 14;
- iu_color, iu_count and iu_existence: 0, 9, 8; iu_color, iu_existence and nlg_scene_qa: 0, 0, 1;
- all four: 0, 0, 0 - the loop's failure, reproduced. With the colour rows worded apart ("the same colour" /
  "another colour") all four still read 0, so it is not the shared phrase;
- all four, 2,400 steps in 4 parts: 0 at 600, 15 at 1,200, 16 at 1,800.
- all four with the colour rows three times (--repeat iu_color=3, 48% of the rows): 0, 0, 0. More colour rows do
  not speed it. No one sub-task blocks it: the more of the other answer rows beside them, the later it forms.
2026-12-08, runs/s1c's rows (the same recipe at train.judge_sft.epochs=2.4, 4,030 rows), all four sub-tasks:
- --balance (every sub-task's verdicts evened out, colour 509 / 509): it says "differs" of 14, 16, 15 wrong answers
  and of 13, 16, 15 of the 16 right short ones - it tells short from verbose answers, not right from wrong;
- --reword side-by-side ("The answer says blue, and blue against red matches"): 0, 3, 3 - it writes both colours
  right next to each other and still calls them a match;
- --reword verify ("The answer says blue. The circle is not blue, which differs"): 3, 16, 16, every right answer
  "matches": checking the answer's colour in the image is a yes/no look-up the judge learns, where comparing two
  colour words is not; --reword verify-but (the loop's words since, assess_text._colour_verdict): 0, 15, 16;
- --reword evidence-verify (the shape's colour first, as every other answer's evidence: "The circle is red. The
  answer says blue; the circle is not blue, which differs"): 0, 16, 16, every right answer "matches". In the loop
  the verify-but words cost relation questions out of distribution (the judge opens with "The answer says no"
  and gives no evidence, runs/s1v); these keep the evidence first, not yet run in the loop.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

VERDICT = re.compile(r"(?:which|against \w+) (matches|differs)")
COLOUR_VERDICT = re.compile(r"(The (\w+) is (\w+)\. The answer says (\w+)), which (matches|differs)")
REWORDINGS = {
    # both colours next to each other just before the verdict
    "side-by-side": lambda m: f"{m[1]}, and {m[4]} against {m[3]} {m[5]}",
    # the answer's colour checked against the image, a yes/no look-up like an existence question's
    "verify": lambda m: (f"The answer says {m[4]}. The {m[2]} is {'' if m[5] == 'matches' else 'not '}{m[4]}, "
                         f"which {m[5]}"),
    # the shape's colour first, as every other answer's evidence, then the answer's colour checked in the image
    "evidence-verify": lambda m: (f"{m[1]}; the {m[2]} is {'' if m[5] == 'matches' else 'not '}{m[4]}, "
                                  f"which {m[5]}"),
    # as verify, and saying the shape's colour too: the loop's words since 2026-12-08
    "verify-but": lambda m: loop_words(shape=m[2], truth=m[3], said=m[4], matches=m[5] == "matches"),
}


def loop_words(shape: str, truth: str, said: str, matches: bool) -> str:
    """The teacher's colour finding (assess_text._colour_verdict) with the row's own verdict, up to its verdict
    word, as the rows it rewords end there ("..., which differs" and then ", so it is wrong")."""
    from flywheel.worlds.shapes.assess_text import _colour_verdict

    text = _colour_verdict(shape, said, truth, matches, ()).text
    return text[:text.index(", so it is ")]


def reword(messages: str, how: str) -> str:
    """A colour row's verdicts reworded (REWORDINGS); "The circle is red. The answer says blue, which differs"
    becomes "..., and blue against red differs" or "The answer says blue. The circle is not blue, which differs"."""
    return COLOUR_VERDICT.sub(REWORDINGS[how], messages)


def trl_row(row: dict) -> dict:
    """A curated SFT row as the prompt-completion row `pretrain_vlm` trains on (PIL images)."""
    from PIL import Image

    messages = json.loads(row["messages"])
    return {"images": [Image.open(io.BytesIO(b)).convert("RGB") for b in row["images"]],
            "prompt": messages[:-1], "completion": messages[-1:]}


def gold_colour_requests(cfg) -> tuple[list[str], list]:
    """(gold variant, pointwise request) of every id-test gold candidate of a colour question."""
    from flywheel import storage
    from flywheel.datasets import read_dataset
    from flywheel.evaluate import meta
    from flywheel.iteration import paths
    from flywheel.judge import pointwise
    from flywheel.worlds.shapes.gold import variant_of

    base = storage.join(paths(cfg, 0)["gold"], "id-test")
    _, prompts = meta.read_gold(base)
    cands = [c for c in read_dataset(storage.join(base, "candidates"))[0].to_pylist()
             if prompts.get(c["prompt_id"], {}).get("subtask") == "iu_color"]
    return ([variant_of(c) or "?" for c in cands],
            [pointwise.build(prompts[c["prompt_id"]], c, style=cfg.judge.prompt_style) for c in cands])


def by_verdicts(row: dict):
    """Balance key: stratum (sub-task, protocol), bucket = the verdicts the row says, in order."""
    return (row["subtask"], row["protocol"]), tuple(VERDICT.findall(row["messages"]))


def readings(model_dir: Path, variants: list[str], requests: list, show: int = 0) -> dict[str, int]:
    """How the checkpoint's greedy analyses compare each gold variant: "<variant>: matches|differs|-" counts;
    `show` of the analyses of wrong answers printed."""
    from flywheel.config import GenerationConfig
    from flywheel.engines.hf import HFTextEngine

    engine = HFTextEngine(str(model_dir), GenerationConfig(max_new_tokens=48, temperature=0.0, batch_size=16))
    texts = [o.text or "" for o in engine.generate(requests)]
    for t in [t for v, t in zip(variants, texts, strict=True) if v == "wrong"][:show]:
        print(f"  wrong answer: {t[:160]!r}")
    said = [VERDICT.search(t) for t in texts]
    return dict(sorted(Counter(f"{v}: {m.group(1) if m else '-'}" for v, m in zip(variants, said, strict=True))
                       .items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="A finished run's workdir: its iteration 0's curated SFT rows "
                    "and its id-test gold.")
    ap.add_argument("--judge", required=True, help="The judge checkpoint to train from (a run's models/judge-base-*).")
    ap.add_argument("--subtasks", default="iu_color,iu_count,iu_existence,nlg_scene_qa")
    ap.add_argument("--protocols", default="pointwise,pairwise")
    ap.add_argument("--repeat", action="append", default=[], metavar="SUBTASK=N",
                    help="Show a sub-task's rows N times as often (a per-sub-task SFT weight); repeatable.")
    ap.add_argument("--balance", action="store_true", help="Balance the rows' verdicts (the words they say) within "
                    "each sub-task and protocol by the Q3 rule (curate.score_balance balances ratings, across "
                    "sub-tasks).")
    ap.add_argument("--reword", choices=sorted(REWORDINGS), help="Reword the colour rows' verdicts (reword).")
    ap.add_argument("--show", type=int, default=0, help="Print this many of the judge's analyses of wrong answers.")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--evals", type=int, default=3, help="Evaluations (the phase is trained in parts).")
    ap.add_argument("--config", default="configs/local_claims.yaml", help="The run's config.")
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.compute as pc

    from flywheel import storage
    from flywheel.config import load_config
    from flywheel.curate.balance import rebalance
    from flywheel.datasets import read_dataset
    from flywheel.iteration import paths
    from flywheel.models.pretrain_vlm import pretrain_vlm_in_parts

    cfg = load_config(args.config, [f"run.workdir={args.run}"])
    subtasks, protocols = set(args.subtasks.split(",")), set(args.protocols.split(","))
    sft = read_dataset(storage.join(paths(cfg, 0)["curated"], "sft"), "sft")[0]
    # filter in Arrow: only the chosen rows' image bytes become Python objects, not all ~35,000 rows'
    chosen = pc.and_(pc.is_in(sft["subtask"], pa.array(sorted(subtasks))),
                     pc.is_in(sft["protocol"], pa.array(sorted(protocols))))
    rows = sft.filter(chosen).to_pylist()
    if not rows:
        raise SystemExit(f"no curated SFT rows of {sorted(subtasks)} x {sorted(protocols)} in {args.run}")
    if args.reword:
        rows = [{**r, "messages": reword(r["messages"], args.reword)} if r["subtask"] == "iu_color" else r
                for r in rows]
    if args.balance:
        rows, rep = rebalance(rows, by_verdicts, name="verdict_balance")
        print(f"balanced: {rep}")
    said = Counter((r["subtask"], m.group(1)) for r in rows for m in VERDICT.finditer(r["messages"]))
    print(f"{len(rows)} rows; verdicts said in them: {dict(sorted(said.items()))}")
    repeat = {k: int(v) for k, v in (x.split("=") for x in args.repeat)}
    pool = [trl_row(r) for r in rows for _ in range(repeat.get(r["subtask"], 1))]
    variants, requests = gold_colour_requests(cfg)
    work = Path(tempfile.mkdtemp(prefix="answer-compare-"))
    try:
        for step, out, stats in pretrain_vlm_in_parts(
                args.judge, work, lambda rng, n: [pool[int(i)] for i in rng.integers(len(pool), size=n)],
                args.steps, args.evals, batch_size=16, lr=5e-4):
            said = readings(out, variants, requests, args.show)
            print(f"step {step}: {said} (loss {stats['sft_loss']:.3f})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
