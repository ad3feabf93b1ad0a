"""The probes' files, read by the driver before any worker starts: held-out prompts of the user's own (policies)
and held-out labels (the judge), each refused by name where it cannot tell the probe anything."""

import pytest
from labeled_sets import png_b64, write_jsonl

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.heldout_inputs import heldout_inputs, inputs_digest, read_heldout_prompts

LOCAL = REPO_ROOT / "configs" / "local.yaml"
# local.yaml's policy probe targets and guards the oracle's accuracy and caption measures
REAL_TARGETS = ["train.policy_dpo.heldout.target=judge/pointwise/score", "train.policy_dpo.heldout.max_drop={}"]


def _prompts(path, colours, split="id-test"):
    return write_jsonl(path, [{"task": "iu", "subtask": "vqa", "query": f"Is it {c}?", "images": [png_b64(c)],
                               "split": split} for c in colours])


def test_held_out_prompts_are_a_seeded_draw_of_the_roles_tasks(tmp_path):
    path = str(_prompts(tmp_path / "h.jsonl", ["red", "blue", "green", "white", "black"]))
    cfg = load_config(LOCAL)
    got = read_heldout_prompts(cfg, "policy_dpo", path, items=3)
    assert len(got) == 3 and got == read_heldout_prompts(cfg, "policy_dpo", path, items=3)  # the same each time
    assert {p["query"] for p in got} < {f"Is it {c}?" for c in ["red", "blue", "green", "white", "black"]}
    with pytest.raises(ValueError, match=r"holds no prompt of the tasks \['ig'\]"):
        read_heldout_prompts(cfg, "diffusion_dpo", path, items=3)
    with pytest.raises(FileNotFoundError, match="train.policy_dpo.heldout.prompts_file: no file at .*gone"):
        read_heldout_prompts(cfg, "policy_dpo", str(tmp_path / "gone.jsonl"), items=3)


def test_a_held_out_prompt_the_update_trains_or_is_gated_on_is_refused(tmp_path):
    pool = _prompts(tmp_path / "pool.jsonl", ["red", "blue"], split="train")
    held = str(_prompts(tmp_path / "h.jsonl", ["green", "blue"]))  # "Is it blue?" is in the pool, another split
    cfg = load_config(LOCAL, [f"preferences.sources=[{{type: jsonl, path: {pool}}}]", "preferences.subtasks=[vqa]",
                              "gate.policy_metric=judge/pointwise/score", "gate.generator_metric=judge/pointwise/score",
                              "train.diffusion_dpo.heldout=null",
                              f"train.policy_dpo.heldout.prompts_file={held}",
                              "train.policy_dpo.heldout.judge=champion", *REAL_TARGETS])
    settings = cfg.train.resolved("policy_dpo")
    with pytest.raises(ValueError, match="1 of its prompts are in preferences.sources .*'Is it blue\\?'"):
        heldout_inputs(cfg, "policy_dpo", settings, judge="models:/judge/1")
    _prompts(tmp_path / "h.jsonl", ["green", "white"])
    with pytest.raises(ValueError, match="rated by heldout.judge \\('champion'\\), and there is none yet"):
        heldout_inputs(cfg, "policy_dpo", settings, judge=None)  # heldout.judge: champion, and no champion
    inputs = heldout_inputs(cfg, "policy_dpo", settings, judge="models:/judge/1")
    assert [p["query"] for p in inputs["heldout_prompts"]] == ["Is it green?", "Is it white?"]
    digest = inputs_digest(inputs)
    _prompts(tmp_path / "h.jsonl", ["green", "yellow"])  # edited in place: another training
    assert inputs_digest(heldout_inputs(cfg, "policy_dpo", settings, judge="models:/judge/1")) != digest


@pytest.mark.parametrize("over, named", [
    (["train.judge_dpo.heldout.prompts_file=p.jsonl"], "the judge's probe takes labels"),
    (["train.policy_dpo.heldout.prompts_file=p.jsonl", *REAL_TARGETS],
     "heldout.judge must name a judge \\(it is None\\)"),
    (["train.policy_dpo.heldout.prompts_file=p.jsonl", "train.policy_dpo.heldout.judge=oracle", *REAL_TARGETS],
     "heldout.judge must name a judge \\(it is 'oracle'\\)"),
    (["train.diffusion_dpo.heldout.gold_file=g.jsonl"], "labeled sets are the judge's held-out probe"),
])
def test_held_out_files_where_they_cannot_work_are_refused_at_load(over, named):
    with pytest.raises(ValueError, match=named):
        load_config(LOCAL, over)


def test_real_data_policies_are_probed_on_held_out_prompts_or_not_at_all(tmp_path):
    pool = _prompts(tmp_path / "pool.jsonl", ["red"], split="train")
    real = [f"preferences.sources=[{{type: jsonl, path: {pool}}}]", "preferences.subtasks=[vqa]",
            "gate.policy_metric=judge/pointwise/score", "gate.generator_metric=judge/pointwise/score",
            "train.diffusion_dpo.heldout=null"]
    with pytest.raises(ValueError, match="train.policy_dpo.heldout evaluates on the oracle world's items: set its "
                                         "prompts_file"):
        load_config(LOCAL, real)
    over = [*real, "train.policy_dpo.heldout.prompts_file=h.jsonl", "train.policy_dpo.heldout.judge=champion"]
    with pytest.raises(ValueError, match=r"\['accuracy', 'caption_f1', 'format_valid'\] are the oracle world's "
                                         "measures"):
        load_config(LOCAL, over)
    c = load_config(LOCAL, [*over, *REAL_TARGETS])
    assert c.train.resolved("policy_dpo").heldout.prompts_file == "h.jsonl"
