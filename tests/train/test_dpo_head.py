"""DPO off a Triton device scores only the completion positions in TRL's fused LM head
(flywheel.train.dpo.labelled_positions_only) and gets TRL's own losses, rewards, gradients and weights."""

import pytest
import torch
import trl.trainer.utils as trl_utils

from flywheel.records import validate
from flywheel.train import dpo, hf
from flywheel.train.data import dpo_rows, to_hf_dataset
from flywheel.train.synthetic import dpo_records


def _train(zoo, cfg, tmp_path, monkeypatch, compact: bool):
    rows_scored: list[int] = []  # positions the head projected, per call
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        rows_scored.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    torch.manual_seed(0)
    model, processor = hf.load_vlm(str(zoo["judge"]))
    settings = cfg.train.resolved("judge_dpo").model_copy(update={
        "batch_size": 2, "grad_accum_steps": 2, "max_steps": 3, "logging_steps": 1})
    dataset = to_hf_dataset(dpo_rows(validate("dpo", dpo_records(12, seed=5))[0]))
    trainer = dpo.build_trainer(model, processor, dataset, settings, str(tmp_path / str(compact)), seed=3,
                                bare=True, compact_head=compact)
    trainer.args.save_strategy = "no"
    trainer.train()
    monkeypatch.undo()
    return trainer, rows_scored


def test_compact_head_matches_trls_head(zoo, cfg, tmp_path, monkeypatch):
    compact, compact_rows = _train(zoo, cfg, tmp_path, monkeypatch, compact=True)
    full, full_rows = _train(zoo, cfg, tmp_path, monkeypatch, compact=False)
    # the compact head projected the completion positions only; TRL's CPU path projects every position
    assert compact_rows and all(n < total for n, total in zip(compact_rows, full_rows, strict=True))
    logged = [(c, f) for c, f in zip(compact.state.log_history, full.state.log_history, strict=True) if "loss" in c]
    assert len(logged) == 3
    for c, f in logged:
        for key in ("loss", "grad_norm", "rewards/margins", "logps/chosen", "logps/rejected", "entropy",
                    "mean_token_accuracy"):
            assert c[key] == pytest.approx(f[key], rel=1e-4, abs=1e-6), key
    for (name, a), b in zip(compact.model.named_parameters(), full.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert trl_utils._use_triton(torch.device("cpu")) is False  # TRL's own choice is back after each step
