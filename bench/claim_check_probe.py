"""Can a judge learn to check a claim against a text, and does a shorter text help? The loop's judges rate stated
relations absent (or, with the verdicts balanced, absent ones stated), and an object claim in another colour or
shape as if stated or absent: `bench/judge_misses.py --claims`. This trains a judge checkpoint on claim checks of
one kind alone (--kind relation | object), in the loop's own request (flywheel/judge/claims.py, compact style,
with the image) and the oracle teacher's words, its verdicts drawn evenly, and prints the held-out share whose
rating is the oracle's, by verdict, as it trains.

Rows as the loop makes them: a scene's description is the reference; the response describes the scene with one
error (an object's colour or shape changed, or two objects swapped, which reverses their relations); a claim of
either text is checked against the other. --context sentences checks it against what
`judgments.claim_context: all_sentences` gives it (flywheel/worlds/shapes/claims.py, the same verdicts): a
relation only the other text's sentences that name both its objects, an object the sentences that introduce
objects.

    .venv/bin/python bench/claim_check_probe.py --judge runs/s1x/models/judge-base-<hash> [--kind object]
        [--context sentences] [--steps 1500] [--evals 3] [--batch-size 16] [--lr 5e-4]

Measured 2026-12-07, --kind relation (200 held-out rows: 100 stated, 28 reversed, i.e. the text relates the two
objects the other way, 72 unplaced, i.e. it relates them not at all; share right, 1,500 steps, ~6 minutes each):
- the seed-1 judge base (runs/s1x/models/judge-base-2c3271c567cf), whole text (47 words): 0.765 at steps 500, 1,000
  and 1,500 alike (stated 1.000, reversed 0.679, unplaced 0.472). It learns a shortcut, not the reading: "the text
  says so" whenever the text has relation sentences (three or more objects), "the text does not place them" when
  it is one sentence about two (a debugging run's outputs). A random-initialised judge of the zoo reads exactly the
  same, 128 wide (0.765 at 500, 1,000, 1,500), 256 wide and 4 layers deep (0.765 at 500 each; stopped there):
  neither width nor depth breaks it.
- the same base, --context sentences (32 words): 0.925 at 500, 0.940 at 1,000 and 1,500 (stated 1.000, reversed
  0.786, unplaced 0.917). Without the sentences that do not bear on the claim, the same shortcut reads nearly
  right: what `judgments.claim_context: sentences` gives the loop's judge.

Measured 2026-12-07, --kind object, the same base (200 held-out rows: 67 stated, 67 another count, 66 another
colour or shape; one error never leaves an object claim absent):
- whole text (29 words): 0.665 at steps 500, 1,000 and 1,500 (stated 0.746 / 0.761 / 0.821, another count 1.000 /
  0.970 / 0.955, another colour or shape 0.242 / 0.258 / 0.212);
- --context sentences (19 words): 0.630 / 0.685 / 0.675 (another colour or shape 0.167 / 0.258 / 0.227).
  Dropping the relation sentences does not help: the judge does not tell whether the claim's colour is in the
  text (the loop's judges misrate about half the gold object claims in another colour), so
  `claim_context: all_sentences` was not run in the loop.
"""
from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from flywheel.worlds.shapes.claims import (
    ABSENT,
    EXACT,
    OTHER_ATTRIBUTE,
    OTHER_COUNT,
    claim_sentences,
    split_claims,
    verdict,
)
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.perturb import swap_positions, wrong_colour, wrong_shape
from flywheel.worlds.shapes.scene import describe, sample_scene


RELATION_VERDICTS = ("stated", "reversed", "unplaced")
OBJECT_VERDICTS = (EXACT, OTHER_COUNT, OTHER_ATTRIBUTE)  # one error never leaves an object claim absent (rating 1)


def verdict_name(kind: str, rating: int, analysis: str) -> str:
    """What a check's verdict says: a relation "stated", "reversed" (the text relates the two objects the other
    way) or "unplaced" (not at all); an object its rating (5 stated, 3 another count, 2 another colour or
    shape)."""
    if kind == "object":
        return str(rating)
    return "stated" if rating == EXACT else "reversed" if analysis.startswith("The text says") else "unplaced"


