"""Can the judge base learn to check a caption's mention against the reference, in the judge's own request, and
how fast? bench/lookup_probe.py found, in text alone, that a look-up keyed by colour (copying the shape after it,
the captions' own order) is learnt sooner than one keyed by shape (copying the colour before it). This trains the
world's judge base (a run's cached `judge-base-*`: it sees, quotes answers, never judged) on rows in the pointwise
caption request, each naming an object and asking what the other text holds of it:

    Checking. Look the mention up in the reference.  <pointwise caption request: image, reference, response>
    It mentions a green circle.  -> "It mentions a green circle: the green shape is a square."  (--key colour)
                                 -> "The green shape is a square."                (--key colour --words answer)
    The purple circle.           -> "It calls it green."     (--key shape: the colour the response gives it)

(nothing / "missing" when the reference has no such colour; the asked key names one object), and prints the
greedy answer's accuracy (the whole answer) on held-out rows as it trains.

    .venv/bin/python bench/judge_caption_check.py --base runs/fr3/models/judge-base-<hash> [--key colour]
        [--words teacher] [--steps 3000] [--evals 3] [--batch-size 16] [--lr 5e-4] [--save DIR]

Measured 2026-11-27 on runs/fr3's judge base (batch 16, lr 5e-4, the vision side frozen, 200 held-out rows;
the error then drawn by a local copy of perturb.wrong_colour / wrong_shape: the same rows' kinds, other draws):
- --key colour --words answer: 0.000 at step 0 (it has never seen the format), 0.990 at step 1,000 (229 s);
  copying the mention's own shape scores 0.380;
- --key shape, the look-up the teacher's "It calls the purple circle green." needs (the colour the response
  gives a reference object, the token before its shape): 0.965 at step 1,000 (222 s); copying 0.460;
- --key colour in the words of the trial in docs/tuning.md (judge), which also copy the mention: 0.71 at step
  1,000 (212 s).
So once a request names the object, the judge base looks it up either way within 1,000 steps, unlike the text-only
LM of bench/lookup_probe.py. In the loop it did not carry over: judge SFT on analyses that look every mention up
left the look-ups at chance, and at 0.57 from this bench's checkpoint (`--save`, then bench/judge_learning.py
--base <it>).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.perturb import wrong_colour, wrong_shape
from flywheel.worlds.shapes.scene import Scene, describe, sample_scene

HEADER = "Checking. Look the mention up in the reference."


def _changed(scene: Scene, rng: np.random.Generator, world: ShapesWorldConfig) -> Scene:
    """The scene with one object's colour or shape changed: what a caption with one error describes."""
    i = int(rng.integers(len(scene.objects)))
    return (wrong_colour(scene, i, rng, world.palette) if rng.random() < 0.5
            else wrong_shape(scene, i, rng, world.shapes))


