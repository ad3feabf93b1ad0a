"""The vision side of the zoo VLMs: which parameters it is, the features the language model reads, its dense
pretraining, and trainings that keep it fixed."""

import numpy as np
import pytest
import torch

from flywheel.models.pretrain_config import VisionPretrainConfig
from flywheel.models.pretrain_vision import IGNORE, CellTask, cell_accuracy, pretrain_vision
from flywheel.models.vision import freeze_vision, image_features, is_vision, vision_parameters
from flywheel.train.hf import load_vlm


def test_vision_names_cover_both_architectures_and_nothing_of_the_language_model():
    assert is_vision("model.visual.blocks.0.attn.qkv.weight")  # Qwen2-VL encoder
    assert is_vision("model.visual.merger.mlp.0.weight")  # Qwen2-VL projector
    assert is_vision("model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight")  # LLaVA's CLIP
    assert is_vision("model.multi_modal_projector.linear_1.weight")
    assert is_vision("base_model.model.model.visual.blocks.0.attn.qkv.lora_A.default.weight")  # under PEFT
    assert not is_vision("model.language_model.layers.0.self_attn.q_proj.weight")
    assert not is_vision("lm_head.weight") and not is_vision("model.visualizer_free.weight")


@pytest.mark.parametrize("name", ["judge", "policy"])
def test_features_are_a_square_token_grid_and_freezing_stops_only_the_vision_side(zoo, name):
    from PIL import Image

    model, processor = load_vlm(str(zoo[name]))
    feats = image_features(model, processor, [Image.new("RGB", (56, 56), "white")] * 3)
    assert feats.shape[0] == 3 and feats.shape[2] == model.config.text_config.hidden_size
    assert int(feats.shape[1] ** 0.5) ** 2 == feats.shape[1]
    n = freeze_vision(model)
    frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
    assert n == sum(p.numel() for p in vision_parameters(model)) > 0
    assert frozen == {k for k, _ in model.named_parameters() if is_vision(k)}


def _dot_task():
    """A toy cell task: one red dot in one of the 16 cells of a 56-px image; its cell is 'dot', the rest
    background."""
    from PIL import Image, ImageDraw

    def make(rng, n, grid):
        images, labels = [], np.full((n, grid * grid), 1, np.int64)
        for i in range(n):
            r, c = rng.integers(grid, size=2)
            image = Image.new("RGB", (56, 56), "white")
            x, y = (c + 0.5) * 56 / grid, (r + 0.5) * 56 / grid
            ImageDraw.Draw(image).ellipse([x - 5, y - 5, x + 5, y + 5], fill="red")
            images.append(image)
            labels[i, r * grid + c] = 0
        return images, labels

    return CellTask(("dot", "background"), 1, make)


def test_pretrain_vision_trains_the_vision_side_only_and_saves_a_loadable_vlm(zoo, tmp_path):
    from safetensors.torch import load_file

    cfg = VisionPretrainConfig(steps=3, batch_size=4, eval_images=8, warmup_steps=0)
    metrics = pretrain_vision(zoo["policy"], tmp_path / "seen", _dot_task(), cfg, seed=0)
    assert metrics["vision_seconds"] > 0 and 0 <= metrics["vision/object_cells"] <= 1
    before = load_file(next(zoo["policy"].glob("*.safetensors")))
    after = load_file(next((tmp_path / "seen").glob("*.safetensors")))
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(is_vision(k) for k in moved)
    load_vlm(str(tmp_path / "seen"))  # a standard checkpoint again


class Killed(Exception):
    """Stands in for the SIGKILL of a base build's Ray task."""


