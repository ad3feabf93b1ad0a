"""train.<training>.weight_average: the export is an exponential moving average of the trainable weights over the
steps (diffusers' EMAModel, decay ramping as (1+t)/(10+t) up to the ceiling), not the last step's weights, and a
checkpoint carries the average so that a resumed training ends with the same one (tested through Ray Train in
test_trainings.py's kill-and-resume test)."""

import pytest
import torch
from transformers import TrainerCallback

from flywheel.config import load_config
from flywheel.records import validate
from flywheel.train import hf, sft
from flywheel.train.data import sft_rows, to_hf_dataset
from flywheel.train.synthetic import sft_records
from flywheel.train.weight_average import FILE, WeightAverageCallback

from flywheel.config import REPO_ROOT

LOCAL = REPO_ROOT / "configs" / "local.yaml"


class Snapshots(TrainerCallback):
    """The trainable weights after every optimizer step (runs before the average copies itself in)."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.steps.append([p.detach().clone() for p in model.parameters() if p.requires_grad])


def _train(zoo, cfg, out, steps: int, decay: float, save_steps: int = 10**9, resume_from=None):
    torch.manual_seed(0)
    model, processor = hf.load_vlm(str(zoo["judge"]))
    settings = cfg.train.resolved("judge_sft").model_copy(update={
        "batch_size": 4, "micro_batches": 1, "max_steps": steps, "lr": 1e-3, "save_steps": save_steps})
    dataset = to_hf_dataset(sft_rows(validate("sft", sft_records(16, seed=4))[0], completion_only_loss=True))
    average, snapshots = WeightAverageCallback(decay), Snapshots()
    trainer = sft.build_trainer(model, processor, dataset, settings, str(out), seed=3, bare=True,
                                callbacks=[snapshots, average])
    trainer.args.save_total_limit = None  # keep checkpoint-3 beside the last
    if resume_from is not None:
        average.load_from(resume_from)
    trainer.train(resume_from_checkpoint=resume_from)
    return [p.detach().clone() for p in model.parameters() if p.requires_grad], snapshots.steps


def test_the_export_is_the_moving_average_of_the_steps_not_the_last_step(zoo, cfg, tmp_path):
    decay = 0.5
    final, steps = _train(zoo, cfg, tmp_path, steps=6, decay=decay)
    expected = [s.clone() for s in steps[0]]  # EMAModel: the first step copies (decay 0), then the ramp
    for t, weights in enumerate(steps[1:], start=2):
        d = min(decay, t / (9 + t))
        for e, w in zip(expected, weights):
            e.mul_(d).add_(w, alpha=1 - d)
    for got, want in zip(final, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert any(not torch.equal(got, last) for got, last in zip(final, steps[-1]))  # not the last step's weights


def test_a_resumed_training_goes_on_with_the_checkpoints_average(zoo, cfg, tmp_path):
    from safetensors import safe_open

    _train(zoo, cfg, tmp_path, steps=6, decay=0.9, save_steps=3)  # writes checkpoint-3 (and -6)
    checkpoint = tmp_path / "checkpoint-3"
    with safe_open(str(checkpoint / FILE), "pt") as f:
        assert f.metadata()["optimization_step"] == "3"
        expected = [f.get_tensor(str(i)) for i in range(len(f.keys()))]
    resumed, steps = _train(zoo, cfg, tmp_path, steps=6, decay=0.9, resume_from=str(checkpoint))
    assert len(steps) == 3  # steps 4-6 only
    for t, weights in enumerate(steps, start=4):  # the saved average, stepped on with the ramp at t = 4, 5, 6
        d = min(0.9, t / (9 + t))
        for e, w in zip(expected, weights, strict=True):
            e.mul_(d).add_(w, alpha=1 - d)
    for got, want in zip(resumed, expected, strict=True):
        torch.testing.assert_close(got, want)
    # a fresh average (resume without the file) would be far from it: it starts again from step 4's weights
    assert max((g - s).abs().max().item() for g, s in zip(resumed, steps[-1])) > 1e-4


def test_a_checkpoint_without_an_average_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="without weight averaging"):
        WeightAverageCallback(0.9).load_from(str(tmp_path))


def test_weight_average_is_refused_where_it_cannot_apply():
    assert load_config(LOCAL, ["train.judge_sft.weight_average=0.99"]).train.resolved("judge_sft").weight_average \
        == 0.99
    with pytest.raises(ValueError, match="judge_dpo: weight_average does not combine with a held-out"):
        load_config(LOCAL, ["train.judge_dpo.weight_average=0.99"])
    with pytest.raises(ValueError, match="diffusion_dpo: weight_average does not combine with diffusion_dpo"):
        load_config(LOCAL, ["train.diffusion_dpo.weight_average=0.99"])
