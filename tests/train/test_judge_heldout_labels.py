"""A judge DPO early-stopped on held-out human labels (train.judge_dpo.heldout.gold_file), through Ray Train: the
driver reads the file and the workers rate its outputs, as a user with real data and no oracle world runs it."""

import pytest
from labeled_sets import pair, png_b64, point, write_jsonl

from flywheel.train.api import train


def _heldout(path) -> str:
    return ("train.judge_dpo.heldout={every_steps: 2, items: 4, target: pairwise/accuracy, patience: 5, "
            f"max_new_tokens: 16, gold_file: {path}}}")


def _labels(path, winner: str):
    q = {"task": "iu", "subtask": "vqa", "query": "What colour is this?", "images": [png_b64("red")]}
    return write_jsonl(path, [point(q, "Red.", 5), point(q, "Blue.", 1), pair(q, "Green.", "It is red.", winner)])


@pytest.mark.slow  # ~40 s: three judge DPO runs of 4 steps through Ray Train
def test_judge_dpo_is_probed_on_held_out_human_labels(ray_local, make_cfg, datasets, tmp_path):
    path = _labels(tmp_path / "heldout.jsonl", "B")
    cfg = make_cfg(_heldout(path))
    res = train(cfg, "judge-dpo", datasets["judge_dpo"], base=cfg.models.judge.path)
    curves = {c["step"]: c for c in res.final["heldout.curves"]}
    assert sorted(curves) == [0, 2, 4]
    # the file's two labelled outputs and its pair: 2 pairs, every output rated; the random judge's answers do
    # not parse, so they are failures, never scores
    assert all(c["pairwise/n"] == 2 and c["format_valid"] == 0.0 and c["pairwise/accuracy"] == 0.0
               for c in curves.values())
    assert res.final["heldout.refused"] and res.final["heldout.reason"].startswith("no_gain")

    # the labels are part of what the training is: an edited file trains again, the same file does not
    again = train(cfg, "judge-dpo", datasets["judge_dpo"], base=cfg.models.judge.path)
    assert again.reused and again.model_uri == res.model_uri
    _labels(path, "A")
    edited = train(cfg, "judge-dpo", datasets["judge_dpo"], base=cfg.models.judge.path)
    assert not edited.reused and edited.run_key != res.run_key


def test_the_driver_names_a_missing_or_empty_heldout_file(make_cfg, datasets, tmp_path):
    cfg = make_cfg(_heldout(tmp_path / "gone.jsonl"))
    with pytest.raises(FileNotFoundError, match="train.judge_dpo.heldout.gold_file: no file at .*gone.jsonl"):
        train(cfg, "judge-dpo", datasets["judge_dpo"], base=cfg.models.judge.path)
    (tmp_path / "empty.jsonl").write_text("")
    cfg = make_cfg(_heldout(tmp_path / "empty.jsonl"))
    with pytest.raises(ValueError, match="empty.jsonl holds no valid item \\(it is empty\\)"):
        train(cfg, "judge-dpo", datasets["judge_dpo"], base=cfg.models.judge.path)
