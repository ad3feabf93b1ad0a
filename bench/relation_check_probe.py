"""Can a judge learn to check a relation claim against a text, and does a shorter text help? The loop's judges rate
stated relations absent (or, with the verdicts balanced, absent ones stated): `bench/judge_misses.py --claims`. This
trains a judge checkpoint on relation claim checks alone, in the loop's own request (flywheel/judge/claims.py,
compact style, with the image) and the oracle teacher's words, half of them stated in the text and half not, and
prints the held-out share whose rating is the oracle's, stated and absent apart, as it trains.

Rows as the loop makes them: a scene's description is the reference; the response describes the scene with one
error (an object's colour or shape changed, or two objects swapped, which reverses their relations); a relation of
either text is checked against the other. --context sentences checks it against only the other text's sentences
that name both of its objects (the same verdicts: a relation is stated in one sentence) instead of the whole text.

    .venv/bin/python bench/relation_check_probe.py --judge runs/s1x/models/judge-base-<hash> [--context sentences]
        [--steps 1500] [--evals 3] [--batch-size 16] [--lr 5e-4]

Measured 2026-12-07 (200 held-out rows: 100 stated, 28 reversed, i.e. the text relates the two objects the other
way, 72 unplaced, i.e. it relates them not at all; share right, 1,500 steps, ~6 minutes each):
- the seed-1 judge base (runs/s1x/models/judge-base-2c3271c567cf), whole text (47 words): 0.765 at steps 500, 1,000
  and 1,500 alike (stated 1.000, reversed 0.679, unplaced 0.472). It learns a shortcut, not the reading: "the text
  says so" whenever the text has relation sentences (three or more objects), "the text does not place them" when
  it is one sentence about two (a debugging run's outputs). A random-initialised judge of the zoo reads exactly the
  same, 128 wide (0.765 at 500, 1,000, 1,500), 256 wide and 4 layers deep (0.765 at 500 each; stopped there):
  neither width nor depth breaks it.
- the same base, --context sentences (32 words): 0.925 at 500, 0.940 at 1,000 and 1,500 (stated 1.000, reversed
  0.786, unplaced 0.917). Without the sentences that do not bear on the claim, the same shortcut reads nearly
  right: what `judgments.claim_context: sentences` gives the loop's judge.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from flywheel.worlds.shapes.claims import ABSENT, EXACT, Claim, split_claims, verdict
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.perturb import swap_positions, wrong_colour, wrong_shape
from flywheel.worlds.shapes.scene import describe, sample_scene
from flywheel.worlds.shapes.text_parse import sentences


def naming_both(claim: Claim, text: str) -> str:
    """The text's sentences that name both of the claim's objects (its colour and shape words), joined."""
    def names(sentence: str, group) -> bool:
        colour, shape = group
        return (colour is None or colour in sentence.lower()) and shape in sentence.lower()
    return " ".join(f"{s.strip()}." for s in sentences(text) if names(s, claim.subject) and names(s, claim.object))


def check_row(rng: np.random.Generator, world: ShapesWorldConfig, context: str, stated: bool) -> tuple[dict, str]:
    """(TRL prompt-completion row, what the text says of the claim: "stated", "reversed" (it relates the two
    objects otherwise) or "unplaced") of one relation claim, stated in its text or not."""
    from flywheel.judge import claims
    from flywheel.worlds.shapes.render import render

    while True:
        scene = sample_scene(rng, config=world)
        n = len(scene.objects)
        i, j = (int(k) for k in rng.choice(n, size=2, replace=False)) if n > 1 else (0, 0)
        error = rng.integers(3)
        response = (wrong_colour(scene, i, rng, world.palette) if error == 0 else
                    wrong_shape(scene, i, rng, world.shapes) if error == 1 else swap_positions(scene, i, j))
        reference, said = describe(scene), describe(response)
        checks = [(c, reference) for c in split_claims(said) if c.kind == "relation"]
        checks += [(c, said) for c in split_claims(reference) if c.kind == "relation"]
        checks = [(c, t, *verdict(c, t)) for c, t in checks]
        checks = [x for x in checks if (x[3] == EXACT) == stated and x[3] in (EXACT, ABSENT)]
        if checks:
            break
    claim, against, analysis, rating = checks[int(rng.integers(len(checks)))]
    if context == "sentences":
        against = naming_both(claim, against)
        assert verdict(claim, against)[1] == rating, (claim.text, against)  # the check asks the same question
    image = render(scene, world.image_size)
    req = claims.build(claim.text, against, [image], style="compact")
    return {"images": [image], "prompt": req.messages,
            "completion": [{"role": "assistant", "content": [{"type": "text", "text":
                                                               f"Analysis: {analysis}\nRating: {rating}"}]}]}, (
        "stated" if rating == EXACT else "reversed" if analysis.startswith("The text says") else "unplaced")


def accuracy(model_dir: Path, rows: list[tuple[dict, str]]) -> dict[str, float]:
    """The share of rows whose greedy rating is the oracle's: all, and by what the text says of the claim."""
    from flywheel.config import GenerationConfig
    from flywheel.engines.base import TextRequest
    from flywheel.engines.hf import HFTextEngine
    from flywheel.judge import pointwise

    engine = HFTextEngine(str(model_dir), GenerationConfig(max_new_tokens=48, temperature=0.0, batch_size=16))
    outs = engine.generate([TextRequest(r["prompt"], r["images"]) for r, _ in rows])
    right = np.array([getattr(pointwise.parse(o.text or ""), "rating", None) == (EXACT if said == "stated" else ABSENT)
                      for o, (_, said) in zip(outs, rows, strict=True)])
    said = np.array([s for _, s in rows])
    return {"all": right.mean()} | {s: right[said == s].mean() for s in ("stated", "reversed", "unplaced")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", required=True, help="A judge checkpoint (a run's models/judge-base-*, or a trained "
                    "judge's directory).")
    ap.add_argument("--context", choices=["text", "sentences"], default="text")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--evals", type=int, default=3, help="Held-out evaluations (the phase is trained in parts).")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--held-out", type=int, default=200)
    ap.add_argument("--config", default="configs/local.yaml", help="Its world is the one the rows show.")
    args = ap.parse_args()

    from flywheel.config import load_config
    from flywheel.models.pretrain_vlm import pretrain_vlm_in_parts

    world = load_config(args.config).world.shapes
    held = np.random.default_rng(10**6)
    tests = [check_row(held, world, args.context, stated=k % 2 == 0) for k in range(args.held_out)]
    words = np.mean([len(r["prompt"][0]["content"][-1]["text"].split()) for r, _ in tests])
    kinds = Counter(s for _, s in tests)
    print(f"{args.held_out} held-out rows ({dict(kinds)}), context {args.context}: {words:.0f} words of request text")
    print(f"step 0: {_fmt(accuracy(Path(args.judge), tests))}", flush=True)
    work, t0 = Path(tempfile.mkdtemp(prefix="relation-check-")), time.perf_counter()
    try:
        for step, out, stats in pretrain_vlm_in_parts(
                args.judge, work, lambda rng, n: [check_row(rng, world, args.context, rng.random() < 0.5)[0]
                                                  for _ in range(n)],
                args.steps, args.evals, batch_size=args.batch_size, lr=args.lr):
            print(f"step {step}: {_fmt(accuracy(out, tests))} (loss {stats['sft_loss']:.3f}, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fmt(acc: dict[str, float]) -> str:
    return (f"right {acc['all']:.3f} (stated {acc['stated']:.3f}; absent: reversed {acc['reversed']:.3f}, "
            f"unplaced {acc['unplaced']:.3f})")


if __name__ == "__main__":
    main()
