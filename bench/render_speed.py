"""The shapes world's renderer against the full-grid renderer it replaced: the same pixels, and how much faster.

The full-grid renderer tested every supersample point against every object and box-averaged a float32 canvas;
the current one tests only the points in each object's box and sums integers. Rendering was ~40% of a base build's
vision pretraining (py-spy, 2026-11-28). Prints whether every image is bit-identical and the speed ratio of the two,
measured in one run on the same scenes.

    .venv/bin/python bench/render_speed.py [--scenes 300] [--sizes 56,112]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from PIL import Image

from flywheel.worlds.shapes.render import check_size, render, shape_mask
from flywheel.worlds.shapes.scene import Scene, sample_scene
from flywheel.worlds.shapes.vocab import BACKGROUND, COLOURS


def render_full_grid(scene: Scene, size: int = 56, supersample: int = 4) -> Image.Image:
    """The renderer as it was before 2026-11-28, kept as the reference the current one must match."""
    size = check_size(size)
    n = size * max(1, int(supersample))
    c = (np.arange(n) + 0.5) / n
    xs, ys = np.meshgrid(c, c)
    canvas = np.empty((n, n, 3), np.float32)
    canvas[:] = BACKGROUND
    for obj in scene.objects:
        canvas[shape_mask(obj, xs, ys)] = COLOURS[obj.colour]
    k = n // size
    small = canvas.reshape(size, k, size, k, 3).mean(axis=(1, 3))
    return Image.fromarray(np.round(small).astype(np.uint8), "RGB")


def seconds(fn, scenes: list[Scene], size: int) -> float:
    t0 = time.perf_counter()
    for scene in scenes:
        fn(scene, size)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenes", type=int, default=300)
    ap.add_argument("--sizes", default="56,112")
    args = ap.parse_args()
    scenes = [sample_scene(seed) for seed in range(args.scenes)]
    for size in (int(s) for s in args.sizes.split(",")):
        same = all(np.array_equal(np.asarray(render(s, size)), np.asarray(render_full_grid(s, size))) for s in scenes)
        old, new = seconds(render_full_grid, scenes, size), seconds(render, scenes, size)
        print(f"{size} px, {len(scenes)} scenes: identical={same}  full grid {1e3 * old / len(scenes):.2f} ms/image, "
              f"now {1e3 * new / len(scenes):.2f} ms/image: {old / new:.1f}x faster")


if __name__ == "__main__":
    main()
