"""The `flywheel train …` sub-app: mountable, documented, fails cleanly on a bad config."""

import typer
from typer.testing import CliRunner

from flywheel.train.cli import train_app


def test_train_app_mounts_with_four_commands():
    app = typer.Typer()
    app.add_typer(train_app, name="train")
    out = CliRunner().invoke(app, ["train", "--help"])
    assert out.exit_code == 0
    for cmd in ("judge-sft", "judge-dpo", "policy-dpo", "diffusion-dpo"):
        assert cmd in out.output
    out = CliRunner().invoke(app, ["train", "diffusion-dpo", "--help"])
    assert out.exit_code == 0 and "--data" in out.output and "--fresh" in out.output


def test_bad_override_exits_2_naming_the_key(tmp_path):
    out = CliRunner().invoke(train_app, ["judge-sft", "--data", str(tmp_path), "train.judge_sft.lr=fast"])
    assert out.exit_code == 2 and "train.judge_sft.lr" in out.output


def test_judge_sft_refuses_a_method_rather_than_ignoring_it(tmp_path):
    r = CliRunner().invoke(train_app, ["judge-sft", "--data", str(tmp_path / "x"), "--method", "dpo",
                                       f"run.workdir={tmp_path}/w"])
    assert r.exit_code == 2 and "--method dpo: judge-sft has one method" in r.output, r.output
