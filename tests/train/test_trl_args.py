"""The TRL arguments every training shares (flywheel/train/hf.py `trl_args`), as TRL's configs take them."""

import warnings

import pytest
from trl import DPOConfig, SFTConfig

from flywheel.train import hf


@pytest.mark.parametrize("config_cls, training", [(SFTConfig, "judge_sft"), (DPOConfig, "judge_dpo"),
                                                  (DPOConfig, "policy_dpo")])
def test_activation_checkpointing_is_off_under_its_current_name(cfg, tmp_path, config_cls, training):
    # TRL turns it on by default, under the name transformers 5.23 deprecates (`gradient_checkpointing`, gone in
    # v6); on the tiny models it only costs time.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = config_cls(**hf.trl_args(cfg.train.resolved(training), str(tmp_path), seed=0))
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False


def test_dataloader_workers_collate_in_processes_kept_across_epochs(make_cfg, tmp_path):
    settings = make_cfg("train.dataloader_workers=2").train.resolved("judge_sft")
    args = SFTConfig(**hf.trl_args(settings, str(tmp_path), seed=0))
    assert args.dataloader_num_workers == 2 and args.dataloader_persistent_workers
    args = SFTConfig(**hf.trl_args(make_cfg().train.resolved("judge_sft"), str(tmp_path), seed=0))
    assert args.dataloader_num_workers == 0 and not args.dataloader_persistent_workers