def check_row(rng: np.random.Generator, world: ShapesWorldConfig, kind: str, context: str,
              want: tuple[int, ...]) -> tuple[dict, str, int]:
    """(TRL prompt-completion row, its verdict_name, the oracle's rating) of one claim check of `kind` whose
    rating is in `want`."""
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
        checks = [(c, reference) for c in split_claims(said)] + [(c, said) for c in split_claims(reference)]
        checks = [(c, t, *verdict(c, t)) for c, t in checks if c.kind == kind]
        checks = [x for x in checks if x[3] in want]
        if checks:
            break
    claim, against, analysis, rating = checks[int(rng.integers(len(checks)))]
    if context == "sentences":
        against = claim_sentences(claim.text, against)
        assert verdict(claim, against)[1] == rating, (claim.text, against)  # the check asks the same question
    image = render(scene, world.image_size)
    req = claims.build(claim.text, against, [image], style="compact")
    answer = f"Analysis: {analysis}\nRating: {rating}"
    completion = [{"role": "assistant", "content": [{"type": "text", "text": answer}]}]
    row = {"images": [image], "prompt": req.messages, "completion": completion}
    return row, verdict_name(kind, rating, analysis), rating


def wanted(kind: str, k: int) -> tuple[int, ...]:
    """The ratings the k-th row draws from, evenly: a relation stated or not, an object each of its three."""
    return ((EXACT,), (ABSENT,))[k % 2] if kind == "relation" else (OBJECT_VERDICTS[k % 3],)


def accuracy(model_dir: Path, rows: list[tuple[dict, str, int]]) -> dict[str, float]:
    """The share of rows whose greedy rating is the oracle's: all, and by verdict."""
    from flywheel.config import GenerationConfig
    from flywheel.engines.base import TextRequest
    from flywheel.engines.hf import HFTextEngine
    from flywheel.judge import pointwise

    engine = HFTextEngine(str(model_dir), GenerationConfig(max_new_tokens=48, temperature=0.0, batch_size=16))
    outs = engine.generate([TextRequest(r["prompt"], r["images"]) for r, _, _ in rows])
    right = np.array([getattr(pointwise.parse(o.text or ""), "rating", None) == rating
                      for o, (_, _, rating) in zip(outs, rows, strict=True)])
    said = np.array([s for _, s, _ in rows])
    return {"all": right.mean()} | {s: right[said == s].mean() for s in dict.fromkeys(said)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", required=True, help="A judge checkpoint (a run's models/judge-base-*, or a trained "
                    "judge's directory).")
    ap.add_argument("--kind", choices=["relation", "object"], default="relation")
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
    tests = [check_row(held, world, args.kind, args.context, wanted(args.kind, k)) for k in range(args.held_out)]
    words = np.mean([len(r["prompt"][0]["content"][-1]["text"].split()) for r, _, _ in tests])
    kinds = Counter(s for _, s, _ in tests)
    print(f"{args.held_out} held-out rows ({dict(kinds)}), context {args.context}: {words:.0f} words of request text")
    print(f"step 0: {_fmt(accuracy(Path(args.judge), tests))}", flush=True)
    work, t0 = Path(tempfile.mkdtemp(prefix="claim-check-")), time.perf_counter()
    drawn = itertools.count()  # training rows draw their verdicts evenly too
    try:
        for step, out, stats in pretrain_vlm_in_parts(
                args.judge, work, lambda rng, n: [check_row(rng, world, args.kind, args.context,
                                                            wanted(args.kind, next(drawn)))[0] for _ in range(n)],
                args.steps, args.evals, batch_size=args.batch_size, lr=args.lr):
            print(f"step {step}: {_fmt(accuracy(out, tests))} (loss {stats['sft_loss']:.3f}, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fmt(acc: dict[str, float]) -> str:
    by = ", ".join(f"{k} {acc[k]:.3f}" for k in (*RELATION_VERDICTS, *map(str, OBJECT_VERDICTS)) if k in acc)
    return f"right {acc['all']:.3f} ({by})"


if __name__ == "__main__":
    main()
