import inspect

import pytest
import typer
from tiny_iteration import ZOO_MODELS
from typer.testing import CliRunner

from flywheel.cli import app

runner = CliRunner()


def test_config_show_prints_resolved_config_with_overrides():
    result = runner.invoke(app, ["config", "show", "train.lr=0.5", "judge.engine=oracle"])
    assert result.exit_code == 0, result.output
    assert "lr: 0.5" in result.output and "engine: oracle" in result.output
    assert "# config hash:" in result.output


def test_bad_config_exits_2_with_the_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tracking:\n  url: x\n")
    result = runner.invoke(app, ["config", "show", "--config", str(bad)])
    assert result.exit_code == 2
    assert "unknown key 'tracking.url'" in result.output


def test_models_build_lists_three_checkpoints(cfg, zoo):
    result = runner.invoke(app, ["models", "build", f"run.workdir={cfg.run.workdir}", *ZOO_MODELS])
    assert result.exit_code == 0, result.output
    for name, path in zoo.items():
        assert name in result.output and str(path) in result.output.replace("\n", "")


def test_only_real_commands_exist():
    result = runner.invoke(app, ["--help"])
    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert commands == {"run", "eval", "report", "data", "prune", "smoke", "models", "config", "train", "serve",
                        "schedule"}
    assert result.exit_code == 0


@pytest.mark.parametrize("command", [["report"], ["prune"], ["data"], ["models", "build"], ["serve"]])
def test_a_commands_help_breaks_no_line_mid_paragraph(command, monkeypatch):
    monkeypatch.setattr("typer.rich_utils.MAX_WIDTH", 1000)  # room for each paragraph on one line
    # Typer keeps a docstring's line breaks after its first paragraph, then wraps them again at the terminal's width
    doc = inspect.getdoc(typer.main.get_command(app).commands[command[0]].commands[command[1]].callback
                         if len(command) > 1 else typer.main.get_command(app).commands[command[0]].callback)
    out = runner.invoke(app, [*command, "--help"], terminal_width=400).output
    lines = [line.strip() for line in out.splitlines()]
    for paragraph in doc.split("\n\n")[1:]:
        assert " ".join(paragraph.split("\n")) in lines, paragraph


def test_run_refuses_no_iterations_before_touching_the_workdir(tmp_path):
    r = runner.invoke(app, ["run", "--iterations", "0", f"run.workdir={tmp_path}/w"])
    assert r.exit_code == 2 and "--iterations 0: must be at least 1" in r.output, r.output
    assert not (tmp_path / "w").exists()


def test_run_refuses_a_negative_first_iteration(tmp_path):
    r = runner.invoke(app, ["run", "--start", "-1", f"run.workdir={tmp_path}/w"])
    assert r.exit_code == 2 and "'--start'" in r.output and not (tmp_path / "w").exists(), r.output


@pytest.mark.parametrize("job", ["iteration", "eval", "smoke", "serve"])
def test_a_jobs_usage_names_its_script(job):
    import subprocess
    import sys

    from flywheel.config import REPO_ROOT

    out = subprocess.run([sys.executable, f"jobs/{job}.py", "--help"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120, env={"COLUMNS": "200", "PATH": ""})
    assert out.returncode == 0, out.stderr
    usage = next(line for line in out.stdout.splitlines() if "Usage:" in line)
    assert usage.split()[1] in (f"jobs/{job}.py", f"{job}.py") and usage.split()[2] == "[OPTIONS]", usage


def test_serve_detach_refuses_the_address_an_embedded_ray_left_behind(monkeypatch, tmp_path):
    """A process started by one that ran an embedded Ray inherits its RAY_ADDRESS (raycluster.EMBEDDED_ENV marks
    it): that is no cluster to leave the app on, so --detach is refused before any Ray starts."""
    from flywheel import raycluster

    monkeypatch.setenv(raycluster.EMBEDDED_ENV, "10.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    r = runner.invoke(app, ["serve", "--detach", f"run.workdir={tmp_path}/w"])
    assert r.exit_code == 2 and "--detach needs a Ray cluster" in r.output, r.output


@pytest.mark.parametrize("error, line", [
    (ConnectionError("teacher endpoint unreachable"), "stopped: ConnectionError: teacher endpoint unreachable"),
    # printed as is: rich would read the brackets as markup and drop them
    (KeyError("[bold]labels[/bold] missing"), "stopped: KeyError: '[bold]labels[/bold] missing'")])
def test_run_that_stops_ends_with_why_and_how_to_resume(monkeypatch, tmp_path, error, line):
    """The iteration itself is stood in for (its failures have their own tests): what the command does with one."""
    from flywheel import iteration, raycluster

    def stops(cfg, n, tracker):
        raise error

    monkeypatch.setattr(raycluster, "init_ray", lambda cfg: None)
    monkeypatch.setattr(iteration, "run_iteration", stops)
    r = runner.invoke(app, ["run", f"run.workdir={tmp_path}/w"])
    assert r.exit_code == 1, r.output
    assert line in r.output
    assert "the same command again resumes" in r.output.replace("\n", " ")


def test_eval_reads_a_storage_uri_and_names_a_missing_file(tmp_path):
    """`--data` is a string, not a Path: Path("s3://b/x") would collapse to "s3:/b/x"."""
    r = runner.invoke(app, ["eval", "--data", f"file://{tmp_path}/missing.jsonl", "--judge", "zoo:judge",
                            f"run.workdir={tmp_path}"])
    said = r.output.replace("\n", "")  # rich wraps the long path; no space is lost inside it
    assert r.exit_code == 2 and f"--data file://{tmp_path}/missing.jsonl:" in said and "cannot read it" in " ".join(
        r.output.split())


def test_a_default_config_missing_from_another_directory_names_the_projects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["config", "show"])
    assert r.exit_code == 2
    assert f"configs/local.yaml: config file not found (relative to {tmp_path}; the project's is " in r.output
    assert "[red]" not in r.output
