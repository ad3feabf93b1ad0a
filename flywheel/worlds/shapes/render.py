"""Render scenes to RGB images on a white background.

Shapes are point-sampled on a supersampled grid with numpy (exact geometry, no dependence on a drawing
library's edge rules) and box-averaged down: that is the anti-aliasing.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.scene import Obj, RngLike, Scene
from flywheel.worlds.shapes.spec import DrawSpec, scene_for_spec
from flywheel.worlds.shapes.vocab import BACKGROUND, COLOURS

PATCH = 28  # Qwen2-VL: 14-px patches merged 2x2


def check_size(size: int) -> int:
    if not isinstance(size, (int, np.integer)) or size <= 0 or size % PATCH:
        raise ValueError(f"image size must be a positive multiple of {PATCH} px, got {size!r}")
    return int(size)


def shape_mask(obj: Obj, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Which points (xs, ys in fractions of the side) lie inside the object."""
    h = obj.size / 2
    dx, dy = xs - obj.x, ys - obj.y
    if obj.shape == "circle":
        return dx * dx + dy * dy <= h * h
    inside_box = (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if obj.shape == "square":
        return inside_box
    # triangle: apex at the top centre, base along the bottom edge of the box (base = height = size)
    return inside_box & (np.abs(dx) <= (dy + h) / 2)


def render(scene: Scene, size: int = 56, supersample: int = 4) -> Image.Image:
    """The scene as an RGB image of `size` x `size` px (a multiple of 28); supersample 1 = aliased edges."""
    size = check_size(size)
    k = max(1, int(supersample))
    n = size * k
    c = (np.arange(n) + 0.5) / n  # sample-point centres in [0, 1]; y grows downwards
    canvas = np.tile(np.array(BACKGROUND, np.uint8), (n, n, 1))
    for obj in scene.objects:  # later objects paint over earlier ones (valid layouts never overlap)
        # Only the sample points in the object's box can lie inside it, so test those alone (rendering was ~40% of
        # a base build's vision pretraining); two spare points a side leave every boundary to shape_mask's test.
        h = obj.size / 2
        x0, x1 = _window(c, obj.x, h)
        y0, y1 = _window(c, obj.y, h)
        xs, ys = np.meshgrid(c[x0:x1], c[y0:y1])
        canvas[y0:y1, x0:x1][shape_mask(obj, xs, ys)] = COLOURS[obj.colour]
    # Box-average k x k samples. The sums are exact integers, and dividing them in float64 before rounding to
    # float32 is what np.mean of the float32 canvas did, so images are bit-identical to the full-grid renderer's.
    rows = canvas.reshape(size, k, n * 3).sum(axis=1, dtype=np.uint32)  # contiguous sums first: ~2x faster
    sums = rows.reshape(size, size, k, 3).sum(axis=2, dtype=np.uint32)
    small = (sums / float(k * k)).astype(np.float32)
    return Image.fromarray(np.round(small).astype(np.uint8), "RGB")


def _window(c: np.ndarray, centre: float, h: float) -> tuple[int, int]:
    lo = int(np.searchsorted(c, centre - h)) - 2
    hi = int(np.searchsorted(c, centre + h, side="right")) + 2
    return max(lo, 0), min(hi, len(c))


def render_spec(spec: DrawSpec, rng: RngLike, size: int = 56, config: ShapesWorldConfig | None = None
                ) -> tuple[Image.Image, Scene]:
    """A correct render of a spec (random valid layout that satisfies its relation) and the scene drawn."""
    cfg = config or ShapesWorldConfig()
    scene = scene_for_spec(spec, rng, cfg)
    return render(scene, size, cfg.supersample), scene
