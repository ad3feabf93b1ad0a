"""Image tokens are never truncated (TRL #5285): a sample far longer than TRL's default max_length (1024), with its
image placed after the long text, keeps every image token through our SFT and DPO trainers and trains; TRL's
default would have cut them (the negative control shows the test can fail)."""

import json

import pytest
import torch

from flywheel.records import validate
from flywheel.train import dpo, hf, sft
from flywheel.train.data import dpo_rows, sft_rows, to_hf_dataset
from flywheel.images import to_png_bytes
from flywheel.train.synthetic import shape_image

TRL_DEFAULT_MAX_LENGTH = 1024


def _long_text(n_words: int = 1400) -> str:
    words = ["red", "green", "blue", "circle", "square", "left", "right", "above", "below", "image", "shows"]
    return " ".join(f"{words[i % len(words)]}{i % 97}" for i in range(n_words))


def _user(long: str) -> dict:
    # the image comes *after* the long text, so truncating the end removes its tokens
    return {"role": "user", "content": [{"type": "text", "text": long}, {"type": "image"},
                                        {"type": "text", "text": "Rate the image."}]}


@pytest.fixture
def judge(zoo):
    return hf.load_vlm(str(zoo["judge"]))  # fresh per test: a trainer's LoRA is injected into the model in place


def _expected_image_tokens(batch, processor) -> int:
    merge = processor.image_processor.merge_size
    return int(batch["image_grid_thw"].prod(dim=-1).sum()) // (merge * merge)


def _image_tokens(batch, processor) -> int:
    return int((batch["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())


def _settings(cfg, training):
    return cfg.train.resolved(training).model_copy(update={"max_steps": 1, "batch_size": 1, "micro_batches": 1,
                                                           "logging_steps": 1, "save_steps": 1000})


def test_long_dpo_sample_keeps_its_image_tokens_and_trains(judge, cfg, tmp_path):
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    model, processor = judge
    img = to_png_bytes(shape_image("red", "square"))
    row = {"target": "judge", "images": [img], "prompt": json.dumps([_user(_long_text())]),
           "chosen": json.dumps([{"role": "assistant", "content": "Rating: 5"}]),
           "rejected": json.dumps([{"role": "assistant", "content": "Rating: 1"}])}
    ds = to_hf_dataset(dpo_rows(validate("dpo", [row])[0]))
    trainer = dpo.build_trainer(model, processor, ds, _settings(cfg, "judge_dpo"), str(tmp_path), seed=0)
    hf.attach(trainer)
    assert trainer.args.max_length is None

    batch = trainer.data_collator([ds[0]])
    assert batch["input_ids"].shape[1] > TRL_DEFAULT_MAX_LENGTH  # really a long sample
    assert _image_tokens(batch, processor) == _expected_image_tokens(batch, processor) > 0

    # negative control: TRL's default max_length cuts the image tokens of this very sample
    example = {k: v for k, v in ds[0].items() if k != "sample_id"}
    cut = DataCollatorForVisionPreference(processor=processor, max_length=TRL_DEFAULT_MAX_LENGTH)([example])
    assert _image_tokens(cut, processor) < _expected_image_tokens(cut, processor)

    trainer.train()
    assert trainer.state.global_step == 1
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))


def test_long_sft_sample_keeps_its_image_tokens_and_trains(judge, cfg, tmp_path):
    model, processor = judge
    row = {"images": [to_png_bytes(shape_image("blue", "circle"))],
           "messages": json.dumps([_user(_long_text()), {"role": "assistant", "content": "Rating: 2"}])}
    ds = to_hf_dataset(sft_rows(validate("sft", [row])[0]))
    settings = _settings(cfg, "judge_sft").model_copy(update={"lora": cfg.train.lora})
    trainer = sft.build_trainer(model, processor, ds, settings, str(tmp_path), seed=0)
    hf.attach(trainer)
    assert trainer.args.max_length is None
    batch = trainer.data_collator([ds[0]])
    assert batch["input_ids"].shape[1] > TRL_DEFAULT_MAX_LENGTH
    assert _image_tokens(batch, processor) == _expected_image_tokens(batch, processor) > 0
    # the answer is still there and is what the loss covers
    assert (batch["labels"] != -100).sum() > 0 and batch["labels"][0, -1] != -100
    trainer.train()
    assert trainer.state.global_step == 1
