"""bench/judge_vision_probe.py: its probes must tell a finding that is in the inputs from one that is not, and its
images and labels must be a run's generated images with the oracle's findings on them, or its table would say a
judge's vision lost (or kept) what the teacher rates when it did not."""

import numpy as np
import pytest
from bench_scripts import load_bench
from PIL import ImageFilter

from flywheel.aspects import AspectTree
from flywheel.datasets import write_dataset
from flywheel.records import with_ids
from flywheel.worlds.shapes.assess import assess
from flywheel.worlds.shapes.assessment import image_of
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.gold import gold_candidates
from flywheel.worlds.shapes.oracle_config import GoldConfig
from flywheel.worlds.shapes.render import render
from flywheel.worlds.shapes.scene import Obj, Scene
from flywheel.worlds.shapes.suites import SuitesConfig, generate

bench = load_bench("judge_vision_probe")
WORLD = ShapesWorldConfig()


def test_a_probe_finds_a_label_the_inputs_hold_and_not_one_they_do_not():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    held = np.c_[y + rng.normal(0, 0.3, 300), rng.normal(size=(300, 5))]
    assert bench.probe(held, y, 5) > 0.9
    assert 0.35 < bench.probe(rng.normal(size=(300, 6)), y, 5) < 0.65
    assert bench.probe(held, np.arange(300) < 3, 5) is None  # 3 positives cannot fill 5 folds


def test_pixel_statistics_see_a_blur():
    scene = Scene((Obj("circle", "red", 0.3, 0.3, 0.4), Obj("square", "blue", 0.25, 0.7, 0.6)))
    sharp = render(scene, WORLD.image_size)
    blurred = sharp.filter(ImageFilter.GaussianBlur(1.5))
    s, b = bench.pixel_stats(sharp), bench.pixel_stats(blurred)
    assert len(s) == 6 and s[0] > 2 * b[0] and s[3] > b[3]  # Laplacian variance, strongest gradient


def test_images_are_the_runs_generated_ones_with_the_oracles_findings(tmp_path, cfg, zoo):
    suites = SuitesConfig(prompts_per_subtask=3, split={"ood_subtasks": [], "ood_aspects": []})
    prompts = with_ids("prompt", generate(suites, WORLD, AspectTree.load(), seed=1))
    cands = with_ids("candidate", [c for p in prompts for c in gold_candidates(p, GoldConfig(), WORLD, seed=1)])
    for kind, rows in (("prompt", prompts), ("candidate", cands)):
        write_dataset(str(tmp_path / "data" / "iterations" / "000" / f"{kind}s"), kind, rows, config_hash="t",
                      producer="test")
    by_id = {p["prompt_id"]: p for p in prompts}
    drawn = [c for c in cands if by_id[c["prompt_id"]]["task"] in ("ig", "itig")]

    images, labels = bench.load_images(tmp_path, ["000"], 10_000, WORLD)
    assert len(images) == len(drawn) > 0 and set(labels) == set(bench.FINDINGS)  # no question or caption
    for i, c in enumerate(drawn):
        said = assess(by_id[c["prompt_id"]], c, WORLD).analysis()
        assert np.array_equal(np.asarray(images[i]), np.asarray(image_of(c)))
        assert {k for k in labels if labels[k][i]} == {k for k, w in bench.FINDINGS.items() if w in said}
    assert labels["empty"].any() and labels["extra"].any()  # the gold variants draw both
    assert len(bench.load_images(tmp_path, ["000"], 5, WORLD)[0]) == 5

    feats = bench.features(str(zoo["judge"]), images[:4], batch=3)
    assert feats.shape[0] == 4 and feats.ndim == 2 and np.isfinite(feats).all()


def test_a_run_without_drawings_is_refused_by_name(tmp_path):
    suites = SuitesConfig(prompts_per_subtask=2, split={"ood_subtasks": [], "ood_aspects": []})
    prompts = [p for p in with_ids("prompt", generate(suites, WORLD, AspectTree.load(), seed=1)) if p["task"] == "iu"]
    cands = with_ids("candidate", [c for p in prompts for c in gold_candidates(p, GoldConfig(), WORLD, seed=1)])
    for kind, rows in (("prompt", prompts), ("candidate", cands)):
        write_dataset(str(tmp_path / "data" / "iterations" / "000" / f"{kind}s"), kind, rows, config_hash="t",
                      producer="test")
    with pytest.raises(SystemExit, match="no generated images under .*000.*candidates"):
        bench.load_images(tmp_path, ["000"], 100, WORLD)
