"""Does the judge's vision carry what the teacher rates in a generated image? Linear probes on a judge's image
features (the frozen vision encoder + projector its language model reads) against the same probes on six plain
pixel statistics, for each image finding of the oracle teacher: blurred, noisy, empty, an extra object.

A judge reads its images only through these features: a finding the pixels predict well and the features do not
is lost, or hidden, in the vision side, and the judge SFT must dig it out. The images are a run's generated
candidates (ig, itig); the labels are the oracle's own findings on them (flywheel/worlds/shapes/assess_image.py).
The probes are scikit-learn's (in the project's `test` extra, which `make setup` installs).

    .venv/bin/python bench/judge_vision_probe.py --model runs/fr3/models/judge-base-<hash> --workdir runs/fr3
        [--iterations 000,001,002] [--images 1500] [--folds 5]

Each probe: standardised inputs, logistic regression (C 0.1, balanced classes), balanced accuracy over
stratified folds (0.5: the probe learns nothing). Measured 2026-11-27 on runs/fr3 (its first 1,500 generated
images of iterations 0-2; share of images with the finding, then features / pixels):

| finding | share | random zoo judge | runs/fr3's judge base | the same with see_blur | pixels |
|---|---|---|---|---|---|
| blurred | 0.63 | 0.591 | 0.663 | 0.649 | 0.829 |
| noisy | 0.05 | 0.536 | 0.812 | 0.899 | 0.969 |
| empty | 0.04 | 0.971 | 0.995 | 0.991 | 0.998 |
| extra | 0.38 | 0.576 | 0.658 | 0.663 | 0.752 |

The judge base's features hold blur little better than a random tower's. Judges trained on a run's rows
(bench/judge_learning.py) said "blurred" of 39/42 blurred and 184/211 sharp gold drawings after 1,258 steps, of
24/42 and 102/211 after 6,290. see_blur (world.base_policies.judge: degraded objects as classes of their own)
sharpened noise more than blur by these linear probes, yet judges trained from it for 6,290 steps said it of
40/42 and 80/211, and ranked drawings better (docs/tuning.md `judge`): a linear probe is a lower bound.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

FINDINGS = {"blurred": "The shapes are blurred", "noisy": "The background is noisy", "empty": "The image is empty",
            "extra": "There is an extra"}


def pixel_stats(image) -> list[float]:
    """Six statistics of sharpness and noise: Laplacian variance and mean, mean and max gradient, grey and
    colour spread."""
    from scipy import ndimage

    a = np.asarray(image.convert("RGB"), dtype=np.float32) / 255
    g = a.mean(-1)
    lap = ndimage.laplace(g)
    grad = np.hypot(ndimage.sobel(g, 0), ndimage.sobel(g, 1))
    return [float(lap.var()), float(np.abs(lap).mean()), float(grad.mean()), float(grad.max()), float(g.std()),
            float(a.std((0, 1)).mean())]


def probe(x: np.ndarray, y: np.ndarray, folds: int) -> float | None:
    """Mean balanced accuracy of a linear probe over stratified folds; None when a class is too rare to fold."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if min(y.sum(), (~y).sum()) < folds:
        return None
    model = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, class_weight="balanced", max_iter=3000))
    cv = StratifiedKFold(folds, shuffle=True, random_state=0)
    return float(cross_val_score(model, x, y, cv=cv, scoring="balanced_accuracy").mean())


def load_images(workdir: Path, iterations: list[str], limit: int, world):
    """The run's generated images (ig and itig candidates, read as the stages wrote them: manifests checked) and
    the teacher's findings on each; candidates are streamed, so reading stops at `limit`."""
    from flywheel.datasets import iter_dataset_rows, read_rows
    from flywheel.worlds.shapes.assess import assess
    from flywheel.worlds.shapes.assessment import image_of

    runs = [workdir / "data" / "iterations" / it for it in iterations]
    prompts = {p["prompt_id"]: p for it in runs for p in read_rows(str(it / "prompts"), "prompt")}
    images, labels = [], {k: [] for k in FINDINGS}
    for c in (c for it in runs for c in iter_dataset_rows(str(it / "candidates"), "candidate")):
        p = prompts.get(c["prompt_id"])
        if p is None or p["task"] not in ("ig", "itig") or not c.get("output_images"):
            continue
        said = assess(p, c, world).analysis()
        images.append(image_of(c))
        for k, words in FINDINGS.items():
            labels[k].append(words in said)
        if len(images) == limit:
            break
    if not images:
        raise SystemExit(f"no generated images under {workdir}/data/iterations/{{{','.join(iterations)}}}/candidates")
    return images, {k: np.array(v) for k, v in labels.items()}


def features(model_dir: str, images: list, batch: int = 64) -> np.ndarray:
    """Every image token's features, flattened per image (the language model reads them token by token)."""
    import torch

    from flywheel.models.vision import image_features
    from flywheel.train.hf import load_vlm

    model, processor = load_vlm(model_dir)
    model.eval()
    with torch.no_grad():
        return np.concatenate([image_features(model, processor, images[i:i + batch]).flatten(1).float().numpy()
                               for i in range(0, len(images), batch)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="A judge checkpoint folder (e.g. a run's models/judge-base-*).")
    ap.add_argument("--workdir", required=True, help="A flywheel run whose generated candidates are probed.")
    ap.add_argument("--iterations", default="000,001,002", help="Comma-separated iterations to take images from.")
    ap.add_argument("--images", type=int, default=1500, help="Most images probed.")
    ap.add_argument("--folds", type=int, default=5)
    args = ap.parse_args()

    import torch

    from flywheel.worlds.shapes.config import ShapesWorldConfig

    torch.set_num_threads(2)
    images, labels = load_images(Path(args.workdir), args.iterations.split(","), args.images, ShapesWorldConfig())
    feats = features(args.model, images)
    pixels = np.array([pixel_stats(im) for im in images])
    print(f"{len(images)} images; features {feats.shape[1]} per image, pixel statistics {pixels.shape[1]}")
    print(f"{'finding':10s} {'share':>6s} {'features':>9s} {'pixels':>7s}   (balanced accuracy, {args.folds} folds)")
    fmt = lambda v: "   n/a" if v is None else f"{v:.3f}"  # noqa: E731
    for k, y in labels.items():
        print(f"{k:10s} {y.mean():6.2f} {fmt(probe(feats, y, args.folds)):>9s} {fmt(probe(pixels, y, args.folds)):>7s}",
              flush=True)


if __name__ == "__main__":
    main()
