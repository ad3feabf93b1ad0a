"""Held-out preference pairs of the SDXL update (issue 5): the split by prompt is deterministic and disjoint from
training, the implicit reward on them is measured with fixed noise (the same model scores the same twice, a model
equal to its reference scores accuracy 0.5 / margin 0), and a tiny training run logs the curve beside the
oracle's held-out curves - in this process (tests/train/local_worker.py), and through Ray Train with two workers."""

import json
import math
import random
from pathlib import Path

import pytest
import torch

from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import write_dataset
from flywheel.records import validate
from flywheel.train import diffusion_dpo as D
from flywheel.train.data import read_training_data
from flywheel.train.heldout_pairs import MIN_PAIRS, HeldoutPairs, split_pairs
from flywheel.train.synthetic import image_pref_records

from .local_worker import LocalContext


def _rows(n: int, prompts: int) -> list[dict]:
    return [{"image_pref_id": f"ip{i}", "prompt": f"prompt {i % prompts}"} for i in range(n)]


def test_split_is_deterministic_by_prompt_and_disjoint():
    rows = _rows(400, 80)
    train, held = split_pairs(rows, 0.1)
    shuffled = random.Random(1).sample(rows, len(rows))
    assert {r["image_pref_id"] for r in split_pairs(shuffled, 0.1)[1]} == {r["image_pref_id"] for r in held}
    assert split_pairs(rows, 0.1) == (train, held)  # same split, dataset order kept
    ids_t, ids_h = {r["image_pref_id"] for r in train}, {r["image_pref_id"] for r in held}
    assert not ids_t & ids_h and len(ids_t | ids_h) == len(rows)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}  # a prompt's pairs stay together
    assert 0.02 < len(held) / len(rows) < 0.25  # about the fraction (whole prompts, by hash)
    assert len(split_pairs(rows, 0.1, max_pairs=10)[1]) <= 10
    assert split_pairs(rows, 0.0) == (rows, [])  # 0 disables


def test_split_holds_out_at_least_one_prompt_from_ten_pairs_and_never_all():
    few = _rows(MIN_PAIRS - 1, 9)
    assert split_pairs(few, 0.5)[1] == []  # too few to spare one
    train, held = split_pairs(_rows(MIN_PAIRS, 5), 1e-9)  # no prompt hashes below the fraction: one anyway
    assert len({r["prompt"] for r in held}) == 1 and len(train) == MIN_PAIRS - 2
    assert split_pairs(_rows(40, 1), 0.5)[1] == []  # a single prompt: holding it out would leave nothing
    train, held = split_pairs(_rows(40, 3), 0.99)
    assert train and held


@pytest.fixture(scope="module")
def full(zoo, cfg):
    return D.load_parts(str(zoo["generator"]), cfg.train.resolved("diffusion_dpo"))  # local.yaml: full UNet


def test_heldout_pairs_use_fixed_noise_and_a_model_equal_to_its_reference_ties(full):
    rows = validate("image_pref", image_pref_records(6, size=56))[0]
    pairs = HeldoutPairs(full, rows, D.PromptCache(full.pipe), beta=5000.0, draws=2, seed=0, batch_size=4)
    full.unet.train()  # as in the training loop
    rng = torch.get_rng_state()
    start = pairs()
    assert start["pairs/implicit_acc"] == 0.5 and start["pairs/margin"] == 0.0  # ties count half
    assert start["pairs/loss"] == pytest.approx(math.log(2))
    saved = {n: p.detach().clone() for n, p in full.unet.named_parameters()}
    try:
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            for p in full.unet.parameters():
                p.add_(1e-2 * torch.randn(p.shape, generator=g))
        moved = pairs()
        assert moved == pairs()  # the same model, the same noise and timesteps: the same value
        assert moved["pairs/margin"] != 0.0 and moved["pairs/loss"] != start["pairs/loss"]
    finally:
        with torch.no_grad():
            for n, p in full.unet.named_parameters():
                p.copy_(saved[n])
    assert torch.equal(torch.get_rng_state(), rng)  # the training's random stream is untouched
    assert full.unet.training  # back in train mode after the evaluation


