"""Judge SFT's loss off a GPU (flywheel.train.sft.model_loss_trainer) is TRL's: the same loss, gradients and token
metrics as TRL's fused LM head, step by step, with gradient accumulation over rows of different completion lengths
(where a per-row or per-batch mean would differ from TRL's per-token one)."""

import pytest
import torch

from flywheel.records import validate
from flywheel.train import hf, sft
from flywheel.train.data import sft_rows, to_hf_dataset
from flywheel.train.synthetic import sft_records


def _train(zoo, cfg, tmp_path, fused: bool, completion_only: bool):
    torch.manual_seed(0)
    model, processor = hf.load_vlm(str(zoo["judge"]))
    settings = cfg.train.resolved("judge_sft").model_copy(update={
        "batch_size": 2, "grad_accum_steps": 2, "micro_batches": 1, "max_steps": 3, "logging_steps": 1})
    rows = validate("sft", sft_records(12, seed=4))[0]
    dataset = to_hf_dataset(sft_rows(rows, completion_only_loss=completion_only))
    trainer = sft.build_trainer(model, processor, dataset, settings, str(tmp_path / str(fused)), seed=3,
                                bare=True, fused_head=fused)
    trainer.args.save_strategy = "no"
    trainer.train()
    return trainer


@pytest.mark.parametrize("completion_only", [True, False])
def test_model_loss_matches_trls_fused_head(zoo, cfg, tmp_path, completion_only):
    own = _train(zoo, cfg, tmp_path, fused=False, completion_only=completion_only)
    fused = _train(zoo, cfg, tmp_path, fused=True, completion_only=completion_only)
    assert type(own).compute_loss is not type(fused).compute_loss  # two loss paths, not one twice
    logged = [(o, f) for o, f in zip(own.state.log_history, fused.state.log_history, strict=True) if "loss" in o]
    assert len(logged) == 3
    for o, f in logged:
        for key in ("loss", "grad_norm", "mean_token_accuracy", "entropy", "num_tokens"):
            assert o[key] == pytest.approx(f[key], rel=1e-4), key
    # the weights after three updates agree too
    for (name, a), b in zip(own.model.named_parameters(), fused.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("gpu", [False, True])
def test_trls_fused_head_is_the_default_on_a_gpu_only(zoo, cfg, tmp_path, monkeypatch, gpu):
    from trl import SFTTrainer

    model, processor = hf.load_vlm(str(zoo["judge"]))
    dataset = to_hf_dataset(sft_rows(validate("sft", sft_records(2))[0]))
    monkeypatch.setattr(hf, "on_gpu", lambda: gpu)  # faked: this box has no GPU; only the choice is checked
    trainer = sft.build_trainer(model, processor, dataset, cfg.train.resolved("judge_sft"), str(tmp_path), seed=0)
    assert (type(trainer).compute_loss is SFTTrainer.compute_loss) == gpu
