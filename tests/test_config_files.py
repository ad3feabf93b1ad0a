"""Config files that extend others: what merges, what replaces, and errors that name the file."""

import pytest

from flywheel.config import ConfigError, load_config
from flywheel.config_files import chain, read_tree


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_child_names_only_what_it_changes(tmp_path):
    write(tmp_path / "base" / "root.yaml", "judge: {engine: hf, generation: {max_new_tokens: 64, batch_size: 8}}\n"
                                           "judgments: {protocols: {iu: [pointwise, pairwise]}}\nrun: {seed: 3}\n")
    write(tmp_path / "base" / "mid.yaml", "extends: root.yaml\njudge: {generation: {batch_size: 4}}\n")
    child = write(tmp_path / "mine" / "child.yaml",
                  "extends: ../base/mid.yaml\njudge: {generation: {temperature: 0.5}}\n"
                  "judgments: {protocols: {iu: [pointwise]}}\n")
    tree, origins = read_tree(child)
    assert tree["judge"] == {"engine": "hf", "generation": {"max_new_tokens": 64, "batch_size": 4,
                                                            "temperature": 0.5}}
    assert tree["judgments"]["protocols"]["iu"] == ["pointwise"]  # a list replaces the base's
    assert tree["run"] == {"seed": 3} and "extends" not in tree
    assert origins["judge.engine"].endswith("root.yaml") and origins["judge.generation.batch_size"].endswith("mid.yaml")
    assert origins["judge.generation.temperature"].endswith("child.yaml")
    assert [p.name for p in chain(child)] == ["child.yaml", "mid.yaml", "root.yaml"]

    cfg = load_config(child, [f"run.workdir={tmp_path}", "judge.generation.batch_size=2"])
    assert (cfg.run.seed, cfg.judge.generation.batch_size, cfg.judge.generation.max_new_tokens) == (3, 2, 64)


def test_replace_drops_the_bases_other_keys_and_null_replaces_a_section(tmp_path):
    write(tmp_path / "base.yaml", "judge: {generation: {max_new_tokens: 64, batch_size: 8}}\n"
                                  "train: {judge_dpo: {heldout: {every_steps: 5, items: 4}}}\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\njudge: {generation: !replace {batch_size: 2}}\n"
                                           "train: {judge_dpo: {heldout: null}}\n")
    tree, origins = read_tree(child)
    assert tree["judge"]["generation"] == {"batch_size": 2} and type(tree["judge"]["generation"]) is dict
    assert tree["train"]["judge_dpo"]["heldout"] is None
    assert "judge.generation.max_new_tokens" not in origins and "train.judge_dpo.heldout.items" not in origins


def test_errors_name_the_file_and_what_is_wrong(tmp_path):
    missing = write(tmp_path / "a.yaml", "extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"a\.yaml: 'extends: nowhere.yaml' names no file"):
        load_config(missing)
    write(tmp_path / "x.yaml", "extends: y.yaml\n")
    write(tmp_path / "y.yaml", "extends: x.yaml\n")
    with pytest.raises(ConfigError, match=r"makes a cycle: .*x\.yaml -> .*y\.yaml -> .*x\.yaml"):
        load_config(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="must name one config file"):
        load_config(write(tmp_path / "b.yaml", "extends: [x.yaml, y.yaml]\n"))
    with pytest.raises(ConfigError, match="!replace tags a mapping"):
        load_config(write(tmp_path / "c.yaml", "run: {seed: !replace 3}\n"))


def test_a_bad_key_is_blamed_on_the_file_that_set_it(tmp_path):
    write(tmp_path / "base.yaml", "judge: {engin: hf}\n")
    child = write(tmp_path / "child.yaml", f"extends: base.yaml\nrun: {{seed: oops, workdir: {tmp_path}}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(child)
    lines = str(e.value).splitlines()
    assert any(line.strip().startswith(str(tmp_path / "base.yaml")) and "unknown key 'judge.engin'" in line
               for line in lines), lines
    assert any(line.strip().startswith(str(child)) and "'run.seed'" in line for line in lines), lines
