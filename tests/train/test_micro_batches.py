"""train.micro_batches: each randomly drawn batch is split into micro-batches of rows of similar length whose
gradients accumulate into one optimizer step. The step must be the one the whole batch gives (the loss sums the
completion tokens over the batch and divides by their count), and the batches must stay random mixes."""

import pytest
import torch
from transformers import TrainerCallback

from flywheel.records import validate
from flywheel.train import hf, sft
from flywheel.train.data import LENGTH, sft_rows, to_hf_dataset
from flywheel.train.synthetic import sft_records


def test_each_batch_is_a_random_draw_sorted_longest_first_and_every_row_comes_once_per_epoch():
    lengths = [int(x) for x in torch.randint(10, 500, (64,), generator=torch.Generator().manual_seed(1))]
    sampler = hf.sorted_micro_batch_sampler(16, lengths, seed=7)
    epochs = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(64))
        batches = [order[i:i + 16] for i in range(0, 64, 16)]
        assert all([lengths[j] for j in b] == sorted((lengths[j] for j in b), reverse=True) for b in batches)
        epochs.append([set(b) for b in batches])
        sampler.set_epoch(epoch)
        assert list(sampler) == order  # drawn from (seed, epoch): a resumed run redraws the same batches
    assert epochs[0] != epochs[1]  # a fresh draw each epoch
    by_length = sorted(range(64), key=lambda j: -lengths[j])
    assert epochs[0] != [set(by_length[i:i + 16]) for i in range(0, 64, 16)]  # not grouped by length


def _one_step(zoo, cfg, tmp_path, micro_batches: int):
    torch.manual_seed(0)
    model, processor = hf.load_vlm(str(zoo["judge"]))
    settings = cfg.train.resolved("judge_sft").model_copy(update={
        "batch_size": 8, "micro_batches": micro_batches, "max_steps": 1, "lr": 1e-3, "logging_steps": 1})
    rows = validate("sft", sft_records(8, seed=4))[0]  # one batch: both sides step on the same 8 rows
    dataset = to_hf_dataset(sft_rows(rows, completion_only_loss=True))
    assert len(set(dataset[LENGTH])) > 1  # rows of different lengths, so the micro-batches differ
    trainer = sft.build_trainer(model, processor, dataset, settings, str(tmp_path / str(micro_batches)), seed=3,
                                bare=True)
    trainer.args.save_strategy = "no"
    assert trainer.args.per_device_train_batch_size == 8 // micro_batches
    assert trainer.args.gradient_accumulation_steps == micro_batches
    grads = Gradients()
    trainer.add_callback(grads)
    trainer.train()
    return trainer, grads.grads


class Gradients(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_take_the_step_the_whole_batch_takes(zoo, cfg, tmp_path):
    whole, whole_grads = _one_step(zoo, cfg, tmp_path, 1)
    split, split_grads = _one_step(zoo, cfg, tmp_path, 4)
    w, s = (next(e for e in t.state.log_history if "loss" in e) for t in (whole, split))
    assert s["loss"] == pytest.approx(w["loss"], rel=1e-5)
    assert whole_grads.keys() == split_grads.keys() and whole_grads
    for name, g in whole_grads.items():  # (Adam's first step is ~lr * sign(g): compare gradients, not weights)
        assert g.abs().max() > 0, name
        torch.testing.assert_close(split_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
