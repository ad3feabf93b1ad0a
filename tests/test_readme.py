"""The README opens with the two commands that matter, and they point at real targets."""

import re

from flywheel.config import REPO_ROOT


def _first_commands():
    text = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README has no command block"
    assert text.index(block.group(0)) < text.index("\n## "), "the commands must come before the first section"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def test_readme_opens_with_exactly_two_commands():
    assert _first_commands() == ["make run", "make test"]


def test_ci_runs_the_readme_test_command():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_make_targets_set_themselves_up():
    makefile = (REPO_ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert re.search(rf"^{target}: setup\b", makefile, re.M), target
    assert "scripts/setup.sh" in makefile
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    assert "torch==2.13.0" in setup  # CPU torch first, so nothing pulls a CUDA build


def test_relative_links_in_the_docs_point_at_real_files():
    """README.md and docs/*.md link to files of this repository (docs/results.md, screenshots, ...)."""
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
            checked += 1
    assert checked >= 3  # the README links the results page and both MLflow screenshots


def test_the_readmes_config_snippets_load_over_the_default(tmp_path):
    """Every ```yaml block of the README is a config a user can paste: over configs/local.yaml it validates."""
    import yaml

    from flywheel.config import load_config

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.S)
    assert blocks and any(b.startswith("extends: local.yaml") for b in blocks)
    (tmp_path / "configs").mkdir()
    for i, block in enumerate(blocks):
        if block.startswith("extends: "):  # a whole config saved beside the one it extends, as the README says
            base_name = block.split("\n", 1)[0].split(":", 1)[1].strip()
            (tmp_path / "configs" / base_name).write_text((REPO_ROOT / "configs" / base_name).read_text())
            (tmp_path / "configs" / f"snippet{i}.yaml").write_text(block)
            cfg = load_config(tmp_path / "configs" / f"snippet{i}.yaml", [f"run.workdir={tmp_path}"])
            assert not cfg.prompts.oracle_world  # its own keys went over the base's
            continue
        base = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
        for key, value in yaml.safe_load(block).items():
            base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
        path = tmp_path / f"snippet{i}.yaml"
        path.write_text(yaml.safe_dump(base))
        cfg = load_config(str(path), [f"run.workdir={tmp_path}"])
        assert cfg.model_dump(mode="json")  # validated as a whole