def check_row(rng: np.random.Generator, world: ShapesWorldConfig, key: str,
              words: str = "teacher") -> tuple[dict, str]:
    """(TRL prompt-completion row, the answer's value). words (--key colour): "answer" writes the value alone,
    "teacher" the mention and its value as the trial's analyses did."""
    from flywheel.judge import base, pointwise
    from flywheel.judge.guidelines import get_guideline
    from flywheel.worlds.shapes.assessment import np_
    from flywheel.worlds.shapes.render import render

    while True:
        scene = sample_scene(rng, config=world)
        keys = [o.colour if key == "colour" else o.shape for o in scene.objects]
        if len(set(keys)) < len(keys):  # the key names one object of the reference
            continue
        response = _changed(scene, rng, world)
        if key == "colour" or any([o.shape for o in response.objects].count(o.shape) == 1 for o in scene.objects):
            break
    m = response.objects[int(rng.integers(len(response.objects)))]
    truth = {(o.colour if key == "colour" else o.shape): o for o in scene.objects}
    found = truth.get(m.colour if key == "colour" else m.shape)
    if key == "colour":
        value = found.shape if found else "missing"
        if words == "answer":
            target = f"The {m.colour} shape is {np_(None, found.shape) if found else 'missing'}."
        else:  # the trial's words (docs/tuning.md, judge): a 2-layer model does not carry a skill across phrasings
            held = (f"the {m.colour} shape is {np_(None, found.shape)}" if found
                    else f"nothing in the image is {m.colour}")
            target = f"It mentions {np_(m.colour, m.shape)}: {held}."
    else:  # the teacher's "It calls the purple circle green.": the response's colour of a reference object
        said = {o.shape: o for o in response.objects}
        shapes = [o.shape for o in response.objects]
        o = next(o for o in scene.objects if shapes.count(o.shape) == 1)
        value = said[o.shape].colour
        m, target = o, f"It calls it {value}."
    image = render(scene, world.image_size)
    sentence, _ = pointwise.instance({"images": [image], "query": "Describe the image.",
                                      "reference_text": describe(scene)},
                                     {"output_text": describe(response)}, get_guideline("iu", "iu_caption"))
    ask = f"It mentions {np_(m.colour, m.shape)}." if key == "colour" else f"The {m.colour} {m.shape}."
    text = f"{HEADER}\n{sentence}\n{ask}"
    return {"images": [image], "prompt": [{"role": "user", "content": base.content_parts(text, 1)}],
            "completion": [{"role": "assistant", "content": [{"type": "text", "text": target}]}]}, value


def accuracy(model_dir: Path, rows: list[tuple[dict, str]]) -> float:
    from flywheel.config import GenerationConfig
    from flywheel.engines.base import TextRequest
    from flywheel.engines.hf import HFTextEngine

    engine = HFTextEngine(str(model_dir), GenerationConfig(max_new_tokens=32, temperature=0.0, batch_size=16))
    outs = engine.generate([TextRequest(r["prompt"], r["images"]) for r, _ in rows])
    wanted = [r["completion"][0]["content"][0]["text"] for r, _ in rows]
    return float(np.mean([(o.text or "").strip() == w for o, w in zip(outs, wanted, strict=True)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="A judge base checkpoint (a run's models/judge-base-*).")
    ap.add_argument("--key", choices=["colour", "shape"], default="colour")
    ap.add_argument("--words", choices=["teacher", "answer"], default="teacher",
                    help="--key colour: the mention and its value, or the value alone.")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--evals", type=int, default=3, help="Held-out evaluations (the phase is trained in parts).")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--held-out", type=int, default=200)
    ap.add_argument("--config", default="configs/local.yaml", help="Its world is the one the rows show.")
    ap.add_argument("--save", default=None, help="Keep the trained checkpoint here (e.g. as a base for "
                    "bench/judge_learning.py --base).")
    args = ap.parse_args()

    from flywheel.config import load_config
    from flywheel.models.pretrain_vlm import pretrain_vlm_in_parts

    world = load_config(args.config).world.shapes
    held = np.random.default_rng(10**6)
    tests = [check_row(held, world, args.key, args.words) for _ in range(args.held_out)]
    copy = np.mean([v == (r["prompt"][0]["content"][-1]["text"].split()[-1 if args.key == "colour" else -2]
                         .strip(".")) for r, v in tests])
    print(f"{args.held_out} held-out rows; copying the mention's own value scores {copy:.3f}", flush=True)
    print(f"step 0: {accuracy(Path(args.base), tests):.3f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="caption-check-"))
    start, t0 = Path(args.base), time.perf_counter()
    try:
        for step, start, stats in pretrain_vlm_in_parts(
                args.base, work, lambda rng, n: [check_row(rng, world, args.key, args.words)[0] for _ in range(n)],
                args.steps, args.evals, batch_size=args.batch_size, lr=args.lr):
            print(f"step {step}: {accuracy(start, tests):.3f} (loss {stats['sft_loss']:.3f}, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
        if args.save:
            shutil.rmtree(args.save, ignore_errors=True)
            shutil.copytree(start, args.save)
            print(f"saved to {args.save}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
