"""bench/judge_soup.py: the weighted mean of same-architecture checkpoints, written so from_pretrained loads it, and
refused by name when the checkpoints are not of one architecture."""

import json

import pytest
import torch
from bench_scripts import load_bench
from safetensors.torch import load_file, save_file

bench = load_bench("judge_soup")


def _checkpoint(path, scale: float, shape=(2, 3)):
    path.mkdir()
    save_file({"w": torch.full(shape, scale), "b": torch.full((3,), -scale, dtype=torch.float16),
               "ids": torch.arange(3)}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"scale": scale}))
    return path


def test_floating_weights_are_averaged_by_weight_and_the_rest_is_the_first_checkpoints(tmp_path):
    a, b = _checkpoint(tmp_path / "a", 1.0), _checkpoint(tmp_path / "b", 4.0)
    bench.average([a, b], [3.0, 1.0], tmp_path / "soup")
    got = load_file(str(tmp_path / "soup" / "model.safetensors"))
    assert torch.equal(got["w"], torch.full((2, 3), 1.75))  # 0.75 * 1 + 0.25 * 4
    assert got["b"].dtype == torch.float16 and torch.equal(got["b"], torch.full((3,), -1.75, dtype=torch.float16))
    assert torch.equal(got["ids"], torch.arange(3))
    assert json.loads((tmp_path / "soup" / "config.json").read_text()) == {"scale": 1.0}


def test_checkpoints_of_other_shapes_or_bad_weights_are_refused_by_name(tmp_path):
    a, odd = _checkpoint(tmp_path / "a", 1.0), _checkpoint(tmp_path / "odd", 2.0, shape=(3, 3))
    with pytest.raises(ValueError, match=r"odd/model.safetensors: w missing or shaped otherwise"):
        bench.average([a, odd], [1, 1], tmp_path / "soup")
    with pytest.raises(ValueError, match="2 checkpoints and 1 weights"):
        bench.average([a, a], [1], tmp_path / "soup")
    with pytest.raises(ValueError, match="non-negative, with a positive sum"):
        bench.average([a, a], [1, -1], tmp_path / "soup")


def test_a_soup_of_the_zoo_judge_loads_as_the_judge_it_is_made_of(zoo, tmp_path):
    from flywheel.train.hf import load_vlm

    bench.average([zoo["judge"], zoo["judge"]], [0.5, 0.5], tmp_path / "soup")
    model, _ = load_vlm(str(tmp_path / "soup"))
    base, _ = load_vlm(str(zoo["judge"]))
    for (name, p), (_, q) in zip(model.state_dict().items(), base.state_dict().items()):
        assert torch.allclose(p, q), name


def test_the_ensemble_rates_each_gold_item_by_the_judges_mean_rating(tmp_path):
    """Three judges' stored meta-evals: the mean of their ratings orders a pair right where most of them do (each
    rates a pair 4 / 2 when right, 2 / 4 when wrong); two judges that disagree tie (3 / 3), which counts wrong."""
    from stored_meta_eval import METRIC, write_gold, write_judged

    from flywheel.config import load_config
    from flywheel.iteration import paths

    cfg = load_config(None, [f"run.workdir={tmp_path}"])
    gold = paths(cfg, 0)["gold"]
    ids = write_gold(gold, 4)
    right = [[True, True, False, False], [True, False, True, False], [False, True, True, True]]
    for it, pattern in enumerate(right):
        write_judged(paths(cfg, it)["meta-eval"], gold, dict(zip(ids, pattern)))
    mixed = bench.ensemble_outcomes(cfg, [0, 1, 2], METRIC)
    assert [mixed[i] for i in ids] == [True, True, True, False]  # the majority of each column
    pair = bench.ensemble_outcomes(cfg, [0, 1], METRIC)
    assert [pair[i] for i in ids] == [True, False, False, False]  # 0 and 1 disagree on the middle two: ties