def test_a_tiny_run_logs_the_heldout_pairs_curve_and_never_trains_on_them(zoo, cfg, tmp_path):
    from flywheel.train import diffusion_loop

    data = str(tmp_path / "pairs")
    write_dataset(data, "image_pref", image_pref_records(20), config_hash="t", producer="test")
    c = load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={cfg.run.workdir}", "models.generator.path=zoo:generator", "train.save_steps=1000",
        "train.logging_steps=1", "train.registry.save_merged=false", "train.diffusion_dpo.max_steps=4",
        "train.diffusion_dpo.batch_size=4", "train.diffusion_dpo.lora.enabled=true", "train.diffusion_dpo.lr=1e-3",
        "train.diffusion_dpo.heldout.every_steps=2", "train.diffusion_dpo.heldout.items=3",
        "train.diffusion_dpo.heldout.inference_steps=2", "train.diffusion_dpo.heldout.probe_guidance_scale=null",
        "train.diffusion_dpo.heldout.max_drop={}", "train.diffusion_dpo.heldout.patience=10",
        "train.diffusion_dpo.heldout.pairs_fraction=0.1", "train.diffusion_dpo.heldout.pairs_noise_draws=2"])
    ctx = LocalContext(c, "diffusion_dpo", data, str(zoo["generator"]), str(tmp_path))
    diffusion_loop.worker(ctx)
    acc = ctx.metrics.history("heldout.pairs/implicit_acc")
    margin = ctx.metrics.history("heldout.pairs/margin")
    assert sorted(acc) == sorted(margin) == [0, 2, 4]  # beside the oracle's held-out curve
    assert sorted(ctx.metrics.history("heldout.score10")) == [0, 2, 4]
    assert acc[0] == 0.5 and margin[0] == 0.0  # the starting model is its own reference
    assert margin[4] != 0.0  # the update moved the implicit reward on pairs it never saw
    assert ctx.metrics.history("data/heldout_pairs") == {0: 3} and ctx.metrics.history("data/train_pairs") == {0: 17}
    held = json.loads((Path(ctx.final[0]) / "flywheel.json").read_text())["heldout_pair_ids"]
    trained = {i for e in ctx.steps.entries for i in e["ids"]}
    assert len(held) == 3 and trained and not trained & set(held)
    final = ctx.final[1]
    assert final["heldout.target"] == "score10"  # the oracle score stays the target
    assert [c["pairs/implicit_acc"] for c in final["heldout.curves"]] == [acc[0], acc[2], acc[4]]


def test_the_heldout_pairs_are_never_a_stopping_signal():
    from flywheel.config import ConfigError

    for bad in ("train.diffusion_dpo.heldout.target=pairs/implicit_acc",
                "train.diffusion_dpo.heldout.max_drop={pairs/implicit_acc: 0.1}"):
        with pytest.raises(ConfigError, match="not a stopping signal"):
            load_config(REPO_ROOT / "configs" / "local.yaml", [bad])


@pytest.mark.slow  # ~50 s on 2 cores (two DDP workers through Ray Train); the in-process run above stays default
def test_two_ray_train_workers_split_alike_and_rank_0_logs_the_curve(ray_local, make_cfg, datasets):
    """Through Ray Train with two DDP workers: every rank trains on the same split, rank 0 alone evaluates the
    held-out pairs (no collective inside), and the stop decision's all-reduce still meets on both ranks."""
    from mlflow import MlflowClient

    from flywheel.train.api import train

    cfg = make_cfg("resources.train.actors=2", "train.diffusion_dpo.max_steps=2", "train.diffusion_dpo.batch_size=2",
                   "train.diffusion_dpo.lora.enabled=true", "train.registry.save_merged=false",
                   "train.diffusion_dpo.heldout={every_steps: 1, items: 3, inference_steps: 2, "
                   "probe_guidance_scale: null, pairs_fraction: 0.2}")
    res = train(cfg, "diffusion-dpo", datasets["image_pref"], register=False, fresh=True)
    assert res.final["workers"] == 2 and res.final["final_step"] == 2
    assert [c["step"] for c in res.final["heldout.curves"]] == [0, 1, 2]
    assert res.final["heldout.start.pairs/implicit_acc"] == 0.5
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    history = client.get_metric_history(res.mlflow_run_id, "heldout.pairs/implicit_acc")
    assert sorted(m.step for m in history) == [0, 1, 2]
    trained = {i for e in res.steps for i in e["ids"]}
    held = {r["image_pref_id"] for r in split_pairs(read_training_data(datasets["image_pref"], "image_pref").rows,
                                                    0.2)[1]}
    assert held and trained and not trained & held
