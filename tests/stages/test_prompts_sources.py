"""Prompts from the user's files: the policies' preference prompts drawn from `preferences.sources` (train prompts
per sub-task, a seeded draw per iteration; id-test ones held out), a file edited in place read again, and the
settings that would ask the oracle world about prompts it has no ground truth for refused by name."""

import json

import pytest

from flywheel.config import load_config
from flywheel.datasets import read_dataset, read_manifest
from flywheel.evaluate.downstream import heldout_prompts
from flywheel.stages import prompts

REAL = ["gate.policy_metric=judge/pointwise/score", "gate.generator_metric=judge/pointwise/score",
        "train.policy_dpo.heldout=null", "train.diffusion_dpo.heldout=null"]


def _file(tmp_path, n_train=5, n_test=3):
    rows = [{"task": "nlg", "subtask": "summarization", "query": f"Summarise text {i}.",
             "split": "train" if i < n_train else "id-test"} for i in range(n_train + n_test)]
    rows += [{"task": "ig", "subtask": "text_to_image", "query": f"Draw thing {i}.", "split": "train"}
             for i in range(4)] + [{"task": "ig", "subtask": "text_to_image", "query": "Draw a cat.",
                                    "split": "id-test"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    return path


def _cfg(tmp_path, path, *over):
    return load_config(None, [f"run.workdir={tmp_path}", f"preferences.sources=[{{type: jsonl, path: {path}}}]",
                              "preferences.subtasks=[summarization, text_to_image]", *REAL, *over])


def test_preference_prompts_are_a_seeded_draw_of_the_files_train_prompts_per_sub_task(tmp_path):
    c = _cfg(tmp_path, _file(tmp_path), "preferences.prompts_per_subtask={nlg: 3, text_to_image: 2}")
    rows, quarantined = prompts.draw_sources(c, "train", seed=1)
    assert [r["subtask"] for r in rows] == ["summarization"] * 3 + ["text_to_image"] * 2  # own entry, then task's
    assert {r["split"] for r in rows} == {"train"} and len({r["prompt_id"] for r in rows}) == 5
    assert [q["index"] for q in quarantined] == [14]  # the file's bad line, with its reason
    again, _ = prompts.draw_sources(c, "train", seed=1)
    assert [r["prompt_id"] for r in again] == [r["prompt_id"] for r in rows]  # a resumed iteration draws the same
    draws = {tuple(r["prompt_id"] for r in prompts.draw_sources(c, "train", seed=s)[0]) for s in range(6)}
    assert len(draws) > 1  # other iterations, other prompts of the pool

    m = prompts.run_fresh(c, str(tmp_path / "pref"), seed=1)
    assert m.row_count == 5 and m.quarantined == 1
    assert read_dataset(str(tmp_path / "pref"), "prompt")[0].column("prompt_id").to_pylist() == [
        r["prompt_id"] for r in rows]


def test_a_sub_task_the_files_lack_is_named(tmp_path):
    c = _cfg(tmp_path, _file(tmp_path), "preferences.subtasks=[summarization, vqa]")
    with pytest.raises(ValueError, match=r"preferences.subtasks \['vqa'\]: no train-split prompt"):
        prompts.draw_sources(c, "train", seed=0)


def test_held_out_prompts_are_the_id_test_ones_of_the_roles_tasks_and_the_same_for_every_model(tmp_path):
    c = _cfg(tmp_path, _file(tmp_path), "gate.eval_items=10")
    text = heldout_prompts(c, ("nlg", "iu"))
    assert sorted(r["query"] for r in text) == [f"Summarise text {i}." for i in range(5, 8)]
    assert [r["query"] for r in heldout_prompts(c, ("ig",))] == ["Draw a cat."]
    c2 = _cfg(tmp_path, _file(tmp_path, n_test=30), "gate.eval_items=10")
    picked = heldout_prompts(c2, ("nlg", "iu"))
    assert len(picked) == 10 and picked == heldout_prompts(c2, ("nlg", "iu"))


def test_a_prompt_file_edited_in_place_is_read_again(tmp_path):
    path = _file(tmp_path)
    c = load_config(None, [f"run.workdir={tmp_path}", "prompts.oracle_world=false", "teacher.engine=http",
                           f"prompts.sources=[{{type: jsonl, path: {path}}}]", "world.gold.splits=[id-test]",
                           f"meta_eval.gold_files={{id-test: {tmp_path / 'gold.jsonl'}}}",
                           "train.judge_dpo.heldout=null", f"preferences.sources=[{{type: jsonl, path: {path}}}]",
                           "preferences.subtasks=[summarization, text_to_image]", *REAL])
    assert prompts.run(c, str(tmp_path / "p")).manifest.row_count == 13
    assert prompts.run(c, str(tmp_path / "p")).skipped
    _file(tmp_path, n_train=6)  # same path, one more prompt
    res = prompts.run(c, str(tmp_path / "p"))
    assert not res.skipped and read_manifest(str(tmp_path / "p")).row_count == 14


@pytest.mark.parametrize("over, named", [
    (["prompts.oracle_world=false"], "teacher.engine is oracle"),
    (["prompts.oracle_world=false", "teacher.engine=http"], "world.gold.splits ['train', 'id-test', 'ood-test'] "
     "have no file in meta_eval.gold_files"),
    (["prompts.oracle_world=false", "teacher.engine=http", "world.gold.splits=[id-test]",
      "meta_eval.gold_files={id-test: g.jsonl}"], "preferences.sources is empty"),
    (["preferences.sources=[{type: jsonl, path: p.jsonl}]", "preferences.subtasks=[vqa]"],
     "gate.policy_metric 'accuracy' is the oracle's"),
])
def test_settings_that_would_ask_the_oracle_about_user_prompts_are_refused_by_name(over, named):
    with pytest.raises(Exception, match=r"prompts without ground truth: .*" + named.replace("[", r"\[")):
        load_config(None, ["train.judge_dpo.heldout=null", *over])


def test_the_judge_dpo_of_real_data_is_probed_on_held_out_labels_or_not_at_all(tmp_path):
    real = ["prompts.oracle_world=false", "teacher.engine=http", "world.gold.splits=[id-test]",
            f"meta_eval.gold_files={{id-test: {tmp_path / 'gold.jsonl'}}}",
            f"preferences.sources=[{{type: jsonl, path: {tmp_path / 'p.jsonl'}}}]", "preferences.subtasks=[vqa]", *REAL]
    with pytest.raises(Exception, match="train.judge_dpo.heldout rates the oracle world's gold: set its gold_file"):
        load_config(None, real)  # local defaults: a judge DPO probe on the oracle world
    c = load_config(None, [*real, f"train.judge_dpo.heldout.gold_file={tmp_path / 'heldout.jsonl'}"])
    assert c.train.resolved("judge_dpo").heldout.gold_file == str(tmp_path / "heldout.jsonl")


def test_a_role_without_held_out_prompts_is_named(tmp_path):
    c = _cfg(tmp_path, _file(tmp_path), "preferences.subtasks=[summarization]")  # no drawing sub-task at all
    with pytest.raises(ValueError, match=r"no id-test prompt of the tasks \['ig'\] to evaluate on"):
        heldout_prompts(c, ("ig",))
    with pytest.raises(ValueError, match=r"preferences.subtasks \['summarization'\]: no id-test-split prompt"):
        heldout_prompts(_cfg(tmp_path, _file(tmp_path, n_test=0), "preferences.subtasks=[summarization]"), ("nlg",))
