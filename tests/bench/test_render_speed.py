"""The fast renderer draws exactly what the full-grid renderer drew: every cached base, gold set and test expectation
was made with the old one, so a single differing pixel would silently change them."""

import numpy as np
import pytest
from bench_scripts import load_bench

from flywheel.worlds.shapes import perturb
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Obj, Scene, sample_scene

bench = load_bench("render_speed")


@pytest.mark.parametrize("size, supersample", [(56, 4), (112, 4), (56, 1), (56, 3), (28, 5), (112, 8)])
def test_renders_are_bit_identical_to_the_full_grid_renderer(size, supersample):
    scenes = [sample_scene(seed) for seed in range(60)]
    scenes += [perturb.swap_positions(s, 0, 1) for s in scenes[:10] if len(s.objects) > 1]
    # objects at the canvas's edges and overlapping (a later one paints over an earlier one)
    scenes += [Scene((Obj("circle", "red", 0.5, 0.0, 1.0), Obj("triangle", "blue", 0.4, 1.0, 0.0))),
               Scene((Obj("square", "green", 0.6, 0.5, 0.5), Obj("circle", "red", 0.3, 0.55, 0.45)))]
    for scene in scenes:
        got = np.asarray(render(scene, size, supersample))
        assert np.array_equal(got, np.asarray(bench.render_full_grid(scene, size, supersample))), scene