def test_a_killed_vision_pretraining_goes_on_from_its_last_save_and_ends_alike(zoo, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from flywheel.models import pretrain_vision as pv

    cfg = VisionPretrainConfig(steps=4, batch_size=4, eval_images=8, warmup_steps=1)  # a save after every step
    want = pretrain_vision(zoo["policy"], tmp_path / "straight", _dot_task(), cfg, seed=0)
    calls, features = [], pv.image_features

    def dies_in_step_3(*args):
        calls.append(1)
        if len(calls) == 4:  # the grid probe, steps 1 and 2, then step 3
            raise Killed
        return features(*args)

    with monkeypatch.context() as m:
        m.setattr(pv, "image_features", dies_in_step_3)
        with pytest.raises(Killed):
            pretrain_vision(zoo["policy"], tmp_path / "resumed", _dot_task(), cfg, seed=0, state_dir=tmp_path / "s")
    assert [d.name for d in (tmp_path / "s").iterdir()] == ["step-2"]  # the last save only
    (tmp_path / "s" / ".step-3").mkdir()  # a save killed midway: never read
    got = pretrain_vision(zoo["policy"], tmp_path / "resumed", _dot_task(), cfg, seed=0, state_dir=tmp_path / "s")
    assert got["vision_loss"] == want["vision_loss"] and got["vision/object_cells"] == want["vision/object_cells"]
    a = load_file(next((tmp_path / "straight").glob("*.safetensors")))
    b = load_file(next((tmp_path / "resumed").glob("*.safetensors")))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_save_of_another_model_is_refused_by_name(zoo, tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "s" / "step-1").mkdir(parents=True)
    save_file({"head.weight": torch.zeros(2, 2)}, str(tmp_path / "s" / "step-1" / "weights.safetensors"))
    cfg = VisionPretrainConfig(steps=2, batch_size=4, eval_images=8, warmup_steps=0)
    with pytest.raises(ValueError, match="do not match"):
        pretrain_vision(zoo["policy"], tmp_path / "out", _dot_task(), cfg, seed=0, state_dir=tmp_path / "s")


def test_cell_accuracy_leaves_ignored_cells_out():
    labels = torch.tensor([[0, 1, IGNORE, 1]])
    pred = torch.tensor([[0, 0, 0, 1]])
    assert cell_accuracy(pred, labels, background=1) == {"object_cells": 1.0, "background_cells": 0.5}


def test_trainings_keep_the_vision_side_fixed_when_asked(cfg, zoo, tmp_path):
    from flywheel.train import hf

    full = cfg.train.resolved("judge_sft")  # local config: a full fine-tune
    assert full.freeze_vision and not full.lora.enabled
    model, _ = load_vlm(str(zoo["judge"]))
    hf.keep_vision(model, full, hf.peft_config(full))
    assert all(not p.requires_grad for p in vision_parameters(model))
    assert any(p.requires_grad for k, p in model.named_parameters() if not is_vision(k))

    from peft import get_peft_model

    lora = cfg.train.resolved("policy_dpo")
    assert lora.freeze_vision and lora.lora.enabled
    wrapped = get_peft_model(load_vlm(str(zoo["policy"]))[0], hf.peft_config(lora))
    adapters = [k for k, _ in wrapped.named_parameters() if "lora_" in k]
    assert adapters and not any(is_vision(k) for k in adapters)
    loose = lora.model_copy(update={"freeze_vision": False})
    wrapped = get_peft_model(load_vlm(str(zoo["policy"]))[0], hf.peft_config(loose))
    assert any(is_vision(k) for k, _ in wrapped.named_parameters() if "lora_" in k)


def test_a_model_without_a_vision_side_is_refused_by_name():
    text_only = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="Sequential has no parameters under visual, vision_tower"):
        freeze_vision(text_only)


def test_pretrain_vlm_loads_the_zoo_judges_processor_in_a_fresh_interpreter(zoo, tmp_path):
    """pretrain_vlm registers the image-only processor itself: a bench that imported nothing else first got a bare
    tokenizer and TRL refused its image rows (bench/answer_compare_probe.py, 2026-12-07). A subprocess, because
    this test session has long since imported the registering module."""
    import subprocess
    import sys

    script = f"""
from PIL import Image
from flywheel.models.pretrain_config import PolicyPretrainConfig
from flywheel.models.pretrain_vlm import pretrain_vlm
row = {{"images": [Image.new("RGB", (56, 56), "red")],
        "prompt": [{{"role": "user", "content": [{{"type": "image"}}, {{"type": "text", "text": "Colour?"}}]}}],
        "completion": [{{"role": "assistant", "content": [{{"type": "text", "text": "Red."}}]}}]}}
cfg = PolicyPretrainConfig(steps=1, batch_size=1, lr=1e-4, warmup_steps=0)
print(pretrain_vlm({str(zoo["judge"])!r}, {str(tmp_path / "out")!r}, lambda rng, n: [row] * n, cfg)["sft_loss"] > 0)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("True")
