"""RowCache (flywheel.train.collate) builds the batches TRL's collator builds, tensor for tensor, for the judge's
Qwen2-VL and the policy's LLaVA, over rows of different lengths, shared images and a text-only row, and it
collates each row once."""

import json

import pytest
import torch

from flywheel.records import validate
from flywheel.train import hf, sft
from flywheel.train.collate import RowCache
from flywheel.train.data import sft_rows, to_hf_dataset
from flywheel.train.synthetic import sft_records


def _text_only_record() -> dict:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Rate this answer to 'what is 2+2?': 4."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "It is right. Rating: 5"}]}]
    return {"images": [], "messages": json.dumps(msgs), "task": "nlg", "protocol": "pointwise", "subtask": "nlg"}


def _dataset():
    rows = validate("sft", [*sft_records(11, seed=2), _text_only_record()])[0]
    return to_hf_dataset(sft_rows(rows, completion_only_loss=True))


@pytest.mark.parametrize("role", ["judge", "policy"])
def test_cached_batches_equal_trls(zoo, cfg, tmp_path, role):
    model, processor = hf.load_vlm(str(zoo[role]))
    dataset = _dataset()
    trainer = sft.build_trainer(model, processor, dataset, cfg.train.resolved("judge_sft"), str(tmp_path), 0,
                                bare=True)
    trl = trainer.data_collator
    cache = RowCache(trl)
    batches = [[0, 1, 2, 3], [11, 4, 5], [3, 11, 0, 6], [7, 8, 9, 10], [2, 1]]  # rows again, text-only row mixed in
    for index in batches:
        ours = cache([dataset[i] for i in index])
        theirs = trl([dataset[i] for i in index])
        assert sorted(ours) == sorted(theirs), index
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), (index, key)
    assert (cache.misses, cache.hits) == (12, 5)
    assert len(cache.images) < 11  # rows showing the same image keep one copy of its tensors
    assert "pixel_values" in ours


def test_training_with_the_cache_is_the_same_training(zoo, cfg, tmp_path):
    logs = {}
    for cached in (False, True):
        torch.manual_seed(0)
        model, processor = hf.load_vlm(str(zoo["judge"]))
        settings = cfg.train.resolved("judge_sft").model_copy(update={
            "batch_size": 4, "epochs": 2, "max_steps": None, "logging_steps": 1, "cache_collated_rows": cached})
        trainer = sft.build_trainer(model, processor, _dataset(), settings, str(tmp_path / str(cached)), 3,
                                    bare=True)
        assert isinstance(trainer.data_collator, RowCache) == cached
        trainer.args.save_strategy = "no"
        trainer.train()
        logs[cached] = [(e["loss"], e["grad_norm"]) for e in trainer.state.log_history if "loss" in e]
    assert len(logs[True]) == 6 and logs[True] == logs[False]
